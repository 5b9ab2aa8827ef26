"""The draft length chosen per decode step (--speculative-num-steps-tiers), on every release
the tiers serve (0.5.12 to 0.5.18): among the step counts the server was started with,
each decode step runs the one its batch size falls to (SpecFallbackState.tier_for_batch), tier
0 being the fallback's plain decode step (common.py).

Every step count above 0 is one of the release's own adaptive runtime states
(EAGLEWorkerV2.build_adaptive_runtime_state: the draft's attention backend and CUDA graphs
for that many steps, the target's verify backend and graph at steps + 1 tokens, the draft
extend's), built at start-up with its CUDA graphs captured only for the batch sizes its tiers
serve (the step counts need not fall as the batch grows: 2,3,2,0 has one 2-step state for
both its ranges), and swapped in with the release's apply_runtime_state before the step runs. The step
count SGLang was started with keeps the state SGLang built for it. What start-up took is
measured and logged as the fallback's is.

Switching keeps the draft KV cache exact: every tier's step ends with a draft forward over the
tokens it accepted (the draft extend, or the fallback's sync) that writes their draft K/V and
the next draft input, whose shapes do not depend on the step count. The scheduler allocates
each step's KV slots from the start-up step counts before the worker picks the tier, so they
stay where the release keeps them, and their allocation holds every tier's. The choice depends
only on the batch size and the tier before, which every TP rank has alike.

Where the releases differ, the methods named here come from each era's tiers.py:
_spec_tiers_graph_sizes and _spec_tiers_capturing_at (where the graph runners read their
capture sizes), _spec_tiers_keep_startup_counts (where apply_runtime_state writes the step
counts), and the hooks into start-up and the decode step.
"""

import dataclasses
import logging
import time

from sglang.srt.layers.moe.utils import (
    speculative_moe_a2a_backend_context,
    speculative_moe_backend_context,
)
from sglang.srt.speculative.adaptive_runtime_state import SpecRuntimeState
from sglang.srt.utils.common import get_available_gpu_memory

logger = logging.getLogger(__name__)


def spectool_fallback_worker():
    """In sglang.srt.server_args: marks that this SGLang has the spec-fallback recipe's worker,
    which --speculative-num-steps-tiers needs (its validation looks for this name)."""
    return True


@dataclasses.dataclass
class SpecTiers:
    """The tiers of one EAGLEWorkerV2: the step counts from the smallest batches to the
    largest, the boundaries between them (tier i serves batches of up to boundaries[i]
    requests), the hysteresis, the step counts SGLang started with (steps, draft tokens),
    the current tier (an index into `steps`) and each positive step count's runtime state."""

    steps: tuple
    boundaries: tuple
    hysteresis: int = 0
    startup: tuple = ()
    tier: int = 0
    states: dict = dataclasses.field(default_factory=dict)

    def batch_range(self, tier):
        """(smallest, largest) decode batch that tier `tier` can serve; largest None for the
        last tier. Entered upward above the boundary below it, kept (or entered downward)
        down to that boundary - hysteresis + 1."""
        low = 1
        if tier > 0:
            low = max(1, self.boundaries[tier - 1] - self.hysteresis + 1)
        high = self.boundaries[tier] if tier < len(self.boundaries) else None
        return low, high

    def graph_sizes(self, sizes, tier):
        """The CUDA-graph batch sizes of `sizes` that tier `tier` replays: a batch takes the
        smallest captured size that holds it, so those from `low` up to the first that
        holds `high` (every one from `low` up for the last tier)."""
        low, high = self.batch_range(tier)
        ordered = sorted(set(sizes))
        holds_high = next((s for s in ordered if high is not None and s >= high), None)
        return [
            s for s in ordered if s >= low and (holds_high is None or s <= holds_high)
        ]

    def step_graph_sizes(self, sizes, steps):
        """The CUDA-graph batch sizes the state of `steps` draft steps replays: those of every
        tier that drafts that many steps (a step count may serve several batch ranges, such
        as 2,3,2,0: 2 steps below the first boundary and again above the second)."""
        return sorted(
            {s for tier, n in enumerate(self.steps) if n == steps for s in self.graph_sizes(sizes, tier)}
        )


