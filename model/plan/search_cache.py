"""Prefix-cache hit rates for the deployment search, answering to each candidate's cache capacity
and retention policy (issue 5 item 6).

The search does not model caching itself: a replica's tier capacities come from
`model.perf.tiers.tier_capacity_tokens` (HBM pool from `model.perf.memory.hbm_budget`, host DRAM, ...), the
hit rate by tier from `model.serve.cache_model.hit_rate` (closed form over the workload's sessions, Che /
TTL approximation) at the candidate's sessions per replica, and the time to bring host-tier hits
back into HBM from `model.perf.tiers.kv_load_time_s`. Each call is ~10 ms, so results are memoized on
(capacities, sessions, policy): a search asks for a few hundred distinct points, once per process.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

DEFAULT_POLICY = "lru"
DEFAULT_TIERS = ("hbm", "host")  # the post's Mooncake store holds CPU-memory (and disk) tiers
_REF_CONTEXT = 131072.0  # context at which per-token reload time is taken (AgentX median ~142K)

_HITS: dict[tuple, tuple[float, float, float]] = {}
_CAPS: dict[tuple, dict[str, float]] = {}
_RELOAD: dict[tuple, float] = {}
_GRID_HITS: dict[tuple, tuple[np.ndarray, np.ndarray, float]] = {}


@dataclass(frozen=True)
class CacheSetup:
    """How the deployment keeps prefixes: retention policy and the tiers it may use."""

    policy: str = DEFAULT_POLICY
    tiers: tuple[str, ...] = DEFAULT_TIERS


def _name(hw) -> str:
    return hw.name if hasattr(hw, "name") else str(hw)  # str() of a spec is slow: only as fallback


def replica_capacities(arch, hw, plan, kv_dtype, tiers=DEFAULT_TIERS,
                       context_tokens: float = _REF_CONTEXT) -> dict[str, float]:
    """Tokens of context one replica keeps per tier (model.perf.tiers, fastest first), with sequences
    of `context_tokens` (windows and fixed state amortized over it)."""
    key = (arch.name, arch.weight_dtype, arch.source, _name(hw), plan, kv_dtype,
           round(float(context_tokens)))
    if key not in _CAPS:
        from model.perf.tiers import tier_capacity_tokens

        _CAPS[key] = {t: float(v) for t, v in tier_capacity_tokens(
            arch, hw, plan, kv_dtype, context_tokens=float(context_tokens)).items()}
    return {t: _CAPS[key][t] for t in tiers}


def reload_s_per_token(arch, hw, plan, kv_dtype, tier: str = "host") -> float:
    """Seconds per token of context to load a session's KV from `tier` into the replica's HBM."""
    key = (arch.name, arch.weight_dtype, arch.source, _name(hw), plan,
           kv_dtype, tier)
    if key not in _RELOAD:
        from model.perf.tiers import kv_load_time_s

        t = float(np.asarray(kv_load_time_s(arch, hw, plan, _REF_CONTEXT, tier, kv_dtype)))
        _RELOAD[key] = t / _REF_CONTEXT
    return _RELOAD[key]


def _round(x: float) -> float:
    """Two significant digits: near-equal capacities and session counts share one answer
    (a 5% capacity step moves the hit rate by well under a point)."""
    return float(f"{x:.2g}")


def tier_hits(workload, capacities: dict[str, float], sessions, policy: str = DEFAULT_POLICY
              ) -> tuple[np.ndarray, np.ndarray, float]:
    """(HBM hit fraction, lower-tier hit fraction, infinite-cache hit) of input tokens, for each
    value of `sessions` (live sessions per replica, array)."""
    from model.serve.cache_model import sticky_tier_hits

    s = np.asarray(sessions, float)
    caps = {k: _round(v) for k, v in capacities.items()}
    wkey = (workload.name, getattr(workload, "source", ""), getattr(workload, "date", ""))
    rounded = np.vectorize(lambda v: _round(max(v, 1.0)), otypes=[float])(s) if s.size else s
    key = lambda v: (wkey, tuple(caps.items()), float(v), policy)  # noqa: E731
    todo = sorted({float(v) for v in rounded.ravel() if key(v) not in _HITS})
    if todo:
        first, lower, inf = sticky_tier_hits(workload, caps, todo, policy)
        for v, f, lo in zip(todo, first, lower, strict=True):
            _HITS[key(v)] = (float(f), float(lo), float(inf))
    hbm, low, inf = np.empty(s.shape), np.empty(s.shape), 0.0
    for idx, value in np.ndenumerate(rounded):
        hbm[idx], low[idx], inf = _HITS[key(value)]
    return hbm, low, inf


# sessions per replica where the model is asked: a factor of 2 apart (hit rates change smoothly
# with the session count; cold-search cost is one closed-form call per point and capacity)
SESSION_GRID = np.geomspace(1.0, 16384.0, 15)


def tier_hits_interp(workload, capacities: dict[str, float], sessions,
                     policy: str = DEFAULT_POLICY) -> tuple[np.ndarray, np.ndarray, float]:
    """`tier_hits` on SESSION_GRID, interpolated in log(sessions) for any array of sessions:
    hit rates vary smoothly with the session count, and a search asks for thousands of counts."""
    key = (workload.name, getattr(workload, "source", ""), tuple(
        (k, _round(v)) for k, v in capacities.items()), policy)
    if key not in _GRID_HITS:
        _GRID_HITS[key] = tier_hits(workload, capacities, SESSION_GRID, policy)
    hbm, low, inf = _GRID_HITS[key]
    x = np.log(np.clip(np.asarray(sessions, float), SESSION_GRID[0], SESSION_GRID[-1]))
    grid = np.log(SESSION_GRID)
    return np.interp(x, grid, hbm), np.interp(x, grid, low), inf
