"""Scenarios of the golden tests: engine configurations and the workloads run on them.

Every speculative scenario is compared, request by request, with the same workload on a
no-speculation engine of the same settings (CUDA graphs, chunked prefill, hidden-state
return): its tokens, and the logprobs and hidden states its requests ask for. Each scenario
also states which path it claims to test, checked from the fallback counters, and the
EAGLE-3 ones the acceptance their trained head reaches.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass, field, replace

from .golden_model import ModelSpec, copy_prompt

THRESHOLD = 4  # T: the scenarios sit around it (T-1, T, T+1)
# The EAGLE-3 engines' acceptance floor (tokens per speculative step, bonus included). The
# trained head drafts the golden prompts' continuation whole (4.0 on CPU, with its draft
# cache in sync: tests/test_golden_eagle3.py); a random head accepts about 1, one drafting
# over a prompt whose draft K/V were never synced 1.3 to 2.1.
HEAD_ACCEPTANCE = 2.5
# bf16 noise: logprobs and hidden states of a fallback step against plain decoding, relative
# (logprobs to max(1, |value|), hidden states to the row's largest value).
LOGPROB_TOL = 0.02
HIDDEN_TOL = 0.02
# Logprobs of requests whose decoding crosses speculative steps: a speculative step's
# logprobs come from the target's verify forward (extend kernels over the draft tokens),
# plain decoding's from its decode kernels, so they differ by bf16 noise of two
# computations, not one (the copy model's top-2 logprobs are about -10, so 0.05 is half a
# nat there; a logprob of a wrong token or position is off by several).
LOGPROB_SPEC_TOL = 0.05


@dataclass
class Request:
    prompt: list[int]
    max_new_tokens: int
    delay: float = 0.0  # seconds after the workload starts
    # (request, tokens): starts once that request of the workload has produced that many
    # tokens, whatever the GPU's speed, so a batch walk through the tiers is the same on
    # every machine (the engine streams that request to see its progress).
    after: tuple[int, int] | None = None
    # What the request asks for besides its tokens (baselines always return logprobs).
    return_logprob: bool = False
    return_hidden_states: bool = False


@dataclass
class Workload:
    name: str
    requests: list[Request]
    note: str = ""


@dataclass
class EngineConfig:
    name: str
    algorithm: str | None  # None (baseline), EAGLE3, STANDALONE
    threshold: int | None = None
    hysteresis: int = 0
    cuda_graph: bool = True
    chunked_prefill: int | None = None
    workloads: list[str] = field(default_factory=list)
    # Server args of the fallback recipe that pick a code path (the golden scenarios' batches
    # are small, so paths chosen by batch size are forced here). Not passed where the switch is
    # upstream's, which has neither these paths nor their flags.
    fallback_args: dict[str, int | None] = field(default_factory=dict)
    # --enable-return-hidden-states: requests may ask for hidden states (the decode graphs
    # then capture them, so it is part of the settings a baseline must share).
    hidden_states: bool = False
    # The target: "dense" (the golden Llama) or "moe" (the golden Qwen3-MoE, golden_moe.py).
    model: str = "dense"
    attention: str = "triton"  # SGLang's attention backend
    # Served as users serve SGLang: `python -m sglang.launch_server` with the flags on its
    # command line, the workload sent to its HTTP API (server_worker.py); the same settings
    # as an in-process Engine, so it is compared with the same baseline.
    served: bool = False
    # --speculative-num-steps-tiers and its boundaries (the recipes add them on some releases
    # only; elsewhere the engine is skipped with the reason).
    tiers: tuple[int, ...] | None = None
    tier_boundaries: tuple[int, ...] | None = None
    # The release as published, without the recipes (stock.py): a control for a scenario
    # that fails on every patched engine.
    stock: bool = False

    @property
    def settings_key(self) -> tuple:
        """Engines with equal keys are comparable: same model and kernels apart from speculation."""
        return (self.cuda_graph, self.chunked_prefill, self.hidden_states, self.model, self.attention)

    def golden_key(self, workload: str) -> str:
        """The workload's name in the golden file: the dense target on triton attention keeps
        the plain name; another model or attention backend decodes tokens of its own."""
        variant = [x for x in (self.model, self.attention) if x not in ("dense", "triton")]
        return "/".join([*variant, workload])


@dataclass
class Expect:
    fallback_steps: str = "any"  # "zero" | "positive" | "all" | "any"
    spec_after_fallback: bool = False
    fallback_after_spec: bool = False
    min_acceptance: float | None = None
    resume_acceptance_not_lower: bool = False
    # "positive" | "zero" | "any": steps on the KV-only draft sync (the recipe's counter; not
    # checked where the switch is upstream's, which has no such path); "graph": positive, and
    # every one of them replayed from the sync's CUDA graphs (at every TP size).
    kv_only: str = "any"
    # "positive" | "any": prefills that wrote only the draft's K/V (the recipe's counter), where
    # the running batch makes them certain whatever the order the requests arrive in.
    kv_only_prefill: str = "any"
    # The engine's decode steps are counted (the recipe's stats file, or upstream's log): a
    # workload with no step counted would pass every step claim above vacuously. False for the
    # patch without the flag, whose decision must never run, so the recipe counts nothing.
    counted: bool = True
    # Mean acceptance of the speculative steps after the last fallback phase, at least this
    # (None: not claimed). With the trained EAGLE-3 head a draft cache kept in sync accepts
    # the copy task's drafts whole (4 per step); a random or stale one about 1 to 2.
    min_acceptance_after: float | None = None
    # The logprobs (of the token and the top 2) of the requests that ask for them equal the
    # baseline's within this relative tolerance (bf16 noise); None: not compared.
    logprobs_within: float | None = None
    # The hidden states of the requests that ask for them equal the baseline's decode steps'
    # within this tolerance, relative to the row's largest value; None: not compared.
    hidden_states_within: float | None = None
    # --speculative-num-steps-tiers: the draft steps of each tier (from the smallest batches
    # up, each step count once: the counters name a tier by it), every boundary between
    # neighbours crossed in both directions by the workload's batches.
    tiers: tuple[int, ...] | None = None
    # The acceptance of each positive tier's phases entered from another tier, at least this
    # share of the most it can accept (draft steps + 1): the trained head drafts the copy
    # task whole with its draft KV cache in sync; a stale one accepts far less.
    min_tier_acceptance: float | None = None
    # A served engine (EngineConfig.served): its log shows one spec-fallback line per switch
    # the counters count, drafting OFF above T and ON at or below T - H.
    switches_logged: bool = False
    # A served engine: SGLang's own /metrics count the workload's decode passes as the
    # counters count steps, and its decode tokens as their requests plus accepted drafts, so
    # a fallback step shows there as a pass of one token per request; every request and
    # generated token is counted once.
    metrics_agree: bool = False

    def __post_init__(self):
        if self.tiers and len(set(self.tiers)) != len(self.tiers):
            raise ValueError(
                f"Expect(tiers={self.tiers}): the tier walk names a tier by its step count, give each once"
            )


# The claims checked on the recipe's own counters and log lines (not where the switch is
# upstream's).
RECIPE_COUNTER_CLAIMS = ("kv_only", "kv_only_prefill", "switches_logged", "metrics_agree")


# The request kinds a workload's requests ask for, as the fallback's eligibility rule names
# them (runner.kept_speculative reads which kinds a release's rule keeps speculating).
REQUEST_KINDS = ("grammar", "logprob", "hidden_states")


def request_kinds(workload: Workload) -> set[str]:
    """The kinds of output the workload's requests ask for beyond their tokens."""
    kinds = set()
    for r in workload.requests:
        kinds |= {"logprob"} if r.return_logprob else set()
        kinds |= {"hidden_states"} if r.return_hidden_states else set()
    return kinds


