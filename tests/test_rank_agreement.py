"""Tensor-parallel rank agreement of the speculation fallback, on the CPU, with the real patched
SGLang 0.5.12 code.

Under tensor parallelism every rank runs its own EAGLEWorkerV2 on identical batches, and every
target or draft forward, CUDA graph capture and graph replay contains collectives (the
row-parallel layers' all-reduces; in the KV-only graphs the draft embedding's). A rank that
branched, flushed or captured differently from the others would hang them. Here several
independent ranks of the real class (every method of the patched file; the release's
ServerArgs, ModelWorkerBatch, ForwardMode, EagleDraftInput, GenerationBatchResult,
ReqToTokenPool, ...) are set up by their own `_spec_fallback_init` and driven through
`forward_batch_generation` with the same batches. The GPU work is done by subclasses of the release's own classes that log
each call that would run collectives (a forward, a capture, a replay) with its shape: equal
logs are equal collectives in the same order. NCCL itself, a capture failing on one rank and
real graphs are for a multi-GPU machine (`spectool verify` at TP=2).
"""

from __future__ import annotations
import __future__

import abc
import ast
import collections
import contextlib
import dataclasses
import enum
import functools
import json
import logging
import os
import re
import threading
import time
import types
import typing
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from spectool.testing import function_source

from .sglang_source import release_instance, release_type, server_args, server_args_class

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.network

WORKER = "sglang/srt/speculative/eagle_worker_v2.py"
GRAPH_RUNNER = "sglang/srt/model_executor/cuda_graph_runner.py"
MOE_UTILS = "sglang/srt/layers/moe/utils.py"
EAGLE3 = "sglang/srt/models/llama_eagle3.py"
LLAMA = "sglang/srt/models/llama.py"
VOCAB, HIDDEN = 40, 8  # the draft's vocabulary and hidden size; the target's aux states are 3x
POOL = 64  # requests the request-to-token pool holds (max_running_requests)

# The real classes of the release that the fallback's decode, prefill and start-up code reads,
# (file, name) in load order (bases first), all into one namespace as in SGLang.
SGLANG_TYPES = (
    ("sglang/srt/model_executor/forward_batch_info.py", "ForwardMode"),
    ("sglang/srt/model_executor/forward_batch_info.py", "CaptureHiddenMode"),
    ("sglang/srt/speculative/spec_registry.py", "CustomSpecAlgo"),
    ("sglang/srt/speculative/spec_info.py", "SpeculativeAlgorithm"),
    ("sglang/srt/speculative/spec_info.py", "SpecInputType"),
    ("sglang/srt/speculative/spec_info.py", "SpecInput"),
    ("sglang/srt/speculative/eagle_info_v2.py", "EagleDraftInputV2Mixin"),
    ("sglang/srt/speculative/eagle_info_v2.py", "EagleVerifyInputV2Mixin"),
    ("sglang/srt/speculative/eagle_info.py", "EagleDraftInput"),
    ("sglang/srt/speculative/eagle_info.py", "EagleVerifyInput"),
    ("sglang/srt/layers/logits_processor.py", "LogitsProcessorOutput"),
    ("sglang/srt/managers/utils.py", "GenerationBatchResult"),
    ("sglang/srt/model_executor/model_runner.py", "ModelRunnerOutput"),
    ("sglang/srt/managers/schedule_batch.py", "ModelWorkerBatch"),
    ("sglang/srt/distributed/parallel_state.py", "GraphCaptureContext"),
    ("sglang/srt/speculative/base_spec_worker.py", "BaseDraftWorker"),
    ("sglang/srt/speculative/base_spec_worker.py", "BaseSpecWorker"),
    ("sglang/srt/utils/common.py", "fast_topk"),
    ("sglang/srt/utils/torch_memory_saver_adapter.py", "TorchMemorySaverAdapter"),
    ("sglang/srt/utils/torch_memory_saver_adapter.py", "_TorchMemorySaverAdapterNoop"),
    ("sglang/srt/mem_cache/memory_pool.py", "ReqToTokenPool"),
)


@functools.cache
def _compiled(path: str, qualname: str):
    return compile(
        function_source(Path(path), qualname),
        f"{path}:{qualname}",
        "exec",
        flags=__future__.annotations.compiler_flag,
        dont_inherit=True,
    )


def load(tree, rel, qualname, namespace):
    """The class or function `qualname` of the release file `rel`, defined in `namespace` (the
    module globals its methods read, which keeps it). Each definition is parsed once per
    process: every rank defines its own worker class. Annotations stay strings (nothing reads
    them; they name SGLang's GPU types)."""
    exec(_compiled(str(tree / rel), qualname), namespace)
    return namespace[qualname.split(".")[-1]]


@pytest.fixture(scope="module")
def release(patched_release):
    return Release(patched_release("0.5.12"))


class Release:
    """The patched tree and the real classes every rank shares (they hold no rank state)."""

    def __init__(self, tree):
        self.tree = tree
        self.types = {
            "dataclasses": dataclasses,
            "dataclass": dataclasses.dataclass,
            "field": dataclasses.field,
            "Enum": enum.Enum,
            "IntEnum": enum.IntEnum,
            "auto": enum.auto,
            "ABC": abc.ABC,
            "abstractmethod": abc.abstractmethod,
            "total_ordering": functools.total_ordering,
            "contextmanager": contextlib.contextmanager,
            "torch": torch,
            "GPU_MEMORY_TYPE_KV_CACHE": "kv_cache",
            **{name: getattr(typing, name) for name in typing.__all__},
        }
        for rel, name in SGLANG_TYPES:
            load(tree, rel, name, self.types)
        self.on_cpu = on_cpu_classes(tree, self.types)
        self.types["ForwardBatch"] = self.on_cpu["ForwardBatchOnCpu"]  # EagleDraftInput's methods build one
        self.ServerArgs = server_args_class(tree, {"logger": logging.getLogger("test")})

    def __getattr__(self, name):
        try:
            return self.on_cpu[name] if name.endswith("OnCpu") else self.types[name]
        except KeyError:
            raise AttributeError(name) from None


# -- stand-ins for GPU objects, each as small as the code under test allows ----------------


class CpuSeqLens(torch.Tensor):
    """Sequence lengths on the CPU. The fallback's target step records the GPU stream on the
    batch's lengths (Tensor.record_stream), which a CPU tensor refuses; nothing else differs."""

    def record_stream(self, stream):
        pass


