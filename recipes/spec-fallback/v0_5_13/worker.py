"""EAGLEWorkerV2 fallback for SGLang 0.5.13 and 0.5.13.post1: the methods that differ from
0.5.12. Every other method is 0.5.12's (../v0_5_12/worker.py), inserted as it is; the state,
the decision and the shared steps are in ../common.py.

What changed in 0.5.13, and how this code follows it:

* The worker takes the ScheduleBatch itself and the step's new lengths go to the scheduler
  through ``on_publish`` (its FutureMap) and the result's ``new_seq_lens``; the event that
  announced them (verify_done) is gone. A fallback step adds exactly one token to every
  request, so it publishes them before the target runs, and the scheduler prepares the next
  step while this one runs, as plain decoding's overlap does.
* The draft-extend CUDA graph returns the draft's logits and hidden states (views of its
  output buffers); the worker takes the top-k itself.
* The draft prefill ends each request's shifted ids with the next prompt token where the
  prefill chunk is not the prompt's last (``_eagle_prefill_tail_tokens``), not with the
  token the target sampled; the KV-only prefill does the same.
"""

import torch
from sglang.srt.managers.scheduler import GenerationBatchResult
from sglang.srt.model_executor.forward_batch_info import ForwardBatch
from sglang.srt.speculative.eagle_info import EagleDraftInput
from sglang.srt.speculative.eagle_utils import _eagle_prefill_tail_tokens


def decode_hook(self, batch, on_publish):
    if self._spec_fallback_should_run(batch):
        return self._spec_fallback_decode(batch, on_publish)
    self._spec_fallback_kv_only_flush("spec")  # a speculative step reads the draft KV


class EAGLEWorkerV2:
    def _spec_fallback_decode(self, batch, on_publish=None):
        """One plain decode step in the speculative result format: stride 1, accept_lens all
        1, the new lengths published and carried by the result."""
        bs = len(batch.seq_lens)
        new_seq_lens = batch.seq_lens + 1
        if on_publish is not None:  # None: the non-overlap scheduler reads the result
            on_publish(new_seq_lens)
        target_out = self._spec_fallback_target_decode(
            batch, batch.spec_info.bonus_tokens, new_seq_lens
        )
        logits_output = target_out.logits_output
        next_token_ids = target_out.next_token_ids.to(torch.int32)
        next_draft_input = EagleDraftInput(bonus_tokens=next_token_ids)
        self._spec_fallback_sync_draft(batch, next_token_ids, logits_output, next_draft_input)
        return GenerationBatchResult(
            logits_output=logits_output,
            next_token_ids=next_token_ids,
            can_run_cuda_graph=target_out.can_run_cuda_graph,
            speculative_num_draft_tokens=1,
            next_draft_input=next_draft_input,
            accept_lens=self._spec_fallback_constant("accept_lens", bs, (), torch.int32, 1),
            new_seq_lens=new_seq_lens,
            routed_experts_output=target_out.routed_experts_output,
            indexer_topk_output=target_out.indexer_topk_output,
        )

    def _spec_fallback_draft_extend(self, batch, tokens, hidden_states, next_draft_input):
        """The draft forward of the KV sync: K/V only far above the threshold, a plain draft
        decode from draft_decode_min_bs requests up, else DRAFT_EXTEND_V2 with one token per
        request (graph replay, or eager)."""
        state = self._spec_fallback
        dw = self.draft_worker
        bs = len(batch.seq_lens)
        if state.kv_only_above is not None and bs > state.kv_only_above:
            return self._spec_fallback_draft_kv_only(
                batch, tokens, hidden_states, next_draft_input
            )
        self._spec_fallback_kv_only_flush("sync")  # the draft reads its KV below
        if state.draft_decode_min_bs is not None and bs >= state.draft_decode_min_bs:
            return self._spec_fallback_draft_decode(
                batch, tokens, hidden_states, next_draft_input
            )
        runner = state.draft_extend_runner
        draft_input = EagleDraftInput(
            hidden_states=hidden_states,
            num_tokens_per_req=1,
            num_tokens_for_logprob_per_req=1,
        )
        forward_batch = draft_input.prepare_for_extend_to_fill_draft_kvcache(
            batch, tokens, 1, dw.draft_runner, runner
        )
        forward_batch.spec_info.num_correct_drafts = torch.zeros(
            bs, dtype=torch.int32, device=self.device
        )
        forward_batch.spec_info.num_accept_tokens = torch.ones(
            bs, dtype=torch.int32, device=self.device
        )
        if runner is not None and runner.can_run(forward_batch):
            self._spec_fallback_next_draft_input(runner.replay(forward_batch), next_draft_input)
            # A view of the graph's output buffer, which the next replay overwrites.
            next_draft_input.hidden_states = next_draft_input.hidden_states.clone()
            return
        # No graph for this batch size: prepare_for_extend_... planned the eager forward.
        draft_logits = dw.draft_runner.forward(forward_batch).logits_output
        self._spec_fallback_next_draft_input(draft_logits, next_draft_input)

    def _spec_fallback_draft_prefill(
        self, batch, target_hidden_states, next_token_ids, mm_input_embeds=None
    ):
        """The draft's half of a prefill (in place of the release's
        _draft_extend_for_prefill): K and V of the draft layer only when the decode steps
        after it will fall back far above the threshold
        (_spec_fallback_kv_only_prefill_applies), else the release's full draft extend. The
        inputs are the release's: each request's ids shifted left by one and ended by its
        tail token (_eagle_prefill_tail_tokens), at the prompt's positions and slots; the
        next draft input is zeros, as after a KV-only decode sync. `ends` goes to the GPU
        without blocking: a blocking copy's stream sync would hold the overlap scheduler
        behind each prefill."""
        dw = self.draft_worker
        # Stashed KV-only rows land before any prefill writes the draft KV: a slot a
        # finished request freed may be one of this prefill's.
        self._spec_fallback_kv_only_flush("prefill")
        if not self._spec_fallback_kv_only_prefill_applies(batch, mm_input_embeds):
            return dw._draft_extend_for_prefill(
                batch, target_hidden_states, next_token_ids, mm_input_embeds
            )
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
        forward_batch = ForwardBatch.init_new(batch, dw.draft_runner)
        self._spec_fallback_kv_only_write(
            forward_batch.input_ids,
            target_hidden_states,
            forward_batch.positions,
            forward_batch.out_cache_loc,
        )
        self._spec_fallback_zero_draft_input(next_draft_input, len(batch.seq_lens))
        self._spec_fallback.count("draft_kv_only_prefills")
        return next_draft_input
