"""Prefix-cache hit rate for the serving model and the planner: closed form (Che / TTL
approximation over the session model) and a replay-backed fast path, behind one call.

Closed form (papers/research/theory.md §8). N sessions share a cache of C tokens; a session holds its
context c between turns and comes back after a gap g (tool call or think time, plus the turn's
own service time; gaps count up to the 300 s live window). The other N-1 sessions touch, within
a gap g, about O(g) = (N-1) E[c_prev min(g', g)] / E[min(g', W)] tokens (the Che / TTL
occupancy read at T = g). Eviction takes prompt tails first, so the returning turn still finds
its first C - O(g) tokens: hit = E[clip(C - O(g), 0, c - u)] / E[c], u being what even an
infinite cache misses (growth, resets). Che's characteristic time T (O(T) = C) is reported per
tier; inclusive tiers serve clip(C_k - O(g)) minus what faster tiers served. Policy
corrections:
- second-hit: a turn's growth is admitted only when seen again, so a turn also misses the
  previous turn's growth: cached part c - u - u_prev (append-only sessions);
- interval: checkpoints at every prompt end cover append-only turns exactly: same as LRU here
  (its losses at branch points and compactions show up only in replay).
Accuracy against the exact replay of the AgentX sample (tests/test_cache_model.py, notebook
cache_hit): within 0.05 (mean 0.012) from ~2 sessions' context (316K tokens) up; pessimistic
below, where real sessions' bursts interleave less than the averaged pressure assumes.
Routing over R replicas: sticky = one replica's view; random / least-loaded = the previous turn
ran elsewhere with probability 1 - 1/R, so the replica's newest copy is k turns old (k ~
geometric(1/R)) and the turn misses its last k growths; a shared pool restores the full prefix
within the pool's T.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import numpy as np

from model.serve.cache_replay import (
    BlockStream,
    check_policy,
    hit_rate_curve,
    replay,
    stream_for,
)
from model.serve.queueing import expected_min
from model.serve.request_mix import WorkloadKey
from model.serve.routing import check_routing, route_replay
from model.specs.errors import ServecastError

# A session counts as live while its gaps stay under the AgentX replay's 300 s idle cap
# (papers/research/workloads.md §1.5); longer pauses are idle time, not cache pressure.
LIVE_WINDOW_S = 300.0


@dataclass(frozen=True)
class CacheResult:
    hit_rate: float  # cached input tokens / input tokens, all tiers
    hits_by_tier: dict[str, float]  # fraction of input tokens served by each tier
    infinite_hit_rate: float  # the workload's ceiling
    policy: str
    replicas: int
    routing: str
    method: str  # "closed-form" | "replay"
    capacity_tokens: dict[str, float]  # per replica, by tier
    characteristic_time_s: dict[str, float] = field(default_factory=dict)  # closed form only

    @property
    def uncached_fraction(self) -> float:
        return 1.0 - self.hit_rate

    def tier_traffic_bytes(self, input_tokens, kv_bytes_per_token_per_gpu: float) -> dict:
        """KV bytes per GPU each tier below HBM moves up for requests of `input_tokens`."""
        tokens = np.asarray(input_tokens, dtype=float)
        return {t: f * tokens * kv_bytes_per_token_per_gpu
                for t, f in self.hits_by_tier.items() if t != "hbm"}

    def reload_time_s(self, input_tokens, kv_bytes_per_token_per_gpu: float, links: dict):
        """Mean time a request of `input_tokens` spends loading its lower-tier hits, tiers in
        parallel links, before prefetch (links: model.perf.tiers.tiers_for(hw)); add to TTFT or
        subtract what a prefetch hides (model.perf.tiers.prefetch)."""
        traffic = self.tier_traffic_bytes(input_tokens, kv_bytes_per_token_per_gpu)
        times = [links[t].transfer_time_s(b) for t, b in traffic.items()]
        return np.max(times, axis=0) if times else 0.0 * np.asarray(input_tokens, dtype=float)

    def summary(self) -> dict:
        return {"hit_rate": self.hit_rate, "hits_by_tier": self.hits_by_tier,
                "infinite_hit_rate": self.infinite_hit_rate, "policy": self.policy,
                "replicas": self.replicas, "routing": self.routing, "method": self.method,
                "capacity_tokens": self.capacity_tokens,
                "characteristic_time_s": self.characteristic_time_s}


# ---------------------------------------------------------------------------------- closed form


@dataclass(frozen=True, eq=False)
class SessionSample:
    """Per-turn sample the closed form integrates over (request-weighted). Compared and hashed
    by identity: the closed form's per-sample curves are cached on it."""

    context_tokens: np.ndarray  # c: input tokens of the turn
    uncached_tokens: np.ndarray  # u: misses with an infinite cache
    gap_s: np.ndarray  # time since the session's previous turn arrived (0: first turn)
    first: np.ndarray  # bool: a session's first turn (nothing to survive)
    session: np.ndarray | None = None  # session of each row (None: rows in session order)

    @property
    def infinite_hit_rate(self) -> float:
        return float(1.0 - self.uncached_tokens.sum() / self.context_tokens.sum())

    @property
    def previous_context(self) -> np.ndarray:
        """KV the session holds during the gap before this turn: its previous prompt, which is
        this turn's cached part (or all of it when the turn reset its context)."""
        cached = self.context_tokens - self.uncached_tokens
        return np.where(cached > 0, cached, self.context_tokens)