def seq_lens(values) -> CpuSeqLens:
    return torch.as_tensor(values, dtype=torch.int64).as_subclass(CpuSeqLens)


class GraphOnCpu:
    """A captured torch.cuda.CUDAGraph: remembers the rows it was captured for and logs each
    replay (under TP the replay runs the all-reduces captured in it)."""

    def __init__(self, log):
        self.log, self.rows = log, None

    def pool(self):
        return self  # the memory-pool handle the next capture shares

    def replay(self):
        self.log.append(("replay", "draft kv-only", self.rows))


class CudaOnCpu:
    """torch.cuda as the fallback's graph capture uses it: graphs are GraphOnCpu, streams do
    nothing; `capturing` is the graph being captured (None outside a capture)."""

    class Stream:
        def wait_stream(self, other):
            pass

    def __init__(self, log):
        self.log, self.capturing, self._stream = log, None, self.Stream()

    def current_stream(self):
        return self._stream

    def stream(self, stream):
        return contextlib.nullcontext()

    def CUDAGraph(self):  # noqa: N802 (torch's name)
        return GraphOnCpu(self.log)

    @contextlib.contextmanager
    def graph(self, graph, pool=None, stream=None):
        self.capturing = graph
        try:
            yield
        finally:
            self.capturing = None

    def synchronize(self):
        pass


class TorchOnCpu(types.ModuleType):
    """The `torch` the patched module sees: the real one, except torch.cuda (no GPU here)."""

    def __init__(self, cuda):
        super().__init__("torch")
        self.cuda = cuda

    def __getattr__(self, name):
        return getattr(torch, name)


def on_cpu_classes(tree, types):
    """The release's ForwardBatch, attention backend, ModelRunner, TpModelWorker and
    EagleDraftWorker (their methods' globals `types`), each subclassed to override only what
    needs the GPU: the forwards log what they would run. Instances are made by
    release_instance, so a field the release renamed fails the test; the subclasses' own
    fields (`rank`: the rank that logs, `name`: a label in the logs) are the test's."""
    forward_batch = release_type(tree, "ForwardBatch", types)

    class ForwardBatchOnCpu(forward_batch):
        """SGLang's ForwardBatch.init_new moves a batch to the GPU (positions by a triton
        kernel); this one keeps the fields the fallback and EagleDraftInput read, positions
        computed as the release does (extend: prefix .. prefix + new tokens; decode: length - 1)."""

        @classmethod
        def init_new(cls, batch, model_runner):
            if batch.forward_mode.is_extend(include_draft_extend_v2=True):
                positions = torch.cat(
                    [
                        torch.arange(p, p + n)
                        for p, n in zip(batch.extend_prefix_lens, batch.extend_seq_lens, strict=True)
                    ]
                )
            else:
                positions = torch.as_tensor(batch.seq_lens) - 1
            return release_instance(
                cls,
                forward_mode=batch.forward_mode,
                spec_info=batch.spec_info,
                input_ids=batch.input_ids,
                out_cache_loc=batch.out_cache_loc,
                seq_lens=batch.seq_lens,
                batch_size=len(batch.seq_lens),
                positions=positions,
            )

    # debug_kernel_api: SGLang's kernel-debugging decorator, which leaves a method as it is
    # unless kernel debugging is on.
    attention_backend = release_type(tree, "AttentionBackend", {**types, "debug_kernel_api": lambda fn: fn})

    class AttentionOnCpu(attention_backend):
        """An attention backend: planning metadata runs no collective."""

        name: str

        def __init__(self, name):
            self.name = name

        def init_forward_metadata(self, forward_batch):
            pass

    class ModelRunnerOnCpu(release_type(tree, "ModelRunner", types)):
        """The release's ModelRunner; `forward` (the draft's) logs the forward it would run
        and returns the release's ModelRunnerOutput."""

        rank: Rank
        name: str
        # Dense Llama models, no linear-attention layers: what the release's own property
        # answers for them (test_recipes_0512 reads it on the release's model configs).
        mambaish_config = None

        def _get_attention_backend(self, init_new_workspace=False):
            self.init_new_workspace = init_new_workspace  # the fallback restores it
            return AttentionOnCpu(f"{self.name} plain")

        def forward(self, forward_batch, skip_attn_backend_init=False):
            bs = forward_batch.batch_size
            self.rank.log.append(("forward", f"draft {forward_batch.forward_mode.name}", bs, self.attn_backend.name))
            logits = torch.arange(bs * VOCAB, dtype=torch.float32).reshape(bs, VOCAB) % 7
            out = types["LogitsProcessorOutput"](next_token_logits=logits, hidden_states=torch.zeros(bs, HIDDEN))
            return types["ModelRunnerOutput"](logits_output=out, can_run_graph=False)

    class TargetWorkerOnCpu(release_type(tree, "TpModelWorker", types)):
        """The release's TpModelWorker: its forward logs which graph and attention backend the
        target would run with and returns the release's GenerationBatchResult."""

        rank: Rank

        def forward_batch_generation(self, batch):
            mr, rank = self.model_runner, self.rank
            graph = getattr(mr.graph_runner, "name", mr.graph_runner)
            tokens = len(batch.input_ids)
            rank.log.append(("forward", f"target {batch.forward_mode.name}", tokens, graph, mr.attn_backend.name))
            bs = len(batch.seq_lens)
            out = types["LogitsProcessorOutput"](next_token_logits=None, hidden_states=rank.hidden(tokens, 3 * HIDDEN))
            return types["GenerationBatchResult"](
                logits_output=out,
                next_token_ids=(torch.arange(bs) * 3 + tokens) % VOCAB,
                can_run_cuda_graph=mr.graph_runner is not None,
            )

    class DraftWorkerOnCpu(release_type(tree, "EagleDraftWorker", types, rel=WORKER)):
        """The release's EagleDraftWorker: the speculative path's draft, draft extend and
        prefill draft are logged; its graphs were captured by the release at start-up."""

        rank: Rank

        def draft_tp_context(self, tp_group):
            return contextlib.nullcontext()

        def draft(self, batch):
            bs = len(batch.seq_lens)
            self.rank.log.append(("forward", "draft multi-step", bs))
            none = dict.fromkeys(
                (
                    "draft_token",
                    "custom_mask",
                    "positions",
                    "retrieve_index",
                    "retrieve_next_token",
                    "retrieve_next_sibling",
                    "retrieve_cum_len",
                    "seq_lens_cpu",
                )
            )
            return types["EagleVerifyInput"](
                **none,
                spec_steps=3,
                topk=1,
                draft_token_num=4,
                capture_hidden_mode=types["CaptureHiddenMode"].FULL,
                seq_lens_sum=0,
            )

        def _draft_extend_for_decode(self, batch, batch_output):
            self.rank.log.append(("forward", "draft extend after verify", len(batch.seq_lens)))

        def _draft_extend_for_prefill(self, batch, hidden_states, next_token_ids, mm_input_embeds):
            self.rank.log.append(("forward", "draft extend of a prefill", len(batch.input_ids)))
            return types["EagleDraftInput"](bonus_tokens=next_token_ids)

    return {
        cls.__name__: cls
        for cls in (ForwardBatchOnCpu, AttentionOnCpu, ModelRunnerOnCpu, TargetWorkerOnCpu, DraftWorkerOnCpu)
    }


