"""Fit the kernel and collective efficiency curves on the measured tables; report held-out error.

    python -m model.fit.calibrate          # refit, rewrite data/calibration/kernels.yaml + kernel_report.md

The measured tables and their reduction to roofline inputs: `model.fit.kernel_tables` (GEMM,
MoE, GQA, KDA) and `model.fit.attention_modules` (MLA, DSV4 CSA/HCA, MSA modules, shapes from
data/architectures/); the fits: `model.fit.kernel_fit` and `model.fit.comm_fit`; the report:
`model.fit.kernel_report`. This module runs them per chip and writes the results.

Leave-one-chip-out: H200 predicted from the H100 fit, B200 from the H100 and H200 fits, via the
transfer rule of `model.perf.kernels`.
"""

from __future__ import annotations

import datetime
import sys
import time
from collections.abc import Callable, Iterator

import numpy as np
import pandas as pd
import yaml

from model.fit.attention_modules import MODULE_TABLES, module_samples
from model.fit.comm_fit import (
    COMM_PARAM_NAMES,
    comm_heldout_ape,
    comm_predict,
    comm_samples,
    fit_comm,
)
from model.fit.kernel_fit import (
    FOLDS,
    PARAM_NAMES,
    fit,
    heldout_ape,
    moe_heldout_by_distribution,
    params_from,
    predict_s,
    theta_of,
)
from model.fit.kernel_report import REPORT_MD, report_markdown, stored_rows
from model.fit.kernel_tables import (
    CHIPS,
    DATASET,
    chip_spec,
    dtypes_in,
    gemm_samples,
    gqa_samples,
    has_table,
    kda_samples,
    moe_distribution,
    moe_dtypes,
    moe_samples,
)
from model.perf import comm, kernels, roofline
from model.specs.hardware import load_hardware
from model.specs.layers import Attention

MIN_ROWS = 30
TRANSFER_PAIRS = (("h100_sxm", "h200_sxm"), ("h100_sxm", "b200_sxm"), ("h200_sxm", "b200_sxm"),
                  ("h200_sxm", "cdna3_304cu"))  # the rule every other op class of MI300X follows
COMM_TABLES = {"nccl": "nccl", "custom": "custom_allreduce", "deepep": "moe_a2a"}


def sample_sets(chip: str, gemm_fits: dict | None = None) -> Iterator[tuple[str, str, Callable]]:
    """Yield (op_class, key, builder) for every fittable table slice of a chip. Module
    builders need the chip's GEMM fits (passed in once those are done)."""
    if not has_table(chip, "gemm"):  # a die measured in the MoE table only (PARTIAL_TABLES)
        for dt in moe_dtypes(chip):
            yield "moe", dt, (lambda dt=dt: moe_samples(chip, dt))
        return
    for dt in dtypes_in(chip, "gemm", "gemm_dtype"):
        yield "gemm", dt, (lambda dt=dt: gemm_samples(chip, dt))
    for dt in moe_dtypes(chip):
        yield "moe", dt, (lambda dt=dt: moe_samples(chip, dt))
    for phase in ("prefill", "decode"):
        for kv in ("bf16", "fp8"):
            yield f"attention.gqa.{phase}", kv, (lambda p=phase, kv=kv: gqa_samples(chip, p, kv))
        yield f"attention.linear.{phase}", "bf16", (lambda p=phase: kda_samples(chip, p))
    if gemm_fits is None:
        return
    for family in MODULE_TABLES:
        for phase in ("prefill", "decode"):
            for kv in ("bf16", "fp8"):
                yield (f"attention.{family}.{phase}", kv,
                       (lambda f=family, p=phase, kv=kv: module_samples(chip, f, p, kv,
                                                                         gemm_fits)))


def comm_sets(chip: str) -> Iterator[tuple[str, str, Callable]]:
    if not has_table(chip, "nccl"):
        return
    for op in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all"):
        yield f"collective.{op}", "nccl", (lambda op=op: comm_samples(chip, op, "nccl"))
    yield "collective.all_reduce", "custom", (lambda: comm_samples(chip, "all_reduce", "custom"))
    yield "collective.all_to_all", "deepep", (lambda: comm_samples(chip, "all_to_all", "deepep"))


