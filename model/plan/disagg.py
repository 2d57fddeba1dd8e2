"""Prefill/decode disaggregation: the deployment description, the KV hand-off from prefill to
decode workers, and the AgentX post's two-stage P/D method (research/theory.md §1.0, §7):

1. saturation analysis: the maximum request rate of prefill-only and decode-only configurations
   (each parallel plan and size), decode under the interactivity SLO and its KV capacity;
2. P/D ratio: `x` prefill and `y` decode instances serve `min(x*lam_P, y*lam_D)` requests/s;
   the rate-matched ratio is `x/y = lam_D/lam_P` (theory.md §7 throughput rate matching);
   `xpyd_rates` / `ratio_sweep` tabulate it for one plan pair over instance counts or budgets.

All rate functions are numpy-vectorized over batches and instance counts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from model.perf.parallel import ParallelPlan
from model.specs.defaults import MAX_NUM_BATCHED_TOKENS
from model.specs.errors import ServecastError

if TYPE_CHECKING:
    from model.plan.launch import ServingFormat

# KV layout of the hand-off. vLLM's hybrid allocator used to keep one tensor per layer and
# attention kind (92 for DeepSeek V4); the packed layout moves one contiguous region per block and
# is ~10% smaller with the FP4 indexer (seed post; theory.md §13 T23: -6.1% / -10.75% stride).
LAYOUTS = ("packed", "per_tensor")
PACKED_SAVING = 0.10
TRANSFER_DESCRIPTOR_S = 2e-6  # per (block, tensor) RDMA work request; NIXL-class engines ~1-3 us


@dataclass(frozen=True)
class PhaseConfig:
    """One kind of worker: a chip, a parallel plan and how many instances run it."""

    hardware: str
    plan: ParallelPlan
    instances: int = 1

    @property
    def gpus(self) -> int:
        return self.plan.gpus * self.instances

    def as_dict(self) -> dict[str, object]:
        p = self.plan
        return {"hardware": self.hardware, "plan": p.label(), "instances": self.instances,
                "gpus": self.gpus, "tp": p.tp, "pp": p.pp, "dp": p.dp, "ep": p.ep,
                "moe_tp": p.moe_tp, "pcp": p.pcp, "dcp": p.dcp, "sp": p.sp}


@dataclass(frozen=True)
class Deployment:
    """A complete serving deployment: aggregated replicas, or x prefill + y decode workers."""

    mode: str  # "aggregated" | "disaggregated"
    arch: str
    concurrency: int  # client lanes (closed-loop sessions) across the whole deployment
    replica: PhaseConfig | None = None  # aggregated
    prefill: PhaseConfig | None = None  # disaggregated
    decode: PhaseConfig | None = None
    max_num_batched_tokens: int = MAX_NUM_BATCHED_TOKENS
    max_num_seqs: int = 256
    long_prefill_token_threshold: int = 0  # 0 = off (vLLM)
    prefill_schedule_interval: int = 1
    kv_connector: str = "NixlConnector"
    # checkpoint, KV dtype, speculative decoding (None: the architecture's own, defaults)
    serving: ServingFormat | None = field(default=None, compare=False, hash=False)
    extras: dict[str, object] = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        if self.mode == "aggregated" and self.replica is None:
            raise ServecastError("Deployment: aggregated mode needs `replica`")
        if self.mode == "disaggregated" and (self.prefill is None or self.decode is None):
            raise ServecastError("Deployment: disaggregated mode needs `prefill` and `decode`")
        if self.mode not in ("aggregated", "disaggregated"):
            raise ServecastError(f"Deployment: mode {self.mode!r}: allowed aggregated, "
                                 "disaggregated")

    @property
    def gpus(self) -> int:
        if self.mode == "aggregated":
            return self.replica.gpus
        return self.prefill.gpus + self.decode.gpus

    def label(self) -> str:
        if self.mode == "aggregated":
            r = self.replica
            return f"agg {r.instances}x[{r.plan.label()}] c{self.concurrency}"
        return (f"disagg {self.prefill.instances}P[{self.prefill.plan.label()}]"
                f"{self.decode.instances}D[{self.decode.plan.label()}] c{self.concurrency}")

    def as_dict(self) -> dict[str, object]:
        out: dict[str, object] = {"mode": self.mode, "label": self.label(), "gpus": self.gpus,
                                  "concurrency": self.concurrency}
        if self.mode == "aggregated":
            out["replica"] = self.replica.as_dict()
            out["workers"] = {"replicas": self.replica.instances}
        else:
            out["prefill"] = self.prefill.as_dict()
            out["decode"] = self.decode.as_dict()
            out["workers"] = {"prefill": self.prefill.instances, "decode": self.decode.instances}
        out["engine"] = {"max_num_batched_tokens": self.max_num_batched_tokens,
                         "max_num_seqs": self.max_num_seqs,
                         "long_prefill_token_threshold": self.long_prefill_token_threshold,
                         "prefill_schedule_interval": self.prefill_schedule_interval}
        return {**out, **self.extras}


# ---------------------------------------------------------------- KV hand-off

def kv_transfer_bytes(new_tokens, kv_bytes_per_token: float, state_bytes: float = 0.0,
                      layout: str = "packed", padding_fraction: float = PACKED_SAVING):
    """Bytes moved from a prefill to a decode worker for one request.

    With sticky sessions the decode worker keeps the session's earlier context, so only the KV of
    the `new_tokens` prefilled this turn moves (plus fixed-size recurrent state, which is rewritten
    every turn). The per-tensor layout pads each tensor's blocks separately: `padding_fraction`
    more bytes (the post's ~10%)."""
    if layout not in LAYOUTS:
        raise ServecastError(f"kv layout {layout!r}: allowed {', '.join(LAYOUTS)}")
    payload = np.asarray(new_tokens, float) * kv_bytes_per_token + state_bytes
    return payload * (1.0 + padding_fraction) if layout == "per_tensor" else payload


def kv_transfer_time_s(new_tokens, kv_bytes_per_token: float, link_bytes_per_s: float,
                       gpus_sending: int = 1, state_bytes: float = 0.0, layout: str = "packed",
                       tensors_per_block: int = 1, block_tokens: int = 64,
                       descriptor_s: float = TRANSFER_DESCRIPTOR_S):
    """Time to hand one request's KV from prefill to decode.

    Each of the `gpus_sending` prefill GPUs ships its shard over its own NIC (`link_bytes_per_s`,
    per GPU per direction; scale-out unless both sides share a scale-up domain), plus one RDMA
    work request per (block, tensor): `tensors_per_block` is 1 for the packed layout and the
    number of per-layer KV tensors (e.g. 92 for DeepSeek V4) for the per-tensor layout."""
    if link_bytes_per_s <= 0:
        raise ServecastError(f"kv transfer: link bandwidth {link_bytes_per_s}: must be positive")
    tokens = np.asarray(new_tokens, float)
    data = kv_transfer_bytes(tokens, kv_bytes_per_token, state_bytes, layout)
    tensors = 1 if layout == "packed" else tensors_per_block
    senders = np.maximum(np.asarray(gpus_sending, float), 1.0)
    descriptors = np.ceil(tokens / block_tokens) * tensors / senders
    return data / (link_bytes_per_s * senders) + descriptors * descriptor_s


# ---------------------------------------------------------------- stage 1: saturation

def prefill_saturation_rps(step_time_s, chunk_tokens: float, uncached_tokens: float):
    """Requests/s one prefill-only instance sustains: full chunks back to back.

    `step_time_s` is the step time of a `chunk_tokens` prefill step (array over plans);
    each request needs `uncached_tokens` of prefill (theory.md §7: Thr_P / E[n_uncached])."""
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
    """M/D/1 mean queueing wait (theory.md §6, T18): rho*S / (2(1-rho)); inf at rho >= 1."""
    from model.serve.queueing import pk_wait_s

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
