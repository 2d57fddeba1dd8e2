"""Exact prefix-cache replay: stack distances, the AgentX infinite-cache hit, capacities,
policies and tiers."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from model import ROOT
from model.serve import cache_replay as cache
from model.specs.errors import ServecastError
from model.specs.traces import Request, Session

TRACES = ROOT / "data" / "traces"
AGENTX = TRACES / "cc_traces_weka_042026_sample"


@pytest.fixture(scope="module")
def stream():
    return cache.stream_for(AGENTX)


def _brute_force_hits(requests: list[list[int]], capacity: int) -> list[list[bool]]:
    """Reference LRU: a request looks its blocks up in the C most recent, then touches them
    tail first (head most recent), as vLLM frees a finished request's blocks in reverse."""
    stack: list[int] = []
    out = []
    for blocks in requests:
        resident = stack[-capacity:] if capacity else []
        out.append([b in resident for b in blocks])
        for b in reversed(blocks):
            if b in stack:
                stack.remove(b)
            stack.append(b)
    return out


@pytest.mark.parametrize("use_numba", [True, False])
def test_stack_distances_match_brute_force_lru(use_numba):
    rng = np.random.default_rng(7)
    for _ in range(60):
        reqs = [list(dict.fromkeys(rng.integers(0, 9, rng.integers(0, 7)).tolist()))
                for _ in range(rng.integers(1, 10))]
        keys = np.array([b for r in reqs for b in reversed(r)], dtype=np.int64)
        bounds = np.r_[0, np.cumsum([len(r) for r in reqs])]
        d = cache.stack_distances(keys, bounds, use_numba=use_numba)
        for capacity in range(0, 10):
            got, k = [], 0
            for r in reqs:
                got.append(list(d[k:k + len(r)][::-1] < capacity))
                k += len(r)
            assert got == _brute_force_hits(reqs, capacity)


def test_hand_example_partial_prefix_survives():
    # A1=[a1 a2], B1=[b1 b2], A2=[a1 a2 a3]. With 3 blocks the LRU stack after B1 is
    # (newest first) b1 b2 a1 a2: a1 is within the 3 most recent, a2 is not -> A2 hits 1 block
    # (64 tokens); with 4 blocks it hits both (128 tokens).
    def req(ids):
        return Request(0.0, 64 * len(ids), 1, np.array(ids), 64)

    a = Session("a", (req([1, 2]),), root_id="a", hash_scope="global")
    b = Session("b", (Request(1.0, 128, 1, np.array([11, 12]), 64),), root_id="b",
                hash_scope="global")
    a2 = Session("a2", (Request(2.0, 192, 1, np.array([1, 2, 3]), 64),), root_id="a2",
                 hash_scope="global")
    s = cache.block_stream([a, b, a2])
    assert cache.replay(s, 3 * 64).request_hit_tokens.tolist() == [0, 0, 64]
    assert cache.replay(s, 4 * 64).request_hit_tokens.tolist() == [0, 0, 128]


def test_infinite_cache_matches_agentx_derived_hit(stream):
    # data/traces/derived/..._requests_derived.csv: inf_cache_hit_tokens = min(in, 64 x the
    # longest leading run of hash_ids seen earlier in the same trace). Over the 20 sample traces
    # it sums to 174,189,120 of 183,341,009 input tokens = 95.008%, trace by trace.
    derived = pd.read_csv(TRACES / "derived" / "cc_traces_weka_042026_requests_derived.csv")
    res = cache.replay(stream)
    sub = derived[derived.trace_id.isin(stream.root_ids)]
    assert res.hit_tokens == int(sub.inf_cache_hit_tokens.sum()) == 174_189_120
    assert res.input_tokens == 183_341_009
    assert res.hit_rate == pytest.approx(0.950083, abs=1e-6)
    per_trace = pd.Series(res.request_hit_tokens, index=[stream.root_ids[r] for r in stream.root])
    assert (per_trace.groupby(level=0).sum()
            == sub.groupby("trace_id").inf_cache_hit_tokens.sum()).all()


@pytest.mark.parametrize("name,expected", [("conversation", 0.374), ("synthetic", 0.651)])
def test_mooncake_infinite_hit(name, expected):
    # papers/research/workloads.md §3 [computed]: token-weighted infinite-cache prefix hit with
    # 512-token blocks, global ids: conversation 37.4%, synthetic 65.1%.
    res = cache.replay(TRACES / f"mooncake_fast25_{name}_trace.jsonl")
    assert res.hit_rate == pytest.approx(expected, abs=0.0006)


def test_curve_equals_replay_and_grows_with_capacity(stream):
    caps = [0.0, 1e5, 1e6, 4e6, np.inf]
    for policy in ("lru", "second-hit"):
        curve = cache.hit_rate_curve(stream, caps, policy)
        exact = [cache.replay(stream, c, policy).hit_rate for c in caps]
        assert curve == pytest.approx(exact, abs=1e-12)
        assert np.all(np.diff(curve) >= 0)
    assert curve[0] == 0.0


def test_policies_at_infinite_capacity(stream):
    # second-hit admits a block on its second sighting, so each append-only turn also misses the
    # previous turn's growth: the ceiling drops from 95.0% to about 1 - 2 x 5.0% = 90.0%
    # (replay: 90.98%, resets are not doubled). Interval only hits at saved prompt ends, which
    # append-only turns always reach; it loses at subagent branch points and compactions.
    lru = cache.replay(stream).hit_rate
    second = cache.replay(stream, policy="second-hit").hit_rate
    interval = cache.replay(stream, policy="interval").hit_rate
    assert second == pytest.approx(0.9098, abs=5e-4)
    assert second < interval < lru
    assert interval == pytest.approx(0.9372, abs=5e-4)
    # checkpoints every 64 tokens are every block boundary: interval == lru exactly
    assert cache.replay(stream, policy="interval", interval_tokens=64).hit_rate == lru


def test_tiers_are_inclusive_and_split_hits(stream):
    one = cache.replay(stream, 4e6)
    two = cache.replay(stream, {"hbm": 3e5, "host": 4e6})
    # an inclusive host tier of 4M tokens serves exactly what a 4M-token single pool would
    assert two.hit_tokens == one.hit_tokens
    assert two.hit_tokens_by_tier["hbm"] + two.hit_tokens_by_tier["host"] == two.hit_tokens
    assert two.hit_tokens_by_tier["hbm"] >= cache.replay(stream, 3e5).hit_tokens * 0.99


def test_replay_errors():
    with pytest.raises(ServecastError, match="no hash_ids"):
        cache.replay(TRACES / "azure_llm_2023_code.csv")
    with pytest.raises(ServecastError, match="allowed: lru, interval, second-hit"):
        cache.replay(AGENTX, policy="fifo")
    with pytest.raises(ServecastError, match="must be >= 0"):
        cache.replay(AGENTX, -5)
