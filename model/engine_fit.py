"""Engine factors, fitted with scipy on the end-to-end calibration measurements
(`data/calibration/e2e_measured.csv`, copied from ../shared/data/calibration/), stored with
provenance in `data/calibration/engine.yaml`, and scored on held-out folds.

Nine named factors per backend (vllm, sglang, trtllm):
- `step_overhead_s`: fixed time per engine step (scheduler, sampling, launches, host syncs);
- `prefill_scale`, `decode_scale`: multiply the kernel time of prefill / decode steps (what the
  per-kernel calibration misses end to end: fusion, graph capture, stragglers);
- `arrival_sync`: how synchronized the benchmark clients' requests are (1 = every client sends
  together, as fixed-length runs drift into; 0 = spread out), see `model.estimate.closed_loop`;
- `request_overhead_s`: fixed time each request spends before its first token outside the
  engine steps (API server, tokenization, admission, first-token streaming);
- `moe_scale`: multiplies the routed-expert kernel time (routing, token permutation and expert
  load imbalance that the per-kernel MoE tables do not see);
- `disagg_decode_scale`: multiplies the decode step of disaggregated decode workers (the
  disaggregated records run faster than the aggregated ones imply; speculative decoding and
  decode-worker counts the records do not carry end up here);
- `disagg_arrival_sync`, `disagg_request_overhead_s`: the arrival synchronization and fixed
  per-request time of disaggregated deployments, whose requests take another path (router,
  prefill worker, KV transfer, decode worker).

The kernel physics (model.roofline with the kernel fits of model.kernels) is computed once per
run (`model.check.case_components`); the fit then only evaluates `closed_loop`, so it takes
seconds. Loss: Cauchy (robust) on log(pred/measured) of TTFT and TPOT. Scores are reported in-sample,
5-fold by configuration (model, system, backend, plan: all ISL/OSL/concurrency points of one
deployment are held out together) and leaving one model out.

Run `python -m model.engine_fit` to refit and rewrite engine.yaml.
"""

from __future__ import annotations

import datetime
from dataclasses import asdict, fields
from functools import cache

import numpy as np
import pandas as pd
import yaml

from model import ROOT

ENGINE_YAML = ROOT / "data" / "calibration" / "engine.yaml"
E2E_CSV = ROOT / "data" / "calibration" / "e2e_measured.csv"
FITTED = ("step_overhead_s", "prefill_scale", "decode_scale", "arrival_sync", "request_overhead_s",
          "moe_scale", "disagg_decode_scale", "disagg_arrival_sync", "disagg_request_overhead_s")
BACKENDS = ("vllm", "sglang", "trtllm")
_LO = np.array([0.0, 0.2, 0.2, 0.0, 0.0, 0.2, 0.2, 0.0, 0.0])
_HI = np.array([0.05, 5.0, 5.0, 1.0, 2.0, 5.0, 5.0, 1.0, 5.0])
_X0 = np.array([0.003, 1.0, 1.0, 0.5, 0.05, 1.0, 1.0, 0.5, 0.1])
_N = len(FITTED)


@cache
def _table() -> dict:
    if not ENGINE_YAML.exists():
        return {}
    return yaml.safe_load(ENGINE_YAML.read_text()) or {}


def load_factors(backend: str, system: str | None = None):
    """Fitted factors of a backend (defaults when engine.yaml has none)."""
    from model.step import EngineFactors

    entry = _table().get("backends", {}).get(backend)
    if not entry:
        return EngineFactors()
    values = {f.name: float(entry[f.name]) for f in fields(EngineFactors) if f.name in entry
              and f.name != "source"}
    values["source"] = f"{ENGINE_YAML.name}:{backend} (fitted {_table().get('fitted', '?')})"
    return EngineFactors(**values)


def factors_dict(factors) -> dict:
    return {k: v for k, v in asdict(factors).items() if k in FITTED}


# ---- data ---------------------------------------------------------------------------------------
COMPONENT_KEYS = ("m_dec", "m_wave", "m_one", "k_dec", "n_dec", "k_wave", "n_wave", "wave_steps_mean", "wave_steps", "k_one",
                  "n_one", "chunks", "running", "concurrency", "osl", "per_rank", "t_kv",
                  "disagg", "spec")


def component_table(path=E2E_CSV) -> pd.DataFrame:
    """One row per measured run: identifiers, measurements and the physics components."""
    from model.check import case_components, load_cases

    rows = []
    for case in load_cases(path):
        comp = case_components(case)
        plan = case.plan.label() if case.plan else (
            f"P{case.disagg.prefill_workers}x{case.disagg.prefill_plan.label()}/"
            f"D{case.disagg.decode_workers}x{case.disagg.decode_plan.label()}")
        row = {"id": case.id, "model": case.model, "system": case.system,
               "backend": case.backend, "mode": case.mode, "plan": plan,
               "config": f"{case.model}|{case.system}|{case.backend}|{plan}",
               "ttft_ms": case.ttft_ms, "tpot_ms": case.tpot_ms, "skip": comp.get("skip")}
        if "skip" not in comp:
            row.update({k: comp[k] for k in COMPONENT_KEYS})
        rows.append(row)
    return pd.DataFrame(rows)


