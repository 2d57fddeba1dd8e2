"""Collective tables (nccl, custom_allreduce, moe_a2a) and the fit of `model.perf.comm`'s curve.

Each table's rows become `CommSamples` (buffer bytes, ranks, measured time); the five
parameters of `model.perf.comm.CommParams` are fitted with scipy least_squares on log time
(relative error), soft-L1 loss. Held-out error: K-fold over message-size octaves.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
from scipy.optimize import least_squares

from model.fit.kernel_fit import FOLDS, SEED, fold_of_rows
from model.fit.kernel_tables import chip_spec, table
from model.perf import comm

NCCL_BYTES = {"half": 2.0, "bfloat16": 2.0, "int8": 1.0, "float": 4.0}
NCCL_OP = {"all_reduce": "all_reduce", "all_gather": "all_gather",
           "reduce_scatter": "reduce_scatter", "alltoall": "all_to_all"}
COMM_PARAM_NAMES = ("latency_s", "latency_per_peer_s", "bus_efficiency_max", "half_bytes",
                    "half_ranks")


@dataclass(frozen=True)
class CommSamples:
    op: str
    algorithm: str  # nccl | custom | deepep
    size_bytes: np.ndarray
    ranks: np.ndarray
    bandwidth_bytes_per_s: float
    time_s: np.ndarray
    group: np.ndarray

    def subset(self, mask) -> CommSamples:
        return replace(self, size_bytes=self.size_bytes[mask], ranks=self.ranks[mask],
                       time_s=self.time_s[mask], group=self.group[mask])


def comm_samples(chip: str, op: str, algorithm: str) -> CommSamples:
    """message_size counts elements (NCCL-tests convention; the int8 rows at equal counts take
    half the time of the half rows at large sizes, which confirms it)."""
    hw = chip_spec(chip)
    if algorithm == "deepep":
        return deepep_samples(chip)
    if algorithm == "custom":
        df = table(chip, "custom_allreduce")
        df = df[df.backend == "vllm_graph"]  # CUDA-graph mode, as vLLM serves
        size = df.message_size.to_numpy(float) * NCCL_BYTES[df.allreduce_dtype.iloc[0]]
    else:
        df = table(chip, "nccl")
        df = df[df.op_name.map(NCCL_OP) == op]
        size = df.message_size.to_numpy(float) * df.nccl_dtype.map(NCCL_BYTES).to_numpy()
    return CommSamples(op, algorithm, size, df.num_gpus.to_numpy(float),
                       hw.scale_up_bandwidth_bytes_per_s, df.latency.to_numpy() * 1e-3,
                       np.log2(size).round().astype(int))


def deepep_samples(chip: str) -> CommSamples:
    """moe_a2a.parquet (DeepEP, EP8 in one node; latency in microseconds): the fastest backend
    per shape (the engine runs low-latency kernels for decode, high-throughput for prefill).
    Bytes one rank sends: tokens x top_k x hidden x (1 B fp8 dispatch | 2 B bf16 combine)."""
    hw = chip_spec(chip)
    keys = ["phase", "num_tokens", "hidden_size", "topk", "ep_size"]
    df = table(chip, "moe_a2a").groupby(keys, as_index=False)["latency"].min()
    width = np.where(df.phase == "dispatch", 1.0, 2.0)
    size = df.num_tokens.to_numpy(float) * df.topk * df.hidden_size * width
    return CommSamples("all_to_all", "deepep", size, df.ep_size.to_numpy(float),
                       hw.scale_up_bandwidth_bytes_per_s, df.latency.to_numpy() * 1e-6,
                       np.log2(size).round().astype(int))


def comm_predict(theta, s: CommSamples):
    params = comm.CommParams(*theta)
    if s.algorithm == "custom":
        return comm.one_shot_all_reduce_s(s.size_bytes, s.ranks, s.bandwidth_bytes_per_s, params)
    return comm.flat_time_s(s.op, s.size_bytes, s.ranks, s.bandwidth_bytes_per_s, params)


def comm_ape(theta, s: CommSamples) -> np.ndarray:
    """Absolute percentage error of every row."""
    return np.abs(comm_predict(theta, s) / s.time_s - 1.0)


def fit_comm(s: CommSamples) -> np.ndarray:
    """Least squares on log time, soft-L1 loss; returns the COMM_PARAM_NAMES vector."""
    log_t = np.log(s.time_s)
    # EP8-only tables (DeepEP) cannot identify a rank effect: half_ranks stays 0 there
    one_n = np.unique(s.ranks).size == 1
    r = least_squares(lambda x: np.log(comm_predict(x, s)) - log_t,
                      [5e-6, 1e-6, 0.8, 1e6, 0.0 if one_n else 1.0],
                      bounds=([0.0, 0.0, 0.05, 0.0, 0.0],
                              [1e-3, 1e-4, 3.0, 1e10, 1e-12 if one_n else 100.0]),
                      loss="soft_l1", f_scale=0.1, x_scale=[1e-5, 1e-6, 0.1, 1e6, 1.0])
    return r.x


def comm_heldout_ape(s: CommSamples, folds: int = FOLDS, seed: int = SEED) -> np.ndarray:
    """K-fold over message-size octaves (whole sizes held out, all GPU counts)."""
    fold = fold_of_rows(s.group, folds, seed)
    out = np.full(len(s.time_s), np.nan)
    for f in range(folds):
        test = fold == f
        out[test] = comm_ape(fit_comm(s.subset(~test)), s.subset(test))
    return out