@functools.cache
def _eagle3_classes(tree):
    """The release's LlamaForCausalLMEagle3, its LlamaModel, decoder layer and attention (no
    method of theirs runs here)."""
    ns = {"torch": torch, "nn": torch.nn}
    llama_layer = release_type(tree, "LlamaDecoderLayer", ns, rel=LLAMA)  # the EAGLE-3 layer's base
    return (
        release_type(tree, "LlamaForCausalLMEagle3", ns, rel=EAGLE3),
        release_type(tree, "LlamaModel", ns, rel=EAGLE3),
        release_type(tree, "LlamaDecoderLayer", {**ns, "LlamaDecoderLayer": llama_layer}, rel=EAGLE3),
        release_type(tree, "LlamaAttention", ns, rel=LLAMA),
    )


def eagle3_head(tree):
    """The release's EAGLE-3 draft model (LlamaForCausalLMEagle3) holding the parts that the
    KV-only sync's checks and buffers read: one input layer with rotary attention, an
    embedding and fc (real torch modules, never run: the K/V write itself is logged by the
    rank). Made without __init__, which loads the model's layers onto the GPU."""
    head, model, layer, attention = _eagle3_classes(tree)
    attention = release_instance(attention, rotary_emb=None)
    return release_instance(
        head,
        model=release_instance(
            model,
            layers=[release_instance(layer, is_input_layer=True, self_attn=attention)],
            is_mrope_enabled=False,
            embed_tokens=torch.nn.Embedding(VOCAB, HIDDEN),
            fc=torch.nn.Linear(3 * HIDDEN, HIDDEN, bias=False),
        ),
    )


def model_runner(rank, name, args, spec_algorithm, model=None):
    """The release's ModelRunner holding what the fallback reads; the draft's shares the
    target's request-to-token pool."""
    release = rank.release
    pool = (
        rank.target_pool
        if name == "draft"
        else release.ReqToTokenPool(size=POOL, max_context_len=256, device=args.device, enable_memory_saver=False)
    )
    runner = release_instance(
        release.ModelRunnerOnCpu,
        rank=rank,
        name=name,
        server_args=args,
        spec_algorithm=spec_algorithm,
        req_to_token_pool=pool,
        attn_backend=release.AttentionOnCpu(f"{name} spec"),
        graph_runner=f"{name} verify graph",
        init_new_workspace=False,
        model=model,
        tp_group=f"tp group of rank {rank.tp_rank}",
        use_mla_backend=False,
        graph_mem_usage=0.0,  # what SGLang's memory report shows; the fallback adds its own
    )
    # An attribute the release's EagleDraftWorker.init_attention_backend gives its runner.
    runner.draft_attn_backend = release.AttentionOnCpu(f"{name} multi-step draft")
    return runner


def target_worker(rank, args, spec_algorithm):
    return release_instance(
        rank.release.TargetWorkerOnCpu,
        rank=rank,
        tp_rank=rank.tp_rank,
        _model_runner=model_runner(rank, "target", args, spec_algorithm),
    )


def draft_worker(rank, args, spec_algorithm):
    runner = model_runner(rank, "draft", args, spec_algorithm, eagle3_head(rank.release.tree))
    return release_instance(
        rank.release.DraftWorkerOnCpu,
        rank=rank,
        draft_runner=runner,
        speculative_num_steps=3,
        speculative_num_draft_tokens=4,
        draft_attn_backend=runner.draft_attn_backend,
        draft_extend_attn_backend=rank.release.AttentionOnCpu("draft extend"),
        cuda_graph_runner="draft graph",
        cuda_graph_runner_for_draft_extend="draft extend graph",
    )


def graph_runners(rank, ns):
    """SGLang's CudaGraphRunner and EAGLEDraftExtendCudaGraphRunner as the fallback builds them:
    the batch sizes come from the release's own get_batch_sizes_to_capture, the capture is
    logged, and the draft extend's replay logs and returns its outputs padded to the graph."""

    class DecodeGraphRunner:
        def __init__(self, model_runner, attn_backend=None):
            self.name = "target decode graph"
            rank.capturing(self.name)
            self.capture_bs, _ = ns["get_batch_sizes_to_capture"](model_runner)
            rank.log.append(
                (
                    "capture",
                    self.name,
                    tuple(self.capture_bs),
                    model_runner.spec_algorithm.name,
                    model_runner.server_args.enable_return_hidden_states,
                    attn_backend.name,
                )
            )

    class DraftExtendGraphRunner:
        def __init__(self, draft_worker, draft_extend_attn_backend=None, speculative_num_steps=None):
            rank.capturing("draft one-token extend graph")
            self.capture_bs, _ = ns["get_batch_sizes_to_capture"](draft_worker.draft_runner)
            rank.log.append(("capture", "draft one-token extend graph", tuple(self.capture_bs), speculative_num_steps))

        def can_run(self, forward_batch):
            return forward_batch.batch_size <= self.capture_bs[-1]

        def replay(self, forward_batch):
            bs = forward_batch.batch_size
            size = next(s for s in self.capture_bs if s >= bs)
            rank.log.append(("replay", "draft one-token extend", size))
            out = rank.release.LogitsProcessorOutput(
                next_token_logits=torch.zeros(size, VOCAB), hidden_states=torch.zeros(size, HIDDEN)
            )
            out.topk_p, out.topk_index = torch.ones(size, 1), torch.zeros(size, 1, dtype=torch.int64)
            return out

    class DraftBackendFactory:
        def __init__(self, server_args, draft_runner, topk, speculative_num_steps):
            pass

        def create_draft_extend_backend(self):
            return rank.release.AttentionOnCpu("draft one-token extend")

    return DecodeGraphRunner, DraftExtendGraphRunner, DraftBackendFactory


