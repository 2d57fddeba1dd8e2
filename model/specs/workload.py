"""Workload profiles: the traffic a deployment serves, as data (`data/workloads/*.yaml`).

Two kinds: `sessions` (agentic), chains of turns whose context only grows, each turn resending
the whole context of which only the growth misses the prefix cache, pausing between turns (tool or
think time) and forking subagents; `requests`, independent requests (fixed-length benchmarks,
Mooncake, Azure), with an arrival rate where the source trace has one.

Every distribution is data: a fixed value, a lognormal, empirical quantiles (fitted from a trace
by `model.fit.workload`), or a weighted mixture of those. `Workload.request_mix(n, seed)` draws
the per-request (context, uncached, output, gap) sample the closed form and the simulator share.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import yaml
from pydantic import Field, ValidationError, model_validator

from model import ROOT
from model.specs import distributions
from model.specs.defaults import SYSTEM_IDLE_CAP_S, TURN_GAP_CAP_S
from model.specs.distributions import Distribution, ProfileModel
from model.specs.draw_cache import cached_arrays, entry_key
from model.specs.errors import ServecastError, SpecError
from model.specs.specio import load_yaml

WORKLOADS_DIR = ROOT / "data" / "workloads"
MIX_FIELDS = ("context_tokens", "uncached_tokens", "output_tokens", "gap_s", "wall_weight")


class Subagents(ProfileModel):
    """Fork-join children of a session: each run is its own short chain of requests."""

    session_fraction: float = Field(ge=0, le=1)  # sessions with at least one subagent run
    runs_per_session: Distribution  # runs, given the session has subagents
    requests_per_run: Distribution
    first_input_tokens: Distribution
    context_growth_tokens: Distribution
    output_tokens: Distribution
    think_time_s: Distribution
    source: str = ""


class QuantileMap(ProfileModel):
    """A monotone map of a per-request quantity, quantile to quantile (`source`: the generator's
    own request-level quantiles, `target`: the published ones at the same probabilities), in
    log space, flat in ratio beyond the ends. It brings a generator's law to a corpus whose
    requests are described only by quantiles."""

    source: tuple[float, ...]
    target: tuple[float, ...]
    note: str = ""

    @model_validator(mode="after")
    def _check(self) -> QuantileMap:
        src, tgt = np.asarray(self.source), np.asarray(self.target)
        if len(src) != len(tgt) or len(src) < 2:
            raise ValueError("source and target must have the same length (at least 2)")
        if np.any(src <= 0) or np.any(tgt <= 0) or np.any(np.diff(src) <= 0) \
                or np.any(np.diff(tgt) < 0):
            raise ValueError("source must increase strictly, target must not decrease, both > 0")
        return self

    def ratio(self, values: np.ndarray) -> np.ndarray:
        """target / source at each value (log-space interpolation, constant beyond the ends)."""
        ls, lt = np.log(self.source), np.log(self.target)
        return np.exp(np.interp(np.log(np.maximum(values, 1.0)), ls, lt - ls))


class ContextMap(QuantileMap):
    """The map of request contexts (AgentX v1.0's stated ISL quantiles). Each request's uncached
    tokens scale with its context, so per-request hit rates are kept."""

    def apply(self, ctx: np.ndarray, unc: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        ratio = self.ratio(ctx)
        return np.maximum(np.round(ctx * ratio), 1.0), np.maximum(np.round(unc * ratio), 1.0)


class UncachedMap(QuantileMap):
    """The map of each request's uncached (new prefill) tokens, applied after the context map,
    capped at the request's context: a corpus's stated per-turn new-prefill law in place of the
    generator's (whose growth, resets and first prompts come from another corpus)."""

    def apply(self, unc: np.ndarray, ctx: np.ndarray) -> np.ndarray:
        return np.clip(np.round(unc * self.ratio(unc)), 1.0, ctx)


class Arrivals(ProfileModel):
    """Open-loop arrival process recorded in the source trace (for trace-derived profiles)."""

    rate_per_s: float = Field(gt=0)
    interarrival_cv: float = Field(ge=0)  # coefficient of variation of inter-arrival times
    source: str = ""


class Workload(ProfileModel):
    name: str
    description: str
    source: str  # trace or paper the profile was fitted to, with its date
    date: str  # when the profile was fitted or written
    kind: Literal["sessions", "requests"]
    hit_rate: float = Field(ge=0, le=1)  # token-weighted prefix-cache hit (infinite cache)
    hit_rate_source: str = ""
    # requests-kind profiles
    input_tokens: Distribution | None = None
    output_tokens: Distribution | None = None
    arrivals: Arrivals | None = None
    # sessions-kind profiles
    turns_per_session: Distribution | None = None
    first_input_tokens: Distribution | None = None
    context_growth_tokens: Distribution | None = None
    reset_probability: float = Field(default=0.0, ge=0, le=1)  # turn recomputes its whole context
    think_time_s: Distribution | None = None
    max_context_tokens: float = Field(default=1_000_000, gt=0)
    subagents: Subagents | None = None
    # share of a subagent request's gap and response that lengthens its session: subagents run
    # beside the parent's own turns and tool gaps (1: in series with the parent)
    subagent_wall_share: float = Field(default=1.0, ge=0, le=1)
    subagent_wall_share_source: str = ""
    context_map: ContextMap | None = None  # applied to every generated request (sessions kind)
    uncached_map: UncachedMap | None = None  # then this, to every request's uncached tokens
    # sessions resampled whole from a recorded trace (AgentX derived requests CSV, repository
    # path) instead of generated from the distributions above
    bootstrap: str | None = None
    checks: dict[str, float] = Field(default_factory=dict)  # published statistics to compare

    @model_validator(mode="after")
    def _kind_fields(self) -> Workload:
        need = {"requests": ("input_tokens", "output_tokens"),
                "sessions": ("turns_per_session", "first_input_tokens", "context_growth_tokens",
                             "think_time_s", "output_tokens")}[self.kind]
        if self.bootstrap is not None:
            if self.kind != "sessions":
                raise ValueError("bootstrap applies to kind 'sessions' only")
            if not (ROOT / self.bootstrap).is_file():
                raise ValueError(f"bootstrap trace {self.bootstrap!r} not found under the "
                                 "repository")
            need = ()
        missing = [k for k in need if getattr(self, k) is None]
        if missing:
            raise ValueError(f"kind {self.kind!r} needs {', '.join(missing)}")
        return self

    def sessions(self, n: int, seed: int = 0) -> list[SessionSpec]:
        """Draw `n` synthetic sessions (sessions kind) or `n` one-request sessions (requests)."""
        return _draw_sessions(self, n, seed)

    def request_mix(self, n: int = 20_000, seed: int = 0, hit_rate: float | None = None
                    ) -> RequestMix:
        """A request-weighted sample of (context, uncached, output, gap) of about `n` requests.

        `hit_rate` (token-weighted) overrides the profile's: the cached part of every request is
        scaled by hit_rate / (the sample's own hit), so a cache model's number plugs in directly.
        """
        return _request_mix(self, n, seed, hit_rate)


@dataclass(frozen=True)
class SessionSpec:
    """One synthetic session: per request, in order (subagent runs are inlined after the parent
    turn that spawned them; how much of their time lengthens the session is the workload's
    `subagent_wall_share`)."""

    context_tokens: np.ndarray
    uncached_tokens: np.ndarray
    output_tokens: np.ndarray
    gap_s: np.ndarray  # idle time before each request (0 for the first)
    subagent: np.ndarray  # bool: request belongs to a subagent run
    run: np.ndarray | None = None  # subagent run number (0 = main agent)


@dataclass(frozen=True)
class RequestMix:
    context_tokens: np.ndarray
    uncached_tokens: np.ndarray
    output_tokens: np.ndarray
    gap_s: np.ndarray
    # per request: the share of its gap and response that lengthens its session (the
    # workload's subagent_wall_share for subagent requests, 1 otherwise); None: all 1
    wall_weight: np.ndarray | None = None

    @functools.cached_property
    def gap_s_ascending(self) -> np.ndarray:
        """The gaps sorted once: the queue laws read their distribution at every solver step."""
        return np.sort(self.gap_s)

    @functools.cached_property
    def uncached_tokens_distinct(self) -> tuple[np.ndarray, np.ndarray]:
        """(distinct uncached counts, each request's index into them), found once."""
        return np.unique(self.uncached_tokens, return_inverse=True)

    @functools.cached_property
    def output_tokens_ascending(self) -> np.ndarray:
        """The output lengths sorted once (the decode times the queue laws read scale them)."""
        return np.sort(self.output_tokens)

    @property
    def lanes_per_session(self) -> float:
        """Request chains a session keeps in flight on average, 1 / E[wall_weight]: a closed
        loop's sessions times this are the chains whose gaps and responses fill the clock."""
        return 1.0 if self.wall_weight is None else 1.0 / float(np.mean(self.wall_weight))

    @property
    def hit_rate(self) -> float:
        total = float(self.context_tokens.sum())
        return 0.0 if total == 0 else 1.0 - float(self.uncached_tokens.sum()) / total

    def __len__(self) -> int:
        return len(self.context_tokens)


def _chain(rng, n_req: int, first: Distribution, growth: Distribution, reset_p: float,
           max_ctx: float) -> tuple[np.ndarray, np.ndarray]:
    """Context and uncached tokens of a chain of `n_req` turns (first turn is cold)."""
    c0 = max(first.sample(rng, 1)[0], 1.0)
    deltas = growth.sample(rng, n_req)  # negative deltas are compactions
    deltas[0] = c0
    ctx = _clipped_levels(deltas, max_ctx)
    unc = ctx.copy()  # the growth over the previous turn (the first turn: all of it)
    unc[1:] -= ctx[:-1]
    unc = np.maximum(unc, 1.0)
    resets = (rng.random(n_req) < reset_p) | (deltas < 0)
    resets[0] = True
    unc[resets] = ctx[resets]
    return np.round(ctx), np.maximum(np.round(unc), 1.0)


def _clipped_levels(deltas: np.ndarray, max_ctx: float) -> np.ndarray:
    """Running context after each delta, never below a few blocks (64 tokens) nor above
    `max_ctx`: the plain running sum where it stays inside those bounds (almost every chain),
    else step by step."""
    ctx = np.cumsum(deltas)
    if ctx.size == 0 or (ctx.min() >= 64.0 and ctx.max() <= max_ctx):
        return ctx
    level = 0.0
    for i, d in enumerate(deltas):
        level = min(max(level + d, 64.0), max_ctx)
        ctx[i] = level
    return ctx


@functools.lru_cache(maxsize=4)
def recorded_sessions(path: str) -> tuple[SessionSpec, ...]:
    """Every trace of an AgentX derived requests CSV (columns `cols`) as a session: its main
    and subagent requests in time order; uncached = in - inf_cache_hit_tokens (the trace's own
    infinite-cache prefix hit), gap = the recorded think time (0 before the first request)."""
    import pandas as pd  # only recorded sessions need pandas: kept off the import path

    cols = ["trace_id", "kind", "t_s", "in", "out", "inf_cache_hit_tokens", "think_time_s"]
    try:
        df = pd.read_csv(ROOT / path, usecols=cols)
    except (OSError, ValueError) as err:
        raise SpecError(path, "<root>", f"not an AgentX derived requests CSV ({err})") from None
    df = df.sort_values(["trace_id", "t_s"], kind="stable")
    # whole columns once, then split at trace boundaries (a pandas groupby per trace would
    # dominate a fresh process's first plan)
    ctx_all = np.maximum(df["in"].to_numpy(float), 1.0)
    unc_all = np.clip(ctx_all - df["inf_cache_hit_tokens"].to_numpy(float), 1.0, ctx_all)
    gap_all = np.nan_to_num(df["think_time_s"].to_numpy(float), nan=0.0)
    out_all = np.maximum(df["out"].to_numpy(float), 1.0)
    sub_all = (df["kind"] != "main").to_numpy()
    ids = df["trace_id"].to_numpy()
    starts = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]])
    out = []
    for a, b in zip(starts, np.r_[starts[1:], len(ids)], strict=True):
        gap = gap_all[a:b].copy()
        gap[0] = 0.0
        sub = sub_all[a:b]
        out.append(SessionSpec(ctx_all[a:b], unc_all[a:b], out_all[a:b], gap, sub,
                               np.cumsum(np.r_[False, sub[1:] & ~sub[:-1]]) * sub))
    return tuple(out)


