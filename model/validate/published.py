"""Published measured results, scored and never fitted: the benchmark-client model on every row of
data/benchmarks/published_results.csv (MLPerf Inference submissions, the TensorRT-LLM performance
overview, AMD's ROCm vLLM results, NVIDIA NIM and an Oracle post; data/benchmarks/README.md says
how the rows were chosen and what each assumes). Nothing in the model is tuned to these rows.

Each row is predicted with `model.serve.estimate.estimate` (what `servecast estimate` runs) on one
replica of the stated deployment (tp x pp x dp GPUs, the stated weight and KV formats, backend and
token budget); its output tokens/s per GPU is that of the measured system, which runs identical
replicas side by side. The concurrency of the closed loop:

- offline: the engine's max batch as the row states it (`max_batch`: MLPerf's gpu_batch_size or
  max_num_seqs, AMD's "Max. Seqs", TensorRT-LLM's default max_batch_size 2048, vLLM's default
  max_num_seqs 256); the model caps the running batch at what the KV pool holds;
- fixed-concurrency: the stated concurrency;
- server and interactive: the stated concurrency where given, else the highest concurrency of the
  doubling grid 1, 2, 4, ... up to the max batch whose predicted mean TTFT and TPOT both meet the
  row's limits (MLPerf states them as p99: the mean is held to the p99 limit); none meets them:
  the row is skipped with that reason.

Rows from a dataset whose requests run to their own lengths state `decode_context_share`: the
running decode batch's mean context beyond the mean prompt, in mean outputs, from the dataset's
per-sample lengths (model.serve.closed_loop.Protocol.running_context; blank: fixed lengths, 0.5).

A row the model cannot map (no published mean input length, a deployment the model refuses, a
KV pool too small) carries a skip_reason and no prediction. Errors are predicted / measured - 1.
`python -m model.validate.published` prints the runs and the error figures as JSON.
"""

from __future__ import annotations

import csv
import json
import math
from functools import cache
from pathlib import Path

import numpy as np

from model import ROOT

RUNS_CSV = ROOT / "data" / "benchmarks" / "published_results.csv"
METRICS = ("output_tps_per_gpu", "ttft_ms", "tpot_ms")
BAND_EDGES = ((1, 4, "1-4"), (5, 32, "5-32"), (33, 256, "33-256"), (257, 10**9, "257+"))


def _number(text: str) -> float | None:
    return float(text) if str(text).strip() else None