class SkewedClock:
    """A rank's `time` module with its own clock: offset and rate differ from the wall clock's,
    as two hosts' or two processes' timings do."""

    def __init__(self, offset, rate):
        self.offset, self.rate, self.start = offset, rate, time.time()

    def _now(self):
        return self.start + self.offset + (time.time() - self.start) * self.rate

    def time(self):
        return self._now()

    def perf_counter(self):
        return self._now()

    def monotonic(self):
        return self._now()

    def sleep(self, seconds):
        time.sleep(seconds)


# -- one rank -------------------------------------------------------------------------------


class Rank:
    """One TP rank: the real patched EAGLEWorkerV2 (made without __init__, which loads models
    on the GPU) holding what __init__ sets, with its fallback set up by the release's own
    _spec_fallback_init from `args`. GPU-side calls go to `log`.

    Rank-local things differ per rank as they do under TP: tp_rank and gpu_id, the clock the
    module's `time` reads (`clock`), and the values (never the shapes) of hidden states
    (`noise`: seeds the rank's own generator; None gives every rank the same values).
    `stats_interval`: how often the stats writer writes, if this rank starts it;
    `out_of_memory_in`: the graph whose capture runs out of GPU memory on this rank."""

    def __init__(
        self, release, tp_rank, args, *, clock=time, noise=None, tp_size=2, stats_interval=None, out_of_memory_in=None
    ):
        self.release, self.tp_rank, self.log, self.out_of_memory_in = release, tp_rank, [], out_of_memory_in
        self.cuda = CudaOnCpu(self.log)
        self.generator = torch.Generator().manual_seed(0 if noise is None else noise)
        ns = dict(release.types)
        ns.update(
            torch=TorchOnCpu(self.cuda),
            logger=logging.getLogger(f"spec-fallback.rank{tp_rank}"),
            os=os,
            time=clock,
            collections=collections,
            dataclasses=dataclasses,
            json=json,
            threading=threading,
            contextlib=contextlib,
            Optional=typing.Optional,
            Any=typing.Any,
        )
        # Free GPU memory differs per rank (other processes, fragmentation): each rank its own.
        free = iter(80.0 - tp_rank - 0.25 * k for k in range(1000))
        ns.update(get_available_gpu_memory=lambda device, gpu_id: next(free))
        # get_batch_sizes_to_capture's collaborators, the same on every rank: no DP attention or
        # gathered MoE buffers (refused with the fallback), attention TP = TP, no context parallel.
        ns.update(
            require_gathered_buffer=lambda server_args: False,
            get_attention_tp_size=lambda: tp_size,
            get_attention_cp_size=lambda: 1,
        )
        load(release.tree, GRAPH_RUNNER, "get_batch_sizes_to_capture", ns)
        # The MoE backend contexts the draft runs in, as the release writes them, over the
        # backends SGLang's start-up sets from the server args.
        ns.update(
            SPECULATIVE_MOE_RUNNER_BACKEND="auto",
            SPECULATIVE_MOE_A2A_BACKEND="none",
            MOE_RUNNER_BACKEND="auto",
            MOE_A2A_BACKEND="none",
            DISABLE_FLASHINFER_CUTLASS_MOE_FP4_ALLGATHER=False,
            contextmanager=contextlib.contextmanager,
        )
        for name in (
            "get_speculative_moe_runner_backend",
            "get_speculative_moe_a2a_backend",
            "speculative_moe_backend_context",
            "speculative_moe_a2a_backend_context",
        ):
            load(release.tree, MOE_UTILS, name, ns)
        decode_runner, extend_runner, backend_factory = graph_runners(self, ns)
        ns.update(
            CudaGraphRunner=decode_runner,
            EAGLEDraftExtendCudaGraphRunner=extend_runner,
            DraftBackendFactory=backend_factory,
            graph_capture=self._graph_capture,
        )

        self.server_args = args
        algorithm = release.SpeculativeAlgorithm.from_string(args.speculative_algorithm)
        self.target_pool = None
        target = target_worker(self, args, algorithm)
        self.target_pool = target.model_runner.req_to_token_pool
        pool = self.target_pool.req_to_token  # the KV slot of each request's every position,
        pool.copy_(torch.arange(pool.numel(), dtype=pool.dtype).reshape(pool.shape))  # as allocated alike on all ranks
        state_cls = load(release.tree, WORKER, "SpecFallbackState", ns)
        if stats_interval is not None:  # this rank's class: how often its stats writer writes
            state_cls.STATS_INTERVAL_S = stats_interval
        w = self.worker = object.__new__(load(release.tree, WORKER, "EAGLEWorkerV2", ns))
        w.server_args, w.topk, w.device = args, args.speculative_eagle_topk, args.device
        w.tp_rank = w.gpu_id = tp_rank
        w.speculative_num_steps = args.speculative_num_steps
        w.speculative_num_draft_tokens = args.speculative_num_draft_tokens
        w.speculative_algorithm, w.page_size = algorithm, args.page_size
        w._target_worker, w._draft_worker = target, draft_worker(self, args, algorithm)
        w.req_to_token_pool = self.target_pool
        w.adaptive_controller, w.plan_stream = None, None
        w.verify = self._verify  # the release's verify replays the target's TARGET_VERIFY graph
        w._spec_fallback_kv_only_write = self._kv_only_write  # the draft layer's K/V (exactness:
        # tests/test_fallback_kv_only.py); eager, or recorded into the graph being captured
        w._spec_fallback_init(args)
        w._spec_tiers_init(args)  # the patched __init__ starts both (tiers: off unless set)
        self.state, self.startup = w._spec_fallback, list(self.log)

    @contextlib.contextmanager
    def _graph_capture(self):
        """SGLang's graph_capture(): registers the captured buffers with every rank's custom
        all-reduce, so all ranks must enter it alike."""
        self.log.append(("capture", "graph_capture", "enter"))
        yield self.release.GraphCaptureContext(stream=self.cuda.current_stream())
        self.log.append(("capture", "graph_capture", "exit"))

    def capturing(self, graph):
        """A capture of `graph` starts: out of GPU memory if this rank is to fail there."""
        if graph == self.out_of_memory_in:
            raise torch.OutOfMemoryError(f"CUDA out of memory. Tried to allocate 2.00 GiB on GPU {self.tp_rank}")

    def _verify(self, batch):
        bs = len(batch.seq_lens)
        self.log.append(("forward", "target verify", bs, "target verify graph"))
        return self.release.GenerationBatchResult(
            next_token_ids=torch.zeros(bs * 4, dtype=torch.int64), speculative_num_draft_tokens=4
        )

    def _kv_only_write(self, tokens, hidden_states, positions, out_cache_loc):
        graph = self.cuda.capturing
        if graph is not None:
            self.capturing("draft kv-only graph")
            graph.rows = len(out_cache_loc)
            self.log.append(("capture", "draft kv-only", graph.rows))
        else:
            self.log.append(("forward", "draft kv-only", len(out_cache_loc)))

    def hidden(self, *shape):
        return torch.rand(*shape, generator=self.generator)

    # -- batches, as each rank's scheduler builds them (its own objects, the same content) --

    def batch(self, step, index):
        kind = step[0]
        if kind == "prefill":
            _, n, grammar, logprob = step
            return self._prefill(index, n, grammar, logprob)
        _, bs, grammar, logprob = step
        return self._decode(index, bs, grammar, logprob, idle=kind == "idle")

    def _common(self, mode, bs, grammar, logprob, **values):
        cls = self.release.ModelWorkerBatch
        required = {
            f.name: None
            for f in dataclasses.fields(cls)
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        }
        return cls(
            **{
                **required,
                "forward_mode": mode,
                "req_pool_indices": torch.arange(bs) + 1,
                "return_logprob": logprob,
                "is_extend_in_batch": mode.is_extend(),
                "all_extend_in_batch": mode.is_extend(),
                "can_run_dp_cuda_graph": False,
                "has_grammar": grammar,
                **values,
            }
        )

    def _decode(self, index, bs, grammar, logprob, idle):
        r = self.release
        bs = 0 if idle else bs
        lens = 20 + (torch.arange(bs) * 7 + index) % 50
        spec_info = r.EagleDraftInput(
            topk_p=torch.ones(bs, 1),
            topk_index=torch.zeros(bs, 1, dtype=torch.int64),
            hidden_states=self.hidden(bs, HIDDEN),
            bonus_tokens=((torch.arange(bs) + index) % VOCAB).to(torch.int32),
        )
        return self._common(
            r.ForwardMode.IDLE if idle else r.ForwardMode.DECODE,
            bs,
            grammar,
            logprob,
            input_ids=None,
            out_cache_loc=None,
            seq_lens=seq_lens(lens),
            seq_lens_cpu=lens.clone(),
            seq_lens_sum=int(lens.sum()),
            spec_info=spec_info,
        )

    def _prefill(self, index, n, grammar, logprob):
        new = [3 + (j + index) % 4 for j in range(n)]
        prefix = [5 * (j % 2) for j in range(n)]
        lens = torch.tensor([p + e for p, e in zip(prefix, new, strict=True)])
        tokens = sum(new)
        return self._common(
            self.release.ForwardMode.EXTEND,
            n,
            grammar,
            logprob,
            input_ids=torch.arange(tokens) % VOCAB,
            out_cache_loc=torch.arange(tokens) + 1000 * index,
            seq_lens=seq_lens(lens),
            seq_lens_cpu=lens.clone(),
            seq_lens_sum=int(lens.sum()),
            extend_seq_lens=new,
            extend_prefix_lens=prefix,
            extend_num_tokens=tokens,
            multimodal_inputs=None,
            spec_info=None,
        )

    # -- one step of the scheduler ------------------------------------------------------

    def step(self, step, index):
        """Run one batch through the worker (and, for a decode batch, the scheduler's report of
        its accept counts); what the step did."""
        stats, start = self.state.stats, len(self.log)
        causes = dict(stats.get("draft_kv_only_flush_causes", {}))
        fallback_steps = stats["fallback_steps"]
        out = self.worker.forward_batch_generation(self.batch(step, index))
        if step[0] != "prefill":
            self.worker.on_verify_complete_cpu([0 if out.speculative_num_draft_tokens == 1 else 2] * step[1])
        flushes = {
            c: n - causes.get(c, 0)
            for c, n in stats.get("draft_kv_only_flush_causes", {}).items()
            if n != causes.get(c, 0)
        }
        mode = step[0] if step[0] == "prefill" else "fallback" if stats["fallback_steps"] > fallback_steps else "spec"
        return Step(mode, self.state.active, flushes, self.log[start:])


