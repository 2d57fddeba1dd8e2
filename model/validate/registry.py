"""The registry of measured sets `servecast validate` scores, and how a score prints. Light on
purpose (no numpy, no model code): the command line lists the sets in its help from here."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from model import ROOT
from model.specs.errors import ServecastError


@dataclass(frozen=True)
class MeasuredSet:
    """One measured set: `runs` and `held_out` name functions as "module:function"."""

    name: str
    runs: str  # () -> list of run records
    source: str  # where the measurements come from
    data: str  # the set's data, relative to the repository root; the report goes beside it
    date: str = ""  # when measured; "" = the range of the runs' own "date" fields
    held_out: str = ""  # (recompute: bool) -> {scheme: scores}: cross-validated errors

    @property
    def report_path(self) -> Path:
        return (ROOT / self.data).parent / f"{self.name}_scoreboard.md"


SETS = (
    MeasuredSet("calibration", "model.validate.check:calibration_runs",
                "aiconfigurator-core 0.12.0 silicon_sample end-to-end runs (NVIDIA), copied "
                "from ../shared/data/calibration/e2e_measured.csv; the engine factors are "
                "fitted on them (data/calibration/engine.yaml): in-sample, held-out below",
                "data/calibration/e2e_measured.csv",
                held_out="model.validate.check:calibration_held_out"),
    MeasuredSet("kernels", "model.validate.kernels:kernel_runs",
                "aiconfigurator-core 0.12.0 silicon tables (vLLM 0.24.0 kernels; NCCL through "
                "the TRT-LLM harness) and, for the MI300X / MI325X die's MoE, AITER's tuned "
                "fused-MoE times (ROCm/aiter @e4048607), data/calibration/ops; the kernel "
                "curves are fitted on "
                "them (data/calibration/kernels.yaml): in-sample, held-out below. A run is one "
                "shape group in one load band, its time the geometric mean of its rows "
                "(model.validate.kernels)",
                "data/calibration/ops",
                date="not stated by the aiconfigurator tables (0.12.0 package data); AITER "
                     "configurations as of its commit of 2026-08-22",
                held_out="model.validate.kernels:kernel_held_out"),
    MeasuredSet("inferencex-agentx", "model.validate.agentx:agentx_runs",
                "SemiAnalysis InferenceX AgentX runs (benchmark API export; provenance in "
                "data/benchmarks/README.md), deployments from the InferenceX recipes "
                "(data/benchmarks/inferencex_agentx_deployments.yaml); never fitted",
                "data/benchmarks/inferencex_agentx_2026-09-15.csv",
                date="2026-09-15 (retrieved from the InferenceX API)"),
    MeasuredSet("inferencex-agentx-simulator", "model.validate.agentx_simulated:simulated_runs",
                "the same InferenceX AgentX runs, predicted by the simulator (model.serve.simulate) "
                "on each aggregated run's replica, stored in "
                "data/benchmarks/inferencex_agentx_simulated.csv by `python -m "
                "model.validate.agentx_simulated`; never fitted",
                "data/benchmarks/inferencex_agentx_simulated.csv",
                date="2026-09-15 (retrieved from the InferenceX API)"),
    MeasuredSet("published", "model.validate.published:published_runs",
                "results vendors and engines published with their deployment stated (MLPerf "
                "Inference v5.1, TensorRT-LLM performance overview, AMD ROCm vLLM results, NVIDIA "
                "NIM, an Oracle MI300X post; sources and dates per row in "
                "data/benchmarks/published_results.csv and data/benchmarks/README.md); never fitted",
                "data/benchmarks/published_results.csv",
                date="per row (source_date): 26 rows published 2025-09-09 to 2025-10-06, 42 "
                     "from sources that state no date, read 2026-12-06"),
)


def set_names() -> tuple[str, ...]:
    return tuple(s.name for s in SETS)


def measured_set(name: str) -> MeasuredSet:
    """The registry entry of `name`; ServecastError naming the allowed sets otherwise."""
    for s in SETS:
        if s.name == name:
            return s
    raise ServecastError(f"unknown measured set {name!r}; allowed: {', '.join(set_names())}")


def percent(value: float | None, signed: bool = False) -> str:
    """A fraction as a percentage with one decimal ("-" for None)."""
    if value is None:
        return "-"
    return f"{value * 100:+.1f}%" if signed else f"{value * 100:.1f}%"
