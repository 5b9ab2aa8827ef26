"""Flags of the draft length chosen per decode step (SGLang 0.5.12 to 0.5.18): the step
counts the server keeps ready (--speculative-num-steps-tiers) and the batch sizes between them
(--speculative-num-steps-tier-boundaries), validated just before the threshold's own
validation. Tier 0 is the spec-fallback recipe's plain decode step: its threshold is the last
boundary. The worker side (start-up states, the switch per step) is the spec-fallback recipe.
"""

import argparse
import logging
from typing import List, Optional

logger = logging.getLogger(__name__)


def int_list(value: str) -> List[int]:
    """argparse type of a comma-separated list of whole numbers (3,1,0)."""
    try:
        return [int(part) for part in value.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated whole numbers such as 3,1,0, got {value!r}"
        ) from None


class TierFields:
    speculative_num_steps_tiers: Optional[List[int]] = None
    speculative_num_steps_tier_boundaries: Optional[List[int]] = None


def add_cli_args(parser: argparse.ArgumentParser):
    parser.add_argument(
        "--speculative-num-steps-tiers",
        type=int_list,
        default=ServerArgs.speculative_num_steps_tiers,
        help="Draft length chosen per decode step from the batch size: the numbers of draft "
        "steps, from the smallest batches to the largest, each different from the one before "
        "(e.g. 3,1,0 or 2,3,2,0; at most --speculative-num-steps). 0, only as the last, is the "
        "plain decode step of --speculative-disable-batch-size-threshold. Every tier's CUDA "
        "graphs are captured at start-up for the batch sizes it serves. Needs "
        "--speculative-num-steps-tier-boundaries. Default: off (the fixed step count).",
    )
    parser.add_argument(
        "--speculative-num-steps-tier-boundaries",
        type=int_list,
        default=ServerArgs.speculative_num_steps_tier_boundaries,
        help="The largest decode batch each tier of --speculative-num-steps-tiers serves but "
        "the last, increasing (e.g. 16,48: 3 steps up to 16 requests, 1 up to 48, 0 above). "
        "A tier is left for the one before only at boundary - "
        "--speculative-disable-batch-size-hysteresis requests. Default: off.",
    )


def call_validation(self):
    self._validate_speculative_num_steps_tiers()


def reserve_tier_memory(self, reserved_mem):
    # Each tier's own CUDA graphs and attention backends beyond those SGLang captures for
    # --speculative-num-steps, reserved as the fallback's (tier 0) are; tier 0's here only
    # when its threshold comes from the last boundary (set later, by the validation).
    # Left unset, --speculative-num-steps is chosen later; the validation then refuses a
    # tier above it, so the longest tier's graphs are SGLang's own.
    tiers = self.speculative_num_steps_tiers or ()
    start = self.speculative_num_steps if self.speculative_num_steps is not None else max(tiers, default=0)
    for tier_steps in dict.fromkeys(tiers):  # one state per step count, whatever it serves
        if tier_steps != start and (
            tier_steps > 0 or self.speculative_disable_batch_size_threshold is None
        ):
            reserved_mem += 512 + self.cuda_graph_max_bs * 2


