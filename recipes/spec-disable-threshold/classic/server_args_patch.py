"""Flags of the dynamic speculation disable where spectool's fallback is the worker (0.5.6.post2
to 0.5.14): dataclass fields plus argparse flags, validated at the end of ServerArgs'
_handle_speculative_decoding (from 0.5.13: of speculative_hook.handle_speculative_decoding).

Both a field and an ``add_argument`` are needed in this style: ``from_cli_args`` reads every
dataclass field from the argparse namespace.
"""

import argparse
import logging
from typing import Optional

from sglang.srt.environ import envs

logger = logging.getLogger(__name__)


def int_or_off(value: str) -> Optional[int]:
    """argparse type of a count that can be switched off: a whole number, or 'off' (None)."""
    if value.strip().lower() == "off":
        return None
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a whole number or 'off', got {value!r}"
        ) from None


class ServerArgsFields:
    speculative_disable_batch_size_threshold: Optional[int] = None
    speculative_disable_batch_size_hysteresis: int = 0
    speculative_disable_draft_decode_min_bs: Optional[int] = 16
    speculative_disable_kv_only_margin: Optional[int] = 0
    speculative_disable_kv_only_steps_per_replay: int = 4


def add_cli_args(parser: argparse.ArgumentParser):
    parser.add_argument(
        "--speculative-disable-batch-size-threshold",
        type=int,
        default=ServerArgs.speculative_disable_batch_size_threshold,
        help="Dynamic speculation disable: when a decode batch holds more than this many "
        "requests, EAGLE skips drafting and runs a plain one-token target decode (keeping the "
        "draft KV cache in sync). 0 means never draft in decode. Default: off.",
    )
    parser.add_argument(
        "--speculative-disable-batch-size-hysteresis",
        type=int,
        default=ServerArgs.speculative_disable_batch_size_hysteresis,
        help="Once drafting is off, turn it back on only when the decode batch is at most "
        "threshold - hysteresis requests (avoids flapping at the boundary); 0 or below the "
        "threshold. Default: 0.",
    )
    parser.add_argument(
        "--speculative-disable-draft-decode-min-bs",
        type=int_or_off,
        default=ServerArgs.speculative_disable_draft_decode_min_bs,
        help="While drafting is off, keep the draft KV cache in sync with a plain decode "
        "forward of the draft from this many requests up, and with a one-token draft extend "
        "below; 'off' always uses the draft extend. Default: 16.",
    )
    parser.add_argument(
        "--speculative-disable-kv-only-margin",
        type=int_or_off,
        default=ServerArgs.speculative_disable_kv_only_margin,
        help="While drafting is off and the decode batch is more than this many requests "
        "above the threshold, the draft KV sync writes only the draft layer's K/V (EAGLE-3 "
        "heads of one layer), not its output; 'off' always runs the draft. Default: 0.",
    )
    parser.add_argument(
        "--speculative-disable-kv-only-steps-per-replay",
        type=int,
        default=ServerArgs.speculative_disable_kv_only_steps_per_replay,
        help="How many decode steps' K/V-only draft syncs are written by one CUDA graph "
        "replay (1: every step its own). Default: 4.",
    )


def call_validation(self):
    self._validate_speculative_disable_threshold()


def reserve_fallback_memory(self, reserved_mem):
    # The fallback's plain decode CUDA graphs and second attention backend, reserved
    # as SGLang reserves its own decode graphs' and backend's (spec-fallback logs what
    # they took at start-up).
    if self.speculative_disable_batch_size_threshold is not None:
        reserved_mem += 512 + self.cuda_graph_max_bs * 2