def load_rows(path: Path = RUNS_CSV) -> list[dict]:
    """The CSV's rows as dicts of strings, in file order."""
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _plan(row: dict):
    from model.perf.parallel import ParallelPlan

    tp, pp, dp, ep = (int(row[k]) for k in ("tp", "pp", "dp", "ep"))
    return ParallelPlan(tp=tp, pp=pp, dp=dp, ep=ep, moe_tp=max(tp * dp // ep, 1))


@cache
def _inputs(model: str, chip: str):
    from model.specs.architecture import load_architecture
    from model.specs.hardware import load_hardware

    return load_architecture(model), load_hardware(chip)


def _estimate(row: dict, concurrency: int) -> dict:
    """`estimate` of one replica of the row's deployment at `concurrency` clients."""
    from model.serve.closed_loop import Protocol
    from model.serve.estimate import estimate
    from model.specs.defaults import MAX_NUM_BATCHED_TOKENS

    arch, hw = _inputs(row["model"], row["chip"])
    budget_tokens = int(_number(row["max_num_batched_tokens"]) or MAX_NUM_BATCHED_TOKENS)
    share = _number(row["decode_context_share"])
    protocol = Protocol() if share is None else Protocol(decode_context_share=share)
    return estimate(arch, hw, _plan(row), int(float(row["isl_mean"])),
                    int(round(float(row["osl_mean"]))), concurrency, precision=row["weights"],
                    kv_dtype=row["kv_dtype"], backend=row["backend"],
                    max_num_batched_tokens=budget_tokens, protocol=protocol)


def _meets_limits(row: dict, out: dict) -> bool:
    ttft_limit_ms, tpot_limit_ms = _number(row["ttft_limit_ms"]), _number(row["tpot_limit_ms"])
    return bool(out["feasible"]) and out["ttft_ms"] <= ttft_limit_ms and out["tpot_ms"] <= tpot_limit_ms


def _latency_bound(row: dict) -> tuple[int | None, dict | None]:
    """Highest concurrency of the doubling grid up to the max batch whose prediction meets the
    row's TTFT and TPOT limits, and that prediction (None, None where none does)."""
    best = (None, None)
    concurrency = 1
    while concurrency <= int(float(row["max_batch"])):
        out = _estimate(row, concurrency)
        if not _meets_limits(row, out):
            break
        best = (concurrency, out)
        concurrency *= 2
    return best


def predict_row(row: dict) -> tuple[dict | None, int | None, str | None]:
    """(estimate output, closed-loop concurrency, skip reason) of one row."""
    from model.specs.errors import ServecastError

    if not row["isl_mean"].strip():
        return None, None, ("mean input length of the dataset not published in a source found "
                            "(only its maximum and the reference's mean output length are)")
    stated = _number(row["concurrency"])
    try:
        if row["mode"] in ("server", "interactive") and stated is None:
            concurrency, out = _latency_bound(row)
            if out is None:
                return None, None, "no concurrency meets the row's TTFT and TPOT limits"
        else:
            concurrency = int(stated if stated is not None else float(row["max_batch"]))
            out = _estimate(row, concurrency)
    except ServecastError as why:
        return None, None, str(why)
    if not out["feasible"]:
        return None, concurrency, out["reason"]
    return out, concurrency, None


def measured(row: dict) -> dict:
    """The row's measured metrics (those it states)."""
    values = {m: _number(row[m]) for m in METRICS}
    return {m: v for m, v in values.items() if v is not None}


def _predicted(out: dict | None, keys) -> dict:
    names = {"output_tps_per_gpu": "output_tokens_per_s_per_gpu", "ttft_ms": "ttft_ms",
             "tpot_ms": "tpot_ms"}
    return {k: (None if out is None else float(out[names[k]])) for k in keys}


def load_band(row: dict, concurrency: int | None) -> str:
    """Offline rows run the engine saturated; the others by clients per replica."""
    if row["mode"] == "offline":
        return "saturated"
    if concurrency is None:
        return "unknown"
    return next(name for low, high, name in BAND_EDGES if low <= concurrency <= high)


def published_runs(path: Path = RUNS_CSV) -> list[dict]:
    """One record per CSV row: id, measured, predicted (None where skipped), skip_reason and the
    slice it is scored in (chip, vendor, model, backend, mode, load band)."""
    runs = []
    for row in load_rows(path):
        out, concurrency, reason = predict_row(row)
        meas = measured(row)
        runs.append({
            "id": row["id"], "measured": meas, "predicted": _predicted(out, meas),
            "skip_reason": reason, "concurrency": concurrency,
            "slice": {"chip": row["chip"], "vendor": row["vendor"], "model": row["model"],
                      "backend": row["backend"], "mode": row["mode"],
                      "load_band": load_band(row, concurrency)}})
    return runs


def relative_error(run: dict, metric: str = "output_tps_per_gpu") -> float | None:
    """predicted / measured - 1 of one run's metric (None where either is missing)."""
    p, m = run["predicted"].get(metric), run["measured"].get(metric)
    return None if p is None or m is None else p / m - 1.0


def summary(runs: list[dict], metric: str = "output_tps_per_gpu", worst: int = 8) -> dict:
    """Median |error| of `metric` overall and per slice key, and the worst rows."""
    scored = [(r, relative_error(r, metric)) for r in runs]
    scored = [(r, e) for r, e in scored if e is not None and math.isfinite(e)]

    def median_abs(items):
        return float(np.median([abs(e) for _, e in items])) if items else None

    by = {}
    for key in ("vendor", "chip", "model", "backend", "mode", "load_band"):
        groups = {}
        for r, e in scored:
            groups.setdefault(r["slice"][key], []).append((r, e))
        by[key] = {name: {"rows": len(items), "median_abs_error": median_abs(items)}
                   for name, items in sorted(groups.items())}
    ranked = sorted(scored, key=lambda item: -abs(item[1]))[:worst]
    return {"metric": metric, "rows": len(runs), "predicted": len(scored),
            "median_abs_error": median_abs(scored),
            "median_error": float(np.median([e for _, e in scored])) if scored else None,
            "by": by, "worst": [{"id": r["id"], "error": e} for r, e in ranked]}


if __name__ == "__main__":
    all_runs = published_runs()
    print(json.dumps({"summary": summary(all_runs), "runs": all_runs}, indent=1))