def table_of(op_class: str) -> str:
    """The measured table an op class is fitted on."""
    parts = op_class.split(".")
    if parts[0] != "attention":
        return parts[0]
    family, phase = parts[1], parts[2]
    if family == "gqa":
        return "context_attention" if phase == "prefill" else "generation_attention"
    if family == "linear":
        return "kda"
    return MODULE_TABLES[family][0 if phase == "prefill" else 1]


def _is_module(op_class: str) -> bool:
    parts = op_class.split(".")
    return len(parts) > 1 and parts[1] in MODULE_TABLES


def _summary(errors: np.ndarray) -> dict:
    return {"heldout_median_ape": round(float(np.nanmedian(errors)), 4),
            "heldout_p90_ape": round(float(np.nanpercentile(errors, 90)), 4)}


def _entry(names, theta, rows: int, errors, dataset: str) -> dict:
    """One kernels.yaml entry: the named parameters (6 significant digits), rows, dataset."""
    entry = {name: float(f"{v:.6g}") for name, v in zip(names, theta, strict=True)
             if name != "module_overhead_s" or v > 0}
    entry.update(rows=int(rows), dataset=dataset)
    if errors is not None:
        entry.update(_summary(errors))
    return entry


def _reused(chip: str, reuse: dict | None, missing_only: bool) -> tuple[dict, list[dict]]:
    """The stored entries a partial refit keeps (collectives are refitted unless
    `missing_only`), with their report rows."""
    kept = {op_class: dict(by_key) for op_class, by_key in (reuse or {}).items()
            if missing_only or not op_class.startswith("collective.")}
    return kept, stored_rows(chip, kept)


def _fit_kernels(chip: str, entries: dict, rows: list, heldout: bool, log) -> None:
    """Fit every kernel table slice of `chip` that `entries` has no fit for (GEMMs first: the
    attention modules need the chip's GEMM curves), adding to `entries` and `rows`."""
    gemm_fits = {key: params_from(theta_of(entry)) for key, entry in entries.get("gemm", {}).items()}
    for stage in (None, "modules"):
        for op_class, key, build in sample_sets(chip, gemm_fits if stage else None):
            if (stage and not _is_module(op_class)) or key in entries.get(op_class, {}):
                continue
            s = build()
            if len(s.time_s) < MIN_ROWS:
                continue
            theta = fit(s)
            errors = heldout_ape(s) if heldout else None
            entry = _entry(PARAM_NAMES, theta, len(s.time_s), errors,
                           f"ops/{chip}/{table_of(op_class)}.parquet")
            row = {"chip": chip, "op_class": op_class, "key": key, "rows": len(s.time_s),
                   **({} if errors is None else _summary(errors))}
            if op_class == "moe":
                entry["distribution"] = moe_distribution(chip)
                if heldout:
                    by_dist = moe_heldout_by_distribution(chip, key)
                    entry["heldout_median_ape_by_distribution"] = by_dist
                    row["by_distribution"] = by_dist
            if op_class == "gemm":
                gemm_fits[key] = params_from(theta)
            entries.setdefault(op_class, {})[key] = entry
            rows.append(row)
            log(f"{chip} {op_class} {key}: {entry}")


def _fit_collectives(chip: str, entries: dict, rows: list, heldout: bool, log) -> None:
    for op_class, key, build in comm_sets(chip):
        if key in entries.get(op_class, {}):
            continue
        s = build()
        errors = comm_heldout_ape(s) if heldout else None
        entry = _entry(COMM_PARAM_NAMES, fit_comm(s), len(s.time_s), errors,
                       f"ops/{chip}/{COMM_TABLES[key]}.parquet")
        entries.setdefault(op_class, {})[key] = entry
        rows.append({"chip": chip, "op_class": op_class, "key": key, "rows": len(s.time_s),
                     **({} if errors is None else _summary(errors))})
        log(f"{chip} {op_class} {key}: {entry}")