class ServerArgs(ServerArgsFields):
    def _spectool_resolved_settings(self):
        """The settings as SGLang's own handlers read them while it resolves them: from 0.5.15
        a model's overrides are declared during resolution and reach the fields only at its
        end (arg_groups.overrides.resolved_view); before, the fields themselves."""
        try:
            from sglang.srt.arg_groups.overrides import resolved_view
        except ImportError:
            return self
        return resolved_view(self)

    def _validate_speculative_disable_threshold(self):
        """Refuse settings under which the dynamic speculation disable cannot work."""
        for flag, value, least in (
            (
                "--speculative-disable-draft-decode-min-bs",
                self.speculative_disable_draft_decode_min_bs,
                1,
            ),
            (
                "--speculative-disable-kv-only-margin",
                self.speculative_disable_kv_only_margin,
                0,
            ),
        ):
            if value is not None and (not isinstance(value, int) or value < least):
                raise ValueError(
                    f"{flag} must be a whole number >= {least} or 'off' (None), got {value!r}."
                )
        steps = self.speculative_disable_kv_only_steps_per_replay
        if not isinstance(steps, int) or steps < 1:
            raise ValueError(
                "--speculative-disable-kv-only-steps-per-replay must be a whole number >= 1, "
                f"got {steps!r}."
            )
        threshold = self.speculative_disable_batch_size_threshold
        if threshold is None:
            return
        if threshold < 0:
            raise ValueError(
                f"--speculative-disable-batch-size-threshold must be >= 0 (got {threshold}); "
                "0 means never draft in decode."
            )
        hysteresis = self.speculative_disable_batch_size_hysteresis
        if hysteresis < 0 or (hysteresis > 0 and hysteresis >= threshold):
            raise ValueError(
                "--speculative-disable-batch-size-hysteresis must be 0 or below the threshold "
                f"({threshold}), got {hysteresis}: drafting comes back when the decode batch "
                "holds at most threshold - hysteresis requests, so a hysteresis of the "
                "threshold or more would keep it off for good."
            )
        if self.speculative_algorithm not in ("EAGLE", "EAGLE3", "STANDALONE"):
            raise ValueError(
                "--speculative-disable-batch-size-threshold needs --speculative-algorithm "
                f"EAGLE, EAGLE3 or STANDALONE (got {self.speculative_algorithm})."
            )
        resolved = self._spectool_resolved_settings()
        if getattr(resolved, "enable_multi_layer_eagle", False):
            raise ValueError(
                "--speculative-disable-batch-size-threshold does not support "
                "--enable-multi-layer-eagle (a different worker class)."
            )
        spec_v2 = getattr(envs, "SGLANG_ENABLE_SPEC_V2", None)  # none: always spec v2
        if resolved.disable_overlap_schedule or (spec_v2 is not None and not spec_v2.get()):
            raise ValueError(
                "--speculative-disable-batch-size-threshold works on the overlap (spec v2) "
                "worker only, which --disable-overlap-schedule (passed, or set by SGLang for "
                "this model) or SGLANG_ENABLE_SPEC_V2=0 turns off."
            )
        if self.speculative_eagle_topk != 1:
            raise ValueError(
                "--speculative-disable-batch-size-threshold needs --speculative-eagle-topk 1 "
                f"(got {self.speculative_eagle_topk})."
            )
        if getattr(self, "speculative_use_rejection_sampling", False):
            raise ValueError(
                "--speculative-disable-batch-size-threshold cannot be combined with "
                "--speculative-use-rejection-sampling: the fallback's draft KV sync keeps no "
                "draft probabilities for the next speculative step."
            )
        if resolved.enable_dp_attention:
            raise ValueError(
                "--speculative-disable-batch-size-threshold cannot be combined with "
                "--enable-dp-attention: each DP rank sees its own batch size, so ranks would "
                "take different branches around collective operations."
            )
        if getattr(self, "speculative_adaptive", False):
            raise ValueError(
                "--speculative-disable-batch-size-threshold cannot be combined with "
                "--speculative-adaptive: both swap the worker's runtime state between steps."
            )
        if resolved.enable_two_batch_overlap:
            raise ValueError(
                "--speculative-disable-batch-size-threshold cannot be combined with "
                "--enable-two-batch-overlap: the fallback's plain decode step was not built "
                "for the two-batch split the scheduler plans for each batch."
            )
        if getattr(resolved, "enable_pdmux", False):
            raise ValueError(
                "--speculative-disable-batch-size-threshold cannot be combined with "
                "--enable-pdmux: the fallback's CUDA graphs are captured for one stream, "
                "where PD multiplexing runs decode on stream groups of its own."
            )
        if self.enable_lora or self.lora_paths:
            raise ValueError(
                "--speculative-disable-batch-size-threshold cannot be combined with LoRA "
                "(--enable-lora, --lora-paths): the fallback's decode graph would replace "
                "LoRA buffers that the speculative path's graphs captured."
            )
        if self.speculative_algorithm == "EAGLE" and self.speculative_draft_model_path in (
            None,
            self.model_path,
        ):
            raise ValueError(
                "--speculative-disable-batch-size-threshold does not support NEXTN/MTP "
                "drafts (the target's own next-token layers, --speculative-algorithm NEXTN, "
                "or EAGLE without a separate --speculative-draft-model-path): the fallback "
                "keeps one-layer EAGLE/EAGLE-3 heads and STANDALONE drafts in sync."
            )
        if (
            self.max_running_requests is not None
            and threshold >= self.max_running_requests
        ):
            logger.warning(
                "speculative_disable_batch_size_threshold=%s is not below "
                "max_running_requests=%s (spec v2 lowers the default to 48): the decode batch "
                "can never exceed it, so drafting will never be switched off. Raise "
                "--max-running-requests or lower the threshold.",
                threshold,
                self.max_running_requests,
            )
