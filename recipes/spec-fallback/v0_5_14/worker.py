"""EAGLEWorkerV2 fallback for SGLang 0.5.14: the methods that differ from 0.5.13
(../v0_5_13/worker.py), whose decode step and prefill are inserted as they are, as are
0.5.12's other methods (../v0_5_12/worker.py).

What changed in 0.5.14, and how this code follows it:

* The workers are built before their memory pools, attention backends and CUDA graphs,
  which the scheduler then sets up in that order (alloc_memory_pool,
  init_attention_backends, init_cuda_graphs): the fallback builds its decode step at the end
  of EAGLEWorkerV2.init_cuda_graphs, once the target's and the draft's graphs exist
  (StandaloneWorkerV2 inherits it).
* The target's graph runner is the model runner's decode_cuda_graph_runner, a
  DecodeCudaGraphRunner (model_executor/runner/), which the recipe imports under 0.5.12's
  name; the graph runners read their capture sizes from server_args.cuda_graph_config.
* The draft extend reads an EagleDraftExtendInput prepared by the draft worker's
  prepare_for_draft_extend, and its graph runner answers can_run_graph / execute.
* The draft-extend graph runner takes its width (draft tokens per request) from
  server_args.speculative_num_draft_tokens, which the worker state writes up to 0.5.16 and
  leaves alone on 0.5.17 (it writes the runtime context there, which 0.5.18's runner reads):
  a graph captured at another width writes it where the runner reads it
  (_spec_fallback_draft_extend_width; the fallback's one-token graph from 0.5.16, the tiers).
"""

import contextlib

import torch
from sglang.srt.model_executor.runner.decode_cuda_graph_runner import (
    DecodeCudaGraphRunner as CudaGraphRunner,  # as the recipe imports it
)
from sglang.srt.speculative.eagle_info import EagleDraftExtendInput
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm


def init_hook(self):
    self._spec_fallback_init(self.server_args)


class EAGLEWorkerV2:
    @contextlib.contextmanager
    def _spec_fallback_draft_extend_width(self, draft_tokens):
        """Inside the block the draft-extend graph runner reads a width of `draft_tokens`
        per request: written through server_args.override where ServerArgs has it (0.5.16,
        0.5.17), and put back after; elsewhere the worker state already holds it."""
        args = self.draft_worker.draft_runner.server_args
        override = getattr(args, "override", None)
        if override is None:
            yield
            return
        width = args.speculative_num_draft_tokens
        override("spec_fallback.draft_extend_capture", speculative_num_draft_tokens=draft_tokens)
        try:
            yield
        finally:
            override("spec_fallback.draft_extend_capture", speculative_num_draft_tokens=width)

    def _spec_fallback_build_graphs(self, server_args):
        """0.5.12's graph building (its docstring says why only the batch sizes above
        threshold - hysteresis), with the capture sizes where this release's graph runners
        read them: server_args.cuda_graph_config.decode.bs."""
        state = self._spec_fallback
        mr = self._target_worker.model_runner
        if mr.server_args.cuda_graph_config.decode.backend == "disabled":  # Backend.DISABLED
            return "none (decode CUDA graphs are disabled)"
        floor = state.threshold - state.hysteresis
        sizes = [bs for bs in mr.server_args.cuda_graph_config.decode.bs if bs > floor]
        if not sizes:
            return f"none (no CUDA graph batch size is above {floor} requests)"
        phases = {
            id(args.cuda_graph_config.decode): args.cuda_graph_config.decode
            for args in (mr.server_args, self.draft_worker.draft_runner.server_args)
        }
        saved = [(phase, phase.bs) for phase in phases.values()]
        try:
            for phase, _ in saved:
                phase.bs = list(sizes)
            saved_algorithm = mr.spec_algorithm
            try:
                mr.spec_algorithm = SpeculativeAlgorithm.NONE  # captured as a plain decode model
                state.graph_runner = self._spec_fallback_capture(
                    "a decode CUDA graph", lambda: self._spec_fallback_decode_runner(mr)
                )
            finally:
                mr.spec_algorithm = saved_algorithm
            self._spec_fallback_build_draft_extend_graph(server_args)
        finally:
            for phase, value in saved:
                phase.bs = value
        self._spec_fallback_build_kv_only_graphs(server_args)
        return f"batch sizes {sizes}"

    def _spec_fallback_decode_runner(self, mr):
        """The fallback's decode graph runner, returning the EAGLE-3 auxiliary hidden states
        the draft needs (capture FULL; STANDALONE captures NULL). This release's runner reads
        the capture from server_args, so it is turned on for the capture and put back."""
        state = self._spec_fallback
        if self.speculative_algorithm.is_standalone():
            return CudaGraphRunner(mr, attn_backend=state.attn_backend)
        saved = mr.server_args.enable_return_hidden_states
        mr.server_args.enable_return_hidden_states = True
        try:
            return CudaGraphRunner(mr, attn_backend=state.attn_backend)
        finally:
            mr.server_args.enable_return_hidden_states = saved

    def _spec_fallback_draft_extend(self, batch, tokens, hidden_states, next_draft_input):
        """The draft forward of the KV sync: K/V only far above the threshold, a plain draft
        decode from draft_decode_min_bs requests up, else DRAFT_EXTEND_V2 with one token per
        request (graph replay, or eager)."""
        state = self._spec_fallback
        dw = self.draft_worker
        bs = len(batch.seq_lens)
        if state.kv_only_above is not None and bs > state.kv_only_above:
            return self._spec_fallback_draft_kv_only(batch, tokens, hidden_states, next_draft_input)
        self._spec_fallback_kv_only_flush("sync")  # the draft reads its KV below
        if state.draft_decode_min_bs is not None and bs >= state.draft_decode_min_bs:
            return self._spec_fallback_draft_decode(batch, tokens, hidden_states, next_draft_input)
        runner = state.draft_extend_runner
        extend_input = EagleDraftExtendInput(
            hidden_states=hidden_states,
            num_correct_drafts=torch.zeros(bs, dtype=torch.int32, device=self.device),
            num_accept_tokens=torch.ones(bs, dtype=torch.int32, device=self.device),
            num_tokens_per_req=1,
            num_tokens_for_logprob_per_req=1,
        )
        forward_batch = dw.prepare_for_draft_extend(
            extend_input, batch, tokens.to(torch.int64), 1, dw.draft_runner, runner
        )
        if runner is not None and runner.can_run_graph(forward_batch):
            self._spec_fallback_next_draft_input(runner.execute(forward_batch), next_draft_input)
            # A view of the graph's output buffer, which the next replay overwrites.
            next_draft_input.hidden_states = next_draft_input.hidden_states.clone()
            return
        # No graph for this batch size: prepare_for_draft_extend planned the eager forward.
        draft_logits = dw.draft_runner.forward(forward_batch).logits_output
        self._spec_fallback_next_draft_input(draft_logits, next_draft_input)
