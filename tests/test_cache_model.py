"""Closed-form hit rate (Che / TTL over the session model) against the exact replay, and the
`hit_rate` entry point the serving model and planner call."""

from __future__ import annotations

import numpy as np
import pytest

from model import ROOT
from model.serve import cache_model
from model.serve import cache_replay as cache
from model.specs.errors import ServecastError

AGENTX = ROOT / "data" / "traces" / "cc_traces_weka_042026_sample"


@pytest.fixture(scope="module")
def stream():
    return cache.stream_for(AGENTX)


@pytest.fixture(scope="module")
def sample(stream):
    return cache_model.sample_from_stream(stream)


def test_hand_che_characteristic_time():
    # Two identical sessions, context 100 tokens held between turns, gaps of 10 s (all < the
    # 300 s live window): occupancy(T) = N * c * min(10, T) / 10 = 20 T tokens for T <= 10.
    # A 100-token cache gives T = 100 / 20 = 5 s; 200 tokens or more: everything fits (inf).
    c = np.array([100.0, 200.0, 200.0])
    u = np.array([100.0, 100.0, 100.0])  # first turn cold; later turns reuse the previous 100
    s = cache_model.SessionSample(c, u, np.array([0.0, 10.0, 10.0]),
                                  np.array([True, False, False]))
    assert cache_model.characteristic_time_s(s, 100.0, 2) == pytest.approx(5.0, rel=1e-6)
    assert cache_model.characteristic_time_s(s, 250.0, 2) == np.inf


def test_closed_form_reaches_the_infinite_hit(sample):
    # With room for every session the closed form serves each turn's whole cached part: the
    # token-weighted infinite-cache hit of the sample (95.008%, test_cache).
    res = cache_model.closed_form(sample, np.inf, 7.0)
    assert res.hit_rate == pytest.approx(0.950083, abs=1e-6)
    assert sample.infinite_hit_rate == pytest.approx(0.950083, abs=1e-6)


def test_closed_form_tracks_replay_above_a_few_sessions_of_kv(stream, sample):
    # Same trace, same inputs (contexts, infinite-cache misses, gaps, live sessions): from 316K
    # tokens (about two sessions' context) to 10M the Che form is within 0.05 of the exact
    # replay at every point and 0.012 on average (notebook cache_hit). Below that it
    # is pessimistic: it misses the prefix heads that survive between bursts.
    n = cache_model.effective_sessions(stream)
    assert n == pytest.approx(7.06, abs=0.01)
    caps = np.logspace(5.5, 7, 7)
    replay = cache.hit_rate_curve(stream, caps)
    closed = np.array([cache_model.closed_form(sample, c, n).hit_rate for c in caps])
    assert np.abs(replay - closed).max() < 0.05
    assert np.abs(replay - closed).mean() < 0.015


def test_entry_point_on_a_trace_reads_the_replay_curve(stream):
    # On a curve grid point the interpolated answer is the exact replay; tiers split it.
    cap = float(cache_model.CURVE_POINTS[25])
    res = cache_model.hit_rate(AGENTX, cap)
    assert res.method == "replay"
    assert res.hit_rate == pytest.approx(cache.replay(stream, cap).hit_rate, abs=1e-12)
    tiered = cache_model.hit_rate(AGENTX, {"hbm": 3e5, "host": 4e6})
    assert sum(tiered.hits_by_tier.values()) == pytest.approx(tiered.hit_rate)
    assert tiered.hit_rate == pytest.approx(cache.replay(stream, 4e6).hit_rate, abs=0.003)


def test_entry_point_on_a_profile_uses_the_closed_form():
    from model.specs.workload import load_workload

    w = load_workload("agentx")
    full = cache_model.hit_rate(w, np.inf, concurrency=32)
    assert full.method == "closed-form"
    assert full.hit_rate == pytest.approx(full.infinite_hit_rate, abs=1e-12)
    small = cache_model.hit_rate(w, 1e6, concurrency=32)
    big = cache_model.hit_rate(w, {"hbm": 1e6, "host": 1.6e7}, concurrency=32)
    assert small.hit_rate < big.hit_rate <= full.hit_rate
    assert big.hits_by_tier["hbm"] == pytest.approx(small.hit_rate)
    # second-hit also misses the previous turn's growth: never above LRU
    assert cache_model.hit_rate(w, np.inf, "second-hit", concurrency=32).hit_rate < full.hit_rate
    with pytest.raises(ServecastError, match="needs concurrency"):
        cache_model.hit_rate(w, 1e6)


def test_deployment_hit_rate_wires_memory_and_tiers(stream):
    # DeepSeek-R1 TP8 on H200: the HBM pool holds ~553K tokens of MLA KV (70,272 B per token on
    # every rank) and host DRAM 0.8 x 256 GB / 70,272 B = 2.91M tokens; the trace-backed answer
    # is the replay at those two inclusive capacities (curve interpolation, within 0.003).
    from model.perf.parallel import ParallelPlan
    from model.perf.tiers import tier_capacity_tokens
    from model.specs.architecture import load_architecture
    from model.specs.hardware import load_hardware

    arch, hw, plan = load_architecture("deepseek-r1"), load_hardware("h200-sxm"), ParallelPlan(tp=8)
    caps = tier_capacity_tokens(arch, hw, plan)
    assert caps["host"] == pytest.approx(0.8 * 256e9 / 70272, rel=1e-9)
    res = cache_model.deployment_hit_rate(AGENTX, arch, hw, plan)
    exact = cache.replay(stream, {"hbm": caps["hbm"], "host": caps["host"]})
    assert res.hit_rate == pytest.approx(exact.hit_rate, abs=0.003)
    assert res.hits_by_tier["host"] == pytest.approx(exact.hit_rate_by_tier["host"], abs=0.01)


def test_tier_traffic_and_reload_time():
    # 10% of input served from host: a 100K-token request moves 10K tokens x 70,272 B = 702.72 MB
    # per GPU; over 50 GB/s plus 10 us that is 14.06 ms.
    from model.perf.tiers import Tier

    res = cache_model.CacheResult(0.9, {"hbm": 0.8, "host": 0.1}, 0.95, "lru", 1, "sticky",
                                  "replay", {"hbm": 1e6, "host": 1e7})
    assert res.tier_traffic_bytes(1e5, 70272.0)["host"] == pytest.approx(7.0272e8)
    links = {"host": Tier("host", 1e12, 50e9, 10e-6, "pcie")}
    assert float(res.reload_time_s(1e5, 70272.0, links)) == pytest.approx(10e-6 + 7.0272e8 / 50e9)
