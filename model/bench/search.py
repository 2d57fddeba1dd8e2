"""`bench_search()`: speed of the full deployment search on the default scenario (`make bench`).

Two numbers: `cold` includes enumerating the plans, building every plan's step model, the step
tables the search reads (prefill-only plans need none) and the cache model's answers for every
plan's capacities (what happens once per process is done before the clock starts: imports,
reading data files, calibration tables and the workload's sessions, compiling the sympy op
formulas), median and minimum of `repeats` runs; `warm` re-runs the search with those tables
kept, which is the cost of evaluating the candidates (the target: >= 10,000 candidates in
<= 2 s)."""

from __future__ import annotations

import json
import time

import numpy as np

from model.perf import kernels, ops, roofline
from model.perf.engine_factors import engine_factors
from model.plan import plan_models
from model.plan.plan_models import load_specs
from model.plan.planner import clear_search_caches, plan
from model.plan.traffic import traffic_for
from model.serve import cache_model
from model.specs.defaults import DEFAULT_SCENARIO


def _clear_search_caches() -> None:
    """Forget what a search builds: plans, step models and tables, full-tier evaluations, GEMM
    columns, cache-model answers and per-sample curves (not the kernel parameters read from
    data/calibration/, which a process reads once)."""
    clear_search_caches()
    for cached in (roofline._gemm_columns, cache_model._curve_entry, cache_model._cached_part,
                   cache_model._curve):
        cached.cache_clear()


def bench_search(repeats: int = 3, **scenario) -> dict:
    args = {**DEFAULT_SCENARIO, **scenario}
    # data read once per process, not timed: spec files, the calibration tables and the
    # workload's recorded sessions
    for name in ops.FORMULAS:
        ops.compiled(name)

    _, _, w = load_specs(args["arch"], args["hardware"], args["workload"])
    kernels.fitted_table()
    engine_factors("vllm")
    traffic_for(w)
    colds = []
    for _ in range(repeats):  # the machine's noise is tens of percent: report median and min
        _clear_search_caches()
        started = time.perf_counter()
        result = plan(**args)
        colds.append(time.perf_counter() - started)
    cold = float(np.median(colds))
    started = time.perf_counter()
    result = plan(**args)
    warm = time.perf_counter() - started
    return {"scenario": {k: args[k] for k in ("arch", "hardware", "gpus", "workload")},
            "candidates": int(len(result.candidates)),
            "aggregated_candidates": int((result.candidates["mode"] == "aggregated").sum()),
            "disaggregated_candidates": int((result.candidates["mode"] == "disaggregated").sum()),
            "plans": plan_models._plan_model.cache_info().currsize,
            "plans_with_tables": plan_models.step_table.cache_info().currsize,
            "cold_search_s": cold, "cold_search_min_s": min(colds),
            "cold_search_runs_s": [round(c, 3) for c in colds], "warm_search_s": warm,
            "candidates_per_s_warm": len(result.candidates) / warm,
            "target": ">= 10,000 candidates in <= 2 s",
            "meets_target_warm": bool(len(result.candidates) >= 10_000 and warm <= 2.0),
            "meets_target_cold": bool(len(result.candidates) >= 10_000 and cold <= 2.0)}


if __name__ == "__main__":
    print(json.dumps(bench_search(), indent=2))