def sample_from_workload(workload, n: int = 20_000, seed: int = 0,
                         turn_time_s: float = 0.0) -> SessionSample:
    """Turns drawn from a model.specs.workload.Workload profile (sessions kind)."""
    mix = workload.request_mix(n, seed)
    c = np.asarray(mix.context_tokens, float)
    u = np.asarray(mix.uncached_tokens, float)
    first = u >= c  # cold turns (session starts, resets): nothing of theirs to survive a gap
    gap = np.asarray(mix.gap_s, dtype=float) + turn_time_s
    return SessionSample(c, u, np.where(first, 0.0, gap), first)


def sample_from_stream(stream: BlockStream) -> SessionSample:
    """Turns of a trace: u from the exact infinite-cache replay, gaps from arrival times."""
    inf = replay(stream, np.inf, "lru")
    gap = np.zeros(stream.requests)
    first = np.ones(stream.requests, dtype=bool)
    last_t: dict[int, float] = {}
    for i, s in enumerate(stream.session):
        s = int(s)
        if s in last_t:
            gap[i] = stream.t_s[i] - last_t[s]
            first[i] = False
        last_t[s] = stream.t_s[i]
    c = stream.input_tokens.astype(float)
    u = c - inf.request_hit_tokens
    # a subagent's first turn can hit its parent's prefix: count it, touched just before
    return SessionSample(c, u, np.where(first, 0.0, gap), u >= c, stream.session.copy())


def effective_sessions(stream: BlockStream, window_s: float | None = None) -> float:
    """Sessions live at the arrival of the average input token, a session being live when it
    sent a request in the last `window_s` (default LIVE_WINDOW_S): the concurrency a trace
    replay runs at, weighted the way the hit rate is."""
    window = LIVE_WINDOW_S if window_s is None else window_s
    order = np.argsort(stream.t_s, kind="stable")
    t, sess = stream.t_s[order], stream.session[order]
    live = np.zeros(len(t))
    lo = 0
    counts: dict[int, int] = {}
    for i in range(len(t)):  # sliding window of requests in (t_i - window, t_i]
        counts[int(sess[i])] = counts.get(int(sess[i]), 0) + 1
        while t[lo] <= t[i] - window:
            k = int(sess[lo])
            counts[k] -= 1
            if not counts[k]:
                del counts[k]
            lo += 1
        live[i] = len(counts)
    w = stream.input_tokens[order].astype(float)
    return float((live * w).sum() / w.sum())


