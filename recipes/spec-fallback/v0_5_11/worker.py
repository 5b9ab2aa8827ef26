"""EAGLEWorkerV2 fallback for SGLang 0.5.11: the seed era's decode step
(../seed/worker.py) with 0.5.12's start-up and draft decode sync (../v0_5_12/worker.py), both
inserted as they are; the methods here are what neither fits.

0.5.11 sits between the two eras:

* Like the seed era, the scheduler reads the result stride from the worker
  (``draft_worker.speculative_num_draft_tokens``) and the bonus token is ``verified_id``:
  the seed's padded result (the token at ``i * num_draft_tokens``, accept_lens all 1) is
  what it reads. Its prepare_for_decode pre-claims the bonus KV slot and the consumer adds
  ``accept_lens - 1``: the one token of a fallback step lands in the claimed slot.
* Like 0.5.12, ``CudaGraphRunner`` takes its own attention backend, so 0.5.12's start-up
  (decode graph, plain draft backend) and its draft decode sync run unchanged.
* The draft extend's accept counters are ``num_accepted_drafts`` / ``num_accepted_tokens``
  (0.5.12: ``num_correct_drafts`` / ``num_accept_tokens``), and the worker has no
  ``_override_worker_state`` to capture a one-token draft-extend graph under: the one-token
  draft extend (below --speculative-disable-draft-decode-min-bs requests) runs eagerly.
* The EAGLE-3 head keeps its one layer as ``midlayer``, not in the ``layers`` list that the
  KV-only sync reads: there is no KV-only sync on 0.5.11 (nor its queue and KV-only
  prefill: the release's draft prefill runs as it is, and the seed's no-op flush stands in
  for the queue's), and the draft decode (--speculative-disable-draft-decode-min-bs) syncs
  the draft at large batches.
"""

import torch
from sglang.srt.speculative.eagle_info import EagleDraftInput


class EAGLEWorkerV2:
    def _spec_fallback_kv_only_unsupported(self):
        """Why the KV-only sync cannot run here (see the module docstring)."""
        return "this release's EAGLE-3 head keeps its layer as midlayer, which it does not read"

    def _spec_fallback_build_draft_extend_graph(self, server_args):
        """No one-token draft-extend graph on 0.5.11 (see the module docstring): the draft
        sync below the draft-decode batch size runs eagerly."""

    def _spec_fallback_build_kv_only_graphs(self, server_args):
        """No KV-only sync on 0.5.11, so no graphs of it (see the module docstring)."""

    def _spec_fallback_draft_extend(self, batch, tokens, hidden_states, next_draft_input):
        """The draft forward of the KV sync: a plain draft decode from draft_decode_min_bs
        requests up, else an eager DRAFT_EXTEND_V2 with one token per request."""
        state = self._spec_fallback
        dw = self.draft_worker
        bs = len(batch.seq_lens)
        if state.draft_decode_min_bs is not None and bs >= state.draft_decode_min_bs:
            return self._spec_fallback_draft_decode(
                batch, tokens, hidden_states, next_draft_input
            )
        draft_input = EagleDraftInput(
            hidden_states=hidden_states,
            num_tokens_per_req=1,
            num_tokens_for_logprob_per_req=1,
        )
        forward_batch = draft_input.prepare_for_extend_to_fill_draft_kvcache(
            batch, tokens, 1, dw.draft_runner, None
        )
        forward_batch.spec_info.num_accepted_drafts = torch.zeros(
            bs, dtype=torch.int32, device=self.device
        )
        forward_batch.spec_info.num_accepted_tokens = torch.ones(
            bs, dtype=torch.int32, device=self.device
        )
        draft_logits = dw.draft_runner.forward(
            forward_batch, skip_attn_backend_init=True
        ).logits_output
        self._spec_fallback_next_draft_input(draft_logits, next_draft_input)
