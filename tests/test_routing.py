"""Routing over replicas: sticky vs random vs least-loaded, with and without a shared pool."""

from __future__ import annotations

import numpy as np
import pytest

from model import ROOT
from model.serve import cache_replay as cache
from model.serve import routing
from model.specs.errors import ServecastError

AGENTX = ROOT / "data" / "traces" / "cc_traces_weka_042026_sample"


@pytest.fixture(scope="module")
def stream():
    return cache.stream_for(AGENTX)


def test_sticky_beats_random_over_8_replicas(stream):
    # Sticky keeps every session (and its subagents) on one replica, so with unbounded caches
    # each replica holds its sessions' whole history: exactly the single-cache 95.008%
    # (test_cache: derived inf_cache_hit_tokens). Random routing finds, on the replica it picks,
    # only the prefix of the session's last visit there, on average R = 8 turns old, so it
    # misses those turns' growth: 73.0% with seed 0; least-loaded behaves the same (72.1%).
    inf = cache.replay(stream).hit_rate
    sticky = routing.route_replay(stream, 8, "sticky")
    rand = routing.route_replay(stream, 8, "random", seed=0)
    least = routing.route_replay(stream, 8, "least-loaded")
    assert sticky.hit_rate == pytest.approx(inf, abs=1e-12)
    assert rand.hit_rate == pytest.approx(0.730, abs=0.005)
    assert least.hit_rate == pytest.approx(0.721, abs=0.005)
    assert sticky.hit_rate - rand.hit_rate > 0.2
    # ...at finite capacity the gap widens: random keeps up to 8 copies of each session
    s_cap = routing.route_replay(stream, 8, "sticky", 5e5).hit_rate
    r_cap = routing.route_replay(stream, 8, "random", 5e5).hit_rate
    assert s_cap - r_cap > sticky.hit_rate - rand.hit_rate


def test_load_imbalance_is_the_price_of_stickiness(stream):
    # Keeping sessions whole can never balance better than the largest session's share:
    # trace_0003 alone holds 2.094 x the mean replica's input tokens over 8 replicas.
    roots = np.bincount(stream.root, weights=stream.input_tokens)
    bound = roots.max() * 8 / roots.sum()
    assert bound == pytest.approx(2.094, abs=0.001)
    sticky = routing.route_replay(stream, 8, "sticky")
    rand = routing.route_replay(stream, 8, "random", seed=0)
    assert sticky.imbalance >= bound
    assert rand.imbalance < 1.1
    assert routing.route_replay(stream, 8, "least-loaded").imbalance < 1.05


def test_shared_pool_recovers_random_routing(stream):
    # An unbounded shared pool sees every replica's blocks: any miss on the local replica is a
    # remote hit, so the total equals the single-cache hit rate; local + remote add up.
    res = routing.route_replay(stream, 8, "random", pool_tokens=np.inf)
    assert res.hit_rate == pytest.approx(cache.replay(stream).hit_rate, abs=1e-12)
    assert res.hit_tokens_by_tier["local"] + res.hit_tokens_by_tier["remote"] == res.hit_tokens
    assert res.hit_tokens_by_tier["remote"] > 0.2 * res.input_tokens


def test_one_replica_is_the_plain_replay(stream):
    for name in routing.ROUTINGS:
        assert routing.route_replay(stream, 1, name, 1e6).hit_tokens == \
            cache.replay(stream, 1e6).hit_tokens


def test_routing_errors(stream):
    with pytest.raises(ServecastError, match="allowed: sticky, random, least-loaded"):
        routing.route_replay(stream, 8, "round-robin")
    with pytest.raises(ServecastError, match="replicas must be >= 1"):
        routing.assign_replicas(stream, 0, "sticky")