def _occupancy_curve(sample: SessionSample, sessions: float) -> tuple[np.ndarray, np.ndarray]:
    """(T grid, KV the sessions keep resident with characteristic time T): N E[c min(g,T)]/E[g],
    nondecreasing in T. The per-session curve is computed once per sample."""
    grid, per_session, _ = _curve_entry(sample)
    return grid, sessions * per_session


@lru_cache(maxsize=32)
def _curve_entry(sample: SessionSample) -> tuple:
    """(T grid, per-session occupancy, per-session occupancy at each turn's gap), once per
    sample: a search asks the closed form for hundreds of capacities and session counts, and
    every answer is linear in the session count."""
    grid, per_session = _per_session_occupancy(sample)
    return grid, per_session, np.interp(np.minimum(sample.gap_s, grid[-1]), grid, per_session)


def _per_session_occupancy(sample: SessionSample) -> tuple[np.ndarray, np.ndarray]:
    g = sample.gap_s[~sample.first]
    c = sample.previous_context[~sample.first]
    if g.size == 0:
        return np.array([0.0, np.inf]), np.array([0.0, 0.0])
    grid = np.unique(np.r_[0.0, np.quantile(g, np.linspace(0, 1, 257))])
    order = np.argsort(g)
    mean = expected_min(g[order], grid, c[order], side="left")  # E[c min(g, T)]
    return grid, mean / max(np.minimum(g, LIVE_WINDOW_S).mean(), 1e-9)


def _footprint(sample: SessionSample, sessions: float) -> np.ndarray:
    """Distinct KV `sessions` sessions touch within each turn's gap: the occupancy curve read
    at T = gap."""
    return sessions * _curve_entry(sample)[2]


def characteristic_time_s(sample: SessionSample, capacity_tokens, sessions: float):
    """T solving C = N E[c_prev min(g, T)] / E[g]: inf when everything fits, 0 when nothing
    does (numpy-broadcast over capacities)."""
    grid, occupied = _occupancy_curve(sample, sessions)
    cap = np.asarray(capacity_tokens, dtype=float)
    t = np.interp(cap, occupied, grid)
    out = np.where(cap >= occupied[-1], np.inf, np.where(cap <= 0, 0.0, t))
    return float(out) if out.ndim == 0 else out


@lru_cache(maxsize=32)
def _cached_part(sample: SessionSample, policy: str, replicas: int, routing: str,
                 pooled: bool) -> np.ndarray:
    """Tokens of each turn that a big-enough cache serves under the policy and routing (kept per
    sample: a search asks about hundreds of capacities of one sample)."""
    c, u = sample.context_tokens, sample.uncached_tokens
    growth = np.where(sample.first | (u >= c), 0.0, u)  # append-only growth of each turn
    if policy == "second-hit":
        u = np.minimum(u + _previous_in_session(growth, sample.session), c)
    cached = c - u
    if replicas > 1 and routing != "sticky" and not pooled:
        p = 1.0 / replicas
        ks = np.arange(1, 400)
        weights = p * (1 - p) ** (ks - 1)
        older = np.maximum(cached[:, None] - (ks[None, :] - 1) * growth[:, None], 0.0)
        cached = older @ weights
    return cached


def _previous_in_session(values: np.ndarray, session: np.ndarray | None) -> np.ndarray:
    """Each row's value from the same session's previous row (0 for a session's first row)."""
    if session is None:
        return np.r_[0.0, values[:-1]]
    out = np.zeros_like(values)
    last: dict[int, float] = {}
    for i, s in enumerate(session):
        out[i] = last.get(int(s), 0.0)
        last[int(s)] = values[i]
    return out


