"""The era-independent half of the fallback: decision, counters, observability.

Inserted into EAGLEWorkerV2 of every supported SGLang release. Everything here depends only
on the batch (size, grammar, logprob and hidden-state flags), which every tensor-parallel
rank receives identically, so all ranks take the same branch; the hysteresis state is
updated from the same inputs on every rank. The era-specific half (how one plain decode step
is returned, graph capture) is in v0_5_12/worker.py and seed/worker.py; the target step and
the draft KV sync below are the same in both eras.
"""

import collections
import json
import logging
import os
import time

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


class EAGLEWorkerV2:
    def _spec_fallback_init(self, server_args):
        """spectool spec-fallback: read the threshold, prepare counters and the decode graph."""
        self._fallback_threshold = getattr(
            server_args, "speculative_disable_batch_size_threshold", None
        )
        self._fallback_hysteresis = (
            getattr(server_args, "speculative_disable_batch_size_hysteresis", 0) or 0
        )
        self._fallback_active = False
        self._fallback_stats = {
            "fallback_steps": 0,
            "spec_steps": 0,
            "switches_to_fallback": 0,
            "switches_to_spec": 0,
            "fallback_requests": 0,
            "last_batch_size": 0,
            # One entry per run of steps in one mode; acceptance is measured per phase, so a
            # stale draft cache after a switch shows up as a drop in the next spec phase.
            "phases": [],
            "phase_count": 0,
        }
        # Phase ids of steps whose results the scheduler has not reported yet (bounded: a
        # release without the on_verify_complete_cpu hook never pops).
        self._fallback_modes = collections.deque(maxlen=4096)
        # One writer per engine: rank 0. StandaloneWorkerV2 (0.5.12) sets no tp_rank of its
        # own, so the rank comes from the target worker, which every release gives one; at
        # TP=2 both ranks once wrote the same file and one crashed on the other's rename.
        rank = getattr(self, "tp_rank", None)
        if rank is None:
            rank = getattr(getattr(self, "_target_worker", None), "tp_rank", 0)
        self._fallback_stats_path = (
            os.environ.get("SPECTOOL_FALLBACK_STATS") if rank == 0 else None
        )
        self._fallback_publish_interval = float(
            os.environ.get("SPECTOOL_FALLBACK_STATS_INTERVAL", "0.5")
        )
        self._fallback_last_publish = 0.0
        self._fallback_attn_backend = None
        self._fallback_graph_runner = None
        self._fallback_draft_extend_runner = None
        # Read by the prefill hook of every engine, flag set or not (the era's KV-only init sets
        # it when there is a threshold): an engine without the flag crashed on its first
        # prefill when only that init set it (the bench's A1, session 9).
        self._fallback_kv_only_above = None
        if self._fallback_threshold is None:
            return
        self._spec_fallback_build_decode_graph(server_args)
        logger.info(
            "spec-fallback: drafting is switched off above %d requests per decode batch "
            "(back on at <= %d); decode CUDA graph: %s",
            self._fallback_threshold,
            self._fallback_threshold - self._fallback_hysteresis,
            "yes" if self._fallback_graph_runner is not None else "no (eager)",
        )

    def _spec_fallback_plain_attn_backend(self, runner):
        """A second attention backend of the runner's kind with its own workspace, for plain
        one-token DECODE steps (the runner's own backend is planned for speculative shapes)."""
        backup_init = runner.init_new_workspace
        try:
            return runner._get_attention_backend(init_new_workspace=True)
        finally:
            runner.init_new_workspace = backup_init

    def _spec_fallback_capture(self, what, otherwise, build):
        """build() (a CUDA graph capture), or None with a warning saying what runs instead:
        a failed capture must not stop the server, the eager step is slower but correct."""
        try:
            return build()
        except Exception as exc:
            logger.warning("spec-fallback: could not capture %s (%s); %s", what, exc, otherwise)
            return None

    def _spec_fallback_eligible(self, batch):
        """The stated rule, for decode steps and prefills alike: batches with grammars, that
        return logprobs or hidden states stay on the speculative path."""
        return not (
            batch.has_grammar
            or batch.return_logprob
            or getattr(batch, "return_hidden_states", False)
        )

    def _spec_fallback_should_run(self, batch):
        """Decide per decode step; identical on every TP rank (depends on the batch only)."""
        threshold = self._fallback_threshold
        if (
            threshold is None
            or batch.forward_mode.is_idle()
            or batch.spec_info is None
        ):
            return False
        bs = len(batch.seq_lens)
        if self._fallback_active:
            active = bs > threshold - self._fallback_hysteresis
        else:
            active = bs > threshold
        take = active and self._spec_fallback_eligible(batch)
        stats = self._fallback_stats
        mode = "fallback" if take else "spec"
        phases = stats["phases"]
        if not phases or phases[-1]["mode"] != mode:
            stats["phase_count"] += 1
            phases.append({"id": stats["phase_count"], "mode": mode,
                           "steps": 0, "reqs": 0, "correct_drafts": 0})
            del phases[:-200]
        phases[-1]["steps"] += 1
        self._fallback_modes.append(phases[-1]["id"])
        stats["last_batch_size"] = bs
        if active != self._fallback_active:
            self._fallback_active = active
            key = "switches_to_fallback" if active else "switches_to_spec"
            stats[key] += 1
            logger.info(
                "spec-fallback: decode batch of %d requests, drafting %s "
                "(fallback steps %d, speculative steps %d so far)",
                bs,
                "OFF" if active else "ON",
                stats["fallback_steps"],
                stats["spec_steps"],
            )
        if take:
            stats["fallback_steps"] += 1
            stats["fallback_requests"] += bs
        else:
            stats["spec_steps"] += 1
        if self._fallback_stats_path:
            self._spec_fallback_publish_stats()
        return take

    def _spec_fallback_on_verify(self, num_correct_drafts_per_req):
        """Result-side counters: the scheduler reports accept counts in step order, so the
        oldest pending step's phase is the one this result belongs to."""
        if not getattr(self, "_fallback_modes", None):
            return
        phase_id = self._fallback_modes.popleft()
        for phase in reversed(self._fallback_stats["phases"]):
            if phase["id"] == phase_id:
                phase["reqs"] += len(num_correct_drafts_per_req)
                phase["correct_drafts"] += sum(num_correct_drafts_per_req)
                break

    def _spec_fallback_publish_stats(self):
        """Counters for tests and dashboards: a JSON file named by SPECTOOL_FALLBACK_STATS,
        rewritten at most every SPECTOOL_FALLBACK_STATS_INTERVAL seconds (default 0.5)."""
        now = time.monotonic()
        if now - self._fallback_last_publish < self._fallback_publish_interval:
            return
        self._fallback_last_publish = now
        path = self._fallback_stats_path
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self._fallback_stats, f)
        os.replace(tmp, path)

    def _spec_fallback_target_decode(self, batch, input_ids, new_seq_lens=None):
        """One plain DECODE step of the target over `input_ids` (one token per request), on
        the fallback's own attention backend and decode graph; the spec path's TARGET_VERIFY
        graph is swapped out for the call, never replayed with wrong shapes.

        The token's KV goes to req_to_token[req, seq_len], inside the v2 per-request
        over-allocation, exactly where verify would put its first token. Afterwards the batch
        holds its pre-step lengths again and out_cache_loc = those slots, which is what the
        draft extend over the same tokens needs. `new_seq_lens`: the lengths + 1 if the
        caller has them already (one kernel fewer)."""
        batch.seq_lens.record_stream(
            torch.get_device_module(self.device).current_stream()
        )
        out_cache_loc = self.req_to_token_pool.req_to_token[
            batch.req_pool_indices, batch.seq_lens
        ].to(torch.int64)
        batch.out_cache_loc = out_cache_loc
        pre_step = self._spec_fallback_as_decode(batch, input_ids, new_seq_lens)
        mr = self._target_worker.model_runner
        saved = (mr.attn_backend, mr.graph_runner)
        mr.attn_backend = self._fallback_attn_backend
        mr.graph_runner = self._fallback_graph_runner
        try:
            target_out = self._target_worker.forward_batch_generation(batch)
        finally:
            mr.attn_backend, mr.graph_runner = saved
        batch.seq_lens, batch.seq_lens_cpu, batch.seq_lens_sum = pre_step
        batch.out_cache_loc = out_cache_loc
        return target_out

    def _spec_fallback_as_decode(self, batch, input_ids, new_seq_lens=None):
        """Make the batch a plain one-token DECODE batch over `input_ids`: lengths + 1, no
        spec_info, and the hidden-state capture EAGLE-3's draft needs (none for STANDALONE).
        Returns the pre-step (seq_lens, seq_lens_cpu, seq_lens_sum) for the caller to put
        back; out_cache_loc is the caller's. `new_seq_lens` (the lengths + 1, already made by
        the caller for the next draft input) becomes the batch's lengths for the step: nothing
        writes a batch's lengths in place in overlap mode."""
        pre_step = (batch.seq_lens, batch.seq_lens_cpu, batch.seq_lens_sum)
        bs = len(batch.seq_lens)
        batch.input_ids = input_ids.to(torch.int64)
        batch.seq_lens = pre_step[0] + 1 if new_seq_lens is None else new_seq_lens
        batch.seq_lens_cpu = pre_step[1] + 1
        batch.seq_lens_sum = pre_step[2] + bs
        batch.forward_mode = ForwardMode.DECODE
        batch.spec_info = None
        batch.capture_hidden_mode = (
            CaptureHiddenMode.NULL
            if self.speculative_algorithm.is_standalone()
            else CaptureHiddenMode.FULL
        )
        return pre_step

    def _spec_fallback_sync_draft(self, batch, tokens, logits_output, next_draft_input):
        """Draft KV sync: a one-token draft extend over the tokens the target produced, with
        its hidden states, filling next_draft_input's topk_p / topk_index / hidden_states."""
        with (
            self.draft_worker.draft_tp_context(self.draft_worker.draft_runner.tp_group),
            speculative_moe_backend_context(),
            speculative_moe_a2a_backend_context(),
        ):
            self._spec_fallback_draft_extend(
                batch, tokens, logits_output.hidden_states, next_draft_input
            )
        logits_output.hidden_states = None  # saves a (bs, 3H) device-to-host copy
