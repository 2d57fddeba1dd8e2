"""Prefill/decode disaggregation: the AgentX post's two-stage P/D method (papers/research/theory.md §1.0,
§7). The deployment itself is described in `model.plan.deployment`, the KV hand-off between the
pools in `model.serve.pools`.

1. saturation analysis: the maximum request rate of prefill-only and decode-only configurations
   (each parallel plan and size), decode under the interactivity SLO and its KV capacity;
2. P/D ratio: `x` prefill and `y` decode instances serve `min(x*lam_P, y*lam_D)` requests/s;
   the rate-matched ratio is `x/y = lam_D/lam_P` (papers/research/theory.md §7 throughput rate matching);
   `xpyd_rates` / `ratio_sweep` tabulate it for one plan pair over instance counts or budgets.

All rate functions are numpy-vectorized over batches and instance counts.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from model.serve.mean_waits import pk_wait_s

DECODE_BATCHES = np.unique(np.round(np.geomspace(1, 1024, 40)))  # stage 1's decode batches


# ---------------------------------------------------------------- stage 1: saturation

def prefill_saturation_rps(step_time_s, chunk_tokens: float, uncached_tokens: float):
    """Requests/s one prefill-only instance sustains: full chunks back to back.

    `step_time_s` is the step time of a `chunk_tokens` prefill step (array over plans);
    each request needs `uncached_tokens` of prefill (papers/research/theory.md §7: Thr_P / E[n_uncached])."""
    tokens_per_s = chunk_tokens / np.asarray(step_time_s, float)
    return tokens_per_s / np.maximum(uncached_tokens, 1.0)


def decode_saturation(batch, step_time_s, output_tokens: float, slo_tokens_per_s: float = 0.0,
                      max_batch=np.inf):
    """Decode-only saturation: for each candidate batch (last axis) the request rate
    `B / (O * T(B))` and interactivity `1/T(B)`; the saturating point is the largest batch
    meeting the SLO and the KV capacity (`max_batch`).

    Returns (rate_rps, interactivity, best_index) with best_index -1 where nothing qualifies."""
    batch = np.asarray(batch, float)
    step = np.asarray(step_time_s, float)
    rate = batch / (output_tokens * step)
    inter = 1.0 / step
    ok = (inter >= slo_tokens_per_s) & (batch <= np.asarray(max_batch, float)[..., None])
    masked = np.where(ok, rate, -np.inf)
    best = np.argmax(masked, axis=-1)
    best = np.where(np.take_along_axis(ok, best[..., None], -1)[..., 0], best, -1)
    return rate, inter, best


# ---------------------------------------------------------------- stage 2: P/D ratio

def rate_matched_ratio(prefill_rps, decode_rps):
    """Prefill instances per decode instance that balance the two stages (x/y = lam_D/lam_P)."""
    return np.asarray(decode_rps, float) / np.asarray(prefill_rps, float)


def xpyd_grid(prefill_gpus: int, decode_gpus: int, budget_gpus: int, exact: bool = False):
    """All (x, y) >= 1 with x*prefill_gpus + y*decode_gpus <= budget (== budget when `exact`)."""
    xs, ys = [], []
    for x in range(1, budget_gpus // max(prefill_gpus, 1) + 1):
        left = budget_gpus - x * prefill_gpus
        for y in range(1, left // max(decode_gpus, 1) + 1):
            if exact and x * prefill_gpus + y * decode_gpus != budget_gpus:
                continue
            xs.append(x)
            ys.append(y)
    return np.array(xs, int), np.array(ys, int)


def system_rate_rps(x, y, prefill_rps, decode_rps):
    """Requests/s of x prefill + y decode instances: the slower stage limits (no over-credit)."""
    return np.minimum(np.asarray(x) * prefill_rps, np.asarray(y) * decode_rps)


def mdl_wait_s(service_s, utilization):
    """M/D/1 mean queueing wait (papers/research/theory.md §6, T18): rho*S / (2(1-rho)); inf at rho >= 1."""
    s = np.asarray(service_s, float)
    return pk_wait_s(np.asarray(utilization, float) / s, s, s * s)


def xpyd_rates(x, y, prefill_rps: float, prefill_gpus: int, decode_rps: float,
               decode_gpus: int, tokens_per_request: float | None = None) -> pd.DataFrame:
    """Stage 2 for one (prefill plan, decode plan) pair at the given instance counts.

    `prefill_rps` / `decode_rps` are the stage-1 saturation rates of one instance. Each row:
    the GPUs used, the P:D instance ratio, each stage's capacity, the system rate
    `min(x*lam_P, y*lam_D)` and which stage limits it, the share of the faster stage left idle,
    and (with `tokens_per_request`, input incl. cached + output) TPGS = rate * tokens / GPUs,
    as the search counts it. `x` may be fractional to trace the continuous ratio curve."""
    x = np.asarray(x, float)
    y = np.asarray(y, float)
    x, y = np.broadcast_arrays(x, y)
    p_cap, d_cap = x * prefill_rps, y * decode_rps
    rate = system_rate_rps(x, y, prefill_rps, decode_rps)
    gpus = x * prefill_gpus + y * decode_gpus
    out = pd.DataFrame({
        "x": x, "y": y, "gpus": gpus, "p_per_d": x / y,
        "prefill_gpu_share": x * prefill_gpus / gpus,
        "prefill_capacity_rps": p_cap, "decode_capacity_rps": d_cap, "rate_rps": rate,
        "rps_per_gpu": rate / gpus,
        "limit": np.where(p_cap < d_cap, "prefill", "decode"),
        "idle_fraction": 1.0 - rate / np.maximum(np.maximum(p_cap, d_cap), 1e-300),
    })
    if tokens_per_request is not None:
        out["tpgs"] = rate * float(tokens_per_request) / gpus
    return out


def ratio_sweep(prefill_rps: float, prefill_gpus: int, decode_rps: float, decode_gpus: int,
                budgets, tokens_per_request: float | None = None) -> pd.DataFrame:
    """Every xPyD deployment of one plan pair that uses exactly one of `budgets` GPUs (the
    search's rule: idle GPUs serve nothing), with its stage-2 rates (`xpyd_rates`), a
    `budget_gpus` column and a `label` such as "2P1D". Budgets no (x, y) >= 1 fills are left
    out."""
    parts = []
    for budget in sorted({int(b) for b in np.atleast_1d(budgets)}):
        xs, ys = xpyd_grid(int(prefill_gpus), int(decode_gpus), budget, exact=True)
        if len(xs):
            parts.append(xpyd_rates(xs, ys, prefill_rps, prefill_gpus, decode_rps, decode_gpus,
                                    tokens_per_request).assign(budget_gpus=budget))
    if not parts:
        return xpyd_rates([], [], prefill_rps, prefill_gpus, decode_rps, decode_gpus,
                          tokens_per_request).assign(budget_gpus=0, label="")
    out = pd.concat(parts, ignore_index=True)
    out[["x", "y", "gpus"]] = out[["x", "y", "gpus"]].astype(int)
    out["label"] = out["x"].astype(str) + "P" + out["y"].astype(str) + "D"
    return out
