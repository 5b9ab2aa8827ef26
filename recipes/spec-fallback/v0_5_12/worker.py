"""EAGLEWorkerV2 fallback for SGLang 0.5.12: start-up and the decode step (the state, the
decision and the shared steps are in ../common.py).

* Target: one token per request in DECODE mode, through a *second* attention backend and a
  DECODE CUDA graph built once at start-up. In spec mode the target's only graph runner is
  captured for TARGET_VERIFY with num_draft_tokens tokens per request; replaying it with a
  one-token batch would be wrong, so it is swapped out for the call, never reused.
* Draft: one draft forward over the token the target produced, with the target's EAGLE-3
  hidden states, writes the draft KV at the same slot the spec path would have used and
  yields the next topk_p / topk_index / hidden_states, so drafting can resume on the next
  step without a cold or stale draft cache. From --speculative-disable-draft-decode-min-bs
  requests up it is a plain DECODE forward of the draft (a decode attention kernel); below, a
  one-token DRAFT_EXTEND_V2 replaying its own CUDA graph (captured once at one token per
  request, like upstream's steps-0 tier from 0.5.15) wherever the spec path graphs its draft
  extend. More than --speculative-disable-kv-only-margin requests above the threshold it
  writes only the draft layer's K and V.
* Result: next_token_ids (bs,), speculative_num_draft_tokens=1 (the 0.5.12 consumer reads
  its stride from the result), accept_lens all 1, an EagleDraftInput with bonus_tokens,
  new_seq_lens and verify_done: exactly what the scheduler and FutureMap read.
* Grammar, logprob and hidden-state requests fall back like the others: the plain decode
  step serves them as SGLang's decode does (see _spec_fallback_eligible). Idle batches stay
  on the speculative path.
* Start-up captures graphs only for the batch sizes a fallback step can have (above
  threshold - hysteresis), measures the GPU memory the fallback takes and logs it; a capture
  that fails stops the server with the reason.
"""

import logging
import time

import torch
from sglang.srt.distributed.parallel_state import graph_capture
from sglang.srt.model_executor.cuda_graph_runner import CudaGraphRunner
from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
from sglang.srt.speculative.draft_utils import DraftBackendFactory
from sglang.srt.speculative.eagle_draft_extend_cuda_graph_runner import (
    EAGLEDraftExtendCudaGraphRunner,
)
from sglang.srt.speculative.eagle_info import EagleDraftInput
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
from sglang.srt.utils.common import fast_topk, get_available_gpu_memory

logger = logging.getLogger(__name__)


def draft_prefill_call(SELF, BATCH, HIDDEN, TOKENS, MM):
    # forward_batch_generation's prefill branch: the draft's half goes through the fallback.
    return SELF._spec_fallback_draft_prefill(BATCH, HIDDEN, TOKENS, MM)