def closed_form(sample: SessionSample, capacity_tokens: float | Mapping[str, float],
                sessions: float, policy: str = "lru", replicas: int = 1, routing: str = "sticky",
                pool_tokens: float = 0.0) -> CacheResult:
    """Hit rate from the TTL/Che approximation; `capacity_tokens` per replica (one number or
    {tier: tokens}), `sessions` concurrent sessions per replica (sticky) or in total / R."""
    check_policy(policy)
    check_routing(routing)
    tiers = dict(capacity_tokens) if isinstance(capacity_tokens, Mapping) else {
        "hbm": float(capacity_tokens)}
    spread = replicas if (replicas > 1 and routing != "sticky") else 1
    # non-sticky routing leaves copies of every session on every replica it visited
    holders = sessions * min(spread, max(1.0, _visits_per_gap(spread)))
    pooled = pool_tokens > 0
    cached = _cached_part(sample, policy, replicas, routing, pooled)
    total = sample.context_tokens.sum()
    # Stack-distance form of Che: after a gap g the session's prefix sits under the KV the
    # other sessions touched meanwhile, O(g) = (N-1) E[c min(g', g)] / E[min(g', W)]; its
    # first C - O(g) tokens are still resident (eviction takes prompt tails first).
    shares, served = _tier_shares(sample, tiers, np.array([holders]), cached)
    by_tier = {name: float(v[0]) for name, v in shares.items()}
    served = served[0]
    times = {name: characteristic_time_s(sample, cap, holders) for name, cap in tiers.items()}
    if pooled:  # the pool holds the full prefix of every session (all replicas write to it)
        times["remote"] = characteristic_time_s(sample, pool_tokens, sessions * replicas)
        full = sample.context_tokens - sample.uncached_tokens
        pool_others = _footprint(sample, max(sessions * replicas - 1.0, 0.0))
        upto = np.where(sample.first, 0.0, np.clip(pool_tokens - pool_others, 0.0, full))
        by_tier["remote"] = float(np.maximum(upto - served, 0.0).sum() / total)
    hit = sum(by_tier.values())
    return CacheResult(hit_rate=hit, hits_by_tier=by_tier,
                       infinite_hit_rate=sample.infinite_hit_rate, policy=policy,
                       replicas=replicas, routing=routing, method="closed-form",
                       capacity_tokens={**tiers, **({"remote": pool_tokens} if pooled else {})},
                       characteristic_time_s=times)


