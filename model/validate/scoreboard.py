"""`servecast validate`: the model scored against every measured set, one scoreboard.

A measured set is one entry of the registry (`model.validate.registry.SETS`): a function that
returns the set's runs, where the measurements come from, and when they were measured. A run is a dict

    {"id", "measured": {metric: value}, "predicted": {metric: value or None},
     "skip_reason": str or None, "slice": {"chip", "vendor", "model", "backend", "mode",
     "load_band", ...}}

(`run_record` and `run_slice` build one). A set may add slice keys of its own; a slice value of
None means the key does not apply to that run. Relative error = predicted / measured - 1, per
metric, over the runs that have both numbers; `median_abs_error` is the median of its absolute
value. Scores are per set overall and per slice value; nothing here is fitted.

This module imports no model code at load time: a set's runs function is imported when the set
is scored, so scoring one set never loads the others.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from pathlib import Path

import numpy as np

from model import ROOT
from model.validate.registry import (  # noqa: F401  (the registry is part of this API)
    SETS,
    MeasuredSet,
    measured_set,
    percent,
    set_names,
)

SLICE_KEYS = ("chip", "vendor", "model", "backend", "mode", "load_band")
# Closed-loop load bands (concurrent sessions / benchmark clients) shared by the serving sets
CONCURRENCY_BANDS = ((1, 4, "1-4 sessions"), (5, 24, "5-24"), (25, 99, "25-99"),
                     (100, 10**9, "100+"))


def _function(path: str) -> Callable:
    module, name = path.split(":")
    return getattr(importlib.import_module(module), name)


# ---- run records --------------------------------------------------------------------------------
def concurrency_band(concurrency: int) -> str:
    """The CONCURRENCY_BANDS name of a closed-loop load."""
    return next(name for lo, hi, name in CONCURRENCY_BANDS if lo <= concurrency <= hi)


def run_slice(chip: str | None, model: str | None, backend: str | None, mode: str | None,
              load_band: str | None, extra: dict | None = None) -> dict:
    """A run's slice: the chip as its hardware/*.yaml name (aliases resolved) with that spec's
    vendor, then the given keys and any set-specific ones in `extra`."""
    from model.specs.hardware import load_hardware

    hw = load_hardware(chip) if chip else None
    return {"chip": hw.name if hw else None, "vendor": hw.vendor if hw else None,
            "model": model, "backend": backend, "mode": mode, "load_band": load_band,
            **(extra or {})}


def _number(value) -> float | None:
    """A finite float, or None for a missing or non-finite value."""
    if value is None:
        return None
    value = float(value)
    return value if np.isfinite(value) else None


def run_record(run_id: str, measured: dict, predicted: dict | None, skip_reason: str | None,
               slice_: dict, extra: dict | None = None) -> dict:
    """One run: `predicted` None (or `skip_reason` set) means no prediction; every metric of
    `measured` then predicts None."""
    predicted = predicted if not skip_reason else None
    return {"id": str(run_id), "measured": {m: _number(v) for m, v in measured.items()},
            "predicted": {m: _number((predicted or {}).get(m)) for m in measured},
            "skip_reason": skip_reason or None, "slice": slice_, **(extra or {})}


# ---- scores -------------------------------------------------------------------------------------
def _metrics(runs: list[dict]) -> list[str]:
    return list(dict.fromkeys(m for r in runs for m in r["measured"]))


def relative_errors(runs: list[dict], metric: str) -> np.ndarray:
    """predicted / measured - 1 of every run (NaN where a number is missing or measured <= 0)."""
    out = np.full(len(runs), np.nan)
    for i, r in enumerate(runs):
        m, p = r["measured"].get(metric), r["predicted"].get(metric)
        if r["skip_reason"] is None and m is not None and p is not None and m > 0:
            out[i] = p / m - 1.0
    return out


def _stat(fn, e: np.ndarray) -> float | None:
    e = e[~np.isnan(e)]
    return float(fn(e)) if len(e) else None


def scores(errors: dict[str, np.ndarray], predicted: np.ndarray) -> dict:
    """Rows, predicted rows and the error figures of one group of runs (`errors`: metric ->
    relative error per run, `predicted`: whether each run has a prediction)."""
    return {"rows": int(len(predicted)), "predicted": int(predicted.sum()),
            "median_abs_error": {m: _stat(np.median, np.abs(e)) for m, e in errors.items()},
            "median_error": {m: _stat(np.median, e) for m, e in errors.items()},
            "mean_abs_error": {m: _stat(np.mean, np.abs(e)) for m, e in errors.items()}}


def natural_order(value: str) -> tuple:
    """Sort key that puts "5-24" before "25-99" (a leading number compares as a number)."""
    lead = re.match(r"\d+", value)
    return (0, int(lead.group()), value) if lead else (1, 0, value)


def slice_scores(runs: list[dict], errors: dict[str, np.ndarray], predicted: np.ndarray) -> dict:
    """{slice key: {value: scores}} over every slice key the runs carry (values sorted; runs
    whose value is None are left out of that key)."""
    keys = list(dict.fromkeys(k for r in runs for k in r["slice"]))
    out = {}
    for key in keys:
        values = np.array([r["slice"].get(key) for r in runs], dtype=object)
        present = sorted({str(v) for v in values if v is not None}, key=natural_order)
        if present:
            out[key] = {}
            for v in present:
                mask = np.array([x is not None and str(x) == v for x in values])
                out[key][v] = scores({m: e[mask] for m, e in errors.items()}, predicted[mask])
    return out


def set_date(entry: MeasuredSet, runs: list[dict]) -> str:
    """The registry's date, else the range of the runs' own dates."""
    if entry.date:
        return entry.date
    dates = sorted(str(r["date"]) for r in runs if r.get("date"))
    if not dates:
        return "not stated"
    span = dates[0] if dates[0] == dates[-1] else f"{dates[0]} to {dates[-1]}"
    return f"{span} ({len(dates)} of {len(runs)} runs state a date)"


def score_runs(entry: MeasuredSet, runs: list[dict], held_out: dict | None = None) -> dict:
    """The JSON object of one set."""
    errors = {m: relative_errors(runs, m) for m in _metrics(runs)}
    predicted = np.array([r["skip_reason"] is None for r in runs], dtype=bool)
    out = {"name": entry.name, "source": entry.source, "date": set_date(entry, runs),
           **scores(errors, predicted)}
    if held_out is not None:
        out["held_out"] = held_out
    return out | {"slices": slice_scores(runs, errors, predicted), "runs": runs}


def score_set(name: str, cross_validate: bool = False) -> dict:
    """Score one registered set (`cross_validate`: recompute its held-out errors where the set
    can, instead of reading the stored ones)."""
    entry = measured_set(name)
    runs = _function(entry.runs)()
    held_out = _function(entry.held_out)(cross_validate) if entry.held_out else None
    return score_runs(entry, runs, held_out)


def validate(names: list[str] | None = None, cross_validate: bool = False) -> dict:
    """One set's object for one name, else {"sets": [...]} (no names: every set). Every name is
    checked before any set is scored."""
    chosen = list(dict.fromkeys(names or set_names()))
    for n in chosen:
        measured_set(n)
    if names and len(chosen) == 1:
        return score_set(chosen[0], cross_validate)
    return {"sets": [score_set(n, cross_validate) for n in chosen]}


# ---- the generated report -----------------------------------------------------------------------
def _overall_lines(result: dict) -> list[str]:
    lines = ["| metric | median \\|error\\| | median error | mean \\|error\\| |",
             "|---|---:|---:|---:|"]
    for m, v in result["median_abs_error"].items():
        lines.append(f"| {m} | {percent(v)} | {percent(result['median_error'][m], True)} | "
                     f"{percent(result['mean_abs_error'][m])} |")
    return lines


def _held_out_lines(held_out: dict) -> list[str]:
    lines = ["## Held out (cross-validated)", "",
             "| scheme | metric | median \\|error\\| | mean \\|error\\| | source |",
             "|---|---|---:|---:|---|"]
    for scheme, s in held_out.items():
        for m, v in s["median_abs_error"].items():
            mean = (s.get("mean_abs_error") or {}).get(m)
            lines.append(f"| {scheme} | {m} | {percent(v)} | {percent(mean)} | {s['source']} |")
    for scheme, s in held_out.items():
        if s.get("by_op"):
            metrics = list(next(iter(s["by_op"].values())))
            lines += ["", f"{scheme}, per op class:", "",
                      "| op | " + " | ".join(f"{m} median \\|error\\|" for m in metrics) + " |",
                      "|---|" + "---:|" * len(metrics)]
            lines += [f"| {op} | " + " | ".join(percent(v[m]) for m in metrics) + " |"
                      for op, v in s["by_op"].items()]
    return lines + [""]


def _slice_lines(slices: dict, metrics: list[str]) -> list[str]:
    lines = ["## By slice", "",
             "Median |error| (median error) per metric; runs without the slice key are left out "
             "of that table.", ""]
    for key, by_value in slices.items():
        lines += [f"### {key}", "",
                  f"| {key} | runs | predicted | " + " | ".join(metrics) + " |",
                  "|---|---:|---:|" + "---:|" * len(metrics)]
        for value, s in by_value.items():
            cells = [f"{percent(s['median_abs_error'][m])} ({percent(s['median_error'][m], True)})"
                     for m in metrics]
            lines.append(f"| {value} | {s['rows']} | {s['predicted']} | " + " | ".join(cells)
                         + " |")
        lines.append("")
    return lines


def _skipped_lines(runs: list[dict]) -> list[str]:
    reasons: dict[str, int] = {}
    for r in runs:
        if r["skip_reason"] is not None:
            reasons[r["skip_reason"]] = reasons.get(r["skip_reason"], 0) + 1
    if not reasons:
        return []
    return (["## Runs without a prediction", "", "| reason | runs |", "|---|---:|"]
            + [f"| {reason.replace('|', '/')} | {n} |" for reason, n in sorted(reasons.items(),
                                                             key=lambda kv: -kv[1])] + [""])


def report_markdown(result: dict) -> str:
    """The generated report of one set's result (`score_runs`)."""
    share = result["predicted"] / max(result["rows"], 1)
    lines = [f"# Scoreboard: {result['name']}", "",
             f"Generated by `servecast validate {result['name']} --report`; do not edit. "
             "Error = predicted / measured - 1; medians over the runs that have both numbers. "
             "Nothing in this set is fitted unless its source says so.", "",
             f"- Source: {result['source']}", f"- Date: {result['date']}",
             f"- Runs: {result['rows']}, predicted {result['predicted']} ({share:.1%})", "",
             "## Overall", "", *_overall_lines(result), ""]
    if result.get("held_out"):
        lines += _held_out_lines(result["held_out"])
    lines += _slice_lines(result["slices"], list(result["median_abs_error"]))
    lines += _skipped_lines(result["runs"])
    return "\n".join(lines).rstrip() + "\n"


def write_report(result: dict) -> Path:
    """Write the set's report beside its data (MeasuredSet.report_path); returns its path
    relative to the repository root."""
    path = measured_set(result["name"]).report_path
    path.write_text(report_markdown(result))
    return path.relative_to(ROOT)