def predict(df: pd.DataFrame, params: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(ttft_ms, tpot_ms) for the rows of a component table under per-backend params."""
    from model.estimate import closed_loop

    p = np.stack([params[b] for b in df["backend"]])
    comp = {k: df[k].to_numpy(float) for k in COMPONENT_KEYS}
    ttft, tpot, _ = closed_loop(comp, *(p[:, i] for i in range(_N)))
    return ttft * 1e3, tpot * 1e3


def _residuals(vec, df, backends):
    params = {b: vec[_N * i: _N * i + _N] for i, b in enumerate(backends)}
    ttft, tpot = predict(df, params)
    return np.concatenate([np.log(ttft / df["ttft_ms"].to_numpy()),
                           np.log(tpot / df["tpot_ms"].to_numpy())])


def fit(df: pd.DataFrame) -> dict[str, np.ndarray]:
    """Least-squares (soft-L1) fit of the factors per backend present in `df`."""
    from scipy.optimize import least_squares

    backends = sorted(df["backend"].unique())
    x0 = np.tile(_X0, len(backends))
    res = least_squares(_residuals, x0, args=(df, backends), loss="cauchy", f_scale=0.2,
                        bounds=(np.tile(_LO, len(backends)), np.tile(_HI, len(backends))))
    return {b: res.x[_N * i: _N * i + _N] for i, b in enumerate(backends)}


def _errors(df: pd.DataFrame, ttft, tpot) -> dict:
    te = np.abs(ttft / df["ttft_ms"].to_numpy() - 1)
    pe = np.abs(tpot / df["tpot_ms"].to_numpy() - 1)
    return {"rows": int(len(df)), "ttft_median_ape": float(np.median(te)),
            "tpot_median_ape": float(np.median(pe)), "ttft_mape": float(np.mean(te)),
            "tpot_mape": float(np.mean(pe))}


def held_out(df: pd.DataFrame, groups: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """Predictions for every row from a fit that did not see its group."""
    ttft = np.full(len(df), np.nan)
    tpot = np.full(len(df), np.nan)
    for g in groups.unique():
        test = (groups == g).to_numpy()
        train = df[~test]
        params = fit(train)
        sub = df[test]
        fallback = np.median(np.stack(list(params.values())), axis=0)
        full = {b: params.get(b, fallback) for b in sub["backend"].unique()}
        ttft[test], tpot[test] = predict(sub, full)
    return ttft, tpot


def config_folds(df: pd.DataFrame, k: int = 5, seed: int = 0) -> pd.Series:
    configs = np.array(sorted(df["config"].unique()))
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(configs))
    fold_of = {configs[j]: i % k for i, j in enumerate(order)}
    return df["config"].map(fold_of)


def report(df: pd.DataFrame, ttft, tpot) -> dict:
    out = {"overall": _errors(df, ttft, tpot)}
    for g in ("system", "backend", "model", "mode"):
        out[f"by_{g}"] = {str(k): _errors(df[m], ttft[m], tpot[m])
                          for k, m in ((k, (df[g] == k).to_numpy()) for k in sorted(df[g].unique()))}
    return out


def run(path=E2E_CSV, write: bool = True) -> dict:
    """Fit on all predictable rows, score in-sample and held out, write engine.yaml."""
    table = component_table(path)
    df = table[table["skip"].isna()].reset_index(drop=True)
    params = fit(df)
    ttft, tpot = predict(df, params)
    cv_t, cv_p = held_out(df, config_folds(df))
    lomo_t, lomo_p = held_out(df, df["model"])
    result = {
        "fitted": datetime.date.today().isoformat(),
        "fitted_on": "data/calibration/e2e_measured.csv (copy of ../shared/data/calibration/"
                     "e2e_measured.csv: aiconfigurator-core 0.12.0 silicon_sample, NVIDIA)",
        "method": "scipy.optimize.least_squares, cauchy (f_scale 0.2) on log(pred/measured) of "
                  "mean TTFT and mean TPOT; kernels from model.roofline (data/calibration/"
                  "kernels.yaml); closed loop from model.estimate.closed_loop",
        "rows": int(len(table)), "rows_fitted": int(len(df)),
        "backends": {b: {name: float(v) for name, v in zip(FITTED, vec, strict=True)}
                     for b, vec in params.items()},
        "scores": {"in_sample": report(df, ttft, tpot),
                   "held_out_5fold_by_config": report(df, cv_t, cv_p),
                   "held_out_leave_one_model_out": report(df, lomo_t, lomo_p)},
    }
    if write:
        ENGINE_YAML.parent.mkdir(parents=True, exist_ok=True)
        ENGINE_YAML.write_text("# Engine factors per backend; written by `python -m model.engine_fit`"
                               "\n" + yaml.safe_dump(result, sort_keys=False, width=100))
        _table.cache_clear()
        from model.step import _stored_factors

        _stored_factors.cache_clear()
    return result


if __name__ == "__main__":
    r = run()
    s = r["scores"]
    for name in ("in_sample", "held_out_5fold_by_config", "held_out_leave_one_model_out"):
        print(name, s[name]["overall"])
    print(r["backends"])
