"""What the prefix cache does to serving: the hit rate and the tier traffic of
`model.serve.cache_model`, turned into the two things `model.serve.engine.serve` needs.

- hit rate: the token-weighted share of input served from any tier; the request mix's cached
  part is scaled to it, so a smaller cache means more uncached prefill (lower TPGS, longer TTFT);
- reload delay: a hit in a tier below HBM is copied up before the request's prefill can use it.
  The request waits for its copy outside the engine's prefill queue (the KV connector loads
  asynchronously, other requests keep stepping), so the delay adds to that request's TTFT and to
  its response time in the closed loop, not to anyone else's. With `prefetch` the copy starts
  when the session's previous turn ends, so the tool / think gap before the request hides up to
  that much of it (papers/research/theory.md §8; model.perf.tiers.prefetch does the same on a replay).

Lower-tier hits are spread over requests in proportion to their input tokens (the closed form's
token-weighted fractions); tiers copy over their own links in parallel (as
`model.serve.cache_model.CacheResult.reload_time_s`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class CacheEffect:
    hit_rate: float  # cached input tokens / input tokens, all tiers
    hits_by_tier: dict[str, float] = field(default_factory=dict)  # share of input tokens
    kv_bytes_per_token_per_gpu: float = 0.0
    tier_latency_s: dict[str, float] = field(default_factory=dict)
    tier_bandwidth_bytes_per_s: dict[str, float] = field(default_factory=dict)  # per GPU
    prefetch: bool = False  # copy up during the gap before the request
    source: str = ""
    infinite_hit_rate: float | None = None  # the workload's ceiling (the cache_model's)

    def reload_s(self, context_tokens, gap_s=None) -> np.ndarray:
        """Per request: time its lower-tier hits take to reach HBM, less what the gap hides."""
        c = np.asarray(context_tokens, float)
        out = np.zeros_like(c)
        for tier, share in self.hits_by_tier.items():
            if tier == "hbm" or share <= 0:
                continue
            nbytes = share * c * self.kv_bytes_per_token_per_gpu
            t = self.tier_latency_s.get(tier, 0.0) + nbytes / self.tier_bandwidth_bytes_per_s[tier]
            out = np.maximum(out, np.where(nbytes > 0, t, 0.0))
        if self.prefetch and gap_s is not None:
            out = np.maximum(out - np.asarray(gap_s, float), 0.0)
        return out

    def summary(self) -> dict:
        return {"hit_rate": self.hit_rate, "hits_by_tier": dict(self.hits_by_tier),
                "infinite_hit_rate": self.infinite_hit_rate, "prefetch": self.prefetch,
                "source": self.source}


def from_cache_result(result, kv_bytes_per_token_per_gpu: float, links: dict,
                      prefetch: bool = False) -> CacheEffect:
    """A `model.serve.cache_model.CacheResult` plus the tier links (`model.perf.tiers.tiers_for(hw)`)."""
    return CacheEffect(
        float(result.hit_rate), {k: float(v) for k, v in result.hits_by_tier.items()},
        float(kv_bytes_per_token_per_gpu),
        {t: float(links[t].latency_s) for t in result.hits_by_tier if t != "hbm"},
        {t: float(links[t].bandwidth_bytes_per_s) for t in result.hits_by_tier if t != "hbm"},
        prefetch, f"model.serve.cache_model ({result.method}, {result.policy}, "
                  f"{result.replicas} replica(s), {result.routing})",
        float(result.infinite_hit_rate))


def deployment_cache(step_model, workload, sessions: float, policy: str = "lru",
                     tiers=("hbm", "host"), prefetch: bool = False) -> CacheEffect | None:
    """The cache of the replica `step_model` describes (its arch, hw, plan, kv dtype and the
    weights it keeps in host memory, whose HBM the pool takes), for
    `sessions` live sessions per replica; None when the step model has no deployment behind it
    (a reference model) or the workload is not a session profile."""
    arch, hw, plan = (getattr(step_model, a, None) for a in ("arch", "hw", "plan"))
    if arch is None or hw is None or plan is None or workload is None:
        return None
    from model.specs.workload import Workload

    if not isinstance(workload, Workload) or workload.kind != "sessions" or sessions <= 0:
        return None  # recorded traces bring their own hits; request profiles have no sessions
    from model.perf.tiers import kv_bytes_per_token_per_gpu, tiers_for
    from model.serve.cache_model import deployment_hit_rate

    kv_dtype = getattr(step_model, "kv_dtype", None)
    result = deployment_hit_rate(workload, arch, hw, plan, concurrency=float(sessions),
                                 policy=policy, tiers=tuple(tiers), kv_dtype=kv_dtype,
                                 cpu_offload_gib=float(getattr(step_model, "cpu_offload_gib", 0.0)))
    return from_cache_result(result, kv_bytes_per_token_per_gpu(arch, plan, kv_dtype),
                             tiers_for(hw), prefetch)