def _tier_shares(sample: SessionSample, tiers: Mapping[str, float], holders: np.ndarray,
                 cached: np.ndarray) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Share of input tokens each tier serves, for each session count in `holders` (the Che
    stack-distance form of closed_form), and the tokens served per turn (rows: holders)."""
    others = _footprint(sample, np.maximum(holders - 1.0, 0.0)[:, None])
    total = sample.context_tokens.sum()
    served = np.zeros((len(holders), len(sample.gap_s)))
    shares = {}
    for name, cap in tiers.items():
        upto = np.where(sample.first, 0.0, np.clip(cap - others, 0.0, cached))
        shares[name] = np.maximum(upto - served, 0.0).sum(axis=1) / total
        served = np.maximum(served, upto)
    return shares, served


def sticky_tier_hits(workload, capacity_tokens: Mapping[str, float], sessions, policy: str = "lru",
                     seed: int = 0) -> tuple[np.ndarray, np.ndarray, float]:
    """(first-tier hit, lower-tier hit, infinite-cache hit) of one sticky-routed replica for each
    session count in `sessions`: closed_form's tier shares in one array pass (what the deployment
    search asks for a grid of session counts per capacity)."""
    check_policy(policy)
    sessions = np.asarray(sessions, float)
    tiers = dict(capacity_tokens)
    if getattr(workload, "kind", "sessions") == "requests":
        h = float(workload.hit_rate)
        return np.full(sessions.shape, h), np.zeros(sessions.shape), h
    sample = _workload_sample(workload, seed, 0.0)
    shares, _ = _tier_shares(sample, tiers, sessions, _cached_part(sample, policy, 1, "sticky",
                                                                   False))
    first = shares[next(iter(tiers))]
    return first, sum(shares.values()) - first, sample.infinite_hit_rate


def _visits_per_gap(replicas: int) -> float:
    """Replicas a random-routed session keeps a live copy on: about all of them once it has run
    a few turns; the closed form charges each replica for every session."""
    return float(replicas)


# ------------------------------------------------------------------------------- replay-backed

CURVE_POINTS = np.r_[0.0, np.logspace(3, 9, 49), np.inf]  # tokens: 1K .. 1G, log spaced


@lru_cache(maxsize=64)
def _curve(stream: BlockStream, policy: str, interval_tokens: int) -> np.ndarray:
    """Hit rate over CURVE_POINTS capacities, once per stream (trace paths map to one stream:
    model.serve.cache_replay.stream_for caches them)."""
    return hit_rate_curve(stream, CURVE_POINTS, policy, interval_tokens)


def _interp(curve: np.ndarray, capacity: float) -> float:
    if np.isinf(capacity):
        return float(curve[-1])
    x = np.log10(np.maximum(CURVE_POINTS[1:-1], 1.0))
    if capacity <= CURVE_POINTS[1]:
        return float(np.interp(capacity, [0.0, CURVE_POINTS[1]], curve[:2]))
    return float(np.interp(np.log10(capacity), x, curve[1:-1], right=curve[-2]))


def replay_hit_rate(trace, capacity_tokens: float | Mapping[str, float], policy: str = "lru",
                    replicas: int = 1, routing: str = "sticky", pool_tokens: float = 0.0,
                    concurrency: float | None = None, interval_tokens: int = 0,
                    exact: bool = False, seed: int = 0) -> CacheResult:
    """Hit rate of a trace. One replica: read off a cached hit-rate-vs-capacity curve (log
    interpolation; `exact=True` replays instead); inclusive tiers split by curve differences.
    `concurrency`: sessions per replica in the target deployment; capacity is rescaled by the
    trace's own concurrency / concurrency (first-order: sessions alike, interleaving dense)."""
    check_policy(policy)
    check_routing(routing)
    stream = stream_for(trace)
    tiers = dict(capacity_tokens) if isinstance(capacity_tokens, Mapping) else {
        "hbm": float(capacity_tokens)}
    scale = 1.0 if concurrency is None else effective_sessions(stream) / float(concurrency)
    scaled = {k: v * scale for k, v in tiers.items()}
    inf = float(_curve(stream, "lru", 0)[-1])
    if replicas > 1 or pool_tokens > 0:
        if len(scaled) != 1:
            raise ServecastError("routing replay takes one local capacity per replica (+ pool)")
        res = route_replay(stream, replicas, routing, next(iter(scaled.values())),
                           pool_tokens * scale, policy, interval_tokens, seed)
        by_tier = {("hbm" if k == "local" else k): v / res.input_tokens
                   for k, v in res.hit_tokens_by_tier.items()}
        return CacheResult(res.hit_rate, by_tier, inf, policy, replicas, routing, "replay",
                           {**tiers, **({"remote": pool_tokens} if pool_tokens else {})})
    if exact:
        res = replay(stream, scaled, policy, interval_tokens)
        return CacheResult(res.hit_rate, res.hit_rate_by_tier, inf, policy, 1, routing, "replay",
                           tiers)
    curve = _curve(stream, policy, interval_tokens)
    by_tier, best = {}, 0.0
    for name, cap in scaled.items():
        h = _interp(curve, cap)
        by_tier[name] = max(h - best, 0.0)
        best = max(best, h)
    return CacheResult(best, by_tier, inf, policy, 1, routing, "replay", tiers)


# --------------------------------------------------------------------------------- entry point


def _is_trace(obj) -> bool:
    if isinstance(obj, BlockStream):
        return True
    if isinstance(obj, (str, Path)):
        return Path(obj).exists()
    return isinstance(obj, Sequence) and len(obj) > 0 and not isinstance(obj, (str, bytes))


