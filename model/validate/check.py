"""`servecast check FILE`: predict measured benchmark runs and score the gap.

Reads the calibration CSV and `vllm bench serve --save-result` JSON (`model.fit.cases` reads
both and documents how a record's unstated settings are read). Every row it can model is
predicted with the benchmark-client model (`model.serve.estimate` components, then
`model.serve.closed_loop` under the fitted engine factors); the others are listed with the
reason. Errors are absolute percentage errors |pred - meas| / meas (fractions).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from model.fit.cases import Case, case_components, case_plan_label, deployment_kind, load_cases
from model.perf.engine_factors import load_loop_factors
from model.serve.closed_loop import closed_loop, explain_terms

GROUPS = ("system", "backend", "model")


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
