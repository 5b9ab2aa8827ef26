"""The era-independent half of the fallback: its state, the decision, counters, and the
target step and draft KV sync that both eras share.

Inserted into sglang/srt/speculative/eagle_worker_v2.py of every supported release: the
SpecFallbackState dataclass at module level, the EAGLEWorkerV2 methods below in source order,
and the hooks into __init__, forward_batch_generation and on_verify_complete_cpu. The decision
depends only on the batch (its size, and per era which requests it serves), which every
tensor-parallel rank receives identically, so all ranks take the same branch; the hysteresis
state is updated from the same inputs on every rank. The era-specific half (how one plain
decode step is returned, what is captured at start-up) is v0_5_12/worker.py or seed/worker.py.
"""

import collections
import dataclasses
import json
import logging
import os
import threading
import time
from typing import Any, Optional

import torch
from sglang.srt.layers.moe.utils import (
    speculative_moe_a2a_backend_context,
    speculative_moe_backend_context,
)
from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardMode

logger = logging.getLogger(__name__)


def init_hook(self, server_args):
    self._spec_fallback_init(server_args)


def verify_complete_hook(self, num_correct_drafts_per_req):
    self._spec_fallback_on_verify(num_correct_drafts_per_req)


def decode_hook(self, model_worker_batch):
    if self._spec_fallback_should_run(model_worker_batch):
        return self._spec_fallback_decode(model_worker_batch)
    self._spec_fallback_kv_only_flush("spec")  # a speculative step reads the draft KV


@dataclasses.dataclass
class SpecFallbackState:
    """The dynamic speculation disable of one EAGLEWorkerV2: its settings (the
    --speculative-disable-* server args), the decision's state, what start-up built for plain
    decode steps, and its counters.

    The counters are changed under `lock` by the scheduler thread; with a stats file
    (SPECTOOL_FALLBACK_STATS) a daemon thread rewrites it every STATS_INTERVAL_S seconds from
    a consistent copy, so the file is never more than that behind the last step, and no step
    has to come after a change for it to be written."""

    STATS_INTERVAL_S = 0.5

    # Settings. threshold None: the flag is unset and the release's own path always runs.
    threshold: Optional[int] = None
    hysteresis: int = 0
    draft_decode_min_bs: Optional[int] = None  # the draft sync is a DECODE forward from here
    kv_only_above: Optional[int] = None  # the draft sync writes only K/V above this batch
    kv_only_steps_per_replay: int = 1
    # Drafting is off; it comes back at threshold - hysteresis.
    active: bool = False
    # Built at start-up: the target's decode backend and graph, the draft's.
    attn_backend: Any = None
    graph_runner: Any = None
    draft_attn_backend: Any = None
    draft_extend_runner: Any = None
    kv_only_graphs: Optional[dict] = None  # graphs, static buffers and queued rows
    constants: dict = dataclasses.field(default_factory=dict)
    # Counters. `phases`: one entry per run of steps in one mode; acceptance is counted per
    # phase, so a stale draft cache after a switch shows up as a drop in the next spec phase.
    stats: dict = dataclasses.field(
        default_factory=lambda: {
            "fallback_steps": 0,
            "spec_steps": 0,
            "switches_to_fallback": 0,
            "switches_to_spec": 0,
            "fallback_requests": 0,
            "last_batch_size": 0,
            "phases": [],
            "phase_count": 0,
        }
    )
    # The phase id of each step whose result the scheduler has not reported yet (bounded: a
    # release without the on_verify_complete_cpu hook never pops).
    pending_phases: Any = dataclasses.field(
        default_factory=lambda: collections.deque(maxlen=4096)
    )
    lock: Any = dataclasses.field(default_factory=threading.Lock)
    stats_path: Optional[str] = None  # where publish_stats writes them

    @staticmethod
    def tier_for_batch(bs, tier, boundaries, hysteresis):
        """The tier a decode batch of `bs` requests runs in, given the tier of the step before:
        tier i serves batches of up to boundaries[i] requests, the last tier every larger one.
        A batch above a boundary moves up at once; moving down across boundary b needs a batch
        of at most b - hysteresis requests. The binary switch is the case of one boundary (the
        threshold): tier 1 is the fallback. A pure function of the batch size and the tier
        before, which every TP rank computes alike from the same batches."""
        plain = sum(bs > b for b in boundaries)
        if plain >= tier:
            return plain
        while tier > plain and bs <= boundaries[tier - 1] - hysteresis:
            tier -= 1
        return tier

    def record_step(self, bs, fallback, switched, draft_steps=None):
        """Count one decode step of `bs` requests in its phase, and a switch of `active`.
        A phase is a run of steps of one mode and one draft length (`draft_steps`, the
        speculative steps' count of draft steps; 0 for the fallback), so the acceptance of
        each tier of --speculative-num-steps-tiers is read from its own phases."""
        mode = "fallback" if fallback else "spec"
        draft_steps = 0 if fallback else draft_steps
        stats = self.stats
        with self.lock:
            phases = stats["phases"]
            if (
                not phases
                or phases[-1]["mode"] != mode
                or phases[-1].get("draft_steps") != draft_steps
            ):
                stats["phase_count"] += 1
                phases.append({"id": stats["phase_count"], "mode": mode,
                               "draft_steps": draft_steps,
                               "steps": 0, "reqs": 0, "correct_drafts": 0})
                del phases[:-200]
            phases[-1]["steps"] += 1
            stats["last_batch_size"] = bs
            if switched:
                stats["switches_to_fallback" if self.active else "switches_to_spec"] += 1
            if fallback:
                stats["fallback_steps"] += 1
                stats["fallback_requests"] += bs
            else:
                stats["spec_steps"] += 1
            self.pending_phases.append(phases[-1]["id"])

    def record_verify(self, num_correct_drafts_per_req):
        """Result-side counters: the scheduler reports accept counts in step order, so the
        oldest pending step's phase is the one this result belongs to."""
        with self.lock:
            if not self.pending_phases:
                return
            phase_id = self.pending_phases.popleft()
            for phase in reversed(self.stats["phases"]):
                if phase["id"] == phase_id:
                    phase["reqs"] += len(num_correct_drafts_per_req)
                    phase["correct_drafts"] += sum(num_correct_drafts_per_req)
                    break

    def count(self, name, key=None):
        """One more `name` in the counters (or `name[key]`, a count per cause)."""
        with self.lock:
            if key is None:
                self.stats[name] = self.stats.get(name, 0) + 1
            else:
                per_key = self.stats.setdefault(name, {})
                per_key[key] = per_key.get(key, 0) + 1

    def write_stats(self, path):
        """Write the counters to `path` (JSON, replaced atomically), with `written_at`
        (time.time()): a reader that waited for a write after its last request knows the
        file holds every step before that."""
        with self.lock:
            text = json.dumps({**self.stats, "written_at": time.time()})
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, path)

    def publish_stats(self, path):
        """Write the counters to `path` now, then every STATS_INTERVAL_S seconds from a
        daemon thread while stats_path is `path`."""
        self.stats_path = path
        self.write_stats(path)

        def publish():
            while True:
                time.sleep(self.STATS_INTERVAL_S)
                if self.stats_path != path:
                    return
                self.write_stats(path)

        threading.Thread(target=publish, name="spec-fallback-stats", daemon=True).start()