class Step(typing.NamedTuple):
    """What one step did on one rank: the path it took ("spec", "fallback", "prefill"), the
    fallback's hysteresis state after it, the KV-only flushes it caused (cause -> count), and
    the GPU-side calls it made, in order."""

    mode: str
    active: bool
    flushes: dict
    calls: list


def args_for(
    release,
    threshold,
    hysteresis=0,
    *,
    margin=0,
    per_replay=4,
    decode_min_bs=16,
    graph_bs=(1, 2, 4, 8, 12, 16, 24, 32, 48),
    **more,
):
    """One rank's ServerArgs (each rank process holds its own copy of the same values): EAGLE-3,
    topk 1, CUDA graphs at `graph_bs` sizes, the fallback's flags."""
    return server_args(
        release.ServerArgs,
        device="cpu",
        speculative_algorithm="EAGLE3",
        speculative_eagle_topk=1,
        speculative_num_steps=3,
        speculative_num_draft_tokens=4,
        cuda_graph_bs=list(graph_bs),
        max_running_requests=POOL,
        disable_cuda_graph=False,
        speculative_disable_batch_size_threshold=threshold,
        speculative_disable_batch_size_hysteresis=hysteresis,
        speculative_disable_kv_only_margin=margin,
        speculative_disable_kv_only_steps_per_replay=per_replay,
        speculative_disable_draft_decode_min_bs=decode_min_bs,
        **more,
    )


def run_ranks(ranks, steps):
    """Every rank through the same steps; per rank, what each step did."""
    return [[rank.step(step, i) for i, step in enumerate(steps)] for rank in ranks]


