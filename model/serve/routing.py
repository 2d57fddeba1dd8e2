"""Request routing over R replicas and what it does to prefix-cache hits and load balance.

Each replica keeps its own prefix cache (an LRU of `capacity_tokens` over the requests routed to
it); an optional shared remote pool (Mooncake-store style, `pool_tokens`) sees every replica's
stream. A block is served locally if the replica still holds it, else from the pool, else it is
recomputed; the request's hit is still the leading run of its prompt (model.serve.cache_replay).

Routers (seed post: balancing on queue depth, running tokens or KV use all underperformed
session-aware sticky routing on AgentX):
- `sticky`: a root session's first request goes to the replica with the fewest input tokens
  routed so far; the session, and its subagents, stay there.
- `random`: every request to a uniformly random replica (seeded).
- `least-loaded`: every request to the replica with the fewest input tokens in flight
  (requests whose recorded server time covers the arrival), ties to fewest tokens so far.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from model.serve.cache_replay import BlockStream, check_policy, replay_distances, stream_for
from model.specs.errors import ServecastError

ROUTINGS = ("sticky", "random", "least-loaded")


def check_routing(routing: str) -> None:
    if routing not in ROUTINGS:
        raise ServecastError(f"unknown routing {routing!r}; allowed: {', '.join(ROUTINGS)}")


def assign_replicas(stream: BlockStream, replicas: int, routing: str, seed: int = 0) -> np.ndarray:
    """Replica index of every request (replay order)."""
    check_routing(routing)
    if replicas < 1:
        raise ServecastError(f"replicas must be >= 1, got {replicas}")
    n = stream.requests
    if replicas == 1:
        return np.zeros(n, dtype=np.int64)
    if routing == "random":
        return np.random.default_rng(seed).integers(0, replicas, n)
    tokens = stream.input_tokens.astype(float)
    routed = np.zeros(replicas)
    out = np.empty(n, dtype=np.int64)
    if routing == "sticky":
        home: dict[int, int] = {}
        for i in range(n):
            root = int(stream.root[i])
            if root not in home:
                home[root] = int(np.argmin(routed))
            out[i] = home[root]
            routed[out[i]] += tokens[i]
        return out
    busy_until = stream.t_s + np.nan_to_num(stream.api_time_s, nan=0.0)
    in_flight: list[list[int]] = [[] for _ in range(replicas)]
    for i in range(n):
        now = stream.t_s[i]
        load = np.empty(replicas)
        for r in range(replicas):
            in_flight[r] = [j for j in in_flight[r] if busy_until[j] > now]
            load[r] = sum(tokens[j] for j in in_flight[r])
        best = np.flatnonzero(load == load.min())
        pick = int(best[np.argmin(routed[best])])
        out[i] = pick
        in_flight[pick].append(i)
        routed[pick] += tokens[i]
    return out


@dataclass(frozen=True)
class RoutingResult:
    routing: str
    replicas: int
    policy: str
    capacity_tokens: float  # per replica
    pool_tokens: float  # shared remote pool (0: none)
    input_tokens: int
    hit_tokens: int
    hit_tokens_by_tier: dict[str, int]  # local, remote
    replica_input_tokens: np.ndarray  # per replica
    replica_uncached_tokens: np.ndarray  # per replica: prefill work left after hits

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.input_tokens if self.input_tokens else 0.0

    @property
    def imbalance(self) -> float:
        """max / mean input tokens per replica (1 = perfectly even)."""
        mean = self.replica_input_tokens.mean()
        return float(self.replica_input_tokens.max() / mean) if mean else 1.0

    @property
    def uncached_imbalance(self) -> float:
        """max / mean prefill (uncached) tokens per replica: the compute hot spot."""
        mean = self.replica_uncached_tokens.mean()
        return float(self.replica_uncached_tokens.max() / mean) if mean else 1.0

    def summary(self) -> dict:
        return {"routing": self.routing, "replicas": self.replicas, "policy": self.policy,
                "capacity_tokens": self.capacity_tokens, "pool_tokens": self.pool_tokens,
                "hit_rate": self.hit_rate, "hit_tokens": self.hit_tokens,
                "input_tokens": self.input_tokens, "hit_tokens_by_tier": self.hit_tokens_by_tier,
                "imbalance": self.imbalance, "uncached_imbalance": self.uncached_imbalance}


def route_replay(trace, replicas: int, routing: str, capacity_tokens: float = np.inf,
                 pool_tokens: float = 0.0, policy: str = "lru", interval_tokens: int = 0,
                 seed: int = 0) -> RoutingResult:
    """Replay a trace over `replicas` replicas with per-replica caches of `capacity_tokens`
    and an optional shared pool of `pool_tokens`."""
    from model.serve.cache_replay import _blocks

    check_policy(policy)
    stream = stream_for(trace)
    where = assign_replicas(stream, replicas, routing, seed)
    local = None
    for r in range(replicas):
        d = stream.distances_within(where == r, policy)
        local = d if local is None else np.minimum(local, d)
    tiers = [local]
    caps = [_blocks(capacity_tokens, stream.block_tokens)]
    if pool_tokens > 0:
        tiers.append(stream.distances(policy))
        caps.append(_blocks(pool_tokens, stream.block_tokens))
    run, tier_hits = replay_distances(stream, tiers, caps, policy, interval_tokens)
    b = stream.block_tokens
    hit = np.minimum(run * b, stream.input_tokens)
    names = ["local", "remote"][: len(tiers)]
    by_tier = {k: int(np.minimum(tier_hits[:, i] * b, stream.input_tokens).sum())
               for i, k in enumerate(names)}
    return RoutingResult(
        routing=routing, replicas=replicas, policy=policy, capacity_tokens=float(capacity_tokens),
        pool_tokens=float(pool_tokens), input_tokens=int(stream.input_tokens.sum()),
        hit_tokens=int(hit.sum()), hit_tokens_by_tier=by_tier,
        replica_input_tokens=np.bincount(where, weights=stream.input_tokens, minlength=replicas),
        replica_uncached_tokens=np.bincount(where, weights=stream.input_tokens - hit,
                                            minlength=replicas),
    )