def kept_speculative_claims(expect: Expect) -> Expect:
    """A scenario's claims on a release whose fallback keeps its requests' kind on the
    speculative path (a documented per-request rule): every step speculates (the rule is
    per batch, and each such workload keeps a request of that kind in every decode batch:
    one that asks from its first step to the workload's last), tokens stay exact and requested logprobs are the speculative path's (within LOGPROB_SPEC_TOL of plain
    decoding); hidden states are SGLang's speculative rows, not compared."""
    return Expect(
        "zero",
        counted=expect.counted,
        logprobs_within=LOGPROB_SPEC_TOL if expect.logprobs_within is not None else None,
    )


def expectations(expect: Expect, *, recipe_counters: bool = True) -> dict:
    """A scenario's claims as the run it is checked on can show them: without the recipe's
    counters (upstream's switch) its counter claims, and a claim that nothing is counted, are
    dropped."""
    claims = asdict(expect)
    if not recipe_counters:
        for claim in RECIPE_COUNTER_CLAIMS:
            claims.pop(claim)
        if not claims["counted"]:  # upstream's log shows every decode step, flag or not
            claims.pop("counted")
    return claims


@dataclass
class Scenario:
    name: str
    config: str
    workload: str
    expect: Expect
    what: str
    # The engine whose tokens this scenario's must equal, in place of plain decoding's: the
    # release as published (a stock config), for a workload on which the release's own
    # speculation differs from plain decoding. The difference from plain decoding is reported.
    reference: str | None = None


