"""Calibrated kernel efficiencies: the few named factors that turn a roofline into a kernel time.

Every op time in `model.perf.roofline` is

    t = max(flops / (peak(rate) * eff(m)), bytes / (hbm_bandwidth * memory_efficiency)) + overhead_s
    eff(m) = compute_efficiency_max * m / (m + half_tokens)

where m is the op's natural "rows" count (GEMM m, tokens per expert for MoE, query tokens per
sequence-head for attention). The four factors are fitted per measured chip, rate and op class
by `python -m model.fit.calibrate` on `data/calibration/ops/` and stored in
`data/calibration/kernels.yaml` with dataset, date and held-out error. Op classes: `gemm`, `moe`,
`attention.<family>.<phase>` (family gqa | mla | csa | hca | msa | linear; phase prefill |
decode), `memory`.

A chip whose die has measured tables for some op classes (`kernel_tables` in hardware/*.yaml:
MI300X and MI325X have AITER's tuned fused-MoE times) takes the efficiencies of those fits for
them, with the transferred fixed per-call costs where larger (the die table times the GEMM
stages, not the whole layer), and the transfer rule below for the rest.

Transfer rule (chips without measurements, e.g. B300, GB300, MI355X, Rubin, TPU): take the
curves of `hw.calibration_reference` (h100_sxm | h200_sxm | b200_sxm) and rescale the compute
ceiling by the ratio of the two chips' sourced MAMF efficiencies (measured best-shape GEMM
fraction of peak, `mamf_efficiency` in hardware/*.yaml) at the same rate, falling back to the
bf16 ratio when a rate is missing on either side and to 1 when neither has one. Memory
efficiency, the saturation point (half_tokens) and the launch overhead are kept from the
reference: they are properties of the kernels and the HBM controller generation, for which there
is no per-chip measurement. Peak FLOP/s and HBM bandwidth always come from the target chip's own
spec, so the physics moves with the chip and only the empirical fraction is borrowed. Without
any fitted data (no kernels.yaml) the round default curves below apply.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path

from model import ROOT
from model.specs.dtypes import dtype
from model.specs.errors import ServecastError
from model.specs.hardware import CALIBRATION_REFERENCES, load_hardware
from model.specs.specio import load_yaml

KERNELS_YAML = ROOT / "data" / "calibration" / "kernels.yaml"
MEASURED_CHIPS = CALIBRATION_REFERENCES


def saturating(ceiling: float, x, half_x: float, y=None, half_y: float = 0.0):
    """ceiling * x / (x + half_x) [* y / (y + half_y)]: the efficiency curve of every calibrated
    op, rising with its size x (and a second size y, where half_y is set) to `ceiling`."""
    eff = ceiling * x / (x + half_x)
    if y is not None and half_y:
        eff = eff * y / (y + half_y)
    return eff


@dataclass(frozen=True)
class KernelParams:
    """Efficiency curve of one op class on one chip at one rate."""

    compute_efficiency_max: float  # asymptotic fraction of peak FLOP/s at large shapes
    half_tokens: float  # rows m at which half of the ceiling is reached
    memory_efficiency: float  # achieved fraction of HBM bandwidth when memory-bound
    overhead_s: float  # fixed launch / tail latency per call
    half_k: float = 0.0  # GEMM reduction depth at which the pipeline is half full (0: none)
    per_row_s: float = 0.0  # GEMM wrapper cost per activation row (dynamic fp8 quant, scales)
    source: str = "default"  # "fitted:<chip>", "transfer:<ref>", or "default"

    def compute_efficiency(self, m, k=None):
        return saturating(self.compute_efficiency_max, m, self.half_tokens, k, self.half_k)


# Round default curves where no fit exists (GEMM 0.75 of peak, FP4 0.65, HBM streaming 0.85,
# paged-KV reads 0.55: the range of the MAMF tables and the fits); overheads are typical CUDA
# launch + tail latencies (~5-10 us).
_DEFAULTS = {
    "gemm": KernelParams(0.75, 64.0, 0.85, 5e-6),
    "moe": KernelParams(0.60, 64.0, 0.80, 20e-6),
    "memory": KernelParams(1.0, 1.0, 0.85, 0.0),
    "attention.prefill": KernelParams(0.55, 256.0, 0.60, 10e-6),
    "attention.decode": KernelParams(0.30, 8.0, 0.55, 10e-6),
}
_FP4_DEFAULT_EFF = 0.65


def default_params(op_class: str, rate: str = "bf16") -> KernelParams:
    if op_class in _DEFAULTS:
        p = _DEFAULTS[op_class]
    else:
        p = _DEFAULTS["attention." + op_class.rsplit(".", 1)[-1]]
    if rate == "fp4" and op_class in ("gemm", "moe"):
        p = replace(p, compute_efficiency_max=_FP4_DEFAULT_EFF)
    return p


@lru_cache(maxsize=1)
def fitted_table() -> dict:
    """chip -> op_class -> rate -> entry dict (parameters + provenance), read once."""
    path = Path(KERNELS_YAML)
    if not path.exists():
        return {}
    data = load_yaml(path.read_text()) or {}
    return data.get("chips", {})


def _entry_params(entry: dict, source: str) -> KernelParams:
    return KernelParams(float(entry["compute_efficiency_max"]), float(entry["half_tokens"]),
                        float(entry["memory_efficiency"]), float(entry["overhead_s"]),
                        float(entry.get("half_k", 0.0)), float(entry.get("per_row_s", 0.0)),
                        source)


# Formats no table times, priced with the curve of the kernel that runs them at another weight
# width: Hopper runs MXFP8 experts on Marlin's weight-only MoE (vLLM's MiniMax M3 release:
# "Marlin MXFP8 for Hopper-class systems", vllm-project/vllm-project.github.io pull 242), whose
# 4-bit variant the tables time (mxfp4_w4a16 on h100_sxm / h200_sxm). Bytes and rate stay the
# format's own (model.specs.dtypes); only the efficiencies are borrowed.
SAME_KERNEL = {"mxfp8_w8a16": "mxfp4_w4a16"}


def _lookup(chip: str, op_class: str, rate: str,
            same_rate_only: bool = False) -> tuple[KernelParams, str] | None:
    by_class = fitted_table().get(chip, {}).get(op_class)
    if not by_class:
        return None
    if rate in by_class:
        return _entry_params(by_class[rate], f"fitted:{chip}"), rate
    twin = SAME_KERNEL.get(rate) if op_class == "moe" else None
    if twin in by_class:
        return _entry_params(by_class[twin], f"fitted:{chip}:{twin}"), twin
    # A format the chip was not measured in: the measured format of the same rate class
    # (e.g. mxfp4 -> nvfp4), else (`same_rate_only` False) bf16, else whatever exists.
    want = _rate_or_none(rate)
    same = [k for k in by_class if want is not None and _rate_or_none(k) == want]
    others = [] if same_rate_only else ["bf16", "fp8", "fp8_block", "nvfp4"] + list(by_class)
    for alt in same + others:
        if alt in by_class:
            return _entry_params(by_class[alt], f"fitted:{chip}:{alt}"), alt
    return None


def _rate_or_none(name: str) -> str | None:
    try:
        return dtype(name).rate
    except ServecastError:
        return None


def measured_chip(hw) -> str:
    """Measured-data name of this chip if it is one of the measured ones, else ''."""
    names = {str(hw.name).lower().replace("-", "_")}
    names.update(str(a).lower().replace("-", "_") for a in hw.aliases or ())
    for chip in MEASURED_CHIPS:
        if chip in names or chip.removesuffix("_sxm") in names:
            return chip
    return ""


def mamf_ratio(target_mamf: dict, reference_mamf: dict, rate: str) -> float:
    """Transfer factor for the compute ceiling: MAMF(target)/MAMF(reference) at `rate`,
    else at bf16, else 1."""
    for r in (rate, "bf16"):
        a, b = target_mamf.get(r), reference_mamf.get(r)
        if a and b:
            return float(a) / float(b)
    return 1.0


@lru_cache(maxsize=8)
def reference_mamf(chip: str) -> dict:
    """MAMF efficiencies of a measured chip, from its hardware spec (hardware/*.yaml)."""
    return dict(load_hardware(chip).mamf_efficiency)


@lru_cache(maxsize=4096)
def params_for(hw, op_class: str, rate: str) -> KernelParams:
    """Efficiency curve for `op_class` at `rate` on chip `hw` (fitted, transferred or default)."""
    return _params_cached(measured_chip(hw), str(hw.calibration_reference or ""),
                          tuple(sorted((hw.mamf_efficiency or {}).items())), op_class, rate,
                          str(getattr(hw, "kernel_tables", "") or ""))


@lru_cache(maxsize=4096)
def _params_cached(chip: str, reference: str, target_mamf: tuple, op_class: str,
                   rate: str, die_tables: str = "") -> KernelParams:
    if chip:
        found = _lookup(chip, op_class, rate)
        return found[0] if found is not None else default_params(op_class, rate)
    transferred = _transferred(reference, target_mamf, op_class, rate)
    # the chip's own die measured this op class at this rate (hw.kernel_tables)
    found = _lookup(die_tables, op_class, rate, same_rate_only=True) if die_tables else None
    if found is None:
        return transferred
    # A die table times the kernels (AITER's tuner: the two GEMM stages of a fused MoE), not
    # the engine's whole layer with its token sort: its curve sets the efficiencies, the
    # reference's whole-layer fit keeps the fixed per-call and per-row costs where larger.
    return replace(found[0], overhead_s=max(found[0].overhead_s, transferred.overhead_s),
                   per_row_s=max(found[0].per_row_s, transferred.per_row_s))


def _transferred(reference: str, target_mamf: tuple, op_class: str, rate: str) -> KernelParams:
    """The reference chip's curve with its compute ceiling moved by the MAMF ratio."""
    ref = reference.lower().replace("-", "_")
    if ref not in MEASURED_CHIPS:
        return default_params(op_class, rate)
    found = _lookup(ref, op_class, rate)
    if found is None:
        return default_params(op_class, rate)
    params = found[0]
    ratio = mamf_ratio(dict(target_mamf), reference_mamf(ref), rate)
    return replace(params, compute_efficiency_max=min(1.0, params.compute_efficiency_max * ratio),
                   source=f"transfer:{ref}")


def clear_cache() -> None:
    """Forget loaded parameters (after `python -m model.fit.calibrate` rewrites kernels.yaml);
    `model.perf.roofline.clear_cache` also forgets the GEMM columns built from them."""
    for cached in (fitted_table, reference_mamf, params_for, _params_cached):
        cached.cache_clear()