def _draw_sessions(w: Workload, n: int, seed: int) -> list[SessionSpec]:
    rng = np.random.default_rng(seed)
    if w.bootstrap is not None:  # whole recorded sessions, drawn with replacement
        pool = recorded_sessions(w.bootstrap)
        return [pool[i] for i in rng.integers(0, len(pool), n)]
    out: list[SessionSpec] = []
    if w.kind == "requests":
        ctx = np.maximum(np.round(w.input_tokens.sample(rng, n)), 1.0)
        osl = np.maximum(np.round(w.output_tokens.sample(rng, n)), 1.0)
        unc = np.maximum(np.round(ctx * (1.0 - w.hit_rate)), 1.0)
        for i in range(n):
            out.append(SessionSpec(ctx[i:i + 1], unc[i:i + 1], osl[i:i + 1], np.zeros(1),
                                   np.zeros(1, bool)))
        return out
    for _ in range(n):
        turns = int(max(1, round(w.turns_per_session.sample(rng, 1)[0])))
        ctx, unc = _chain(rng, turns, w.first_input_tokens, w.context_growth_tokens,
                          w.reset_probability, w.max_context_tokens)
        osl = np.maximum(np.round(w.output_tokens.sample(rng, turns)), 1.0)
        gap = w.think_time_s.sample(rng, turns)
        gap[0] = 0.0
        sub = np.zeros(turns, bool)
        parts = [(ctx, unc, osl, gap, sub, np.zeros(turns, int))]
        sa = w.subagents
        if sa is not None and rng.random() < sa.session_fraction:
            runs = int(max(1, round(sa.runs_per_session.sample(rng, 1)[0])))
            spawn_after = np.sort(rng.integers(0, turns, runs))
            pieces, last = [], 0
            for r_no, k in enumerate(spawn_after, start=1):  # splice each run after its spawn
                pieces.append(tuple(a[last:k + 1] for a in parts[0]))
                last = k + 1
                m = int(max(1, round(sa.requests_per_run.sample(rng, 1)[0])))
                c, u = _chain(rng, m, sa.first_input_tokens, sa.context_growth_tokens, 0.0,
                              w.max_context_tokens)
                o = np.maximum(np.round(sa.output_tokens.sample(rng, m)), 1.0)
                g = sa.think_time_s.sample(rng, m)
                pieces.append((c, u, o, g, np.ones(m, bool), np.full(m, r_no)))
            pieces.append(tuple(a[last:] for a in parts[0]))
            parts = pieces
        spec = SessionSpec(*(np.concatenate([p[i] for p in parts]) for i in range(6)))
        if w.context_map is not None:
            ctx, unc = w.context_map.apply(spec.context_tokens, spec.uncached_tokens)
            ctx = np.minimum(ctx, w.max_context_tokens)
            spec = SessionSpec(ctx, np.minimum(unc, ctx),
                               *(getattr(spec, f) for f in ("output_tokens", "gap_s",
                                                            "subagent", "run")))
        if w.uncached_map is not None:
            spec = dataclasses.replace(
                spec, uncached_tokens=w.uncached_map.apply(spec.uncached_tokens,
                                                           spec.context_tokens))
        out.append(spec)
    return out


