"""The threshold flag on releases where the fallback is not ported (0.5.19+), which have
upstream's own batch-size switch (the steps-0 tier of ``--speculative-adaptive``): the user's
command line keeps working, the same flag, with the same meaning, mapped onto upstream's
adaptive configuration (drafting with the configured steps up to T requests, steps 0 above).
Upstream quantizes the batch size to a captured CUDA-graph size before looking up the tier,
and its tiers have no batch-size hysteresis.

The fields (0.5.19 annotates them with NS, 0.5.20 declares them in its spec namespace) and
``_spectool_adaptive_tiers``, which checks the flags and writes the tiers; resolved.py declares
upstream's two fields from them.
"""

import json
import logging
import tempfile
from typing import Annotated as A
from typing import Optional

logger = logging.getLogger(__name__)


def NS(path):  # stand-in so this file lints; 0.5.17+ defines NS in arg_groups.arg_utils
    return path


class Fields015:
    speculative_disable_batch_size_threshold: A[
        Optional[int],
        "Disable drafting when a decode batch holds more than this many requests (mapped "
        "onto the steps-0 tier of --speculative-adaptive). 0 means never draft in decode.",
    ] = None
    speculative_disable_batch_size_hysteresis: A[
        int,
        "Accepted for compatibility; upstream's tiers have no batch-size hysteresis.",
    ] = 0


class Fields017:
    speculative_disable_batch_size_threshold: A[
        Optional[int],
        "Disable drafting when a decode batch holds more than this many requests (mapped "
        "onto the steps-0 tier of --speculative-adaptive). 0 means never draft in decode.",
        NS("spec"),
    ] = None
    speculative_disable_batch_size_hysteresis: A[
        int,
        "Accepted for compatibility; upstream's tiers have no batch-size hysteresis.",
        NS("spec"),
    ] = 0


def _spectool_adaptive_tiers(cfg):
    """spectool: the adaptive tiers of --speculative-disable-batch-size-threshold as a JSON
    file (its path), or None when the flag is unset. `cfg` reads the server args as they
    stand; a setting the tiers cannot serve is refused."""
    threshold = getattr(cfg, "speculative_disable_batch_size_threshold", None)
    if threshold is None:
        return None
    if threshold < 0:
        raise ValueError(
            f"--speculative-disable-batch-size-threshold must be >= 0 (got {threshold})."
        )
    hysteresis = getattr(cfg, "speculative_disable_batch_size_hysteresis", 0)
    if hysteresis < 0 or (hysteresis > 0 and hysteresis >= threshold):
        raise ValueError(
            "--speculative-disable-batch-size-hysteresis must be 0 or below the threshold "
            f"({threshold}), got {hysteresis}."
        )
    algorithm = cfg.speculative_algorithm
    topk = getattr(cfg, "speculative_eagle_topk", None)
    if algorithm not in ("EAGLE", "EAGLE3") or topk not in (None, 1):
        # Upstream would switch its adaptive tiers off with a warning: the flag would
        # silently do nothing. Say so at start-up instead.
        raise ValueError(
            "--speculative-disable-batch-size-threshold maps onto upstream's adaptive "
            "batch-size tiers on this SGLang, which support only EAGLE/EAGLE3 with "
            f"--speculative-eagle-topk 1 (got {algorithm}, topk {topk}). Drop the flag, "
            "or stay on SGLang 0.5.12 where the spectool fallback covers this setup."
        )
    if cfg.speculative_adaptive_config is not None:
        raise ValueError(
            "--speculative-disable-batch-size-threshold writes its own adaptive config; "
            "do not combine it with --speculative-adaptive-config."
        )
    if hysteresis:
        logger.warning(
            "--speculative-disable-batch-size-hysteresis is ignored on this SGLang: "
            "upstream's batch-size tiers switch without hysteresis."
        )
    steps = cfg.speculative_num_steps or 3
    tier = {"up_hysteresis": 0.0, "down_hysteresis": 0.0, "ceiling_coeff": 0}
    config = {"1": {"candidate_steps": [steps], **tier}}
    config[str(threshold + 1)] = {"candidate_steps": [0], **tier}
    if threshold == 0:
        # Upstream requires --speculative-num-steps among the candidate steps (start-up
        # fails otherwise), so it sits on a tier no batch can reach.
        config = {
            "1": {"candidate_steps": [0], **tier},
            str(2**31 - 1): {"candidate_steps": [steps], **tier},
        }
    with tempfile.NamedTemporaryFile(
        "w", prefix="spectool-adaptive-", suffix=".json", delete=False
    ) as f:
        json.dump(config, f)
    logger.info(
        "spec-disable-threshold: drafting (steps=%s) up to %d requests, off above "
        "(upstream adaptive tiers, config %s)",
        steps,
        threshold,
        f.name,
    )
    return f.name
