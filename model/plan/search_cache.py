"""Prefix-cache hit rates for the screening tier, answering to each candidate's cache capacity
and retention policy.

The screening does not model caching itself: a replica's tier capacities come from
`model.perf.tiers.tier_capacity_tokens` (HBM pool from `model.perf.memory.hbm_budget`, host
DRAM, ...), the hit rate by tier from `model.serve.cache_model.sticky_tier_hits` (closed form over
the workload's sessions, Che / TTL approximation) at the candidate's sessions per replica, and the
time to bring host-tier hits back into HBM from `model.perf.tiers.kv_load_time_s`. Each cache-model
call is ~10 ms, so the answers are memoized on their arguments (capacities rounded to two
significant digits, a session grid shared by all candidates).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from model.perf.tiers import kv_load_time_s, tier_capacity_tokens
from model.plan.traffic import Keyed
from model.serve.cache_model import sticky_tier_hits

DEFAULT_POLICY = "lru"
DEFAULT_TIERS = ("hbm", "host")  # the post's Mooncake store holds CPU-memory (and disk) tiers
REF_CONTEXT_TOKENS = 131072.0  # context at which per-token reload time is taken (AgentX ~142K)
# sessions per replica where the model is asked: a factor of 2 apart (hit rates change smoothly
# with the session count; cold-search cost is one closed-form call per point and capacity)
SESSION_GRID = np.geomspace(1.0, 16384.0, 15)


@dataclass(frozen=True)
class CacheSetup:
    """How the deployment keeps prefixes: retention policy and the tiers it may use."""

    policy: str = DEFAULT_POLICY
    tiers: tuple[str, ...] = DEFAULT_TIERS


def replica_capacities(arch, hw, plan, kv_dtype, tiers=DEFAULT_TIERS,
                       context_tokens: float = REF_CONTEXT_TOKENS,
                       cpu_offload_gib: float = 0.0) -> dict[str, float]:
    """Tokens of context one replica keeps per tier (model.perf.tiers, fastest first), with
    sequences of `context_tokens` (windows and fixed state amortized over it) and
    `cpu_offload_gib` of weights per GPU in host memory."""
    caps = _capacities(Keyed.arch(arch), hw, plan, kv_dtype, round(float(context_tokens)),
                       float(cpu_offload_gib))
    return {t: caps[t] for t in tiers}


@functools.lru_cache(maxsize=1024)
def _capacities(arch: Keyed, hw, plan, kv_dtype, context_tokens: int,
                cpu_offload_gib: float) -> dict[str, float]:
    return {t: float(v) for t, v in tier_capacity_tokens(
        arch.value, hw, plan, kv_dtype, context_tokens=float(context_tokens),
        cpu_offload_gib=cpu_offload_gib).items()}


def reload_s_per_token(arch, hw, plan, kv_dtype, tier: str = "host") -> float:
    """Seconds per token of context to load a session's KV from `tier` into the replica's HBM."""
    return _reload_s_per_token(Keyed.arch(arch), hw, plan, kv_dtype, tier)


@functools.lru_cache(maxsize=1024)
def _reload_s_per_token(arch: Keyed, hw, plan, kv_dtype, tier: str) -> float:
    t = float(np.asarray(kv_load_time_s(arch.value, hw, plan, REF_CONTEXT_TOKENS, tier,
                                        kv_dtype)))
    return t / REF_CONTEXT_TOKENS


def _round(x: float) -> float:
    """Two significant digits: near-equal capacities and session counts share one answer
    (a 5% capacity step moves the hit rate by well under a point)."""
    return float(f"{x:.2g}")


def tier_hits(workload, capacities: dict[str, float], sessions, policy: str = DEFAULT_POLICY
              ) -> tuple[np.ndarray, np.ndarray, float]:
    """(HBM hit fraction, lower-tier hit fraction, infinite-cache hit) of input tokens, for each
    value of `sessions` (live sessions per replica, array)."""
    s = np.asarray(sessions, float)
    caps = tuple((k, _round(v)) for k, v in capacities.items())
    rounded = np.array([_round(max(v, 1.0)) for v in s.ravel()]).reshape(s.shape)
    points = _tier_hit_points(Keyed.workload(workload), caps, tuple(sorted(set(rounded.ravel()))),
                              policy)
    hbm, low, inf = np.empty(s.shape), np.empty(s.shape), 0.0
    for idx, value in np.ndenumerate(rounded):
        hbm[idx], low[idx], inf = points[value]
    return hbm, low, inf


@functools.lru_cache(maxsize=4096)
def _tier_hit_points(workload: Keyed, capacities: tuple, sessions: tuple, policy: str
                     ) -> dict[float, tuple[float, float, float]]:
    """{sessions: (HBM hit, lower-tier hit, infinite-cache hit)} at each session count."""
    if not sessions:
        return {}
    first, lower, inf = sticky_tier_hits(workload.value, dict(capacities), list(sessions),
                                         policy)
    return {v: (float(f), float(lo), float(inf))
            for v, f, lo in zip(sessions, first, lower, strict=True)}


def tier_hits_interp(workload, capacities: dict[str, float], sessions,
                     policy: str = DEFAULT_POLICY) -> tuple[np.ndarray, np.ndarray, float]:
    """`tier_hits` on SESSION_GRID, interpolated in log(sessions) for any array of sessions:
    hit rates vary smoothly with the session count, and a search asks for thousands of counts."""
    hbm, low, inf = _grid_hits(Keyed.workload(workload),
                               tuple((k, _round(v)) for k, v in capacities.items()), policy)
    x = np.log(np.clip(np.asarray(sessions, float), SESSION_GRID[0], SESSION_GRID[-1]))
    grid = np.log(SESSION_GRID)
    return np.interp(x, grid, hbm), np.interp(x, grid, low), inf


@functools.lru_cache(maxsize=256)
def _grid_hits(workload: Keyed, capacities: tuple, policy: str):
    return tier_hits(workload.value, dict(capacities), SESSION_GRID, policy)