def _request_mix(w: Workload, n: int, seed: int, hit_rate: float | None) -> RequestMix:
    mix = _drawn_mix(w, n, seed)
    if hit_rate is None:
        return mix
    if not 0.0 <= hit_rate < 1.0:
        raise ServecastError(f"hit_rate: {hit_rate} is outside [0, 1)")
    own = mix.hit_rate
    cached = mix.context_tokens - mix.uncached_tokens
    scale = hit_rate / own if own > 0 else 0.0
    if own == 0:  # no cached part in the profile: spread the requested hit uniformly
        uncached = np.maximum(np.round(mix.context_tokens * (1 - hit_rate)), 1.0)
    else:
        uncached = np.maximum(np.round(mix.context_tokens - np.minimum(cached * scale,
                                                                      mix.context_tokens)), 1.0)
    return dataclasses.replace(mix, uncached_tokens=uncached)


def _drawn_mix(w: Workload, n: int, seed: int) -> RequestMix:
    """The request-weighted draw of about `n` requests, through the disk cache of draws
    (model.specs.draw_cache) unless it replays recorded sessions from a file."""
    if w.bootstrap is not None:
        return _draw_mix(w, n, seed)
    key = entry_key(f"{w.model_dump_json()}|{n}|{seed}", (sys.modules[__name__], distributions))

    def draw() -> dict[str, np.ndarray]:
        mix = _draw_mix(w, n, seed)
        return {f: getattr(mix, f) for f in MIX_FIELDS if getattr(mix, f) is not None}

    arrays = cached_arrays("request-mix", key, draw)
    return RequestMix(*(arrays.get(f) for f in MIX_FIELDS))