def workloads(spec: ModelSpec = ModelSpec(), seed: int = 1234) -> dict[str, Workload]:  # noqa: B008 - frozen
    rng = random.Random(seed)

    def batch(n, new, *, seg=None, repeats=2.5):
        return [Request(copy_prompt(rng, spec, segment=seg, repeats=repeats), new) for _ in range(n)]

    T = THRESHOLD
    w = [
        Workload("bs1", batch(1, 96), "one request"),
        Workload(f"bs{T - 1}", batch(T - 1, 64), "T-1 requests"),
        Workload(f"bs{T}", batch(T, 64), "T requests"),
        Workload(f"bs{T + 1}", batch(T + 1, 64), "T+1 requests"),
        Workload("bs8", batch(8, 64), "8 requests"),
        Workload(
            "stagger",
            [Request(copy_prompt(rng, spec), n) for n in (16, 24, 32, 40, 48, 56, 64, 72, 88, 104, 120, 128)],
            "12 requests finishing at staggered lengths: the batch falls below T mid-request",
        ),
        Workload(
            "arrive",
            [Request(copy_prompt(rng, spec, segment=16), 200) for _ in range(2)]
            + [Request(copy_prompt(rng, spec), 32, delay=0.1) for _ in range(8)],
            "2 long requests decode alone, 8 arrive (the batch rises above T mid-request) and "
            "finish first (it falls back below T): spec -> fallback -> spec inside the long ones",
        ),
        Workload(
            "long",
            [Request(copy_prompt(rng, spec, segment=36, repeats=5), 64) for _ in range(T + 2)],
            "long prompts (180 tokens, 3 chunks of 64) through chunked prefill",
        ),
        # Added after the others, so that their prompts (one random stream) stay as recorded.
        Workload(
            "logprobs",
            [Request(copy_prompt(rng, spec), 48, return_logprob=i in (0, 3)) for i in range(T + 1)],
            "T+1 requests, two of them asking for logprobs (top 2): the batch falls back all the same",
        ),
        Workload(
            "outputs",
            [
                Request(copy_prompt(rng, spec), 48, return_logprob=i in (1, 4), return_hidden_states=True)
                for i in range(T + 1)
            ],
            "T+1 requests, all asking for hidden states, two of them for logprobs",
        ),
        Workload(
            "arrive-logprobs",
            [Request(copy_prompt(rng, spec, segment=16), 200, return_logprob=True) for _ in range(2)]
            + [Request(copy_prompt(rng, spec), 32, delay=0.1, return_logprob=i in (0, 5)) for i in range(8)],
            "as arrive, the 2 long requests and 2 of the 8 arriving ones asking for logprobs (top 2): "
            "their logprobs cross speculative and fallback steps",
        ),
        Workload(
            "tier-walk",
            [Request(copy_prompt(rng, spec), 400)]
            + [Request(copy_prompt(rng, spec), 40, after=(0, 32)) for _ in range(2)]
            + [Request(copy_prompt(rng, spec), n, after=(0, 136)) for n in (24, 32, 40, 48, 56, 64)],
            "one long request decodes alone, 2 join after its 32nd token and leave, then 6 join "
            "after its 136th and leave one by one: the batch walks 1 -> 3 -> 1 -> 7 -> 6 ... 1",
        ),
    ]
    # The tier walk's long request alone at 480 tokens (its prompt, no draw from the stream).
    walk = w[-1]
    w.append(Workload("long-480", [Request(walk.requests[0].prompt, 480)], "one request of 480 tokens"))
    return {x.name: x for x in w}


