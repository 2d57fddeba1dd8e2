"""Speed of the cache layer (`make bench`): replay of the full AgentX sample, a capacity curve,
routing over 8 replicas, and the per-call cost of the `cache_model.hit_rate` fast paths."""

from __future__ import annotations

import time

import numpy as np

from model import ROOT
from model.serve import cache_model, routing
from model.serve import cache_replay as cache
from model.specs.traces import load_trace
from model.specs.workload import load_workload

AGENTX = ROOT / "data" / "traces" / "cc_traces_weka_042026_sample"


def _timed(fn):
    start = time.perf_counter()
    value = fn()
    return value, time.perf_counter() - start


def bench_cache() -> dict:
    cache._stack_kernel()  # numba compile/load is a one-time cost, measured separately
    _, jit_s = _timed(lambda: cache.stack_distances(np.arange(10, dtype=np.int64)))
    sessions, load_s = _timed(lambda: load_trace(AGENTX))
    stream, build_s = _timed(lambda: cache.block_stream(sessions))
    inf, replay_s = _timed(lambda: cache.replay(stream))
    caps = np.geomspace(1e4, 1e8, 50)
    _, curve_s = _timed(lambda: cache.hit_rate_curve(stream, caps))
    _, route_s = _timed(lambda: routing.route_replay(stream, 8, "random", 1e6))
    cache_model.hit_rate(AGENTX, 1e6)  # builds the cached curve
    n = 200
    _, fast_s = _timed(lambda: [cache_model.hit_rate(AGENTX, c) for c in np.geomspace(1e5, 1e7, n)])
    w = load_workload("agentx")
    cache_model.hit_rate(w, 1e6, concurrency=32)
    _, closed_s = _timed(lambda: [cache_model.hit_rate(w, c, concurrency=32)
                                  for c in np.geomspace(1e5, 1e7, n)])
    return {
        "agentx_block_references": int(len(stream.keys)),
        "agentx_hit_rate": inf.hit_rate,
        "numba_first_call_s": jit_s,
        "load_trace_s": load_s,
        "build_stream_s": build_s,
        "replay_infinite_s": replay_s,
        "curve_50_capacities_s": curve_s,
        "route_8_replicas_s": route_s,
        "hit_rate_trace_per_call_ms": fast_s / n * 1e3,
        "hit_rate_closed_form_per_call_ms": closed_s / n * 1e3,
    }


if __name__ == "__main__":
    for key, value in bench_cache().items():
        print(f"{key}: {value:.4g}" if isinstance(value, float) else f"{key}: {value}")
