"""EAGLEWorkerV2 fallback for SGLang 0.5.16 to 0.5.18: the methods that differ from 0.5.14
(../v0_5_14/worker.py). Every other method is inserted as it is: the shared ones from
../common.py, 0.5.12's (../v0_5_12/worker.py), 0.5.14's graph sizes.

What changed in 0.5.16, and how this code follows it:

* The ScheduleBatch no longer carries the hidden-state capture of its next forward:
  ForwardBatch.init_new and TpModelWorker.forward_batch_generation take it as an argument
  (init_new also takes return_hidden_states_before_norm). The fallback's target step and
  draft decode pass it (FULL: EAGLE-3's draft reads the target's auxiliary hidden states and
  its own, and requests may ask for hidden states; NULL for STANDALONE otherwise), and the
  KV-only prefill, which reads no hidden states, passes NULL.
* The scheduler reads a speculative result's logprobs and hidden states per request with
  the result's stride, as 0.5.12's does: the decode step serves logprob and hidden-state
  batches as 0.5.12's step does (grammar batches stay speculative: their vocab mask and
  FSM advance belong to the spec path's verify).
* The draft extend is prepared by eagle_worker_common.prepare_for_draft_extend.
* The one-token draft-extend graph is built the way upstream builds its own steps-0 tier:
  the draft worker's attention backends and graphs, made under the worker state of steps 0
  and one draft token (0.5.18 no longer passes the server args to DraftBackendFactory).
* ServerArgs is read-only once resolved: the decode graph captures hidden states through
  its runner's own capture mode instead of server_args.enable_return_hidden_states.
* From 0.5.17 the model runner keeps its graph memory per phase (graph_memory_usage), where
  0.5.12's start-up adds the fallback's to decode.
"""

import logging

import torch
from sglang.srt.layers.moe.utils import (
    speculative_moe_a2a_backend_context,
    speculative_moe_backend_context,
)
from sglang.srt.managers.scheduler import GenerationBatchResult
from sglang.srt.model_executor.forward_batch_info import (
    CaptureHiddenMode,
    ForwardBatch,
    ForwardMode,
)
from sglang.srt.model_executor.runner.decode_cuda_graph_runner import (
    DecodeCudaGraphRunner as CudaGraphRunner,
)
from sglang.srt.speculative.eagle_info import EagleDraftExtendInput, EagleDraftInput
from sglang.srt.speculative.eagle_utils import _eagle_prefill_tail_tokens
from sglang.srt.speculative.eagle_worker_common import prepare_for_draft_extend

logger = logging.getLogger(__name__)


