"""`servecast check FILE`: predict measured benchmark runs and score the gap.

Reads the calibration CSV and `vllm bench serve --save-result` JSON (`model.fit.cases` reads
both and documents how a record's unstated settings are read). Every row it can model is
predicted with the benchmark-client model (`model.serve.estimate` components, then
`model.serve.closed_loop` under the fitted engine factors); the others are listed with the
reason. Errors are absolute percentage errors |pred - meas| / meas (fractions).
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd

from model import ROOT
from model.fit.cases import Case, case_components, case_plan_label, deployment_kind, load_cases
from model.perf.engine_factors import ENGINE_YAML, engine_table, load_loop_factors
from model.serve.closed_loop import closed_loop, explain_terms

GROUPS = ("system", "backend", "model")
E2E_CSV = ROOT / "data" / "calibration" / "e2e_measured.csv"
MODES = {"agg": "aggregated", "disagg": "disaggregated"}
MEASURED_DATE = re.compile(r"measured=(\d{4}-\d{2}-\d{2})")
# engine.yaml score name -> the held-out scheme it stores (model.fit.engine.run)
HELD_OUT = {"held_out_5fold_by_config": "5fold_by_config",
            "held_out_leave_one_model_out": "leave_one_model_out"}


def _factors(case: Case, factors: dict | None) -> dict:
    """Closed-loop factors for a case: `factors` maps backend -> a mapping of factor names
    (model.perf.engine_factors.LoopFactors; missing names from engine.yaml); default: engine.yaml."""
    return {**load_loop_factors(case.backend), **((factors or {}).get(case.backend) or {})}


def predict_case(case: Case, factors: dict | None = None) -> dict:
    """Prediction for one case ({'ttft_ms', 'tpot_ms'}), or {'skip': reason}. `factors` maps
    backend -> factor overrides (default: the fitted ones in data/calibration/engine.yaml)."""
    comp = case_components(case)
    if "skip" in comp:
        return comp
    ttft, tpot, _ = closed_loop(comp, _factors(case, factors))
    return {"ttft_ms": float(ttft) * 1e3, "tpot_ms": float(tpot) * 1e3}


def _ape(pred, meas):
    return np.abs(np.asarray(pred) - np.asarray(meas)) / np.asarray(meas)


def score(table: pd.DataFrame) -> dict:
    """Error figures of the predicted rows of a per-row table."""
    ok = table[table["predicted"]]
    te = _ape(ok["pred_ttft_ms"], ok["ttft_ms"]) if len(ok) else np.array([])
    pe = _ape(ok["pred_tpot_ms"], ok["tpot_ms"]) if len(ok) else np.array([])

    def stat(fn, a):
        return float(fn(a)) if len(a) else None

    return {"rows": int(len(table)), "predicted": int(len(ok)),
            "ttft_mape": stat(np.mean, te), "tpot_mape": stat(np.mean, pe),
            "ttft_median_ape": stat(np.median, te), "tpot_median_ape": stat(np.median, pe)}


def check_table(cases: list[Case], factors=None) -> pd.DataFrame:
    rows = []
    for c in cases:
        r = predict_case(c, factors)
        rows.append({"id": c.id, "model": c.model, "system": c.system, "backend": c.backend,
                     "mode": c.mode, "isl": c.isl, "osl": c.osl, "concurrency": c.concurrency,
                     "plan": case_plan_label(c), "deployment": deployment_kind(c),
                     "ttft_ms": c.ttft_ms, "tpot_ms": c.tpot_ms,
                     "predicted": "skip" not in r,
                     "pred_ttft_ms": r.get("ttft_ms"), "pred_tpot_ms": r.get("tpot_ms"),
                     "skip_reason": r.get("skip")})
    df = pd.DataFrame(rows)
    ok = df["predicted"]
    df["ttft_ape"] = np.where(ok, _ape(df["pred_ttft_ms"].fillna(0), df["ttft_ms"]), np.nan)
    df["tpot_ape"] = np.where(ok, _ape(df["pred_tpot_ms"].fillna(0), df["tpot_ms"]), np.nan)
    return df


def check(path: str | Path, out_csv: str | Path | None = None, overrides: dict | None = None,
          factors=None) -> dict:
    """The `servecast check` contract: rows, predicted, skipped, MAPE and median APE of TTFT and
    TPOT overall and by system, backend, model, mode and deployment (aggregated, disaggregated
    with recorded or with inferred worker counts)."""
    table = check_table(load_cases(path, overrides), factors)
    result = summarize(table)
    if out_csv:
        Path(out_csv).parent.mkdir(parents=True, exist_ok=True)
        table.to_csv(out_csv, index=False)
        result["out"] = str(out_csv)
    return result


def summarize(table: pd.DataFrame) -> dict:
    result = score(table)
    result["coverage"] = result["predicted"] / max(result["rows"], 1)
    result["skipped"] = [{"id": r.id, "reason": r.skip_reason}
                         for r in table[~table["predicted"]].itertuples()]
    for g in GROUPS:
        result[f"by_{g}"] = {str(k): score(sub) for k, sub in table.groupby(g)}
    result["by_mode"] = {str(k): score(sub) for k, sub in table.groupby("mode")}
    result["by_deployment"] = {str(k): score(sub) for k, sub in table.groupby("deployment")}
    return result


def explain_case(case: Case) -> dict:
    """Which terms make up the predicted TPOT and TTFT of a run (seconds), and the largest one:
    engineers read the gap against the term that dominates."""
    comp = case_components(case)
    if "skip" in comp:
        return {}
    terms = explain_terms(comp, _factors(case, None))
    tpot_terms, ttft_terms = terms["tpot_terms_s"], terms["ttft_terms_s"]
    return {"tpot_term": max(tpot_terms, key=tpot_terms.get),
            "ttft_term": max(ttft_terms, key=ttft_terms.get), "arrival_sync": terms["sync"],
            **{f"tpot_{k}_ms": v * 1e3 for k, v in tpot_terms.items()},
            **{f"ttft_{k}_ms": v * 1e3 for k, v in ttft_terms.items()}}


def explain_table(cases: list[Case]) -> pd.DataFrame:
    """check_table plus the term breakdown of each predicted row."""
    table = check_table(cases)
    extra = pd.DataFrame([explain_case(c) for c in cases])
    return pd.concat([table, extra], axis=1)


# ---- the calibration set of `servecast validate` (model.validate.scoreboard) -------------------
def _measured_dates(path: Path) -> dict[str, str]:
    """Run id -> the date its `silicon_data_source` says it was measured (rows that say)."""
    df = pd.read_csv(path, usecols=["id", "silicon_data_source"])
    found = df["silicon_data_source"].astype(str).str.extract(MEASURED_DATE, expand=False)
    return {i: d for i, d in zip(df["id"], found, strict=True) if isinstance(d, str)}


def calibration_runs(path: str | Path = E2E_CSV) -> list[dict]:
    """The calibration runs as scoreboard runs: measured and predicted mean TTFT and TPOT as
    `check` gives them, sliced by chip, model, backend, mode, concurrency band and deployment
    kind (check's `by_deployment`), each with its measurement date where the row states it."""
    from model.validate.scoreboard import concurrency_band, run_record, run_slice

    table = check_table(load_cases(path))
    dates = _measured_dates(Path(path))
    return [run_record(r.id, {"ttft_ms": r.ttft_ms, "tpot_ms": r.tpot_ms},
                       {"ttft_ms": r.pred_ttft_ms, "tpot_ms": r.pred_tpot_ms},
                       r.skip_reason if isinstance(r.skip_reason, str) else None,
                       run_slice(r.system, r.model, r.backend, MODES.get(r.mode, r.mode),
                                 concurrency_band(r.concurrency), {"deployment": r.deployment}),
                       {"date": dates.get(r.id)})
            for r in table.itertuples()]


def calibration_held_out(recompute: bool = False) -> dict:
    """Held-out errors of the engine factors (model.fit.engine): 5-fold by configuration and
    leaving one model out. Stored in engine.yaml when the factors were fitted, or with
    `recompute` refitted here per fold (minutes)."""
    if recompute:
        return _recomputed_held_out()
    doc = engine_table()
    source = (f"{ENGINE_YAML.relative_to(ROOT)}, stored by `python -m model.fit.engine` "
              f"(fitted {doc.get('fitted')})")
    out = {}
    for key, scheme in HELD_OUT.items():
        s = doc["scores"][key]["overall"]
        out[scheme] = {"source": source, "rows": s["rows"],
                       "median_abs_error": {"ttft_ms": s["ttft_median_ape"],
                                            "tpot_ms": s["tpot_median_ape"]},
                       "mean_abs_error": {"ttft_ms": s["ttft_mape"], "tpot_ms": s["tpot_mape"]}}
    return out


def _recomputed_held_out(path: Path = E2E_CSV) -> dict:
    from model.fit.engine import component_table, config_folds, held_out
    from model.validate.scoreboard import scores

    table = component_table(path)
    df = table[table["skip"].isna()].reset_index(drop=True)
    out = {}
    for scheme, groups in (("5fold_by_config", config_folds(df)),
                           ("leave_one_model_out", df["model"])):
        ttft, tpot = held_out(df, groups)
        errors = {"ttft_ms": ttft / df["ttft_ms"].to_numpy() - 1,
                  "tpot_ms": tpot / df["tpot_ms"].to_numpy() - 1}
        out[scheme] = {"source": "recomputed: model.fit.engine.held_out, a refit per fold",
                       **scores(errors, np.ones(len(df), dtype=bool))}
    return out