# The fallback syncs the draft KV with a plain draft decode from 16 requests up and with a
# one-token draft extend below; the golden batches stay under 16, so two engines force the
# decode sync: the always-fallback engine (CUDA graphs) and the eager one (with a transition).
DRAFT_DECODE = {"speculative_disable_draft_decode_min_bs": 1}
# The KV-only draft sync on every fallback step (margin 0, the default), asked for by name,
# through a switch in both directions: the first speculative step after it drafts from zeros,
# and tokens stay exact. Its prefills write only the draft's K/V, and four steps share one
# graph replay (the default, asked for by name): tokens stay exact through its switches, where
# the queue is written before the speculative step's draft.
DRAFT_KV_ONLY = {"speculative_disable_kv_only_margin": 0, "speculative_disable_kv_only_steps_per_replay": 4}
# The engines whose scenarios claim the full draft sync inside a margin of 8 (T+1 at T=4; 8
# requests at T=0, where 9-12 requests take the KV-only one) ask for that margin by name.
MARGIN_8 = {"speculative_disable_kv_only_margin": 8}
# The T=0 engine writes each KV-only step in its own graph replay.
KV_ONLY_EACH_STEP = {"speculative_disable_kv_only_steps_per_replay": 1}


# The tiers engine: 3 draft steps for one request, 1 for 2-4, the fallback above T = 4 (the
# last boundary), so the golden batches cross both boundaries. Within the margin of 8 its
# fallback syncs the draft in full, so every tier's first step drafts from a real state.
TIERS = (3, 1, 0)
TIER_BOUNDARIES = (1, THRESHOLD)
TIER_ACCEPTANCE = HEAD_ACCEPTANCE / 4  # of steps + 1, as the 3-step engines' floor is of 4
# Tiers need not shorten, and a step count may serve two ranges (its tier walk names tiers by
# step count, so its claims are tokens and acceptance, not the boundaries crossed).
TIERS_ONE_COUNT_TWICE = (1, 3, 1, 0)