def hit_rate(workload_or_trace, capacity_tokens: float | Mapping[str, float],
             policy: str = "lru", replicas: int = 1, routing: str = "sticky",
             pool_tokens: float = 0.0, concurrency: float | None = None,
             turn_time_s: float = 0.0, seed: int = 0) -> CacheResult:
    """The one call for the serving model and the planner.

    `workload_or_trace`: a trace (path(s), sessions, BlockStream) -> replay-backed; a
    model.specs.workload.Workload or a profile name -> closed form, which needs `concurrency`
    (sessions per replica). `capacity_tokens`: per replica, one number (HBM pool) or
    {tier: tokens} fastest first (e.g. {"hbm": ..., "host": ..., "nvme": ...})."""
    if _is_trace(workload_or_trace):
        return replay_hit_rate(workload_or_trace, capacity_tokens, policy, replicas, routing,
                               pool_tokens, concurrency, seed=seed)
    workload = workload_or_trace
    if isinstance(workload, str):
        from model.specs.workload import load_workload

        workload = load_workload(workload)
    if concurrency is None or concurrency <= 0:
        raise ServecastError("cache hit rate of a workload profile needs concurrency "
                             "(sessions per replica) > 0")
    if getattr(workload, "kind", "sessions") == "requests":
        # independent requests: the profile's own (infinite-cache) hit, no session to survive
        h = float(workload.hit_rate)
        return CacheResult(h, {"hbm": h}, h, policy, replicas, routing, "profile",
                           {"hbm": float(capacity_tokens)} if not isinstance(
                               capacity_tokens, Mapping) else dict(capacity_tokens))
    sample = _workload_sample(workload, seed, turn_time_s)
    return closed_form(sample, capacity_tokens, float(concurrency), policy, replicas, routing,
                       pool_tokens)


def _workload_sample(workload, seed: int, turn_time_s: float) -> SessionSample:
    """The profile's turn sample, drawn once per (workload, seed, turn time): the per-sample
    curves cached on it serve every later call."""
    return _sample(WorkloadKey.of(workload), seed, turn_time_s)


@lru_cache(maxsize=32)
def _sample(workload: WorkloadKey, seed: int, turn_time_s: float) -> SessionSample:
    return sample_from_workload(workload.workload, seed=seed, turn_time_s=turn_time_s)


def deployment_hit_rate(workload_or_trace, arch, hw, plan, concurrency: float | None = None,
                        policy: str = "lru", tiers: Sequence[str] = ("hbm", "host"),
                        kv_dtype: str | None = None, replicas: int = 1,
                        routing: str = "sticky", seed: int = 0,
                        cpu_offload_gib: float = 0.0) -> CacheResult:
    """Hit rate of one replica of `arch` on `hw` under `plan`: the HBM pool left by
    model.perf.memory.hbm_budget (with `cpu_offload_gib` of weights per GPU in host memory) plus
    the named lower tiers (model.perf.tiers), in tokens of context, fed to `hit_rate`. `tiers`
    from ("hbm", "host", "nvme"); "remote" becomes a shared pool."""
    from model.perf.tiers import tier_capacity_tokens

    caps = tier_capacity_tokens(arch, hw, plan, kv_dtype, cpu_offload_gib=cpu_offload_gib)
    unknown = [t for t in tiers if t not in caps]
    if unknown or "hbm" not in tiers:
        raise ServecastError(f"tiers {list(tiers)}: must include 'hbm'; allowed: {', '.join(caps)}")
    local = {t: caps[t] for t in tiers if t != "remote"}
    pool = caps["remote"] * replicas if "remote" in tiers else 0.0
    if replicas > 1 or pool:
        return hit_rate(workload_or_trace, local["hbm"], policy, replicas, routing, pool,
                        concurrency, seed=seed)
    return hit_rate(workload_or_trace, local, policy, replicas, routing, 0.0, concurrency,
                    seed=seed)