def calibrate_chip(chip: str, heldout: bool = True, log=print, reuse: dict | None = None,
                   missing_only: bool = False) -> tuple[dict, list[dict]]:
    """Fit every op class of one chip; returns (kernels.yaml entries, report rows). With
    `reuse` (this chip's stored entries) only the collectives are refitted; with `missing_only`
    too, every stored fit is kept and only table slices without one are fitted."""
    entries, rows = _reused(chip, reuse, missing_only)
    if not reuse or missing_only:
        _fit_kernels(chip, entries, rows, heldout, log)
    bf16 = entries.get("gemm", {}).get("bf16")
    if bf16 is None:  # a die measured in the MoE table only
        return entries, rows
    entries["memory"] = entries.get("memory") or {"bf16": {
        "compute_efficiency_max": 1.0, "half_tokens": 1.0, "overhead_s": 0.0,
        "memory_efficiency": bf16["memory_efficiency"],
        "dataset": bf16["dataset"], "note": "weight-streaming efficiency of the bf16 GEMM fit"}}
    _fit_collectives(chip, entries, rows, heldout, log)
    return entries, rows


def _rate_of(op_class: str, key: str) -> str:
    if op_class in ("gemm", "moe"):
        return roofline.lookup_dtype(key).rate
    return "bf16"


def _transfer_row(reference: str, target: str, op_class: str, key: str, predicted_s,
                  s) -> dict:
    return {"reference": reference, "target": target, "op_class": op_class, "key": key,
            "rows": len(s.time_s),
            "transfer_median_ape": float(np.median(np.abs(predicted_s / s.time_s - 1.0))),
            "transfer_median_ratio": float(np.median(predicted_s / s.time_s))}


def transfer_check(reference: str, target: str, fitted: dict, log=print) -> list[dict]:
    """Leave-one-chip-out: predict the target chip's measured rows from the reference chip's
    fit, moved by the transfer rule of model.perf.kernels (MAMF ratio on the compute ceiling, the
    target's own peaks and bandwidths). Returns one report row per op class and key."""
    ref = fitted[reference]
    ref_mamf = kernels.reference_mamf(reference)
    tgt_mamf = dict(chip_spec(target).mamf_efficiency)

    def transferred(op_class, key):
        entry = ref.get(op_class, {}).get(key)
        if entry is None:
            return None
        theta = theta_of(entry)
        theta[0] = min(1.0, theta[0] * kernels.mamf_ratio(tgt_mamf, ref_mamf,
                                                          _rate_of(op_class, key)))
        return theta

    out = []
    gemm_fits = {k: params_from(transferred("gemm", k)) for k in ref.get("gemm", {})}
    for op_class, key, build in sample_sets(target, gemm_fits):
        theta = transferred(op_class, key)
        if theta is None:
            continue
        s = build()
        if len(s.time_s) < MIN_ROWS:
            continue
        out.append(_transfer_row(reference, target, op_class, key, predict_s(theta, s), s))
        log(f"transfer {reference}->{target} {op_class} {key}: {out[-1]['transfer_median_ape']:.3f}")
    for op_class, key, build in comm_sets(target):
        entry = ref.get(op_class, {}).get(key)
        if entry is not None:
            s = build()
            out.append(_transfer_row(reference, target, op_class, key,
                                     comm_predict(theta_of(entry, COMM_PARAM_NAMES), s), s))
    return out