def configs() -> list[EngineConfig]:
    T = THRESHOLD
    return [
        EngineConfig(
            "base-graph",
            None,
            workloads=[
                "bs1",
                f"bs{T - 1}",
                f"bs{T}",
                f"bs{T + 1}",
                "bs8",
                "stagger",
                "arrive",
                "logprobs",
                "tier-walk",
                "long-480",
            ],
        ),
        EngineConfig("base-eager", None, cuda_graph=False, workloads=[f"bs{T + 1}", "stagger"]),
        EngineConfig("base-chunked", None, chunked_prefill=64, workloads=["long"]),
        EngineConfig("base-hidden", None, hidden_states=True, workloads=["outputs"]),
        EngineConfig(
            "eagle3-t4",
            "EAGLE3",
            T,
            workloads=["bs1", f"bs{T - 1}", f"bs{T}", f"bs{T + 1}", "stagger", "arrive", "logprobs", "tier-walk"],
            fallback_args=MARGIN_8,
        ),
        EngineConfig(
            "eagle3-t0",
            "EAGLE3",
            0,
            workloads=["bs8", "stagger"],
            fallback_args={**DRAFT_DECODE, **KV_ONLY_EACH_STEP, **MARGIN_8},
        ),
        EngineConfig(
            "eagle3-t4-eager",
            "EAGLE3",
            T,
            cuda_graph=False,
            workloads=[f"bs{T + 1}", "stagger"],
            fallback_args={**DRAFT_DECODE, **MARGIN_8},
        ),
        EngineConfig("eagle3-t4-chunked", "EAGLE3", T, chunked_prefill=64, workloads=["long"], fallback_args=MARGIN_8),
        EngineConfig(
            "eagle3-t4-kv-only", "EAGLE3", T, workloads=[f"bs{T + 1}", "stagger", "arrive"], fallback_args=DRAFT_KV_ONLY
        ),
        # --speculative-num-steps-tiers 3,1,0 with boundaries 1,4 (0.5.12).
        EngineConfig(
            "eagle3-tiers",
            "EAGLE3",
            T,
            workloads=["stagger", "arrive", "tier-walk"],
            fallback_args=MARGIN_8,
            tiers=TIERS,
            tier_boundaries=TIER_BOUNDARIES,
        ),
        # A longer draft at larger batches, and one step count in two tiers: 1 draft step for
        # one request and again for 3-4, 3 for 2, the fallback above
        # (--speculative-num-steps-tiers 1,3,1,0 at 1,2,4): the 1-step state has the CUDA graphs
        # of both its ranges.
        EngineConfig(
            "eagle3-tiers-1310",
            "EAGLE3",
            T,
            workloads=["tier-walk"],
            fallback_args=MARGIN_8,
            tiers=TIERS_ONE_COUNT_TWICE,
            tier_boundaries=(1, 2, T),
        ),
        # The tiers without the fallback: 3 draft steps for one request, 1 above.
        EngineConfig(
            "eagle3-tiers-31",
            "EAGLE3",
            None,
            workloads=["tier-walk"],
            tiers=TIERS[:2],
            tier_boundaries=TIER_BOUNDARIES[:1],
        ),
        EngineConfig("standalone-t4", "STANDALONE", T, workloads=["bs1", "stagger", "arrive"]),
        # STANDALONE returns the target's final hidden states, as the no-speculation engine does
        # (an EAGLE-3 target returns its EAGLE-3 features instead, on every kind of step).
        EngineConfig("standalone-t4-hidden", "STANDALONE", T, hidden_states=True, workloads=["outputs"]),
        # The patch without the flag: what every user who has not opted in runs.
        EngineConfig("eagle3-unset", "EAGLE3", None, workloads=["bs8", "stagger", "tier-walk", "long-480"]),
        # EAGLE-3 on the release as published: whether a request the patched engines decode
        # differently from plain decoding is the release's own.
        EngineConfig("eagle3-stock", "EAGLE3", None, workloads=["long-480"], stock=True),
        # A second target architecture, MoE (golden_moe.py: router top-k, fused experts, its
        # own trained EAGLE-3 head), and a second attention backend, flashinfer, for the dense
        # target: each through both transitions on the fallback's defaults (the KV-only draft
        # sync), as users run it. flashinfer compiles its kernels at first use, so its engines
        # come first in the run.
        EngineConfig("base-flashinfer", None, attention="flashinfer", workloads=["stagger", "arrive-logprobs"]),
        EngineConfig(
            "eagle3-t4-flashinfer", "EAGLE3", T, attention="flashinfer", workloads=["stagger", "arrive-logprobs"]
        ),
        EngineConfig("base-moe", None, model="moe", workloads=["stagger", "arrive-logprobs"]),
        EngineConfig("eagle3-moe-t4", "EAGLE3", T, model="moe", workloads=["stagger", "arrive-logprobs"]),
        # The HTTP server with the flag and the fallback's defaults, as users run it.
        EngineConfig("eagle3-t4-http", "EAGLE3", T, workloads=["arrive"], served=True),
    ]