class ServerArgs(TierFields):
    def _validate_speculative_num_steps_tiers(self):
        """Refuse tier settings the worker cannot serve, one reason each; with tier 0, set
        the fallback's threshold to the last boundary (its own validation follows)."""
        tiers = self.speculative_num_steps_tiers
        bounds = self.speculative_num_steps_tier_boundaries
        if tiers is None:
            if bounds is not None:
                raise ValueError(
                    "--speculative-num-steps-tier-boundaries needs "
                    "--speculative-num-steps-tiers (the step counts it separates)."
                )
            return
        flag = "--speculative-num-steps-tiers"
        for name, value in ((flag, tiers), ("--speculative-num-steps-tier-boundaries", bounds)):
            if value is not None and not (
                isinstance(value, (list, tuple)) and all(type(v) is int for v in value)
            ):
                raise ValueError(
                    f"{name} takes whole numbers (on the command line: comma-separated, "
                    f"such as 3,1,0), got {value!r}."
                )
        if (
            len(tiers) < 2
            or any(a == b for a, b in zip(tiers, tiers[1:]))
            or min(tiers) < 0
            or 0 in tiers[:-1]
        ):
            raise ValueError(
                f"{flag} lists two or more step counts from the smallest batches to the "
                "largest, each different from the one before, none below 0, and 0 (the "
                f"fallback) only as the last (e.g. 3,1,0 or 2,3,2,0), got {','.join(map(str, tiers))}."
            )
        # Before the step counts: without an algorithm SGLang sets none.
        if self.speculative_algorithm not in ("EAGLE", "EAGLE3"):
            raise ValueError(
                f"{flag} needs --speculative-algorithm EAGLE or EAGLE3 (got "
                f"{self.speculative_algorithm})."
            )
        if self.speculative_num_steps is None or max(tiers) > self.speculative_num_steps:
            raise ValueError(
                f"{flag}: every tier must draft at most --speculative-num-steps steps (the "
                "KV cache is allocated for that many), got a tier of "
                f"{max(tiers)} with --speculative-num-steps {self.speculative_num_steps}."
            )
        if bounds is None or len(bounds) != len(tiers) - 1:
            raise ValueError(
                "--speculative-num-steps-tier-boundaries must give one batch size fewer than "
                f"there are tiers ({len(tiers) - 1} for {','.join(map(str, tiers))}), got "
                f"{'none' if bounds is None else ','.join(map(str, bounds))}."
            )
        if bounds[0] < 1 or any(a >= b for a, b in zip(bounds, bounds[1:])):
            raise ValueError(
                "--speculative-num-steps-tier-boundaries must be increasing batch sizes of 1 "
                f"or more, got {','.join(map(str, bounds))}."
            )
        hysteresis = self.speculative_disable_batch_size_hysteresis
        if hysteresis < 0 or (hysteresis > 0 and hysteresis >= bounds[0]):
            raise ValueError(
                "--speculative-disable-batch-size-hysteresis must be 0 or below the smallest "
                f"tier boundary ({bounds[0]}), got {hysteresis}: a tier is left for the one "
                "before at boundary - hysteresis requests."
            )
        if getattr(self, "speculative_adaptive", False):
            raise ValueError(
                f"{flag} cannot be combined with --speculative-adaptive: both choose the "
                "number of draft steps per decode step."
            )
        if "spectool_fallback_worker" not in globals():
            raise ValueError(
                f"{flag} needs the spec-fallback recipe's worker in this SGLang (it builds the "
                "tiers and switches between them): apply spec-fallback with spectool."
            )
        if self.speculative_eagle_topk != 1:
            raise ValueError(
                f"{flag} needs --speculative-eagle-topk 1 (got {self.speculative_eagle_topk})."
            )
        resolved = self._spectool_resolved_settings()
        if resolved.disable_overlap_schedule:
            raise ValueError(
                f"{flag} works on the overlap (spec v2) worker only, which "
                "--disable-overlap-schedule (passed, or set by SGLang for this model) turns off."
            )
        for name, on, why in (
            ("--enable-dp-attention", resolved.enable_dp_attention,
             "each DP rank sees its own batch size, so ranks would choose different tiers"),
            ("--enable-multi-layer-eagle", getattr(resolved, "enable_multi_layer_eagle", False),
             "a different worker class"),
            ("--enable-two-batch-overlap", resolved.enable_two_batch_overlap,
             "a tier switch would drop its attention backend wrapper"),
            ("--enable-pdmux", getattr(resolved, "enable_pdmux", False),
             "a tier switch does not update its decode backend group"),
        ):
            if on:
                raise ValueError(f"{flag} cannot be combined with {name}: {why}.")
        moe = (
            ("--speculative-moe-runner-backend", "speculative_moe_runner_backend", "moe_runner_backend"),
            ("--speculative-moe-a2a-backend", "speculative_moe_a2a_backend", "moe_a2a_backend"),
        )
        for name, spec_field, field in moe:
            spec_value, value = getattr(resolved, spec_field, None), getattr(resolved, field, None)
            if spec_value is not None and spec_value != value:
                raise ValueError(
                    f"{flag} cannot be combined with {name} {spec_value} different from the "
                    f"target's ({value}): the tiers' target graphs are captured with the draft's "
                    "MoE settings."
                )
        max_running = self.max_running_requests
        if max_running is not None and bounds[-1] >= max_running:
            logger.warning(
                "--speculative-num-steps-tier-boundaries: the last boundary (%d) is at or above "
                "--max-running-requests (%d), so the last tier is never reached.",
                bounds[-1],
                max_running,
            )
        threshold = self.speculative_disable_batch_size_threshold
        if tiers[-1] == 0:
            if threshold is not None and threshold != bounds[-1]:
                raise ValueError(
                    f"{flag}: tier 0 starts above the last boundary ({bounds[-1]}), which is "
                    "the fallback's threshold; leave --speculative-disable-batch-size-"
                    f"threshold unset or give it the same value (got {threshold})."
                )
            self.speculative_disable_batch_size_threshold = bounds[-1]
        elif threshold is not None:
            raise ValueError(
                f"{flag} without a tier 0 cannot be combined with "
                "--speculative-disable-batch-size-threshold: add 0 as the last tier, with the "
                "threshold as the last boundary."
            )
        if self.speculative_num_steps not in tiers:
            logger.warning(
                "--speculative-num-steps-tiers drafts at most %s steps, below "
                "--speculative-num-steps %s: SGLang still captures the graphs of %s steps at "
                "start-up, which no tier uses.",
                max(tiers),
                self.speculative_num_steps,
                self.speculative_num_steps,
            )