class EAGLEWorkerV2:
    def _spec_fallback_init(self, server_args):
        """Read the fallback's settings; with a threshold, build its decode step and start
        its counters file (SPECTOOL_FALLBACK_STATS, written by TP rank 0 only)."""
        state = self._spec_fallback = SpecFallbackState(
            threshold=server_args.speculative_disable_batch_size_threshold,
            hysteresis=server_args.speculative_disable_batch_size_hysteresis,
        )
        if state.threshold is None:
            return
        self._spec_fallback_refuse_unsupported_models()
        self._spec_fallback_build(server_args)
        # The TP rank: the worker's, else (StandaloneWorkerV2) its target worker's; from
        # 0.5.16 a worker keeps it in its parallel state (ps.tp_rank).
        rank = None
        for worker in (self, getattr(self, "_target_worker", None)):
            ps = getattr(worker, "ps", None)
            rank = ps.tp_rank if ps is not None else getattr(worker, "tp_rank", None)
            if rank is not None:
                break
        stats_path = os.environ.get("SPECTOOL_FALLBACK_STATS")
        if stats_path and rank == 0:
            state.publish_stats(stats_path)
        logger.info(
            "spec-fallback: drafting is switched off above %d requests per decode batch "
            "(back on at <= %d); decode CUDA graph: %s",
            state.threshold,
            state.threshold - state.hysteresis,
            "yes" if state.graph_runner is not None else "no (eager)",
        )

    def _spec_fallback_plain_attn_backend(self, runner):
        """A second attention backend of the runner's kind with its own workspace, for plain
        one-token DECODE steps (the runner's own backend is planned for speculative shapes)."""
        backup_init = runner.init_new_workspace
        try:
            return runner._get_attention_backend(init_new_workspace=True)
        finally:
            runner.init_new_workspace = backup_init

    def _spec_fallback_refuse_unsupported_models(self):
        """Stop at start-up on models the fallback step cannot serve, saying why: a hybrid
        linear-attention target (GDN, Mamba, Kimi linear or lightning layers, or one in the
        release's linear-attention registry: whatever its mambaish_config names), whose
        recurrent state the speculative path updates after verify and the scheduler then
        tracks, which a plain fallback step does not do; and a NEXTN/MTP draft (the target's
        own next-token layers), which is not an EAGLE head the draft sync can keep in step.
        Every rank loads the same models, so every rank stops with the same message."""
        mr = self._target_worker.model_runner
        try:
            from sglang.srt.configs.hybrid_arch import mambaish_config
        except ImportError:  # up to 0.5.15 the model runner answers itself
            hybrid = mr.mambaish_config is not None
        else:
            hybrid = mambaish_config(mr.model_config) is not None
        if hybrid:
            raise ValueError(
                "--speculative-disable-batch-size-threshold does not support hybrid "
                "linear-attention targets (GDN, Mamba or other linear-attention layers, e.g. "
                "Qwen3-Next, Nemotron-H, Kimi-Linear): "
                "a fallback step would not update the recurrent state that the speculative "
                "path updates after each verify. Serve this model without the flag."
            )
        draft = type(self.draft_worker.draft_runner.model).__name__
        if draft.endswith(("NextN", "MTP")):
            raise ValueError(
                "--speculative-disable-batch-size-threshold does not support NEXTN/MTP drafts "
                f"(the draft model is {draft}, the target's own next-token layers): the "
                "fallback keeps one-layer EAGLE/EAGLE-3 heads and STANDALONE drafts in sync. "
                "Serve this model without the flag."
            )

    def _spec_fallback_capture(self, what, build):
        """build() (a CUDA graph capture) or, if it fails, an error naming what could not be
        captured and why: the server stops instead of serving eagerly. Under tensor
        parallelism a rank that failed alone (out of memory is the likely cause) would leave
        the others waiting in the capture's collectives; the error ends its scheduler, and
        SGLang then stops every rank."""
        try:
            return build()
        except Exception as exc:
            raise RuntimeError(
                f"spec-fallback: could not capture {what} ({type(exc).__name__}: {exc}). "
                "Free GPU memory (a lower --mem-fraction-static or --cuda-graph-max-bs), or "
                "start with --disable-cuda-graph, or without "
                "--speculative-disable-batch-size-threshold."
            ) from exc

    def _spec_fallback_returns_hidden_states(self, batch):
        """Whether a request of the batch asked for hidden states. SGLang marks that on the
        requests (Req.return_hidden_states); the ModelWorkerBatch carries no flag of its own,
        and its capture_hidden_mode cannot tell, since a speculative decode batch asks for
        FULL capture whatever its requests want."""
        return any(req.return_hidden_states for req in batch.reqs or ())

    def _spec_fallback_should_run(self, batch):
        """Decide per decode step; identical on every TP rank (depends on the batch only)."""
        state = self._spec_fallback
        if (
            state.threshold is None
            or batch.forward_mode.is_idle()
            or batch.spec_info is None
        ):
            return False
        bs = len(batch.seq_lens)
        active = (
            state.tier_for_batch(
                bs, int(state.active), (state.threshold,), state.hysteresis
            )
            == 1
        )
        take = active and self._spec_fallback_eligible(batch)
        switched = active != state.active
        if switched:
            logger.info(
                "spec-fallback: decode batch of %d requests, drafting %s "
                "(fallback steps %d, speculative steps %d so far)",
                bs,
                "OFF" if active else "ON",
                state.stats["fallback_steps"],
                state.stats["spec_steps"],
            )
        state.active = active
        state.record_step(
            bs, take, switched, getattr(self, "speculative_num_steps", None)
        )
        return take

    def _spec_fallback_on_verify(self, num_correct_drafts_per_req):
        """The scheduler's accept counts of one step, counted in that step's phase."""
        state = getattr(self, "_spec_fallback", None)
        if state is not None:
            state.record_verify(num_correct_drafts_per_req)

    def _spec_fallback_target_decode(self, batch, input_ids, new_seq_lens=None, hidden=False):
        """One plain DECODE step of the target over `input_ids` (one token per request), on
        the fallback's own attention backend and decode graph; the spec path's TARGET_VERIFY
        graph is swapped out for the call, never replayed with wrong shapes.

        The token's KV goes to req_to_token[req, seq_len], inside the v2 per-request
        over-allocation, exactly where verify would put its first token. Afterwards the batch
        holds its pre-step lengths again and out_cache_loc = those slots, which is what the
        draft extend over the same tokens needs. `new_seq_lens`: the lengths + 1 if the
        caller has them already (one kernel fewer); `hidden`: a request asked for hidden
        states (_spec_fallback_returns_hidden_states)."""
        state = self._spec_fallback
        batch.seq_lens.record_stream(
            torch.get_device_module(self.device).current_stream()
        )
        out_cache_loc = self.req_to_token_pool.req_to_token[
            batch.req_pool_indices, batch.seq_lens
        ].to(torch.int64)
        batch.out_cache_loc = out_cache_loc
        pre_step = self._spec_fallback_as_decode(batch, input_ids, new_seq_lens, hidden)
        mr = self._target_worker.model_runner
        # The model runner's decode graph runner: decode_cuda_graph_runner from 0.5.14.
        graph = "decode_cuda_graph_runner" if hasattr(mr, "decode_cuda_graph_runner") else "graph_runner"
        saved = (mr.attn_backend, getattr(mr, graph))
        mr.attn_backend = state.attn_backend
        setattr(mr, graph, state.graph_runner)
        try:
            target_out = self._target_worker.forward_batch_generation(batch)
        finally:
            mr.attn_backend = saved[0]
            setattr(mr, graph, saved[1])
        batch.seq_lens, batch.seq_lens_cpu, batch.seq_lens_sum = pre_step
        batch.out_cache_loc = out_cache_loc
        return target_out

    def _spec_fallback_as_decode(self, batch, input_ids, new_seq_lens=None, hidden=False):
        """Make the batch a plain one-token DECODE batch over `input_ids`: lengths + 1, no
        spec_info, and the hidden-state capture EAGLE's draft needs, which also serves
        requests that asked for hidden states (STANDALONE captures them only for those).
        Returns the pre-step (seq_lens, seq_lens_cpu, seq_lens_sum) for the caller to put
        back; out_cache_loc is the caller's. `new_seq_lens` (the lengths + 1, already made by
        the caller for the next draft input) becomes the batch's lengths for the step: nothing
        writes a batch's lengths in place in overlap mode."""
        pre_step = (batch.seq_lens, batch.seq_lens_cpu, batch.seq_lens_sum)
        bs = len(batch.seq_lens)
        batch.input_ids = input_ids.to(torch.int64)
        batch.seq_lens = pre_step[0] + 1 if new_seq_lens is None else new_seq_lens
        # From 0.5.13 a batch may carry no host copy of its lengths (None), when no attention
        # backend of the engine needs one.
        batch.seq_lens_cpu = None if pre_step[1] is None else pre_step[1] + 1
        batch.seq_lens_sum = None if pre_step[2] is None else pre_step[2] + bs
        batch.forward_mode = ForwardMode.DECODE
        batch.spec_info = None
        batch.capture_hidden_mode = (
            CaptureHiddenMode.NULL
            if self.speculative_algorithm.is_standalone() and not hidden
            else CaptureHiddenMode.FULL
        )
        return pre_step

    def _spec_fallback_sync_draft(
        self, batch, tokens, logits_output, next_draft_input, hidden=False
    ):
        """Draft KV sync: a one-token draft extend over the tokens the target produced, with
        its hidden states (none for a STANDALONE draft, which reads none), filling
        next_draft_input's topk_p / topk_index / hidden_states. The target's hidden states
        stay in the result only when a request asked for them (`hidden`): one row per
        request, what the target captured (for an EAGLE-3 target its EAGLE-3 features, as on
        SGLang's own speculative steps)."""
        draft_hidden = (
            None
            if self.speculative_algorithm.is_standalone()
            else logits_output.hidden_states
        )
        with (
            self.draft_worker.draft_tp_context(self.draft_worker.draft_runner.tp_group),
            speculative_moe_backend_context(),
            speculative_moe_a2a_backend_context(),
        ):
            self._spec_fallback_draft_extend(batch, tokens, draft_hidden, next_draft_input)
        if not hidden:
            logits_output.hidden_states = None  # no (bs, 3H) device-to-host copy