# Both transitions on the fallback's defaults (the KV-only draft sync), with the trained
# head's acceptance floor after speculation resumes; engines add claims of their own.
KV_ONLY_DOWN = Expect(
    "positive",
    spec_after_fallback=True,
    kv_only="positive",
    kv_only_prefill="positive",
    min_acceptance_after=HEAD_ACCEPTANCE,
)
KV_ONLY_UP = Expect(
    "positive",
    fallback_after_spec=True,
    spec_after_fallback=True,
    kv_only="positive",
    min_acceptance_after=HEAD_ACCEPTANCE,
)


def scenarios() -> list[Scenario]:
    T = THRESHOLD
    s = [
        Scenario(
            "eagle3 always-fallback (T=0)",
            "eagle3-t0",
            "bs8",
            Expect("all", kv_only="zero"),
            "threshold 0, draft decode sync (8 requests: within the KV-only margin)",
        ),
        Scenario(
            "eagle3 always-fallback stagger (T=0)",
            "eagle3-t0",
            "stagger",
            Expect("all", kv_only="graph", kv_only_prefill="positive"),
            "threshold 0: KV-only prefill and sync (CUDA graph) above 8 requests (margin 8), then draft decode",
        ),
        Scenario(
            "eagle3 bs=1 (always spec)",
            "eagle3-t4",
            "bs1",
            Expect("zero", min_acceptance=HEAD_ACCEPTANCE),
            "threshold far above the batch",
        ),
        Scenario(
            f"eagle3 bs=T-1={T - 1}",
            "eagle3-t4",
            f"bs{T - 1}",
            Expect("zero", min_acceptance=HEAD_ACCEPTANCE),
            "below threshold",
        ),
        Scenario(
            f"eagle3 bs=T={T}",
            "eagle3-t4",
            f"bs{T}",
            Expect("zero", min_acceptance=HEAD_ACCEPTANCE),
            "at threshold (drafting stays on)",
        ),
        Scenario(
            f"eagle3 bs=T+1={T + 1}",
            "eagle3-t4",
            f"bs{T + 1}",
            Expect("positive", kv_only="zero"),
            "above threshold, within the KV-only margin: full draft sync",
        ),
        Scenario(
            "eagle3 transition down",
            "eagle3-t4",
            "stagger",
            Expect("positive", spec_after_fallback=True, min_acceptance_after=HEAD_ACCEPTANCE),
            "batch shrinks below T: speculation resumes mid-request, drafting from the synced draft KV",
        ),
        Scenario(
            "eagle3 transition up",
            "eagle3-t4",
            "arrive",
            Expect(
                "positive",
                fallback_after_spec=True,
                spec_after_fallback=True,
                min_acceptance=HEAD_ACCEPTANCE,
                min_acceptance_after=HEAD_ACCEPTANCE,
            ),
            "requests arrive while others decode: fallback starts mid-request, then spec resumes",
        ),
        Scenario(
            "eagle3 logprob requests fall back",
            "eagle3-t4",
            "logprobs",
            Expect("all", logprobs_within=LOGPROB_TOL),
            "T+1 requests, two asking for logprobs: every step falls back, their logprobs are plain decoding's",
        ),
        Scenario(
            "eagle3 no CUDA graph",
            "eagle3-t4-eager",
            f"bs{T + 1}",
            Expect("positive"),
            "eager target and draft, draft decode sync",
        ),
        Scenario(
            "eagle3 no CUDA graph transition",
            "eagle3-t4-eager",
            "stagger",
            Expect("positive", spec_after_fallback=True, min_acceptance_after=HEAD_ACCEPTANCE),
            "eager, draft decode sync, then speculation resumes",
        ),
        Scenario(
            "eagle3 chunked prefill long prompt",
            "eagle3-t4-chunked",
            "long",
            Expect("positive"),
            "chunked prefill (64), 180-token prompts",
        ),
        Scenario(
            "eagle3 KV-only draft sync",
            "eagle3-t4-kv-only",
            f"bs{T + 1}",
            Expect("positive", kv_only="graph"),
            "KV-only draft sync above T (margin 0, the default), replayed from its CUDA graph padded to a captured size",
        ),
        Scenario(
            "eagle3 KV-only transition down",
            "eagle3-t4-kv-only",
            "stagger",
            KV_ONLY_DOWN,
            "KV-only prefill and sync, then speculation resumes from zero drafts over that draft KV",
        ),
        Scenario(
            "eagle3 KV-only transition up",
            "eagle3-t4-kv-only",
            "arrive",
            KV_ONLY_UP,
            "KV-only sync mid-request",
        ),
        Scenario(
            "tiers shrink 3,1,0",
            "eagle3-tiers",
            "stagger",
            Expect("positive", spec_after_fallback=True, min_tier_acceptance=TIER_ACCEPTANCE),
            "12 requests finishing one by one: fallback above 4, 1 draft step at 2-4, 3 at 1, each tier "
            "drafting from the draft KV the one before kept",
        ),
        Scenario(
            "tiers arrive 1,0",
            "eagle3-tiers",
            "arrive",
            Expect(
                "positive",
                fallback_after_spec=True,
                spec_after_fallback=True,
                tiers=TIERS[1:],
                min_tier_acceptance=TIER_ACCEPTANCE,
            ),
            "2 long requests on 1 draft step, 8 arrive (fallback) and leave: back to 1 draft step mid-request",
        ),
        Scenario(
            "tiers every boundary both ways",
            "eagle3-tiers",
            "tier-walk",
            Expect("positive", tiers=TIERS, min_tier_acceptance=TIER_ACCEPTANCE),
            "a long request on 3 draft steps while 2 requests join and leave (1 step), then 6 (fallback, "
            "then 1 step, then 3): every boundary crossed up and down",
        ),
        Scenario(
            "tiers 1,3,1,0 one step count in two tiers",
            "eagle3-tiers-1310",
            "tier-walk",
            Expect("positive", spec_after_fallback=True, min_tier_acceptance=TIER_ACCEPTANCE),
            "the tier walk with 1 draft step at one request and again at 3-4 (one state, the graphs of "
            "both ranges), 3 at 2, the fallback above: tokens exact and drafts accepted in every tier it enters",
        ),
        Scenario(
            "eagle3 long request through both transitions",
            "eagle3-t4",
            "tier-walk",
            Expect(
                "positive", fallback_after_spec=True, spec_after_fallback=True, min_acceptance_after=HEAD_ACCEPTANCE
            ),
            "the tier walk on the binary switch: a 400-token request through spec -> fallback -> spec",
        ),
        Scenario(
            "tiers 3,1 without the fallback",
            "eagle3-tiers-31",
            "tier-walk",
            Expect(counted=False),
            "3 draft steps for one request, 1 for more, no threshold: the fallback's decision never runs",
        ),
        Scenario(
            "standalone bs=1 (high acceptance)",
            "standalone-t4",
            "bs1",
            Expect("zero", min_acceptance=2.0),
            "multi-token accept path",
        ),
        Scenario(
            "standalone transition down",
            "standalone-t4",
            "stagger",
            Expect("positive", spec_after_fallback=True),
            "batch shrinks below T: speculation resumes mid-request",
        ),
        Scenario(
            "standalone spec-fallback-spec",
            "standalone-t4",
            "arrive",
            Expect("positive", fallback_after_spec=True, spec_after_fallback=True, resume_acceptance_not_lower=True),
            "draft KV kept in sync: acceptance after resume >= before",
        ),
        Scenario(
            "standalone hidden states and logprobs",
            "standalone-t4-hidden",
            "outputs",
            Expect("all", logprobs_within=LOGPROB_TOL, hidden_states_within=HIDDEN_TOL),
            "T+1 requests asking for hidden states, two for logprobs: every step falls back, their "
            "logprobs and hidden states are plain decoding's",
        ),
        Scenario(
            "eagle3 patched, flag unset",
            "eagle3-unset",
            "bs8",
            Expect(counted=False),
            "the release's own path on every step, prefill included",
        ),
        Scenario(
            "eagle3 patched, flag unset, long request",
            "eagle3-unset",
            "tier-walk",
            Expect(counted=False),
            "the tier walk on the release's own path: a 400-token request among joining ones",
        ),
        Scenario(
            "eagle3 patched, flag unset, 480 tokens",
            "eagle3-unset",
            "long-480",
            Expect(counted=False),
            "one request of 480 tokens on the patch without the flag, token for token the release as "
            "published (whose EAGLE-3 differs from plain decoding on it)",
            reference="eagle3-stock",
        ),
        Scenario(
            "eagle3 patched, flag unset stagger",
            "eagle3-unset",
            "stagger",
            Expect(counted=False),
            "requests finishing one by one, no flag",
        ),
        Scenario(
            "eagle3 HTTP server transition up",
            "eagle3-t4-http",
            "arrive",
            replace(KV_ONLY_UP, switches_logged=True, metrics_agree=True),
            "python -m sglang.launch_server, requests from concurrent HTTP clients: spec -> fallback -> spec, "
            "each switch in the server log, the fallback's decode passes in SGLang's /metrics",
        ),
    ]
    for label, config in (("moe", "eagle3-moe-t4"), ("flashinfer", "eagle3-t4-flashinfer")):
        s += [
            Scenario(
                f"{label} eagle3 transition down",
                config,
                "stagger",
                KV_ONLY_DOWN,
                "KV-only prefill and sync (the defaults), then speculation resumes drafting from the synced draft KV",
            ),
            Scenario(
                f"{label} eagle3 transition up, logprobs",
                config,
                "arrive-logprobs",
                replace(KV_ONLY_UP, logprobs_within=LOGPROB_SPEC_TOL),
                "spec -> fallback -> spec inside the long requests, which ask for logprobs: their logprobs "
                "across both kinds of step are plain decoding's",
            ),
        ]
    return s