def assert_ranks_agree(ranks, per_rank):
    """Each step took the same mode, flushed for the same causes and made the same GPU-side
    calls on every rank, and the ranks' counters and hysteresis state are equal."""
    for r, steps in enumerate(per_rank[1:], 1):
        for i, (a, b) in enumerate(zip(per_rank[0], steps, strict=True)):
            assert a == b, f"step {i}: rank 0 {a} != rank {r} {b}"
    for rank in ranks[1:]:
        assert rank.startup == ranks[0].startup
        assert rank.state.stats == ranks[0].state.stats and rank.state.active == ranks[0].state.active


# -- the tests --------------------------------------------------------------------------------

# T=8, H=3 (back on at <= 5), KV-only margin 2 (KV-only above 10), draft decode from 8
# requests, 3 steps per replay; graphs up to 48 with a pool of 64, so 49..64 runs eagerly.
DESIGNED = [
    ("decode", 6, False, False),  # 0 spec
    ("decode", 9, False, False),  # 1 fallback on; full sync (draft decode forward)
    ("decode", 11, False, False),  # 2 KV-only, stashed
    ("decode", 11, False, False),  # 3 stashed
    ("decode", 11, False, False),  # 4 stashed: 3 steps -> replay (queued)
    ("decode", 20, False, False),  # 5 stashed
    ("decode", 20, False, False),  # 6 stashed; a third 20 would not fit 48 -> replay (full)
    ("decode", 12, False, False),  # 7 stashed
    ("prefill", 3, False, False),  # 8 writes the stash (prefill); 3 + 12 > 10: KV-only prefill
    ("decode", 15, False, False),  # 9 stashed
    ("decode", 10, False, False),  # 10 within the margin: writes the stash (sync), full sync
    ("decode", 7, False, False),  # 11 band (5 < 7 <= 8): still fallback; extend graph (7 < 8)
    ("decode", 13, False, False),  # 12 stashed
    ("decode", 5, False, False),  # 13 <= T - H: drafting back on, writes the stash (spec)
    ("decode", 9, False, False),  # 14 fallback on again; full sync
    ("decode", 20, False, False),  # 15 stashed
    ("decode", 14, False, False),  # 16 stashed (two sizes in one queue: deduplicated)
    ("decode", 60, False, False),  # 17 larger than any graph: stash written (eager), eager write
    ("decode", 4, False, False),  # 18 spec
    ("prefill", 2, False, False),  # 19 drafting on: full draft prefill
    ("idle", 0, False, False),  # 20 idle: speculative path
]


def test_ranks_agree_on_a_designed_sequence(release):
    """Three ranks (different tp_rank, gpu_id, clocks, hidden-state values) through a sequence
    that crosses the threshold both ways with hysteresis, has prefills in between, and flushes
    the KV-only stash for every cause: the same decisions, flushes and GPU-side calls on each,
    and those are the documented ones."""
    clocks = [time, SkewedClock(3600.0, 7.0), SkewedClock(-50.0, 0.1)]
    ranks = [
        Rank(
            release,
            r,
            args_for(release, 8, 3, margin=2, per_replay=3, decode_min_bs=8),
            clock=clocks[r],
            noise=r,
            tp_size=3,
        )
        for r in range(3)
    ]
    per_rank = run_ranks(ranks, DESIGNED)
    assert_ranks_agree(ranks, per_rank)

    steps = per_rank[0]
    assert "".join(s.mode[0] for s in steps) == "sfffffffpffffsffffsps"
    assert [i for i, s in enumerate(steps) if s.active] == [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 14, 15, 16, 17]
    assert {i: s.flushes for i, s in enumerate(steps) if s.flushes} == {
        4: {"queued": 1},
        6: {"full": 1},
        8: {"prefill": 1},
        10: {"sync": 1},
        13: {"spec": 1},
        17: {"eager": 1},
    }
    calls = [s.calls for s in steps]
    assert calls[0] == [
        ("forward", "draft multi-step", 6),
        ("forward", "target verify", 6, "target verify graph"),
        ("forward", "draft extend after verify", 6),
    ]
    assert calls[1] == [
        ("forward", "target DECODE", 9, "target decode graph", "target plain"),
        ("forward", "draft DECODE", 9, "draft plain"),
    ]
    assert calls[2] == [("forward", "target DECODE", 11, "target decode graph", "target plain")]  # stashed
    assert calls[4][-1] == ("replay", "draft kv-only", 48)  # 33 rows: the smallest graph that holds them
    assert calls[6][-1] == ("replay", "draft kv-only", 48)  # 40 rows
    assert calls[8] == [
        ("forward", "target EXTEND", 12, "target verify graph", "target spec"),
        ("replay", "draft kv-only", 12),
        ("forward", "draft kv-only", 12),
    ]  # the prompt's K/V only
    assert calls[10][1:] == [("replay", "draft kv-only", 16), ("forward", "draft DECODE", 10, "draft plain")]
    assert calls[11][1:] == [("replay", "draft one-token extend", 8)]
    assert calls[13][0] == ("replay", "draft kv-only", 16)
    assert calls[17][1:] == [("replay", "draft kv-only", 48), ("forward", "draft kv-only", 60)]
    assert calls[19] == [
        ("forward", "target EXTEND", 9, "target verify graph", "target spec"),
        ("forward", "draft extend of a prefill", 9),
    ]
    assert calls[20] == [
        ("forward", "draft multi-step", 0),
        ("forward", "target verify", 0, "target verify graph"),
        ("forward", "draft extend after verify", 0),
    ]
    stats = ranks[0].state.stats
    assert stats["draft_kv_only_dedups"] == 1 and stats["draft_kv_only_prefills"] == 1