class EAGLEWorkerV2:
    def _spec_fallback_eligible(self, batch):
        """Which decode batches fall back (0.5.16 on): all but those with grammars. Logprobs
        and hidden states come from the target's plain decode step, in the layout the
        scheduler reads a speculative result in (_spec_fallback_decode). A grammar batch's
        vocab mask and FSM advance belong to the spec path's verify (its grammar barrier),
        which a fallback step does not take: such batches stay speculative."""
        return not batch.has_grammar

    def _spec_fallback_decode(self, batch, on_publish=None):
        """One plain decode step in the speculative result format: stride 1, accept_lens all
        1, the new lengths published before the target runs and carried by the result. The
        scheduler reads a speculative result's logprobs as a row of accepted tokens per
        request, so they become (bs, 1) (top-k and token-id logprobs are one entry per
        request already); the target's hidden states stay in the result, one row per
        request, when a request asked for them."""
        bs = len(batch.seq_lens)
        hidden = self._spec_fallback_returns_hidden_states(batch)
        new_seq_lens = batch.seq_lens + 1
        if on_publish is not None:  # None: the non-overlap scheduler reads the result
            on_publish(new_seq_lens)
        target_out = self._spec_fallback_target_decode(batch, batch.spec_info.bonus_tokens, new_seq_lens, hidden)
        logits_output = target_out.logits_output
        next_token_ids = target_out.next_token_ids.to(torch.int32)
        next_draft_input = EagleDraftInput(bonus_tokens=next_token_ids)
        self._spec_fallback_sync_draft(batch, next_token_ids, logits_output, next_draft_input, hidden)
        if batch.return_logprob and logits_output.next_token_logprobs is not None:
            logits_output.next_token_logprobs = logits_output.next_token_logprobs.reshape(bs, 1)
        return GenerationBatchResult(
            logits_output=logits_output,
            next_token_ids=next_token_ids,
            can_run_cuda_graph=target_out.can_run_cuda_graph,
            speculative_num_draft_tokens=1,
            next_draft_input=next_draft_input,
            accept_lens=self._spec_fallback_constant("accept_lens", bs, (), torch.int32, 1),
            new_seq_lens=new_seq_lens,
            expert_distribution_metrics=target_out.expert_distribution_metrics,
            routed_experts_output=target_out.routed_experts_output,
            indexer_topk_output=target_out.indexer_topk_output,
        )

    def _spec_fallback_decode_runner(self, mr):
        """0.5.14's decode graph runner. ServerArgs is read-only once resolved from 0.5.16,
        so the capture of hidden states is not turned on in server_args: the runner class
        answers FULL for its own capture mode (STANDALONE keeps the release's runner, which
        captures NULL)."""
        state = self._spec_fallback
        if self.speculative_algorithm.is_standalone():
            return CudaGraphRunner(mr, attn_backend=state.attn_backend)
        runner_class = type(
            "SpecFallbackDecodeRunner",
            (CudaGraphRunner,),
            {
                # Data descriptors: the base runner's own assignments leave them FULL.
                "return_hidden_states_mode": property(lambda runner: CaptureHiddenMode.FULL, lambda runner, value: None),
                "enable_return_hidden_states": property(lambda runner: True, lambda runner, value: None),
            },
        )
        return runner_class(mr, attn_backend=state.attn_backend)

    def _spec_fallback_capture_mode(self, hidden=False):
        """The hidden-state capture of the fallback's plain decode forwards: FULL for EAGLE
        (the draft reads the target's auxiliary hidden states, and its next draft input its
        own hidden states), and for requests that asked for hidden states; else NULL
        (STANDALONE), or for STANDALONE requests asking for hidden states what its decode graph
        captured."""
        if self.speculative_algorithm.is_standalone():
            if not hidden:
                return CaptureHiddenMode.NULL
            # The release's own runner captured the server's mode, which may be LAST: a
            # replay asking more than its graph captured is refused.
            runner = self._spec_fallback.graph_runner
            return getattr(runner, "capture_hidden_mode", CaptureHiddenMode.FULL)
        return CaptureHiddenMode.FULL

    def _spec_fallback_target_decode(self, batch, input_ids, new_seq_lens=None, hidden=False):
        """One plain DECODE step of the target over `input_ids` (one token per request), on
        the fallback's own attention backend and decode graph; the spec path's TARGET_VERIFY
        graph is swapped out for the call, never replayed with wrong shapes (as in
        ../common.py, with the capture passed to the target worker).

        The token's KV goes to req_to_token[req, seq_len], inside the v2 per-request
        over-allocation, exactly where verify would put its first token. Afterwards the batch
        holds its pre-step lengths again and out_cache_loc = those slots, which is what the
        draft extend over the same tokens needs. `hidden`: a request asked for hidden
        states."""
        state = self._spec_fallback
        batch.seq_lens.record_stream(torch.get_device_module(self.device).current_stream())
        out_cache_loc = self.req_to_token_pool.req_to_token[batch.req_pool_indices, batch.seq_lens].to(torch.int64)
        batch.out_cache_loc = out_cache_loc
        pre_step = self._spec_fallback_as_decode(batch, input_ids, new_seq_lens)
        mr = self._target_worker.model_runner
        saved = (mr.attn_backend, mr.decode_cuda_graph_runner)
        mr.attn_backend = state.attn_backend
        mr.decode_cuda_graph_runner = state.graph_runner
        try:
            target_out = self._target_worker.forward_batch_generation(
                batch, capture_hidden_mode=self._spec_fallback_capture_mode(hidden)
            )
        finally:
            mr.attn_backend, mr.decode_cuda_graph_runner = saved
        batch.seq_lens, batch.seq_lens_cpu, batch.seq_lens_sum = pre_step
        batch.out_cache_loc = out_cache_loc
        return target_out

    def _spec_fallback_as_decode(self, batch, input_ids, new_seq_lens=None, hidden=False):
        """Make the batch a plain one-token DECODE batch over `input_ids`: lengths + 1 (the
        host copy too, where the batch has one) and no spec_info; the capture goes to the
        forward as an argument (_spec_fallback_capture_mode). Returns the pre-step
        (seq_lens, seq_lens_cpu, seq_lens_sum) for the caller to put back."""
        pre_step = (batch.seq_lens, batch.seq_lens_cpu, batch.seq_lens_sum)
        bs = len(batch.seq_lens)
        batch.input_ids = input_ids.to(torch.int64)
        batch.seq_lens = pre_step[0] + 1 if new_seq_lens is None else new_seq_lens
        batch.seq_lens_cpu = None if pre_step[1] is None else pre_step[1] + 1
        batch.seq_lens_sum = None if pre_step[2] is None else pre_step[2] + bs
        batch.forward_mode = ForwardMode.DECODE
        batch.spec_info = None
        return pre_step

    def _spec_fallback_draft_decode(self, batch, tokens, hidden_states, next_draft_input):
        """The draft KV sync as one plain DECODE step of the draft model (eager), as in
        0.5.12: the token the target produced, at the same slot and position the draft
        extend would use, with the target's hidden states as the EAGLE-3 input; the
        attention metadata is planned without spec_info, on the plain draft backend."""
        dr = self.draft_worker.draft_runner
        pre_step = self._spec_fallback_as_decode(batch, tokens)
        saved = dr.attn_backend
        dr.attn_backend = self._spec_fallback.draft_attn_backend
        try:
            forward_batch = ForwardBatch.init_new(
                batch,
                dr,
                capture_hidden_mode=self._spec_fallback_capture_mode(),
                return_hidden_states_before_norm=False,
            )
            dr.attn_backend.init_forward_metadata(forward_batch)
            forward_batch.mark_forward_metadata_ready()
            forward_batch.spec_info = EagleDraftInput(hidden_states=hidden_states)
            draft_logits = dr.forward(forward_batch).logits_output
        finally:
            dr.attn_backend = saved
            batch.seq_lens, batch.seq_lens_cpu, batch.seq_lens_sum = pre_step
        self._spec_fallback_next_draft_input(draft_logits, next_draft_input)

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
        forward_batch = prepare_for_draft_extend(
            extend_input,
            batch,
            tokens.to(torch.int64),
            1,
            dw.draft_runner,
            runner,
            return_hidden_states_before_norm=False,
        )
        if runner is not None and runner.can_run_graph(forward_batch):
            self._spec_fallback_next_draft_input(runner.execute(forward_batch), next_draft_input)
            # A view of the graph's output buffer, which the next replay overwrites.
            next_draft_input.hidden_states = next_draft_input.hidden_states.clone()
            return
        # No graph for this batch size: prepare_for_draft_extend planned the eager forward.
        draft_logits = dw.draft_runner.forward(forward_batch).logits_output
        self._spec_fallback_next_draft_input(draft_logits, next_draft_input)

    def _spec_fallback_build_draft_extend_graph(self, server_args):
        """A DRAFT_EXTEND_V2 graph at one token per request, with its own attention backend,
        built as upstream builds its steps-0 tier: the draft worker's backends and graphs
        made under the worker state of steps 0 / one draft token (which puts the spec path's
        back afterwards). Only where the spec path itself graphs its draft extend."""
        dw = self.draft_worker
        if getattr(dw, "cuda_graph_runner_for_draft_extend", None) is None:
            return

        def capture():
            with (
                self._override_worker_state(0, 1),
                self._spec_fallback_draft_extend_width(1),
                dw.draft_tp_context(dw.draft_runner.tp_group),
                speculative_moe_backend_context(),
                speculative_moe_a2a_backend_context(),
            ):
                dw.init_attention_backend()
                dw._capture_cuda_graphs()
                return dw.cuda_graph_runner_for_draft_extend

        runner = self._spec_fallback_capture("a one-token draft-extend CUDA graph", capture)
        if getattr(runner, "captured_req_width", 1) != 1:
            logger.warning(
                "spec-fallback: the draft-extend graph was captured at %d tokens per request, "
                "not 1; the fallback's draft sync runs eagerly",
                runner.captured_req_width,
            )
            runner = None
        self._spec_fallback.draft_extend_runner = runner

    def _spec_fallback_draft_prefill(self, batch, target_hidden_states, next_token_ids, mm_input_embeds=None):
        """The draft's half of a prefill, as in 0.5.13 (../v0_5_13/worker.py): K and V of the
        draft layer only when the decode steps after it will fall back far above the
        threshold, else the release's full draft extend; `ends` goes to the GPU without
        blocking."""
        dw = self.draft_worker
        # Stashed KV-only rows land before any prefill writes the draft KV: a slot a
        # finished request freed may be one of this prefill's.
        self._spec_fallback_kv_only_flush("prefill")
        if not self._spec_fallback_kv_only_prefill_applies(batch, mm_input_embeds):
            return dw._draft_extend_for_prefill(batch, target_hidden_states, next_token_ids, mm_input_embeds)
        ids = batch.input_ids
        ends = torch.as_tensor(batch.extend_lens, dtype=torch.int64).cumsum(0) - 1
        shifted = torch.empty_like(ids)
        shifted[:-1] = ids[1:]
        tails = _eagle_prefill_tail_tokens(batch, next_token_ids)
        shifted[ends.to(ids.device, non_blocking=True)] = tails.to(ids.dtype)
        ids.copy_(shifted)
        next_draft_input = EagleDraftInput(
            hidden_states=target_hidden_states,
            bonus_tokens=next_token_ids,
            num_tokens_per_req=1,
            num_tokens_for_logprob_per_req=1,
        )
        batch.spec_info = next_draft_input
        forward_batch = ForwardBatch.init_new(
            batch,
            dw.draft_runner,
            capture_hidden_mode=CaptureHiddenMode.NULL,
            return_hidden_states_before_norm=False,
        )
        self._spec_fallback_kv_only_write(
            forward_batch.input_ids,
            target_hidden_states,
            forward_batch.positions,
            forward_batch.out_cache_loc,
        )
        self._spec_fallback_zero_draft_input(next_draft_input, len(batch.seq_lens))
        self._spec_fallback.count("draft_kv_only_prefills")
        return next_draft_input
