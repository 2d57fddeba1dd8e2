"""The request sample the serving closed form integrates over.

A session profile's requests come in sessions whose contexts and gaps are strongly correlated,
so n requests drawn as whole sessions hold only ~n/40 independent sessions, and their
heavy-tailed means sit ~10% off (AgentX: mean context 164K in a 4,000-request draw against 148K
in 200K). Drawing MIX_SESSIONS_FACTOR times the requests and keeping every 16th gives the same n
requests from 16x the sessions. The FCFS wait law reads all of the 16x draw (`queue=True`): it
needs only their service and gap, and it is set by the rare cold prompts (a session's first
turn), of which the thinned sample keeps one in 16.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import TYPE_CHECKING

import numpy as np

from model.specs.errors import ServecastError
from model.specs.workload import ClosedLoop, Load, RequestMix, Workload

if TYPE_CHECKING:
    from model.serve.policy import EnginePolicy

# requests drawn from the profile (deterministic seed). AgentX prefill work is heavy-tailed:
# across seeds its mean (uncached x context) varies 10.7% at 4,000 draws and 3.9% at 20,000,
# and the FCFS wait goes with its second moment
MIX_SIZE = 20000
MIX_SESSIONS_FACTOR = 16  # draw 16x the requests, keep every 16th: 16x as many sessions


@dataclass(frozen=True)
class WorkloadKey:
    """A workload as a cache key: its JSON dump (pydantic models are not hashable), or its
    identity for an object without one (the key holds it, so the identity stays its own)."""

    key: object
    workload: object = field(compare=False)

    @staticmethod
    def of(workload) -> WorkloadKey:
        dump = getattr(workload, "model_dump_json", None)
        return WorkloadKey(dump() if dump is not None else ("id", id(workload)), workload)


def request_mix_for(workload: Workload, n: int = MIX_SIZE, seed: int = 0,
                    hit_rate: float | None = None, *, queue: bool = False) -> RequestMix:
    """The request sample `serve` integrates over: n requests drawn with `seed`, every 16th of
    a 16x draw for session profiles. `queue=True`: all of the 16x draw, the FCFS wait law's
    sample (other workloads: the sample itself). A `hit_rate` override scales each request's
    cached part (as Workload.request_mix does). Deterministic, so each is drawn once."""
    thinned = _thinned_draw(workload)
    # other workloads: the queue sample is the sample itself (the same object)
    return _mix(WorkloadKey.of(workload), n, seed, hit_rate, queue and thinned)


def _thinned_draw(workload) -> bool:
    return getattr(workload, "kind", "requests") == "sessions" and isinstance(workload, Workload)


@lru_cache(maxsize=64)
def _mix(spec: WorkloadKey, n: int, seed: int, hit_rate: float | None, queue: bool) -> RequestMix:
    workload = spec.workload
    if hit_rate is not None and not isinstance(workload, Workload):
        return workload.request_mix(n, seed, hit_rate)  # a recorded trace refuses, with why
    if hit_rate is not None:
        base = _mix(spec, n, seed, None, queue)
        own = base.hit_rate
        if not 0.0 <= hit_rate < 1.0:
            raise ServecastError(f"hit_rate: {hit_rate} is outside [0, 1)")
        c = base.context_tokens
        if own > 0:
            unc = c - np.minimum((c - base.uncached_tokens) * hit_rate / own, c)
        else:
            unc = c * (1.0 - hit_rate)
        return replace(base, uncached_tokens=np.maximum(np.round(unc), 1.0))
    if not _thinned_draw(workload):
        return workload.request_mix(n, seed, None)
    if queue:
        return _thinned(workload.request_mix(n * MIX_SESSIONS_FACTOR, seed, None), slice(None))
    return _thinned(_mix(spec, n, seed, None, True), slice(0, None, MIX_SESSIONS_FACTOR))


def _thinned(big: RequestMix, keep: slice) -> RequestMix:
    return RequestMix(big.context_tokens[keep], big.uncached_tokens[keep],
                      big.output_tokens[keep], big.gap_s[keep],
                      None if big.wall_weight is None else big.wall_weight[keep])


def request_sample(mix: RequestMix, load: Load, policy: EnginePolicy | None = None
                   ) -> RequestMix:
    """The sample as the engine reads it: float arrays, a closed loop's gaps capped. Where
    subagents run beside their parent (wall weights w below 1), a closed loop of N sessions
    is N / E[w] request chains (`RequestMix.lanes_per_session`), each gap weighted by
    w / E[w]: Little's law over a session's clock, N = X E[w (Z + R)], with the response R
    the same for every request. A closed loop's gap, as the engine sees it, ends when the
    front end hands the request over (`policy.frontend_s` of its prompt after the client's
    gap), as it does in model.serve.simulate."""
    gap = mix.gap_s
    if isinstance(load, ClosedLoop):
        gap = np.minimum(gap, load.gap_cap_s)
        if mix.wall_weight is not None:
            gap = gap * mix.wall_weight / float(mix.wall_weight.mean())
        if policy is not None:
            gap = gap + policy.frontend_s(mix.context_tokens)
    return RequestMix(mix.context_tokens.astype(float), mix.uncached_tokens.astype(float),
                      mix.output_tokens.astype(float), gap.astype(float), mix.wall_weight)


def cache_hit_rate(cache, workload: Workload, n: int, seed: int) -> float | None:
    """The hit rate the sample takes from a cache model (model.serve.cache_effect.CacheEffect):
    the cache's misses on top of what an infinite cache already misses, applied to this sample
    (its own draw of the profile may sit a little off the ceiling); None: the sample's own."""
    ceiling = cache.infinite_hit_rate
    if ceiling is None:
        return cache.hit_rate
    if cache.hit_rate < ceiling - 1e-12:
        own = request_mix_for(workload, n, seed).hit_rate
        return own * cache.hit_rate / max(ceiling, 1e-12)
    return None


def live_sessions(workload: Workload, load: Load, seed: int) -> float:
    """Sessions per replica holding a cache footprint: a closed loop's concurrency; an open
    loop's arrivals times the gap between a session's turns (its idle time, which dominates
    agentic traffic; Little's law)."""
    if isinstance(load, ClosedLoop):
        return float(load.concurrency)
    gap = float(np.mean(request_mix_for(workload, MIX_SIZE, seed).gap_s))
    return max(float(load.rate_per_s) * gap, 1.0)