def _draw_mix(w: Workload, n: int, seed: int) -> RequestMix:
    if w.kind == "requests":
        sessions = _draw_sessions(w, n, seed)
    else:
        sessions, count = [], 0
        rng_seed = seed
        while count < n:  # draw sessions until about n requests (request-weighted mix)
            batch = _draw_sessions(w, 64, rng_seed)
            rng_seed += 1
            for s in batch:
                sessions.append(s)
                count += len(s.context_tokens)
                if count >= n:
                    break
    return RequestMix(*(np.concatenate([getattr(s, f) for s in sessions])
                        for f in MIX_FIELDS[:4]), _wall_weight(w, sessions))


def _wall_weight(w: Workload, sessions: list[SessionSpec]) -> np.ndarray | None:
    if w.subagent_wall_share == 1.0:
        return None
    sub = np.concatenate([s.subagent for s in sessions])
    return np.where(sub, w.subagent_wall_share, 1.0) if sub.any() else None


# ------------------------------------------------------------------ loading

def list_workloads() -> list[str]:
    return sorted(p.stem for p in WORKLOADS_DIR.glob("*.yaml"))


def _format_error(err: ValidationError) -> tuple[str, str]:
    first = err.errors()[0]
    key = ".".join(str(p) for p in first["loc"] if not isinstance(p, int) or True) or "<root>"
    return key, first["msg"]


