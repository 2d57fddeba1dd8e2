"""Collective communication time: alpha-beta with algorithm factors and size-dependent efficiency.

    t = latency_s + latency_per_peer_s (n-1) + factor(op, n) S / (B eff(S, n))
    eff(S, n) = bus_efficiency_max * S / (S + half_bytes) * n / (n + half_ranks)

(measured bus bandwidth on NVSwitch nodes grows with the rank count: 8-GPU all-reduce reaches
~445 GB/s on H100 where 2 GPUs reach ~320 GB/s, nccl.parquet; NVLS / more concurrent links)

S is the buffer size in bytes as NCCL-tests count it (all-reduce: the reduced buffer; all-gather:
the gathered output; reduce-scatter: the input; all-to-all: what one rank holds before the
exchange; p2p: the bytes sent). B is the per-GPU per-direction link bandwidth of the scope.
Algorithm factors (NCCL-tests bus bandwidth, github.com/NVIDIA/nccl-tests doc/PERFORMANCE.md):
ring all-reduce 2(n-1)/n, all-gather / reduce-scatter / all-to-all (n-1)/n, p2p 1. All-reduce
also has vLLM's custom one-shot / two-shot kernels inside the scale-up domain (one-shot reads
every peer's buffer: factor (n-1)); the engine uses whichever is faster, so all-reduce time is
the minimum.

Scale-out (`scope="scale_out"`, GPUs spanning several scale-up domains) is hierarchical: an
all-reduce is reduce-scatter inside the domain, all-reduce of S/D across domains over the NIC,
all-gather inside; all-gather / reduce-scatter likewise; all-to-all sends the (n-D)/n off-domain
share over the NIC and the rest over the scale-up links concurrently (max of the two).

Latency, efficiency ceiling and half-efficiency size are fitted per chip on nccl.parquet and
custom_allreduce.parquet (`python -m model.fit.calibrate`); chips without measurements borrow them
from `hw.calibration_reference` (same rule as model.perf.kernels), and the scale-out path uses the
reference's NCCL curve on the NIC bandwidth with a larger fixed latency (no scale-out data).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from model.perf import kernels
from model.perf.kernels import MEASURED_CHIPS, fitted_table, measured_chip, saturating
from model.specs.errors import Infeasible

OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "p2p")
SCOPES = ("scale_up", "scale_out")
# Inter-node launch + network RTT per collective step (IB/RoCE ~ 5-10 us;
# ~1 us per hop inside a switch domain; NCCL cross-node small-message latency ~ 20 us).
SCALE_OUT_EXTRA_LATENCY_S = 15e-6


@dataclass(frozen=True)
class CommParams:
    latency_s: float  # fixed launch + synchronization
    latency_per_peer_s: float  # grows with ranks (ring steps, barrier fan-in)
    bus_efficiency_max: float  # large-message bus bandwidth / per-direction link bandwidth
    half_bytes: float  # message size at which half of that is reached
    half_ranks: float = 0.0  # rank count at which half of it is reached (0: no rank effect)
    source: str = "default"

    def efficiency(self, size_bytes, ranks=None):
        return saturating(self.bus_efficiency_max, size_bytes, self.half_bytes, ranks,
                          self.half_ranks)


# Where no fit exists: large-message all-reduce busbw ~0.92 of unidirectional NVLink (NCCL and
# nccl-tests reports, hardware/sources.yaml S46), small-message latency ~10-25 us (NCCL), custom
# all-reduce ~5 us.
_DEFAULTS = {
    "nccl": CommParams(10e-6, 1e-6, 0.92, 2e6),
    "custom": CommParams(5e-6, 0.0, 0.80, 1e6),
    "deepep": CommParams(40e-6, 0.0, 0.40, 1e6),  # DeepEP EP8: ~40-80 us floor (moe_a2a)
}


def algorithm_factor(op: str, n):
    n = np.asarray(n, dtype=float)
    if op == "all_reduce":
        return 2.0 * (n - 1.0) / n
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1.0) / n
    if op == "p2p":
        return np.ones_like(n)
    raise Infeasible(f"collective {op!r} unknown; allowed: {', '.join(OPS)}")


@lru_cache(maxsize=512)
def comm_params(hw, op: str, algorithm: str = "nccl") -> CommParams:
    """Fitted (or transferred, or default) curve of one collective on chip `hw`."""
    return _comm_params(measured_chip(hw), str(hw.calibration_reference or ""), op, algorithm)


def clear_cache() -> None:
    """Forget loaded parameters (after `python -m model.fit.calibrate` rewrites kernels.yaml)."""
    kernels.clear_cache()
    comm_params.cache_clear()
    _comm_params.cache_clear()


@lru_cache(maxsize=512)
def _comm_params(chip: str, reference: str, op: str, algorithm: str) -> CommParams:
    source_chip = chip or reference.lower().replace("-", "_")
    if source_chip in MEASURED_CHIPS:
        entry = fitted_table().get(source_chip, {}).get(f"collective.{op}", {}).get(algorithm)
        if entry is None and op == "p2p":  # p2p is an all-gather step between two ranks
            entry = fitted_table().get(source_chip, {}).get("collective.all_gather", {}).get(
                algorithm)
        if entry is not None:
            tag = "fitted" if chip else "transfer"
            return CommParams(float(entry["latency_s"]), float(entry["latency_per_peer_s"]),
                              float(entry["bus_efficiency_max"]), float(entry["half_bytes"]),
                              float(entry.get("half_ranks", 0.0)), f"{tag}:{source_chip}")
    return _DEFAULTS[algorithm]


def flat_time_s(op: str, size_bytes, n, bandwidth_bytes_per_s: float, params: CommParams):
    """One alpha-beta collective over n ranks on links of the given per-direction bandwidth."""
    s = np.maximum(np.asarray(size_bytes, dtype=float), 1.0)
    factor = algorithm_factor(op, n)
    n = np.asarray(n, dtype=float)
    latency = params.latency_s + params.latency_per_peer_s * (n - 1.0)
    return latency + factor * s / (bandwidth_bytes_per_s * params.efficiency(s, n))


def one_shot_all_reduce_s(size_bytes, n, bandwidth_bytes_per_s: float, params: CommParams):
    """vLLM custom all-reduce: the faster of one-shot (read all n-1 peers) and two-shot
    (reduce-scatter + all-gather) on the scale-up fabric."""
    s = np.maximum(np.asarray(size_bytes, dtype=float), 1.0)
    n = np.asarray(n, dtype=float)
    eff = bandwidth_bytes_per_s * params.efficiency(s, n)
    one_shot = (n - 1.0) * s / eff
    two_shot = 2.0 * (n - 1.0) / n * s / eff
    latency = params.latency_s + params.latency_per_peer_s * (n - 1.0)
    return latency + np.minimum(one_shot, two_shot)


def collective_time_s(op: str, bytes_, gpus, hw, scope: str = "scale_up",
                      algorithm: str | None = None):
    """Time of one collective of `bytes_` over `gpus` ranks (0 for a single rank).

    `algorithm="deepep"` times an all-to-all with the DeepEP curve (fitted on moe_a2a.parquet:
    MoE dispatch/combine kernels, higher fixed latency, lower bus efficiency than NCCL's
    all-to-all); `algorithm="symm"` a symmetric-memory transfer inside the scale-up domain
    (each rank writes its share straight into its peers' buffers in one step, as vLLM's custom
    all-reduce does: that kernel's fitted latency and link efficiency, no ring steps);
    default: NCCL (and vLLM custom all-reduce for all-reduce)."""
    if scope not in SCOPES:
        raise Infeasible(f"collective scope {scope!r} unknown; allowed: {', '.join(SCOPES)}")
    if op not in OPS:
        raise Infeasible(f"collective {op!r} unknown; allowed: {', '.join(OPS)}")
    n = np.asarray(gpus, dtype=float)
    size = np.asarray(bytes_, dtype=float)
    nccl = comm_params(hw, op, "deepep" if algorithm == "deepep" and op == "all_to_all"
                       else "nccl")
    if scope == "scale_up" and algorithm == "symm":
        custom = comm_params(hw, "all_reduce", "custom")
        t = (one_shot_all_reduce_s(size, n, hw.scale_up_bandwidth_bytes_per_s, custom)
             if op == "all_reduce" else
             flat_time_s(op, size, n, hw.scale_up_bandwidth_bytes_per_s, custom))
    elif scope == "scale_up":
        t = flat_time_s(op, size, n, hw.scale_up_bandwidth_bytes_per_s, nccl)
        if op == "all_reduce":
            custom = comm_params(hw, op, "custom")
            t = np.minimum(t, one_shot_all_reduce_s(size, n, hw.scale_up_bandwidth_bytes_per_s,
                                                    custom))
    else:
        t = _scale_out_time_s(op, size, n, hw, nccl)
    if op == "p2p":
        return t * np.ones_like(n)
    return np.where(n <= 1, 0.0, t)


def _scale_out_time_s(op: str, size, n, hw, nccl: CommParams):
    domain = float(max(1, int(hw.scale_up_domain_gpus)))
    up_bw, out_bw = hw.scale_up_bandwidth_bytes_per_s, hw.scale_out_bandwidth_bytes_per_s
    out = CommParams(nccl.latency_s + SCALE_OUT_EXTRA_LATENCY_S, nccl.latency_per_peer_s,
                     nccl.bus_efficiency_max, nccl.half_bytes, nccl.half_ranks, nccl.source)
    inner = np.minimum(n, domain)
    outer = np.maximum(n / domain, 1.0)
    if op == "p2p":
        return flat_time_s("p2p", size, 2.0, out_bw, out)
    if op == "all_to_all":
        off = np.clip((n - inner) / n, 0.0, 1.0)
        # an empty message (no tokens this step) moves nothing: no 0 / 0 at zero efficiency
        rate = np.maximum(out_bw * out.efficiency(size, n), 1e-300)
        t_out = out.latency_s + np.where(np.asarray(size) > 0, off * size / rate, 0.0)
        t_in = flat_time_s("all_to_all", size * inner / n, inner, up_bw, nccl)
        return np.where(n <= domain, flat_time_s("all_to_all", size, n, out_bw, out),
                        np.maximum(t_out, t_in))
    if op == "all_reduce":
        t = (flat_time_s("reduce_scatter", size, inner, up_bw, nccl)
             + flat_time_s("all_reduce", size / inner, outer, out_bw, out)
             + flat_time_s("all_gather", size, inner, up_bw, nccl))
    else:  # all_gather / reduce_scatter: inner level on the full buffer, outer on 1/inner of it
        t = (flat_time_s(op, size, inner, up_bw, nccl)
             + flat_time_s(op, size / inner, outer, out_bw, out))
    flat = flat_time_s(op, size, n, out_bw, out)
    return np.where(n <= domain, flat, t)