@pytest.mark.parametrize(
    "tp_size,graph_bs,flags,decode_bs,kv_only_bs",
    [
        # T=16: only sizes above 16; the pool (64) cuts 72 and 80 off, and the release captures
        # 64 in their place
        (2, (1, 2, 4, 8, 16, 24, 32, 48, 72, 80), (16, 0, 0), (24, 32, 48, 64), (24, 32, 48, 64)),
        (8, (8, 16, 24, 32, 48, 64), (20, 6, 4), (16, 24, 32, 48, 64), (32, 48, 64)),
        (4, (1, 2, 3, 4, 6, 12), (2, 1, 1), (2, 3, 4, 6, 12), (4, 6, 12)),
    ],
)
def test_capture_sizes_are_the_same_on_every_rank(release, tp_size, graph_bs, flags, decode_bs, kv_only_bs):
    """Start-up on every rank of a TP group captures the same graphs in the same order: the
    target's decode graph and the one-token draft extend at the release's batch sizes above
    T - H (the batches a fallback step can have), then
    inside graph_capture() one KV-only graph per decode-graph size above T + M, largest first
    (`flags`: T, H, M)."""
    threshold, hysteresis, margin = flags
    args = [args_for(release, threshold, hysteresis, margin=margin, graph_bs=graph_bs) for _ in range(tp_size)]
    ranks = [Rank(release, r, args[r], clock=SkewedClock(r, 1), tp_size=tp_size) for r in range(tp_size)]
    assert all(rank.log == ranks[0].log for rank in ranks[1:])
    assert ranks[0].log == [
        ("capture", "target decode graph", decode_bs, "NONE", True, "target plain"),
        ("capture", "draft one-token extend graph", decode_bs, 0),
        ("capture", "graph_capture", "enter"),
        *[
            call
            for bs in kv_only_bs[::-1]  # a warm-up write, then the capture
            for call in (("forward", "draft kv-only", bs), ("capture", "draft kv-only", bs))
        ],
        ("capture", "graph_capture", "exit"),
    ]
    assert all(tuple(rank.state.kv_only_graphs["graphs"]) == kv_only_bs for rank in ranks)


@pytest.mark.parametrize(
    "graph,what",
    [
        ("target decode graph", "a decode CUDA graph"),
        ("draft one-token extend graph", "a one-token draft-extend CUDA graph"),
        ("draft kv-only graph", "the KV-only draft sync's CUDA graphs"),
    ],
)
def test_a_capture_failing_on_one_rank_stops_it_with_the_reason(release, graph, what):
    """Out of GPU memory while one rank alone captures a fallback graph: that rank's start-up
    stops with an error naming the graph and the cause, and SGLang then stops every rank.
    Serving that rank eagerly instead would change its collectives (without the KV-only
    graphs it writes the draft KV every step while the others replay every few steps): the
    others would hang."""
    Rank(release, 0, args_for(release, 8, 3, margin=2, per_replay=3))
    reason = re.escape(f"could not capture {what} (OutOfMemoryError: CUDA out of memory")
    with pytest.raises(RuntimeError, match=reason) as err:
        Rank(release, 1, args_for(release, 8, 3, margin=2, per_replay=3), out_of_memory_in=graph)
    assert isinstance(err.value.__cause__, torch.OutOfMemoryError)


STEP = st.one_of(
    st.tuples(st.just("decode"), st.integers(1, POOL), st.booleans(), st.booleans()).map(
        lambda s: (s[0], s[1], s[2] and s[1] % 5 == 0, s[3] and s[1] % 7 == 0)
    ),  # flags now and then
    st.tuples(st.just("prefill"), st.integers(1, 6), st.booleans(), st.booleans()).map(
        lambda s: (s[0], s[1], s[2] and s[1] == 6, s[3] and s[1] == 5)
    ),
    st.just(("idle", 0, False, False)),
)


@st.composite
def workloads(draw):
    """Settings and a batch sequence that walks around T: near the switch points T - H, T and
    T + M most of the time, anywhere up to the pool now and then, prefills in between."""
    threshold = draw(st.integers(1, 40))
    hysteresis = draw(st.integers(0, threshold - 1))
    margin = draw(st.sampled_from([None, 0, 1, 3, 8]))
    per_replay = draw(st.integers(1, 6))
    decode_min_bs = draw(st.sampled_from([None, 1, 8, 16, 32]))
    edges = [threshold - hysteresis, threshold - hysteresis + 1, threshold, threshold + 1]
    if margin is not None:
        edges += [threshold + margin, threshold + margin + 1]
    near = st.sampled_from([e for e in edges if 1 <= e <= POOL]).flatmap(
        lambda e: st.integers(max(1, e - 2), min(POOL, e + 2))
    )
    plain = near.map(lambda bs: ("decode", bs, False, False))
    step = st.one_of(plain, plain, STEP)  # two thirds near a switch point
    steps = draw(st.lists(step, min_size=5, max_size=30))
    return (threshold, hysteresis, margin, per_replay, decode_min_bs), steps


# No shrinking: every example builds two workers, so shrinking a failure takes minutes; a
# failing example is reported as generated, and the assertion names the step and both calls.
@settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    database=None,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(workloads())
def test_ranks_agree_on_random_sequences(release, workload):
    """Generated settings (T, H, KV-only margin, steps per replay, draft-decode minimum) and
    batch sequences: two ranks with different rank-local state agree step by step, and the
    hysteresis state follows the documented rule (fallback above T, drafting again at
    <= T - H; idle batches and prefills leave it alone)."""
    (threshold, hysteresis, margin, per_replay, decode_min_bs), steps = workload
    ranks = [
        Rank(
            release,
            r,
            args_for(release, threshold, hysteresis, margin=margin, per_replay=per_replay, decode_min_bs=decode_min_bs),
            clock=time if r == 0 else SkewedClock(1e5, 3.0),
            noise=r,
        )
        for r in range(2)
    ]
    per_rank = run_ranks(ranks, steps)
    assert_ranks_agree(ranks, per_rank)
    active = False
    for step, done in zip(steps, per_rank[0], strict=True):
        if step[0] == "decode":
            active = step[1] > (threshold - hysteresis if active else threshold)
        assert done.active == active, (step, done)
        if step[0] == "decode" and not (step[2] or step[3]):  # a batch every rule lets fall back
            assert done.mode == ("fallback" if active else "spec"), (step, done)
        elif step[0] == "idle":
            assert done.mode == "spec"