class EAGLEWorkerV2:
    def _spec_tiers_init(self, server_args):
        """Read the tiers; with --speculative-num-steps-tiers, build every tier's state and
        start in the first tier (the smallest batches')."""
        self._spec_tiers = None
        steps = server_args.speculative_num_steps_tiers
        if not steps:
            return
        tiers = self._spec_tiers = SpecTiers(
            steps=tuple(steps),
            boundaries=tuple(server_args.speculative_num_steps_tier_boundaries),
            hysteresis=server_args.speculative_disable_batch_size_hysteresis,
            startup=(self.speculative_num_steps, self.speculative_num_draft_tokens),
        )
        with (
            self.draft_worker.draft_tp_context(self.draft_worker.draft_runner.tp_group),
            speculative_moe_backend_context(),
            speculative_moe_a2a_backend_context(),
        ):
            self._spec_tiers_build()
        self._spec_tiers_apply(tiers.steps[0])

    def _spec_tiers_build(self):
        """Start-up: SGLang's own state for the step count it started with, and a state per
        other positive step count, its CUDA graphs captured only for the batch sizes its tiers
        serve (SpecTiers.step_graph_sizes). The GPU memory taken is measured, logged and written
        to the counters (tiers_startup_memory_gib); up to 0.5.16 it is also added to the
        model runner's graph_mem_usage, which SGLang's memory report shows. From 0.5.17 the
        release's build_adaptive_runtime_state records each state's graphs in that report
        itself (per phase: target_verify, draft_decode, draft_extend), so nothing is added."""
        tiers = self._spec_tiers
        mr = self._target_worker.model_runner
        dw = self.draft_worker
        before = get_available_gpu_memory(self.device, self.gpu_id)
        tic = time.perf_counter()
        # The model runner's decode graph runner: decode_cuda_graph_runner from 0.5.14.
        if hasattr(mr, "decode_cuda_graph_runner"):
            target_graph_runner = mr.decode_cuda_graph_runner
        else:
            target_graph_runner = mr.graph_runner
        tiers.states[self.speculative_num_steps] = SpecRuntimeState(
            speculative_num_steps=self.speculative_num_steps,
            speculative_num_draft_tokens=self.speculative_num_draft_tokens,
            draft_attn_backend=dw.draft_attn_backend,
            cuda_graph_runner=dw.cuda_graph_runner,
            target_attn_backend=mr.attn_backend,
            target_graph_runner=target_graph_runner,
            draft_extend_attn_backend=dw.draft_extend_attn_backend,
            cuda_graph_runner_for_draft_extend=dw.cuda_graph_runner_for_draft_extend,
        )
        server_sizes = self._spec_tiers_graph_sizes()
        startup = self.speculative_num_steps
        plan = []
        for tier, steps in enumerate(tiers.steps):
            low, high = tiers.batch_range(tier)
            served = f"{low}-{high}" if high is not None else f"{low} and up"
            if steps == 0:
                plan.append(f"0 steps at {served} requests (the fallback)")
                continue
            if steps == startup:
                plan.append(f"{steps} at {served} (SGLang's start-up graphs)")
                continue
            if steps in tiers.states:  # built for an earlier tier of this step count
                plan.append(f"{steps} at {served} (the graphs above)")
                continue
            sizes = []
            if server_sizes is not None:
                sizes = tiers.step_graph_sizes(server_sizes, steps)
            tiers.states[steps] = self._spec_tiers_build_state(steps, sizes)
            plan.append(f"{steps} at {served} (CUDA graphs: {sizes or 'none'})")
        used = before - get_available_gpu_memory(self.device, self.gpu_id)
        if hasattr(mr, "graph_mem_usage"):
            mr.graph_mem_usage += used
        self._spec_fallback.stats["tiers_startup_memory_gib"] = round(used, 3)
        logger.info(
            "spec-tiers: draft steps %s; start-up took %.2f GiB of GPU memory and %.1f s",
            "; ".join(plan),
            used,
            time.perf_counter() - tic,
        )

    def _spec_tiers_build_state(self, steps, sizes):
        """The release's adaptive runtime state of `steps` draft steps, its graphs captured at
        batch sizes `sizes` (none: eager; _spec_tiers_capturing_at). A capture that fails
        stops the server with the reason, as the fallback's do."""
        try:
            with self._spec_tiers_capturing_at(sizes, steps + 1):
                return self.build_adaptive_runtime_state(steps, steps + 1)
        except Exception as exc:
            raise RuntimeError(
                f"spec-tiers: could not build the tier of {steps} draft steps "
                f"({type(exc).__name__}: {exc}). Free GPU memory (a lower "
                "--mem-fraction-static or --cuda-graph-max-bs), or start with "
                "--disable-cuda-graph, or without --speculative-num-steps-tiers."
            ) from exc

    def _spec_tiers_select(self, batch):
        """Per decode step, before the fallback's decision: the tier of this batch, and its
        runtime state swapped in (tier 0 leaves it to the fallback, whose own rule at the
        last boundary gives the same answer; a batch the fallback does not take runs the
        start-up state). Idle batches keep the tier."""
        tiers = self._spec_tiers
        if tiers is None or batch.forward_mode.is_idle() or batch.spec_info is None:
            return
        state = self._spec_fallback
        bs = len(batch.seq_lens)
        tier = state.tier_for_batch(bs, tiers.tier, tiers.boundaries, tiers.hysteresis)
        steps = tiers.steps[tier]
        if tier != tiers.tier:
            logger.debug(  # the counters count switches; SGLang logs each swap itself
                "spec-tiers: decode batch of %d requests, draft steps %d -> %d",
                bs,
                tiers.steps[tiers.tier],
                steps,
            )
            tiers.tier = tier
            state.count("tier_switches")
        if steps == 0 and not self._spec_fallback_eligible(batch):
            # A batch the fallback keeps speculating (a grammar, say) runs the start-up
            # state, whose graphs serve every batch size.
            steps = tiers.startup[0]
        state.count("tier_steps", steps)
        if steps:
            self._spec_tiers_apply(steps)

    def _spec_tiers_apply(self, steps):
        """Swap in the runtime state of `steps` draft steps (the release's
        apply_runtime_state), keeping the start-up step counts where the scheduler sizes each
        step's KV allocation from them before the tier is known."""
        if steps == self.speculative_num_steps:
            return
        self.apply_runtime_state(self._spec_tiers.states[steps])
        self._spec_tiers_keep_startup_counts()