def baseline_for(cfg: EngineConfig, all_configs: list[EngineConfig], workload: str) -> EngineConfig:
    for b in all_configs:
        if b.algorithm is None and b.settings_key == cfg.settings_key and workload in b.workloads:
            return b
    raise KeyError(f"no baseline engine runs workload {workload} with settings {cfg.settings_key}")


def join_problems(wl: Workload) -> list[str]:
    """A request that joins by tokens waits on an earlier request of its workload, which the
    engine streams; one that named itself, a later request or none there would wait forever."""
    return [
        f"{wl.name}: request {i} joins after request {r.after[0]}, which is not an earlier request"
        for i, r in enumerate(wl.requests)
        if r.after and not 0 <= r.after[0] < i
    ]


def check_plan() -> list[str]:
    """Consistency of the tables above (run by the CPU tests)."""
    problems = []
    cfgs = {c.name: c for c in configs()}
    wl = workloads()
    for w in wl.values():
        problems += join_problems(w)
    for s in scenarios():
        c = cfgs.get(s.config)
        if c is None:
            problems.append(f"{s.name}: unknown config {s.config}")
            continue
        if s.workload not in c.workloads:
            problems.append(f"{s.name}: config {c.name} does not run workload {s.workload}")
        if s.workload not in wl:
            problems.append(f"{s.name}: unknown workload {s.workload}")
        if c.served and any(r.after for r in wl.get(s.workload, Workload("", [])).requests):
            problems.append(f"{s.name}: the HTTP clients send requests at their delays; {s.workload} joins by tokens")
        ref = cfgs.get(s.reference) if s.reference else None
        if s.reference and (ref is None or not ref.stock or s.workload not in ref.workloads):
            problems.append(f"{s.name}: reference {s.reference} is not a stock config running {s.workload}")
        try:
            baseline_for(c, list(cfgs.values()), s.workload)
        except KeyError as exc:
            problems.append(f"{s.name}: {exc}")
    return problems