def workload_from_dict(data: object, path: object = "<dict>") -> Workload:
    if not isinstance(data, dict):
        raise SpecError(path, "<root>", "expected a mapping of workload fields")
    try:
        return Workload.model_validate(data)
    except ValidationError as err:
        key, msg = _format_error(err)
        raise SpecError(path, key, msg) from None


@functools.lru_cache(maxsize=64)
def load_workload(name_or_path: str) -> Workload:
    """Load and validate a profile by name (`agentx`) or by path to a YAML file."""
    path = Path(name_or_path)
    if not (path.suffix in (".yaml", ".yml") and path.exists()):
        path = WORKLOADS_DIR / f"{name_or_path}.yaml"
    if not path.exists():
        raise ServecastError(f"unknown workload {name_or_path!r}; allowed: "
                             f"{', '.join(list_workloads())} or a path to a .yaml profile")
    try:
        data = load_yaml(path.read_text())
    except yaml.YAMLError as err:
        raise SpecError(path, "<root>", f"not valid YAML ({err.__class__.__name__})") from None
    return workload_from_dict(data, path)


# ------------------------------------------------------------------ load models

@dataclass(frozen=True)
class ClosedLoop:
    """`concurrency` sessions (lanes) each loop request -> response -> gap, as AgentX replays.

    Gaps (tool/think time) come from the workload, capped at `gap_cap_s` (InferenceX caps each
    trajectory's idle time at 300 s); profiles without gaps (fixed-length) loop back-to-back, as
    `vllm bench serve --max-concurrency` does. While no request is in flight anywhere, the replay
    skips ahead so that no all-idle interval lasts longer than `idle_cap_s` (AIPerf
    --system-idle-gap-cap-seconds 10; model.specs.idle_cap); None keeps every gap. `forked_runs`:
    subagent runs play as concurrent chains joined at the parent's next turn (AIPerf's replay)."""

    concurrency: int
    gap_cap_s: float = TURN_GAP_CAP_S
    idle_cap_s: float | None = SYSTEM_IDLE_CAP_S
    forked_runs: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.concurrency, (int, np.integer)) or self.concurrency < 1:
            raise ServecastError(f"load: concurrency: must be an integer >= 1, got "
                                 f"{self.concurrency!r}")
        if not self.gap_cap_s >= 0:
            raise ServecastError(f"load: gap_cap_s: must be >= 0, got {self.gap_cap_s!r}")
        if self.idle_cap_s is not None and not self.idle_cap_s >= 0:
            raise ServecastError(f"load: idle_cap_s: must be >= 0 seconds or None (off), got "
                                 f"{self.idle_cap_s!r}")