def run(chips=CHIPS, heldout: bool = True, log=print, collectives_only: bool = False,
        missing_only: bool = False) -> dict:
    """Fit all chips, check the transfer rule, write kernels.yaml and kernel_report.md
    (`collectives_only`: keep the stored kernel fits, refit the collectives; `missing_only`:
    keep every stored fit and its date, fit only what has none: a new format leaves the
    others' fits as they were, where a full refit would drift them in their flat directions)."""
    fitted, rows = {}, []
    stored = kernels.fitted_table() if collectives_only or missing_only else {}
    today = datetime.date.today().isoformat()
    for chip in chips:
        entries, chip_rows = calibrate_chip(chip, heldout=heldout, log=log,
                                            reuse=stored.get(chip), missing_only=missing_only)
        if missing_only:
            old = stored.get(chip, {})
            for op_class, by_key in entries.items():
                for key, entry in by_key.items():
                    if key not in old.get(op_class, {}):
                        entry.setdefault("fitted_on", today)
        fitted[chip] = entries
        rows += chip_rows
    write_fits(fitted, _stored_date() if missing_only else today)
    transfers = []
    for ref, tgt in TRANSFER_PAIRS:
        if ref in fitted and tgt in chips:
            transfers += transfer_check(ref, tgt, fitted, log=log)
    REPORT_MD.write_text(report_markdown(pd.DataFrame(rows), pd.DataFrame(transfers), today))
    return {"fitted": fitted, "heldout": pd.DataFrame(rows), "transfer": pd.DataFrame(transfers)}


def _stored_date() -> str:
    return str(yaml.safe_load(kernels.KERNELS_YAML.read_text())["fitted_on"])


def write_fits(fitted: dict, today: str) -> None:
    doc = {"description": "Fitted kernel and collective efficiency curves (model.perf.kernels, "
                          "model.perf.comm); regenerate with `python -m model.fit.calibrate`.",
           "dataset": DATASET, "fitted_on": today,
           "method": f"scipy least_squares on log time, soft-L1; held-out error: {FOLDS}-fold "
                     "over shape groups, median absolute percentage error",
           "chips": fitted}
    kernels.KERNELS_YAML.write_text(yaml.safe_dump(doc, sort_keys=False, width=100))
    roofline.clear_cache()
    comm.clear_cache()


def main(argv: list[str] | None = None) -> None:
    """Fit the kernel and collective curves and write data/calibration/kernels.yaml."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m model.fit.calibrate", description=main.__doc__)
    ap.add_argument("--collectives-only", action="store_true",
                    help="refit the collectives alone, keeping every kernel fit")
    ap.add_argument("--missing-only", action="store_true",
                    help="fit only the slices kernels.yaml does not hold yet")
    args = ap.parse_args(sys.argv[1:] if argv is None else argv)
    run(collectives_only=args.collectives_only, missing_only=args.missing_only)


def bench_kernels(candidates: int = 10_000) -> dict:
    """Per-call cost of the kernel functions (scalar) and a vectorized 10,000-candidate sweep,
    in microseconds / milliseconds (`make bench`)."""
    hw = load_hardware("h200-sxm")
    att = Attention("gqa", 64, 8, 128, 128, ())
    calls = {
        "gemm_time_us": lambda m: roofline.gemm_time_s(m, 7168, 2048, "fp8_block", hw),
        "moe_time_us": lambda m: roofline.moe_time_s(m, 7168, 2048, 8, 32, 1, 8, "fp8", hw),
        "attention_time_us": lambda m: roofline.attention_time_s("gqa", "decode", m, 1, 32_000,
                                                                 att, "fp8", hw, 8),
        "collective_time_us": lambda m: comm.collective_time_s("all_reduce", m * 14336.0, 8, hw),
        "memory_time_us": lambda m: roofline.memory_time_s(m * 1e6, hw),
    }
    out = {}
    for name, fn in calls.items():
        fn(64.0)  # load fits once
        reps = 2000
        t0 = time.process_time()  # CPU time: less sensitive to other load on a shared box
        for i in range(reps):
            fn(float(1 + i % 512))
        out[name] = (time.process_time() - t0) / reps * 1e6
    m = np.linspace(1, 16384, candidates)
    t0 = time.process_time()
    for fn in calls.values():
        fn(m)
    out[f"sweep_{candidates}_all_five_ms"] = (time.process_time() - t0) * 1e3
    return {k: round(v, 2) for k, v in out.items()}


if __name__ == "__main__":
    main()