class EAGLEWorkerV2:
    def _spec_fallback_build(self, server_args):
        """Start-up: the draft sync's settings, a second target attention backend, and the
        CUDA graphs of the fallback step (_spec_fallback_build_graphs). The GPU memory all of
        it takes is measured as SGLang measures its own graphs' (free memory before and
        after), logged, added to the model runner's graph memory usage that SGLang's
        memory report shows, and written to the counters (startup_memory_gib)."""
        state = self._spec_fallback
        mr = self._target_worker.model_runner
        before = get_available_gpu_memory(self.device, self.gpu_id)
        tic = time.perf_counter()
        state.attn_backend = self._spec_fallback_plain_attn_backend(mr)
        self._spec_fallback_init_draft_decode(server_args)
        self._spec_fallback_init_draft_kv_only(server_args)
        graphs = "none (--disable-cuda-graph)"
        if not server_args.disable_cuda_graph:
            graphs = self._spec_fallback_build_graphs(server_args)
        used = before - get_available_gpu_memory(self.device, self.gpu_id)
        if hasattr(mr, "graph_mem_usage"):
            mr.graph_mem_usage += used
        else:  # 0.5.17 on: GiB per graph phase; the fallback's graphs are decode graphs
            usage = dict(mr.graph_memory_usage)
            usage["decode"] = usage.get("decode", 0.0) + used
            mr.graph_memory_usage = usage
        state.stats["startup_memory_gib"] = round(used, 3)
        logger.info(
            "spec-fallback: start-up took %.2f GiB of GPU memory and %.1f s (a decode attention "
            "backend; CUDA graphs: %s)",
            used,
            time.perf_counter() - tic,
            graphs,
        )

    def _spec_fallback_build_graphs(self, server_args):
        """The fallback's CUDA graphs: a DECODE graph of the target at one token per request,
        the draft's one-token extend, the KV-only sync. Only for the batch sizes a fallback
        step can have: above threshold - hysteresis (a batch takes the smallest captured
        size that holds it, so every such batch still finds one). The release's graph
        runners read their sizes from server_args.cuda_graph_bs, which holds these sizes
        while they capture. Returns what was captured, for the start-up log."""
        state = self._spec_fallback
        mr = self._target_worker.model_runner
        floor = state.threshold - state.hysteresis
        sizes = [bs for bs in mr.server_args.cuda_graph_bs if bs > floor]
        if not sizes:
            return f"none (no CUDA graph batch size is above {floor} requests)"
        holders = {id(a): a for a in (mr.server_args, self.draft_worker.draft_runner.server_args)}
        saved = [(args, args.cuda_graph_bs) for args in holders.values()]
        try:
            for args, _ in saved:
                args.cuda_graph_bs = list(sizes)
            saved_mode = (mr.spec_algorithm, mr.server_args.enable_return_hidden_states)
            try:
                # Capture as a plain decode model whose graphs also return the EAGLE-3
                # auxiliary hidden states (capture_hidden_mode FULL), which the draft
                # needs. The capture mode must equal what fallback steps request, or the
                # runner cannot replay them (STANDALONE requests NULL; FULL only for
                # requests that want hidden states, which --enable-return-hidden-states
                # then makes it capture).
                mr.spec_algorithm = SpeculativeAlgorithm.NONE
                if not self.speculative_algorithm.is_standalone():
                    mr.server_args.enable_return_hidden_states = True
                state.graph_runner = self._spec_fallback_capture(
                    "a decode CUDA graph",
                    lambda: CudaGraphRunner(mr, attn_backend=state.attn_backend),
                )
            finally:
                mr.spec_algorithm, mr.server_args.enable_return_hidden_states = saved_mode
            self._spec_fallback_build_draft_extend_graph(server_args)
        finally:
            for args, value in saved:
                args.cuda_graph_bs = value
        self._spec_fallback_build_kv_only_graphs(server_args)
        return f"batch sizes {sizes}"

    def _spec_fallback_init_draft_decode(self, server_args):
        """From --speculative-disable-draft-decode-min-bs requests up ('off': never), the
        draft KV sync is a DECODE forward on a plain draft attention backend instead of the
        one-token DRAFT_EXTEND_V2: a decode kernel reads each request's KV once, where an
        extend kernel works on tiles of query rows of which one-token queries use one. The
        decode forward is eager, so at smaller batches the extend's CUDA graph is kept."""
        min_bs = server_args.speculative_disable_draft_decode_min_bs
        if min_bs is None:
            return
        state = self._spec_fallback
        state.draft_attn_backend = self._spec_fallback_plain_attn_backend(
            self.draft_worker.draft_runner
        )
        state.draft_decode_min_bs = min_bs

    def _spec_fallback_init_draft_kv_only(self, server_args):
        """While the batch is more than --speculative-disable-kv-only-margin requests above
        the threshold ('off': never), the draft KV sync computes only what the draft's KV
        cache holds, the K and V of its one layer, not the draft's output.

        The output (top-k and hidden state for the next draft) matters only if the next step
        speculates, which it can only do from within the margin of the threshold, where the
        full forward runs. If the batch falls further in one step, that speculative step
        drafts from zeros: its drafts are rejected, the tokens stay the target's, and the
        spec path's own draft extend reseeds the next draft. At margin 0 the full sync runs
        only inside the hysteresis band (the fallback on, the batch at most the threshold),
        so --speculative-disable-batch-size-hysteresis is what buys real drafts on the way
        back under it. EAGLE-3 heads of one layer only."""
        margin = server_args.speculative_disable_kv_only_margin
        if margin is None:
            return
        why = self._spec_fallback_kv_only_unsupported()
        if why:
            logger.info("spec-fallback: no KV-only draft sync (%s); the draft runs in full", why)
            return
        state = self._spec_fallback
        state.kv_only_above = state.threshold + margin
        state.kv_only_steps_per_replay = (
            server_args.speculative_disable_kv_only_steps_per_replay
        )

    def _spec_fallback_kv_only_unsupported(self):
        """Why the KV-only sync cannot run on this draft, or None: it needs an EAGLE-3 head of
        one input layer (whose K/V depend only on the token and the target's hidden states),
        rotary positions and a K/V (not MLA) cache."""
        if not self.speculative_algorithm.is_eagle3():
            return "not EAGLE-3"
        dr = self.draft_worker.draft_runner
        model = getattr(dr.model, "model", None)
        layers = getattr(model, "layers", None)
        if layers is None or len(layers) != 1:
            return "the draft model has not exactly one layer"
        layer = layers[0]
        attn = getattr(layer, "self_attn", None)
        if not getattr(layer, "is_input_layer", False) or not hasattr(attn, "rotary_emb"):
            return "the draft layer is not an EAGLE-3 input layer with rotary attention"
        if getattr(model, "is_mrope_enabled", False):
            return "M-RoPE positions"
        if getattr(dr, "use_mla_backend", False):
            return "MLA KV cache"
        return None

    def _spec_fallback_build_draft_extend_graph(self, server_args):
        """A DRAFT_EXTEND_V2 graph at one token per request, with its own attention backend.

        The spec path's draft-extend graph is captured for steps + 1 tokens per request and
        cannot replay a one-token batch; this one is built the way upstream's adaptive tiers
        build theirs (worker state overridden to steps 0 / 1 draft token during capture).
        Only where the spec path itself graphs its draft extend (same backend support).
        """
        dw = self.draft_worker
        if getattr(dw, "cuda_graph_runner_for_draft_extend", None) is None:
            return

        def capture():
            with self._override_worker_state(0, 1):
                backend = DraftBackendFactory(
                    server_args, dw.draft_runner, self.topk, 0
                ).create_draft_extend_backend()
                return EAGLEDraftExtendCudaGraphRunner(
                    dw, draft_extend_attn_backend=backend, speculative_num_steps=0
                )

        self._spec_fallback.draft_extend_runner = self._spec_fallback_capture(
            "a one-token draft-extend CUDA graph", capture
        )

    def _spec_fallback_build_kv_only_graphs(self, server_args):
        """CUDA graphs of the KV-only draft sync, one per decode-graph batch size above the
        KV-only threshold, replayed on inputs copied into static buffers (padding rows write
        to the KV pool's dummy slot 0, as padded decode-graph rows do): eager, the sync is a
        few dozen small kernels per step. Under tensor parallelism the draft's embedding
        all-reduces, so the capture runs inside SGLang's graph_capture(), as the release's
        own graph runners do (its custom all-reduce registers the graphs' buffers on every
        rank)."""
        state = self._spec_fallback
        above = state.kv_only_above
        runner = state.graph_runner
        if above is None or runner is None:
            return
        sizes = sorted(bs for bs in runner.capture_bs if bs > above)
        if not sizes:
            return
        model = self.draft_worker.draft_runner.model.model
        max_bs, device = sizes[-1], self.device
        pd_decode = getattr(server_args, "disaggregation_mode", "null") == "decode"
        bufs = {
            "tokens": torch.zeros(max_bs, dtype=torch.int32, device=device),
            "hidden": torch.zeros(
                (max_bs, model.fc.in_features), dtype=model.fc.weight.dtype, device=device
            ),
            "positions": torch.zeros(max_bs, dtype=torch.int64, device=device),
            "loc": torch.zeros(max_bs, dtype=torch.int64, device=device),
        }

        def capture():
            graphs, pool = {}, None
            with graph_capture() as context:  # every rank captures the same sizes in order
                stream = context.stream
                for bs in reversed(sizes):  # largest first, so the smaller share its pool
                    args = [bufs[k][:bs] for k in ("tokens", "hidden", "positions", "loc")]
                    stream.wait_stream(torch.cuda.current_stream())
                    with torch.cuda.stream(stream):  # warm-up outside capture (writes slot 0)
                        self._spec_fallback_kv_only_write(*args)
                    torch.cuda.current_stream().wait_stream(stream)
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph, pool=pool, stream=stream):
                        self._spec_fallback_kv_only_write(*args)
                    pool = graph.pool()
                    graphs[bs] = graph
            torch.cuda.synchronize()
            return self._spec_fallback_kv_only_queue(graphs, bufs, pd_decode)

        state.kv_only_graphs = self._spec_fallback_capture(
            "the KV-only draft sync's CUDA graphs", capture
        )

    def _spec_fallback_eligible(self, batch):
        """Every decode batch may fall back: the fallback step is a plain decode step of the
        target, whose sampling applies grammars (the vocab mask of each request's grammar,
        which the scheduler brings up to date before a speculative batch with grammars)
        and computes logprobs, and whose forward returns hidden states, as SGLang's own
        decode does; _spec_fallback_decode puts them in the speculative result's layout."""
        return True

    def _spec_fallback_decode(self, batch):
        """One plain decode step in the speculative result format (0.5.12: stride 1).

        The result is the target's own plain-decode result, so whatever SGLang's decode
        returns passes through (logprobs, hidden states, routed experts, the indexer's top-k,
        expert-distribution metrics), with the speculative fields the scheduler reads added:
        next_token_ids (bs,), speculative_num_draft_tokens=1, accept_lens all 1 and the next
        draft input. The scheduler reads a speculative result's logprobs per request as a
        row of accepted tokens, so they become (bs, 1); top-k and token-id logprobs are one
        entry per request already, as its row-major layout with one token per row wants."""
        device = self.device
        bs = len(batch.seq_lens)
        hidden = self._spec_fallback_returns_hidden_states(batch)
        # The scheduler plans the next step once verify_done fires (spec v2's
        # prepare_for_decode waits on it for the new lengths), so it is recorded only after
        # they exist. The spec path can only have them after verify; here every request gains
        # exactly one token, so they exist before the target runs: the event fires right away
        # and the scheduler prepares the next step while this one runs, as plain decoding's
        # overlap does.
        new_seq_lens = batch.seq_lens + 1
        verify_done = torch.get_device_module(device).Event()
        verify_done.record()
        result = self._spec_fallback_target_decode(
            batch, batch.spec_info.bonus_tokens, new_seq_lens, hidden
        )
        logits_output = result.logits_output
        next_token_ids = result.next_token_ids.to(torch.int32)
        next_draft_input = EagleDraftInput(
            bonus_tokens=next_token_ids,
            new_seq_lens=new_seq_lens,
            verify_done=verify_done,
        )
        self._spec_fallback_sync_draft(
            batch, next_token_ids, logits_output, next_draft_input, hidden
        )
        if batch.return_logprob and logits_output.next_token_logprobs is not None:
            logits_output.next_token_logprobs = logits_output.next_token_logprobs.reshape(bs, 1)
        result.next_token_ids = next_token_ids
        result.speculative_num_draft_tokens = 1
        result.next_draft_input = next_draft_input
        result.accept_lens = self._spec_fallback_constant("accept_lens", bs, (), torch.int32, 1)
        return result

    def _spec_fallback_constant(self, name, rows, tail, dtype, value):
        """A (rows, *tail) tensor of `value`: a view of a buffer filled once per engine (made
        again, larger, when a larger batch comes) instead of a fill kernel every step. Safe
        because nothing writes into them: the scheduler copies the draft input into its
        FutureMap and accept_lens to the host."""
        cache = self._spec_fallback.constants
        buf = cache.get(name)
        if buf is None or buf.shape[0] < rows:
            size = max(rows, 2 * (0 if buf is None else buf.shape[0]))
            buf = cache[name] = torch.full((size, *tail), value, dtype=dtype, device=self.device)
        return buf[:rows]

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
            # Outputs live in the shared graph memory pool: copy them out before the
            # next replay, as the spec path's own draft extend does.
            out = runner.replay(forward_batch)
            next_draft_input.topk_p = out.topk_p[:bs].clone()
            next_draft_input.topk_index = out.topk_index[:bs].clone()
            next_draft_input.hidden_states = out.hidden_states[:bs].clone()
            return
        # No graph for this batch size: prepare_for_extend_... set up eager metadata.
        draft_logits = dw.draft_runner.forward(
            forward_batch, skip_attn_backend_init=True
        ).logits_output
        self._spec_fallback_next_draft_input(draft_logits, next_draft_input)

    def _spec_fallback_draft_decode(self, batch, tokens, hidden_states, next_draft_input):
        """The draft KV sync as one plain DECODE step of the draft model (eager): the token
        the target produced, at the same slot (batch.out_cache_loc) and position (the
        pre-step length) the draft extend would use, with the target's hidden states as the
        EAGLE-3 input. The attention metadata is planned without spec_info (a plain decode
        over req_to_token); the draft model then reads its hidden states from spec_info."""
        dr = self.draft_worker.draft_runner
        pre_step = self._spec_fallback_as_decode(batch, tokens)
        saved = dr.attn_backend
        dr.attn_backend = self._spec_fallback.draft_attn_backend
        try:
            forward_batch = ForwardBatch.init_new(batch, dr)
            dr.attn_backend.init_forward_metadata(forward_batch)
            forward_batch.spec_info = EagleDraftInput(hidden_states=hidden_states)
            draft_logits = dr.forward(
                forward_batch, skip_attn_backend_init=True
            ).logits_output
        finally:
            dr.attn_backend = saved
            batch.seq_lens, batch.seq_lens_cpu, batch.seq_lens_sum = pre_step
        self._spec_fallback_next_draft_input(draft_logits, next_draft_input)

    def _spec_fallback_next_draft_input(self, draft_logits, next_draft_input):
        """The next draft's input from an eager draft forward of the sync, as the spec path's
        own draft extend makes it: top-k of the softmax, and the draft's hidden states."""
        probs = torch.softmax(draft_logits.next_token_logits, dim=-1)
        next_draft_input.topk_p, next_draft_input.topk_index = fast_topk(
            probs, self.topk, dim=-1
        )
        next_draft_input.hidden_states = draft_logits.hidden_states

    def _spec_fallback_draft_kv_only(self, batch, tokens, hidden_states, next_draft_input):
        """The draft sync of K and V only (_spec_fallback_kv_only_write): stashed for a CUDA
        graph replay where graphs were captured, else (after the stash is written) eager. The
        next draft input is zeros, right in shape for the scheduler's FutureMap (why: the
        docstring of _spec_fallback_init_draft_kv_only)."""
        state = self._spec_fallback
        args = (tokens, hidden_states, batch.seq_lens, batch.out_cache_loc)
        if self._spec_fallback_kv_only_stash(*args):
            state.count("draft_kv_only_graph_steps")
        else:
            self._spec_fallback_kv_only_flush("eager")
            self._spec_fallback_kv_only_write(*args)
        self._spec_fallback_zero_draft_input(next_draft_input, len(batch.seq_lens))
        state.count("draft_kv_only_steps")

    def _spec_fallback_zero_draft_input(self, next_draft_input, bs):
        """The next draft's input after a KV-only sync: zeros of the shapes and dtypes the
        draft forward would give (top-k of one, the draft's hidden size)."""
        embed = self.draft_worker.draft_runner.model.model.embed_tokens.weight
        constant = self._spec_fallback_constant
        next_draft_input.topk_p = constant("topk_p", bs, (self.topk,), torch.float32, 0)
        next_draft_input.topk_index = constant("topk_index", bs, (self.topk,), torch.int64, 0)
        next_draft_input.hidden_states = constant(
            "hidden_states", bs, (embed.shape[-1],), embed.dtype, 0
        )

    def _spec_fallback_kv_only_queue(self, graphs, bufs, dedup_always):
        """An empty KV-only queue over captured `graphs` (batch size -> graph) and their static
        buffers. The graphs are kept smallest first: a replay takes the first size that fits
        the rows. `pending` holds each queued step's tokens, positions and slots
        (_spec_fallback_kv_only_stash); its lengths are the queue's only count of rows, steps
        and batch sizes. On a PD-disaggregated decode server requests join without a prefill
        step, so a slot can repeat in a queue of one batch size: there (`dedup_always`) every
        queue of two or more steps is deduplicated."""
        return {"graphs": dict(sorted(graphs.items())), "bufs": bufs, "dedup_always": dedup_always,
                "pending": {"tokens": [], "positions": [], "loc": []}}

    def _spec_fallback_kv_only_stash(self, tokens, hidden_states, positions, out_cache_loc):
        """Queue one KV-only step's rows for the graphs' static buffers, after the rows of the
        steps before it (hidden states copied in now, tokens, positions and slots kept until
        the replay); False if no captured graph can take them (no graphs, a batch larger
        than the largest, hidden states of another width).

        Up to --speculative-disable-kv-only-steps-per-replay steps share one replay: the
        draft's fc and K/V GEMMs then read their weights once for all of them, and the
        graph's dozen kernels launch once. The queue holds the largest graph's rows (the
        engine's cuda_graph_max_bs). Nothing reads the draft KV in between: every other
        draft forward (speculative step, full sync, prefill) first writes the stash
        (_spec_fallback_kv_only_flush), and this far above the threshold the next step cannot
        speculate. Rows are independent (token, hidden states, position, slot), so steps of
        different batches share a replay."""
        state = self._spec_fallback
        captured = state.kv_only_graphs
        bs = len(positions)
        if captured is None or hidden_states.shape[-1] != captured["bufs"]["hidden"].shape[-1]:
            return False
        capacity = next(reversed(captured["graphs"]))
        if bs > capacity:
            return False
        bufs, pending = captured["bufs"], captured["pending"]
        start = sum(map(len, pending["loc"]))
        if start + bs > capacity:
            self._spec_fallback_kv_only_flush("full")
            start = 0
        end = start + bs
        # The hidden states live in the target graph's output, which its next replay
        # overwrites: copied now. Tokens, positions and slots are this step's own tensors,
        # which nothing writes again: kept, and concatenated into the buffers once per replay.
        bufs["hidden"][start:end].copy_(hidden_states)
        pending["tokens"].append(tokens)
        pending["positions"].append(positions)
        pending["loc"].append(out_cache_loc)
        # Written now rather than at the next step when the next step of this size could
        # not join (same outcome, one step earlier).
        if len(pending["loc"]) >= state.kv_only_steps_per_replay:
            self._spec_fallback_kv_only_flush("queued")
        elif end + bs > capacity:
            self._spec_fallback_kv_only_flush("full")
        return True

    def _spec_fallback_kv_only_flush(self, cause):
        """Write the stashed KV-only rows: replay the smallest captured graph that holds
        them, padding rows sent to the KV pool's dummy slot 0 at position 0 with token 0 (as
        padded decode-graph rows are). A no-op with nothing stashed, or without graphs (an
        engine without the flag or without the KV-only sync). Every TP rank stashes and
        flushes at the same steps: both depend only on the batch sizes. `cause` is counted
        (draft_kv_only_flush_causes): "queued" (N steps stashed), "full" (the next step
        would not fit), "spec", "sync", "prefill" (a draft forward that reads or writes the
        draft KV), "eager" (a batch no graph takes); the replays are their sum.

        The rows are deduplicated (_spec_fallback_last_write_wins) only where a slot can
        repeat: a queue whose steps have different batch sizes. A slot is given again only
        after it was freed, and a request whose rows are queued frees its slots only by
        leaving the batch, which shrinks it (requests join only through a prefill, which
        writes the queue first; cached prefixes that the radix cache evicts hold no queued
        rows, their requests having left before). In steady decoding every queue has one
        size, and the sort the deduplication takes is saved."""
        state = self._spec_fallback
        captured = state.kv_only_graphs
        sizes = [len(loc) for loc in captured["pending"]["loc"]] if captured else []
        if not sizes:
            return
        rows, bufs = sum(sizes), captured["bufs"]
        size = next(s for s in captured["graphs"] if s >= rows)
        for name, parts in captured["pending"].items():
            out = bufs[name][:rows]
            if len(parts) > 1 and all(p.dtype == out.dtype for p in parts):
                torch.cat(parts, out=out)
            else:  # one step, or a dtype the buffer casts
                start = 0
                for part in parts:
                    out[start : start + len(part)].copy_(part)
                    start += len(part)
            parts.clear()
        if len(sizes) > 1 and (len(set(sizes)) > 1 or captured["dedup_always"]):
            self._spec_fallback_last_write_wins(bufs["loc"][:rows])
            state.count("draft_kv_only_dedups")
        if size > rows:
            bufs["tokens"][rows:size].zero_()
            bufs["positions"][rows:size].zero_()
            bufs["loc"][rows:size].zero_()
        captured["graphs"][size].replay()
        state.count("draft_kv_only_flush_causes", cause)

    def _spec_fallback_last_write_wins(self, loc):
        """In place: where rows of several steps write one slot, only the latest keeps it;
        the earlier go to the dummy slot 0. A slot freed by a finished request can be given
        to another request a step later; written one step at a time, the later write lands
        last, but one scatter with a repeated index leaves either. Sorting is stable, so
        within a slot the rows stay in step order. No host sync (no unique())."""
        order = torch.sort(loc, stable=True).indices
        ordered = loc[order]
        superseded = torch.zeros_like(ordered, dtype=torch.bool)
        superseded[:-1] = ordered[:-1] == ordered[1:]
        dropped = torch.empty_like(superseded)
        dropped[order] = superseded
        loc.masked_fill_(dropped, 0)

    def _spec_fallback_kv_only_write(self, tokens, hidden_states, positions, out_cache_loc):
        """Write the draft layer's K and V for the tokens the target produced, as its forward
        would (same slot, position = the pre-step length), and nothing else: the input
        layer's K/V depend only on the token's embedding and the target's hidden states (fc
        and the two input norms), so the attention, MLP, head and top-k are skipped (of an
        8B-shaped head's parameters only fc and qkv_proj's K/V rows are read, plus one
        embedding row per token). With an unquantized qkv_proj only its K and V rows are
        multiplied (RoPE then rotates a scratch query)."""
        model = self.draft_worker.draft_runner.model.model
        layer = model.layers[0]
        attn = layer.self_attn
        embeds = model.embed_tokens(tokens.to(torch.int64))
        if hidden_states.shape[-1] != embeds.shape[-1]:
            input_norm = getattr(model, "input_norm", None)  # norm_before_fc heads (0.5.17+)
            if input_norm is not None:
                hidden_states = input_norm(hidden_states)
            if model.fc_norm is not None:
                chunks = hidden_states.chunk(model.num_aux_hidden_states, dim=-1)
                hidden_states = torch.cat(
                    [norm(chunk) for norm, chunk in zip(model.fc_norm, chunks)], dim=-1
                )
            hidden_states = model.fc(hidden_states)
        layer_input = torch.cat(
            [layer.input_layernorm(embeds), layer.hidden_norm(hidden_states)], dim=-1
        )
        proj = attn.qkv_proj
        weight = getattr(proj, "weight", None)
        if (
            weight is not None
            and weight.dtype == layer_input.dtype
            and type(getattr(proj, "quant_method", None)).__name__ == "UnquantizedLinearMethod"
        ):
            bias = getattr(proj, "bias", None)
            kv = torch.nn.functional.linear(
                layer_input,
                weight[attn.q_size :],
                None if bias is None else bias[attn.q_size :],
            )
            k, v = kv.split([attn.kv_size, attn.kv_size], dim=-1)
            q = torch.empty_like(k)
        else:
            qkv, _ = proj(layer_input)
            q, k, v = qkv.split([attn.q_size, attn.kv_size, attn.kv_size], dim=-1)
        _, k = attn.rotary_emb(positions.to(torch.int64), q, k)
        radix = attn.attn
        self.draft_worker.draft_runner.token_to_kv_pool.set_kv_buffer(
            radix,
            out_cache_loc,
            k.reshape(-1, radix.tp_k_head_num, radix.qk_head_dim),
            v.reshape(-1, radix.tp_v_head_num, radix.v_head_dim),
            radix.k_scale,
            radix.v_scale,
        )

    def _spec_fallback_draft_prefill(
        self, batch, target_hidden_states, next_token_ids, mm_input_embeds=None
    ):
        """The draft's half of a prefill (in place of the release's
        _draft_extend_for_prefill). When the decode steps after it will fall back far above
        the threshold (_spec_fallback_kv_only_prefill_applies), only the draft layer's K and
        V are written for the prompt tokens (_spec_fallback_kv_only_write, eager), from the
        inputs the release builds: each request's ids shifted left by one and ended by the
        token the target produced, at the prompt's positions and slots. The next draft input
        is zeros, as after a KV-only decode sync. Otherwise the release's full draft extend.
        This keeps the draft's full forward off the time to first token of prompts that
        will not draft. `ends` goes to the GPU without blocking: a blocking copy's stream
        sync would hold the overlap scheduler behind each prefill."""
        dw = self.draft_worker
        # Stashed KV-only rows land before any prefill writes the draft KV: a slot a
        # finished request freed may be one of this prefill's.
        self._spec_fallback_kv_only_flush("prefill")
        if not self._spec_fallback_kv_only_prefill_applies(batch, mm_input_embeds):
            return dw._draft_extend_for_prefill(
                batch, target_hidden_states, next_token_ids, mm_input_embeds
            )
        # The release's per-request shift, vectorised: position j takes token j + 1, and
        # each request's last position the token the target produced.
        ids = batch.input_ids
        ends = torch.tensor(batch.extend_seq_lens, dtype=torch.int64).cumsum(0) - 1
        shifted = torch.empty_like(ids)
        shifted[:-1] = ids[1:]
        # non_blocking: a blocking host-to-device copy syncs the stream (see the docstring).
        shifted[ends.to(ids.device, non_blocking=True)] = next_token_ids.to(ids.dtype)
        ids.copy_(shifted)
        next_draft_input = EagleDraftInput(
            hidden_states=target_hidden_states,
            bonus_tokens=next_token_ids,
            new_seq_lens=batch.seq_lens,
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

    def _spec_fallback_kv_only_prefill_applies(self, batch, mm_input_embeds):
        """Whether a prefill takes the KV-only draft path: the KV-only sync is on; the batch
        is a plain text EXTEND; and its requests plus the running batch (while the fallback is on: the last decode
        step's size) are more than the margin above the threshold. Depends on the batch and
        on state every TP rank updates alike. A guess too high (the running requests finished
        meanwhile) costs one speculative step drafting from zeros, never a wrong token, as
        for the decode sync."""
        state = self._spec_fallback
        above = state.kv_only_above
        if above is None or mm_input_embeds is not None:
            return False
        if any(getattr(batch, "multimodal_inputs", None) or ()):
            return False
        if batch.forward_mode != ForwardMode.EXTEND:
            return False
        running = state.stats["last_batch_size"] if state.active else 0
        return len(batch.seq_lens) + running > above