@dataclass(frozen=True)
class OpenLoop:
    """Requests arrive at `rate_per_s` with inter-arrival coefficient of variation
    `interarrival_cv` (1 = Poisson; the simulator draws gamma inter-arrivals)."""

    rate_per_s: float
    interarrival_cv: float = 1.0

    def __post_init__(self) -> None:
        if not (np.isfinite(self.rate_per_s) and self.rate_per_s > 0):
            raise ServecastError(f"load: rate_per_s: must be > 0, got {self.rate_per_s!r}")
        if not (np.isfinite(self.interarrival_cv) and self.interarrival_cv > 0):
            raise ServecastError(f"load: interarrival_cv: must be > 0, got "
                                 f"{self.interarrival_cv!r}")

    @staticmethod
    def from_workload(workload: Workload, rate_scale: float = 1.0) -> OpenLoop:
        """The arrival process recorded in a trace-derived profile (optionally scaled)."""
        if workload.arrivals is None:
            raise ServecastError(f"workload {workload.name}: arrivals: profile has no recorded "
                                 "arrival process; give a rate")
        return OpenLoop(workload.arrivals.rate_per_s * rate_scale,
                        workload.arrivals.interarrival_cv)


@dataclass(frozen=True)
class TraceArrivals:
    """Trace-driven open loop: request i arrives at `arrival_s[i]` with its own lengths."""

    arrival_s: np.ndarray
    context_tokens: np.ndarray
    uncached_tokens: np.ndarray
    output_tokens: np.ndarray

    @property
    def rate_per_s(self) -> float:
        span = float(np.ptp(self.arrival_s))
        return len(self.arrival_s) / span if span > 0 else float("inf")

    @property
    def interarrival_cv(self) -> float:
        gaps = np.diff(np.sort(self.arrival_s))
        return float(gaps.std() / gaps.mean()) if len(gaps) > 1 and gaps.mean() > 0 else 1.0

    def mix(self) -> RequestMix:
        return RequestMix(self.context_tokens.astype(float), self.uncached_tokens.astype(float),
                          self.output_tokens.astype(float), np.zeros(len(self.arrival_s)))


Load = ClosedLoop | OpenLoop | TraceArrivals


