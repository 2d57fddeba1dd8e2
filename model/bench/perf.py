"""Speed of the perf model (`make bench` calls `bench_perf`): one estimate and a 2,000-row check.

Targets: one estimate <= 50 ms; checking 2,000 rows <= 30 s.
"""

from __future__ import annotations

import json
import time

import pandas as pd

from model import ROOT
from model.fit.cases import case_components, load_cases
from model.perf import step
from model.perf.parallel import ParallelPlan
from model.serve.estimate import estimate
from model.specs.architecture import load_architecture
from model.specs.hardware import load_hardware
from model.validate.check import check_table

CSV = ROOT / "data" / "calibration" / "e2e_measured.csv"


def bench_perf(rows: int = 2000) -> dict:
    """Measured wall times: estimate (cold: plan validation and step-model build included; warm:
    a cached step model) and `check` over the first `rows` rows of the calibration CSV (cold)."""
    arch = load_architecture("deepseek-v3")
    hw = load_hardware("h200-sxm")
    estimate(arch, hw, ParallelPlan(dp=8, ep=8), 1024, 1024, 64)  # imports, kernel tables
    step._build.cache_clear()
    t0 = time.perf_counter()
    estimate(arch, hw, ParallelPlan(dp=8, ep=8), 8192, 1024, 128)
    cold = time.perf_counter() - t0
    n = 20
    t0 = time.perf_counter()
    for c in range(n):
        estimate(arch, hw, ParallelPlan(dp=8, ep=8), 8192, 1024, 16 + c)
    warm = (time.perf_counter() - t0) / n

    cases = load_cases(CSV)[:rows]
    case_components.cache_clear()
    step._build.cache_clear()
    t0 = time.perf_counter()
    table = check_table(cases)
    check_s = time.perf_counter() - t0
    return {"estimate_cold_ms": cold * 1e3, "estimate_warm_ms": warm * 1e3,
            "check_rows": len(cases), "check_s": check_s,
            "check_predicted": int(pd.Series(table["predicted"]).sum()),
            "targets": {"estimate_ms": 50.0, "check_2000_rows_s": 30.0}}


if __name__ == "__main__":
    print(json.dumps(bench_perf(), indent=2))
