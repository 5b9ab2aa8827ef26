"""EAGLEWorkerV2 fallback for the seed era, SGLang 0.5.6.post2 to 0.5.10 (spec v2 behind
SGLANG_ENABLE_SPEC_V2=1): start-up and the decode step (the state, the decision and the
shared steps are in ../common.py).

What differs from 0.5.12, and how this code handles it:

* The scheduler reads the result stride from the *worker*
  (``draft_worker.speculative_num_draft_tokens``), so ``next_token_ids`` is padded to
  ``bs * num_draft_tokens`` with the real token at ``i * num_draft_tokens``; ``accept_lens``
  is all 1, so the consumer takes exactly that token and ``kv_committed_len += 1``.
* The bonus token field is ``verified_id``.
* ``CudaGraphRunner(model_runner)`` takes its attention backend from the model runner, so
  the second backend is installed on the runner while the decode graph is captured.
* Field names drift inside the era (``num_tokens_per_batch`` until 0.5.8,
  ``num_tokens_per_req`` from 0.5.9; ``ModelRunner.forward`` returns a tuple in 0.5.6.post2):
  they are read from the running SGLang, not hard-coded per release.
"""

import dataclasses
import logging
import time

import torch
from sglang.srt.managers.scheduler import GenerationBatchResult
from sglang.srt.model_executor.cuda_graph_runner import CudaGraphRunner
from sglang.srt.server_args import ServerArgs
from sglang.srt.speculative.eagle_info import EagleDraftInput
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
from sglang.srt.utils.common import fast_topk

logger = logging.getLogger(__name__)


class EAGLEWorkerV2:
    def _spec_fallback_build(self, server_args):
        """Start-up: a second target attention backend plus a DECODE graph runner (one
        token per request). This era's draft KV sync is always the one-token draft extend,
        so the flags that choose another sync have no effect here: said once, if set."""
        for name in (
            "speculative_disable_draft_decode_min_bs",
            "speculative_disable_kv_only_margin",
            "speculative_disable_kv_only_steps_per_replay",
        ):
            if getattr(server_args, name) != getattr(ServerArgs, name):
                logger.warning(
                    "spec-fallback: --%s has no effect on this SGLang: its draft KV sync is "
                    "always a one-token draft extend",
                    name.replace("_", "-"),
                )
        state = self._spec_fallback
        mr = self._target_worker.model_runner
        state.attn_backend = self._spec_fallback_plain_attn_backend(mr)
        if server_args.disable_cuda_graph:
            return
        tic = time.perf_counter()
        saved = (
            mr.spec_algorithm,
            mr.server_args.enable_return_hidden_states,
            mr.attn_backend,
        )
        try:
            # The runner captures with the model runner's backend and capture mode: present
            # it as a plain decode model with our backend, returning the EAGLE-3 hidden
            # states (STANDALONE requests none; the modes must match or it recaptures).
            mr.spec_algorithm = SpeculativeAlgorithm.NONE
            if not self.speculative_algorithm.is_standalone():
                mr.server_args.enable_return_hidden_states = True
            mr.attn_backend = state.attn_backend
            state.graph_runner = self._spec_fallback_capture(
                "a decode CUDA graph", lambda: CudaGraphRunner(mr)
            )
        finally:
            (
                mr.spec_algorithm,
                mr.server_args.enable_return_hidden_states,
                mr.attn_backend,
            ) = saved
        logger.info(
            "spec-fallback: decode CUDA graph captured in %.1f s",
            time.perf_counter() - tic,
        )

    def _spec_fallback_eligible(self, batch):
        """Which decode batches fall back in this era: those without grammars, logprobs or
        hidden states. The others stay on the speculative path: this era's consumers of
        those outputs (in the padded layout above) were never run against a fallback step,
        since these releases do not run on the project's GPU image."""
        return not (
            batch.has_grammar
            or batch.return_logprob
            or self._spec_fallback_returns_hidden_states(batch)
        )

    def _spec_fallback_decode(self, batch):
        """One plain decode step in the padded speculative result format."""
        device = self.device
        bs = len(batch.seq_lens)
        ndt = self.speculative_num_draft_tokens
        new_seq_lens = batch.seq_lens + 1
        target_out = self._spec_fallback_target_decode(batch, batch.spec_info.verified_id)
        # The lengths first, then the event announcing them (as upstream's verify does).
        verify_done = torch.get_device_module(device).Event()
        verify_done.record()
        logits_output = target_out.logits_output
        tokens = target_out.next_token_ids.to(torch.int32)
        next_draft_input = EagleDraftInput(
            verified_id=tokens, new_seq_lens=new_seq_lens, verify_done=verify_done
        )
        self._spec_fallback_sync_draft(batch, tokens, logits_output, next_draft_input)
        # The consumer slices next_token_ids[i * ndt : i * ndt + accept_lens[i]].
        return GenerationBatchResult(
            logits_output=logits_output,
            next_token_ids=tokens.repeat_interleave(ndt),
            can_run_cuda_graph=target_out.can_run_cuda_graph,
            next_draft_input=next_draft_input,
            accept_lens=torch.ones(bs, dtype=torch.int32, device=device),
        )

    def _spec_fallback_draft_extend(self, batch, tokens, hidden_states, next_draft_input):
        """DRAFT_EXTEND_V2 with one token per request (eager)."""
        dw = self.draft_worker
        bs = len(batch.seq_lens)
        names = {f.name for f in dataclasses.fields(EagleDraftInput)}
        per = "num_tokens_per_req" if "num_tokens_per_req" in names else "num_tokens_per_batch"
        draft_input = EagleDraftInput(
            hidden_states=hidden_states,
            **{per: 1, per.replace("num_tokens_", "num_tokens_for_logprob_"): 1},
        )
        forward_batch = draft_input.prepare_for_extend_to_fill_draft_kvcache(
            batch, tokens, 1, dw.draft_runner, None
        )
        forward_batch.spec_info.accept_length = torch.ones(
            bs, dtype=torch.int32, device=self.device
        )
        out = dw.draft_runner.forward(forward_batch, skip_attn_backend_init=True)
        draft_logits = out.logits_output if hasattr(out, "logits_output") else out[0]
        probs = torch.softmax(draft_logits.next_token_logits, dim=-1)
        next_draft_input.topk_p, next_draft_input.topk_index = fast_topk(
            probs, self.topk, dim=-1
        )
        next_draft_input.hidden_states = draft_logits.hidden_states

    def _spec_fallback_kv_only_flush(self, cause):
        """Nothing to write: this era has no KV-only draft sync, so no rows are ever queued
        (the decode hook, shared by every era, calls it before a speculative step)."""