def test_only_rank_zero_writes_the_stats_file(release, tmp_path, monkeypatch):
    """SPECTOOL_FALLBACK_STATS is in every rank's environment (each rank process inherits it);
    only rank 0 starts the writer thread and writes the file. Ranks 1..3 run a workload
    first: no file, no temporary file, no writer thread; then rank 0, whose file holds its
    counters, which are every rank's."""
    path = tmp_path / "stats.json"
    monkeypatch.setenv("SPECTOOL_FALLBACK_STATS", str(path))
    steps = DESIGNED[:12]
    before = {t for t in threading.enumerate() if t.name == "spec-fallback-stats"}
    others = [Rank(release, r, args_for(release, 8, 3, margin=2, per_replay=3), tp_size=4) for r in (1, 2, 3)]
    others_per_rank = run_ranks(others, steps)
    assert list(tmp_path.iterdir()) == []
    assert {t for t in threading.enumerate() if t.name == "spec-fallback-stats"} == before
    rank0 = Rank(release, 0, args_for(release, 8, 3, margin=2, per_replay=3), tp_size=4)
    try:
        assert path.exists() and json.loads(path.read_text())["spec_steps"] == 0
        writers = {t for t in threading.enumerate() if t.name == "spec-fallback-stats"} - before
        assert len(writers) == 1
        per_rank = run_ranks([rank0], steps)
        assert_ranks_agree([rank0, *others], per_rank + others_per_rank)
        rank0.state.write_stats(str(path))  # what the writer thread writes every 0.5 s
        written = json.loads(path.read_text())
        del written["written_at"]
        assert written == json.loads(json.dumps(others[0].state.stats))
        assert sorted(p.name for p in tmp_path.iterdir()) == ["stats.json"]
    finally:
        rank0.state.stats_path = None  # the writer thread ends


def test_rank_local_differences_change_nothing(release, tmp_path, monkeypatch):
    """Two ranks that differ in everything rank-local: tp_rank and gpu_id (0 and 7), the clock
    (the wall clock; one a day ahead running 50 times as fast), hidden-state values, and on
    rank 0 the stats writer rewriting its file every millisecond while the steps run. They
    take the same steps. The comparison is not blind: a rank given another threshold (a
    server flag, equal on every rank by construction) makes other calls."""
    monkeypatch.setenv("SPECTOOL_FALLBACK_STATS", str(tmp_path / "stats.json"))
    steps = DESIGNED + DESIGNED[::-1]
    rank0 = Rank(release, 0, args_for(release, 8, 3, margin=2, per_replay=3), noise=0, stats_interval=0.001)
    try:
        rank7 = Rank(
            release, 7, args_for(release, 8, 3, margin=2, per_replay=3), noise=7, clock=SkewedClock(86400.0, 50.0)
        )
        per_rank = run_ranks([rank0, rank7], steps)
        assert_ranks_agree([rank0, rank7], per_rank)
        assert json.loads((tmp_path / "stats.json").read_text())["phase_count"] > 0  # written during the steps
    finally:
        rank0.state.stats_path = None  # the writer thread ends
    other = Rank(release, 1, args_for(release, 9, 3, margin=2, per_replay=3), noise=0)
    assert [s.calls for s in run_ranks([other], steps)[0]] != [s.calls for s in per_rank[0]]


def test_the_fallback_reads_rank_local_values_only_for_stats_and_logs(release):
    """In the patched file, the fallback's code reads the rank only to choose the stats
    writer, the environment only for the stats file, the clock only for the stats file and a
    start-up log line, and the device's free memory only to report what start-up took (a log
    line, SGLang's memory report, the counters): no branch depends on any of them, and no
    rank query."""
    source = (release.tree / WORKER).read_text()
    tree = ast.parse(source)
    worker = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "EAGLEWorkerV2")
    state = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "SpecFallbackState")
    fallback = [n for n in worker.body if isinstance(n, ast.FunctionDef) and n.name.startswith("_spec_fallback")]
    fallback += [n for n in state.body if isinstance(n, ast.FunctionDef)]
    hooks = [
        n
        for n in worker.body
        if isinstance(n, ast.FunctionDef) and n.name in ("forward_batch_generation", "on_verify_complete_cpu")
    ]

    def reads(fn):
        """The rank-local names a function reads (attribute, global, or getattr's string), sorted."""
        local = {
            "tp_rank",
            "gpu_id",
            "environ",
            "getenv",
            "envs",
            "time",
            "perf_counter",
            "monotonic",
            "get_tensor_model_parallel_rank",
            "get_attention_tp_rank",
            "current_device",
            "get_available_gpu_memory",
            "random",
        }
        found = set()
        for node in ast.walk(fn):
            if isinstance(node, ast.Attribute) and node.attr in local:
                found.add(node.attr)
            elif isinstance(node, ast.Name) and node.id in local:
                found.add(node.id)
            elif isinstance(node, ast.Constant) and node.value in local:
                found.add(node.value)
        return sorted(found)

    where = {
        f"{'SpecFallbackState' if fn in state.body else 'EAGLEWorkerV2'}.{fn.name}": reads(fn)
        for fn in fallback
        if reads(fn)
    }
    assert where == {
        "EAGLEWorkerV2._spec_fallback_init": ["environ", "tp_rank"],
        "EAGLEWorkerV2._spec_fallback_build": ["get_available_gpu_memory", "gpu_id", "perf_counter", "time"],
        "SpecFallbackState.write_stats": ["time"],
        "SpecFallbackState.publish_stats": ["time"],
    }
    # Nor do the methods the recipe hooks into (the decode and prefill entry, the scheduler's
    # accept-count report).
    assert [reads(fn) for fn in hooks] == [[], []]
    # The environment is read once, for the stats file, and only rank 0 writes it.
    init = next(fn for fn in fallback if fn.name == "_spec_fallback_init")
    init_src = ast.get_source_segment(source, init)
    assert init_src.count("os.environ") == 1 and 'os.environ.get("SPECTOOL_FALLBACK_STATS")' in init_src
    assert "if stats_path and rank == 0:" in init_src
    # The time is read only for a log line at start-up.
    build = next(fn for fn in fallback if fn.name == "_spec_fallback_build")
    assert "time.perf_counter() - tic" in ast.get_source_segment(source, build)
    # The free memory measured on each rank is reported, never branched on.
    tests = [ast.unparse(n.test) for n in ast.walk(build) if isinstance(n, (ast.If, ast.While, ast.IfExp))]
    assert not [t for t in tests if "before" in t or "used" in t or "memory" in t], tests
    uses = [
        ast.unparse(n)
        for n in ast.walk(build)
        if isinstance(n, (ast.AugAssign, ast.Assign, ast.Expr))
        and "used" in {x.id for x in ast.walk(n) if isinstance(x, ast.Name)}
    ]
    # Up to 0.5.16 the model runner sums graph memory in graph_mem_usage, from 0.5.17 per
    # phase in graph_memory_usage; the start-up adds the fallback's to whichever it has.
    assert len(uses) == 5 and "mr.graph_mem_usage += used" in uses, uses
    assert "usage['decode'] = usage.get('decode', 0.0) + used" in uses, uses
