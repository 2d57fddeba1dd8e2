"""The kernel efficiency fit and its held-out error.

Each op class has the roofline form of `model.perf.roofline` with named parameters
(compute_efficiency_max, half_tokens, memory_efficiency, overhead_s, and where the data
identify them module_overhead_s, half_k, per_row_s), fitted with scipy.optimize.least_squares on
log time (relative error), soft-L1 loss. Held-out error: K-fold (5) over shape groups (a GEMM's
(n, k), a MoE's layer shape, an attention config), median absolute percentage error.
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import least_squares

from model.fit.kernel_tables import (
    Samples,
    moe_distribution,
    moe_distributions,
    moe_group_keys,
    moe_samples,
)
from model.perf import roofline
from model.perf.kernels import KernelParams

FOLDS = 5
SEED = 0

PARAM_NAMES = ("compute_efficiency_max", "half_tokens", "memory_efficiency", "overhead_s",
               "module_overhead_s", "half_k", "per_row_s")
_X0 = np.array([0.7, 64.0, 0.8, 5e-6, 0.0, 0.0, 0.0])
_LOWER = np.array([0.02, 0.0, 0.02, 0.0, 0.0, 0.0, 0.0])
_UPPER = np.array([1.0, 1e5, 1.0, 2e-3, 5e-3, 1e5, 1e-6])
_SCALE = np.array([0.1, 100.0, 0.1, 1e-5, 1e-5, 100.0, 1e-9])


def params_from(theta) -> KernelParams:
    e_max, half, e_mem, t0, _, half_k, per_row = theta
    return KernelParams(float(e_max), float(half), float(e_mem), float(t0), float(half_k),
                        float(per_row))


def theta_of(entry: dict, names=PARAM_NAMES) -> np.ndarray:
    """The parameter vector of a stored kernels.yaml entry (absent parameters are 0)."""
    return np.array([float(entry.get(name, 0.0)) for name in names])


def predict_s(theta, s: Samples):
    core = roofline.roofline_time_s(s.flops, s.hbm_bytes, s.peak_flops_per_s,
                                    s.bandwidth_bytes_per_s, params_from(theta), s.rows, s.kdim,
                                    s.tile, s.row_count)
    return core + s.extra_s + theta[4]


def fit(s: Samples) -> np.ndarray:
    """Least squares on log time, soft-L1 loss; returns the PARAM_NAMES vector."""
    free = np.array([True, True, True, True, s.fit_module_overhead, s.kdim is not None,
                     s.row_count is not None])
    lower, upper = _LOWER[free], _UPPER[free]
    log_t = np.log(s.time_s)

    def full(x):
        theta = _X0.copy()
        theta[free] = x
        return theta

    def residual(x):
        return np.log(predict_s(full(x), s)) - log_t

    best = None
    for half0 in (16.0, 512.0):  # the half point is multi-modal: try two starts
        x0 = _X0.copy()
        x0[1] = half0
        x0[5] = 100.0
        r = least_squares(residual, np.clip(x0[free], lower, upper), bounds=(lower, upper),
                          loss="soft_l1", f_scale=0.1, x_scale=_SCALE[free], max_nfev=300)
        if best is None or r.cost < best.cost:
            best = r
    return full(best.x)


def ape(theta, s: Samples) -> np.ndarray:
    """Absolute percentage error of every row."""
    return np.abs(predict_s(theta, s) / s.time_s - 1.0)


def group_folds(groups: np.ndarray, folds: int = FOLDS, seed: int = SEED) -> dict:
    """Shape group id -> fold, a seeded random permutation dealt round-robin."""
    rng = np.random.default_rng(seed)
    return dict(zip(rng.permutation(groups), np.arange(len(groups)) % folds, strict=True))


def fold_of_rows(group: np.ndarray, folds: int = FOLDS, seed: int = SEED) -> np.ndarray:
    """The fold of every row (rows of one shape group share it)."""
    fold_of = group_folds(np.unique(group), folds, seed)
    return np.array([fold_of[g] for g in group])


def heldout_ape(s: Samples, folds: int = FOLDS, seed: int = SEED) -> np.ndarray:
    """Absolute percentage error of every row, predicted by a fit that never saw its group."""
    fold = fold_of_rows(s.group, folds, seed)
    out = np.full(len(s.time_s), np.nan)
    for f in range(min(folds, len(np.unique(s.group)))):
        test = fold == f
        out[test] = ape(fit(s.subset(~test)), s.subset(test))
    return out


def moe_heldout_by_distribution(chip: str, dtype_name: str, folds: int = FOLDS,
                                seed: int = SEED) -> dict:
    """Held-out median APE of the MoE curve (fitted on the chip's moe_distribution) on every
    routing distribution its table times: K-fold over layer shapes, each fold's fit predicting
    the held-out shapes' rows of each distribution."""
    fit_s = moe_samples(chip, dtype_name)
    others = {d: moe_samples(chip, dtype_name, d) for d in moe_distributions(chip)}
    keys = moe_group_keys(chip, dtype_name)
    groups = np.unique(fit_s.group)
    fold_of = group_folds(groups, folds, seed)
    errors = {d: [] for d in others}
    fitted_on = moe_distribution(chip)
    for f in range(min(folds, len(groups))):
        held = {keys[fitted_on][g] for g in groups if fold_of[g] == f}
        theta = fit(fit_s.subset(np.array([fold_of[g] != f for g in fit_s.group])))
        for d, s in others.items():
            mask = np.array([keys[d][g] in held for g in s.group])
            if mask.any():
                errors[d].append(ape(theta, s.subset(mask)))
    return {d: round(float(np.median(np.concatenate(e))), 4) for d, e in errors.items() if e}
