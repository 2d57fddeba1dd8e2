"""Collective time model (model.perf.comm): alpha-beta physics, algorithm factors, scopes, fit."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from model import ROOT
from model.perf.comm import collective_time_s, comm_params
from model.specs.errors import Infeasible
from model.specs.hardware import load_hardware

H100 = load_hardware("h100-sxm")
GB300 = load_hardware("gb300-nvl72")


def test_ring_all_reduce_bound():
    # 8-GPU ring all-reduce of 1 GB at 450 GB/s per direction: >= 2 * 7/8 * 1e9 / 450e9 = 3.89 ms
    t = collective_time_s("all_reduce", 1e9, 8, H100, "scale_up")
    assert t >= 2 * 7 / 8 * 1e9 / 450e9
    # NCCL-tests on 8xH100 reach 370-480 GB/s bus bandwidth at large sizes (hardware/sources.yaml
    # S46); the fit over 2-8 GPUs must stay within 2x of the bound
    assert t < 2 * (2 * 7 / 8 * 1e9 / 450e9)


def test_gather_scatter_factor_and_single_rank():
    # all-gather of S over n ranks moves (n-1)/n S per rank
    t = collective_time_s("all_gather", 256e6, 4, H100, "scale_up")
    assert t >= 3 / 4 * 256e6 / 450e9
    assert collective_time_s("all_reduce", 1e6, 1, H100, "scale_up") == 0.0


def test_small_messages_are_latency_bound():
    # 16 KB all-reduce over 8 GPUs: the bandwidth term is ~0.06 us; measured ~5-20 us
    # (custom_allreduce.parquet: 4.7-5.6 us in CUDA-graph mode on H100)
    t = collective_time_s("all_reduce", 16e3, 8, H100, "scale_up")
    assert 2e-6 < t < 25e-6


def test_vectorized_over_sizes_and_ranks():
    sizes = np.array([1e3, 1e6, 1e9])
    t = collective_time_s("reduce_scatter", sizes, 8, H100, "scale_up")
    assert t.shape == (3,) and np.all(np.diff(t) > 0)
    t2 = collective_time_s("all_to_all", 1e8, np.array([2, 4, 8]), H100, "scale_up")
    assert t2.shape == (3,)


def test_scale_out_hierarchical_is_slower_than_inside_the_domain():
    # 16 H100s (2 nodes): all-reduce crosses the 50 GB/s NIC; the cross-node phase alone moves
    # 2 * (2-1)/2 * S/8 per GPU at 50 GB/s
    s = 1e9
    inside = collective_time_s("all_reduce", s, 8, H100, "scale_up")
    across = collective_time_s("all_reduce", s, 16, H100, "scale_out")
    assert across > inside
    assert across >= 2 * (1 / 2) * (s / 8) / 50e9


def test_p2p_and_all_to_all_scale_out():
    # PP send of 100 MB over a 400 Gb/s NIC: >= 2 ms
    assert collective_time_s("p2p", 100e6, 2, H100, "scale_out") >= 100e6 / 50e9
    # all-to-all over 16 GPUs in 8-GPU nodes: half the bytes leave the node
    t = collective_time_s("all_to_all", 1e9, 16, H100, "scale_out")
    assert t >= 0.5 * 1e9 / 50e9


def test_unknown_op_and_scope_are_user_errors():
    with pytest.raises(Infeasible, match="allowed"):
        collective_time_s("broadcast", 1e6, 8, H100, "scale_up")
    with pytest.raises(Infeasible, match="allowed"):
        collective_time_s("all_reduce", 1e6, 8, H100, "intra_node")


def test_fitted_all_reduce_matches_measured_rows():
    # data/calibration/ops/h100_sxm/nccl.parquet (message_size in half elements) and
    # custom_allreduce.parquet (vllm_graph): the engine takes the faster algorithm; check a
    # large and a small 8-GPU row. Held-out median error of these fits: see kernel_report.md.
    ops = ROOT / "data" / "calibration" / "ops" / "h100_sxm"
    nccl = pd.read_parquet(ops / "nccl.parquet")
    row = nccl[(nccl.op_name == "all_reduce") & (nccl.num_gpus == 8)
               & (nccl.nccl_dtype == "half") & (nccl.message_size == 268435456)].iloc[0]
    custom = pd.read_parquet(ops / "custom_allreduce.parquet")
    crow = custom[(custom.backend == "vllm_graph") & (custom.num_gpus == 8)
                  & (custom.message_size == 268435456)].iloc[0]
    measured = min(row.latency, crow.latency) * 1e-3  # 2.111 ms (NCCL) vs 2.117 ms (custom)
    t = collective_time_s("all_reduce", 268435456 * 2, 8, H100, "scale_up")
    # the pooled 2/4/8-GPU fit over-predicts the largest 8-GPU message by ~30% (NVLS lifts the
    # 8-GPU bus bandwidth to ~445 GB/s, 2 GPUs reach ~320): a known weakness, bounded here
    assert measured <= t <= 1.35 * measured
    small = custom[(custom.backend == "vllm_graph") & (custom.num_gpus == 8)
                   & (custom.message_size == 4096)].iloc[0].latency * 1e-3  # 5.1 us
    assert collective_time_s("all_reduce", 4096 * 2, 8, H100, "scale_up") == pytest.approx(
        small, rel=0.3)


def test_unmeasured_chip_transfers_collective_curves():
    # GB300 (reference b200_sxm): same fitted latency/efficiency, its own 72-GPU NVLink domain
    p = comm_params(GB300, "all_reduce", "nccl")
    assert p.source == "transfer:b200_sxm"
    assert collective_time_s("all_gather", 1e8, 64, GB300, "scale_up") >= 63 / 64 * 1e8 / 900e9


def test_deepep_all_to_all_curve():
    # moe_a2a.parquet (DeepEP, EP8, H100): even 1-token dispatch/combine takes >= 35 us, far above
    # NCCL's small all-to-all (~8 us in nccl.parquet); large messages stay above the link bound
    small = collective_time_s("all_to_all", 7168 * 8 * 2, 8, H100, "scale_up", algorithm="deepep")
    assert small > collective_time_s("all_to_all", 7168 * 8 * 2, 8, H100, "scale_up")
    assert small >= 20e-6
    # combine of 65536 tokens, top-8, hidden 7168, bf16: measured 21.2 ms (deepep_ht, 256
    # experts); the DeepEP fit is the weakest collective (held-out median 23%, report) and
    # over-predicts the largest messages: assert within a factor 2 and above the link bound
    big = 65536 * 8 * 7168 * 2.0
    t = collective_time_s("all_to_all", big, 8, H100, "scale_up", algorithm="deepep")
    assert t >= 7 / 8 * big / 450e9
    assert 21.24e-3 / 2 < t < 21.24e-3 * 2


def test_symmetric_memory_exchange_costs_one_custom_kernel_step():
    # DCP's query gather / output merge on the symmetric-memory path (vLLM PRs #48897, #50484)
    # is priced as one write into every peer, with vLLM's custom all-reduce kernel curve.
    # B200, 8 GPUs, 16 KB: custom one-shot all-reduce measured 8.22 us (custom_allreduce.parquet,
    # vLLM_custom_graph); NCCL all-gather measured 19.55 us (nccl.parquet, half)
    b200 = load_hardware("b200-sxm")
    symm = collective_time_s("all_gather", 16384, 8, b200, "scale_up", algorithm="symm")
    assert symm == pytest.approx(8.22e-6, rel=0.15)
    nccl = collective_time_s("all_gather", 16384, 8, b200, "scale_up")
    assert nccl == pytest.approx(19.55e-6, rel=0.15)
    # all-reduce on that path is the custom kernel itself; across domains NCCL stays
    assert collective_time_s("all_reduce", 16384, 8, b200, "scale_up", algorithm="symm") == \
        pytest.approx(8.22e-6, rel=0.15)
    assert collective_time_s("all_gather", 16384, 144, GB300, "scale_out", algorithm="symm") == \
        collective_time_s("all_gather", 16384, 144, GB300, "scale_out")
