"""The per-op kernel tables as a measured set of `servecast validate`.

Every measured table slice that data/calibration/kernels.yaml has a fitted curve for (GEMM, MoE,
attention and collectives per chip and format, read as `python -m model.fit.calibrate` reads
them: model.fit.calibrate.sample_sets / comm_sets) is predicted with its stored curve, the one
the model runs with (in-sample). A run is one shape group (the unit the fit's K-fold holds out:
a GEMM's (n, k), a MoE layer shape, an attention config, a collective's message-size octave) in
one load band; its `kernel_time_s` is the geometric mean time of its rows, measured and
predicted, so its error is the group's typical ratio at that load. (The tables hold ~880,000
rows; one run per row would not fit a JSON answer.) Load band: the roofline's rows per call
(GEMM m, MoE rows per expert, attention query rows), for collectives the message size.

The cross-validated errors are the 5-fold held-out errors kernels.yaml stores per table.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pandas as pd

from model.perf.kernels import KERNELS_YAML, fitted_table
from model.validate.scoreboard import run_record, run_slice

METRIC = "kernel_time_s"
# (upper bound, name): the roofline's rows per call; a collective's message bytes
ROW_BANDS = ((16, "1-16 rows"), (256, "17-256 rows"), (4096, "257-4096 rows"),
             (np.inf, "4097+ rows"))
BYTE_BANDS = ((2.0**16, "below 64 KiB"), (2.0**22, "64 KiB-4 MiB"), (np.inf, "4 MiB and up"))


def _bands(values: np.ndarray, bands: tuple, side: str) -> np.ndarray:
    """The band name of every value (`side` "left": upper bounds inclusive)."""
    names = np.array([name for _, name in bands], dtype=object)
    return names[np.searchsorted([hi for hi, _ in bands[:-1]], values, side=side)]


def measured_tables(chip: str, entries: dict) -> Iterator[tuple[str, str, pd.DataFrame]]:
    """(op class, format, rows) of every table slice of `chip` with a stored curve; rows hold
    the measured and predicted time, the shape group and the load band."""
    from model.fit.calibrate import comm_sets, sample_sets
    from model.fit.comm_fit import COMM_PARAM_NAMES, comm_predict
    from model.fit.kernel_fit import params_from, predict_s, theta_of

    gemm_fits = {k: params_from(theta_of(v)) for k, v in entries.get("gemm", {}).items()}
    for op_class, key, build in sample_sets(chip, gemm_fits):
        if (entry := entries.get(op_class, {}).get(key)) is not None:
            s = build()
            yield op_class, key, pd.DataFrame({
                "measured_s": s.time_s, "predicted_s": predict_s(theta_of(entry), s),
                "group": s.group, "band": _bands(s.rows, ROW_BANDS, "left")})
    for op_class, key, build in comm_sets(chip):
        if (entry := entries.get(op_class, {}).get(key)) is not None:
            s = build()
            yield op_class, key, pd.DataFrame({
                "measured_s": s.time_s,
                "predicted_s": comm_predict(theta_of(entry, COMM_PARAM_NAMES), s),
                "group": s.group, "band": _bands(s.size_bytes, BYTE_BANDS, "right")})


def table_runs(chip: str, op_class: str, key: str, rows: pd.DataFrame) -> list[dict]:
    """One run per shape group and load band of a table slice (a die's partial table is
    sliced under the chip whose spec its rows are reduced with)."""
    from model.fit.kernel_tables import PARTIAL_TABLES

    logs = rows.assign(measured=np.log(rows.measured_s), predicted=np.log(rows.predicted_s))
    agg = logs.groupby(["group", "band"], sort=True).agg(
        rows=("measured", "size"), measured=("measured", "mean"), predicted=("predicted", "mean"))
    parts = op_class.split(".")
    phase = parts[2] if parts[0] == "attention" else None
    base = run_slice(PARTIAL_TABLES.get(chip, chip), None, None, phase, None,
                     {"op": op_class, "format": key})
    return [run_record(f"{chip}/{op_class}/{key}/group{g}/{band}",
                       {METRIC: float(np.exp(r.measured))}, {METRIC: float(np.exp(r.predicted))},
                       None, base | {"load_band": band}, {"table_rows": int(r.rows)})
            for (g, band), r in agg.iterrows()]


def kernel_runs(chips: tuple[str, ...] | None = None) -> list[dict]:
    """The kernel set's runs, every measured chip (or `chips`) in the order of kernels.yaml."""
    fitted = fitted_table()
    return [run for chip in chips or tuple(fitted)
            for op_class, key, rows in measured_tables(chip, fitted[chip])
            for run in table_runs(chip, op_class, key, rows)]


def kernel_held_out(recompute: bool = False) -> dict:
    """The 5-fold held-out errors kernels.yaml stores per table (model.fit.kernel_report):
    the median over tables of each table's held-out median, overall and per op class.
    Recomputing them is a refit of every table (`python -m model.fit.calibrate`, not run
    here), so `recompute` changes nothing but says so."""
    from model.fit.kernel_report import heldout_report
    from model.specs.specio import load_yaml

    report = heldout_report()
    fitted_on = load_yaml(KERNELS_YAML.read_text()).get("fitted_on")
    source = (f"data/calibration/kernels.yaml, stored by `python -m model.fit.calibrate` "
              f"(fitted {fitted_on}); median over tables of each table's held-out median")
    if recompute:
        source += "; not recomputed (a refit of every table: python -m model.fit.calibrate)"
    by_op = report.groupby("op_class")["heldout_median_ape"].median()
    return {"5fold_by_shape_group": {
        "source": source, "tables": int(len(report)),
        "table_rows": int(report["rows"].sum()),
        "median_abs_error": {METRIC: float(report["heldout_median_ape"].median())},
        "by_op": {op: {METRIC: float(v)} for op, v in by_op.items()}}}