def _cached_prefix_tokens(request, seen: set) -> int:
    """Prompt tokens of `request` an infinite prefix cache already holds: the longest run of its
    leading `hash_ids` in `seen` (the blocks its root session has sent), in tokens; adds the
    request's blocks to `seen`. 0 where the trace has no block hashes."""
    if request.hash_ids is None or not request.block_tokens:
        return 0
    ids = request.hash_ids.tolist()
    run = 0
    for h in ids:
        if h not in seen:
            break
        run += 1
    seen.update(ids)
    return min(request.input_tokens, run * request.block_tokens)


def trace_arrivals(sessions, time_scale: float = 1.0) -> TraceArrivals:
    """Trace-driven arrivals from `model.specs.traces` sessions: every request at its recorded time
    (divided by `time_scale` to replay faster), uncached tokens from an infinite per-root-session
    prefix cache over its `hash_ids` (the whole prompt where a trace has none)."""
    rows = []
    seen: dict[str, set] = {}
    reqs = sorted(((r.t_s, s, r) for s in sessions for r in s.requests), key=lambda x: x[0])
    for t, s, r in reqs:
        cached = _cached_prefix_tokens(r, seen.setdefault(s.root_id or s.session_id, set()))
        rows.append((t / time_scale, r.input_tokens, max(r.input_tokens - cached, 1),
                     max(r.output_tokens, 1)))
    if not rows:
        raise ServecastError("trace: no requests to replay")
    arr = np.array(rows, float)
    return TraceArrivals(arr[:, 0] - arr[0, 0], arr[:, 1], arr[:, 2], arr[:, 3])


class RecordedWorkload:
    """Recorded sessions (AgentX traces, via `model.specs.traces`) used in place of a fitted profile:
    closed-loop lanes replay them turn by turn with their recorded think times, as the AgentX
    replay does; the closed form reads the same requests as its request mix.

    Per request: context = `in`, uncached = the part after the longest run of already-seen
    `hash_ids` in its root session (infinite per-session cache), gap = recorded think time.
    Subagent requests are spliced into the parent's timeline at their recorded times.
    """

    kind = "sessions"

    def __init__(self, sessions, name: str = "recorded") -> None:
        by_root: dict[str, list] = {}
        for s in sessions:
            by_root.setdefault(s.root_id or s.session_id, []).extend(
                (r.t_s, s.kind != "main", r) for r in s.requests)
        self.name = name
        self.specs: list[SessionSpec] = []
        for rows in by_root.values():
            rows.sort(key=lambda x: x[0])
            seen: set = set()
            ctx, unc, out, gap, sub = [], [], [], [], []
            for _, is_sub, r in rows:
                cached = _cached_prefix_tokens(r, seen)
                ctx.append(max(r.input_tokens, 1))
                unc.append(max(r.input_tokens - cached, 1))
                out.append(max(r.output_tokens, 1))
                gap.append(max(r.think_time_s, 0.0))
                sub.append(is_sub)
            if ctx:
                gap[0] = 0.0
                self.specs.append(SessionSpec(np.array(ctx, float), np.array(unc, float),
                                              np.array(out, float), np.array(gap, float),
                                              np.array(sub, bool)))
        if not self.specs:
            raise ServecastError("trace: no requests to replay")
        mix = self.request_mix()
        self.hit_rate = mix.hit_rate

    def sessions(self, n: int, seed: int = 0) -> list[SessionSpec]:
        """`n` recorded sessions in a seeded random order (cycling through the recording)."""
        rng = np.random.default_rng(seed)
        order = np.concatenate([rng.permutation(len(self.specs))
                                for _ in range(n // len(self.specs) + 1)])[:n]
        return [self.specs[i] for i in order]

    def request_mix(self, n: int = 0, seed: int = 0, hit_rate: float | None = None
                    ) -> RequestMix:
        if hit_rate is not None:
            raise ServecastError("trace: hit_rate: a recorded trace brings its own cache hits")
        return RequestMix(*(np.concatenate([getattr(s, f) for s in self.specs])
                            for f in ("context_tokens", "uncached_tokens", "output_tokens",
                                      "gap_s")))

    def model_dump_json(self) -> str:  # cache key for the serving model's request mix
        return f"recorded:{self.name}:{id(self)}"
