"""Kernel time physics (model.perf.roofline) and the chip transfer rule (model.perf.kernels)."""

from __future__ import annotations

import numpy as np
import pytest

from model.perf.kernels import params_for
from model.perf.roofline import (
    attention_flops_bytes,
    attention_time_s,
    experts_touched,
    gemm_time_s,
    mean_attended,
    memory_time_s,
    moe_time_s,
)
from model.specs.errors import Infeasible
from model.specs.hardware import load_hardware
from model.specs.layers import Attention, Indexer

H100 = load_hardware("h100-sxm")
B200 = load_hardware("b200")
GQA = Attention("gqa", 64, 8, 128, 128, ())  # Llama-3.1-70B-like attention
MLA = Attention("mla", 128, 1, 192, 128, (), kv_lora_rank=512, qk_rope_head_dim=64)  # DSV3


def test_gemm_never_beats_the_compute_roofline():
    # 4096^3 bf16 on H100: 2 * 4096^3 / 989.4e12 FLOP/s = 0.1389 ms (dense peak, hardware/h100-sxm.yaml)
    t = gemm_time_s(4096, 4096, 4096, "bf16", H100)
    assert t >= 2 * 4096**3 / 989.4e12
    # and the fitted efficiency keeps it within a sane MAMF-like band (> 55% of peak)
    assert t < 2 * 4096**3 / (0.55 * 989.4e12)


def test_gemm_small_batch_is_bounded_by_weight_streaming():
    # m=1, 8192x8192 bf16 weights = 134.2 MB at 3.35 TB/s = 40.1 us minimum
    t = gemm_time_s(1, 8192, 8192, "bf16", H100)
    assert t >= 8192 * 8192 * 2 / 3.35e12
    # fp8 weights halve the stream (and fp8 has its own fitted curve): still >= 20 us
    assert gemm_time_s(1, 8192, 8192, "fp8", H100) >= 8192 * 8192 / 3.35e12


def test_gemm_vectorized_and_monotone_in_m():
    m = np.array([1, 16, 256, 4096, 16384])
    t = gemm_time_s(m, 7168, 2048, "fp8_block", H100)
    assert t.shape == m.shape
    assert np.all(np.diff(t) >= 0)


def test_gemm_fitted_close_to_a_measured_row():
    # data/calibration/ops/h100_sxm/gemm.parquet, bfloat16 m=16384 n=8192 k=8192: fastest
    # kernel 3.1085 ms; the fit's held-out median error for H100 bf16 GEMM is 7.6% (report)
    t = gemm_time_s(16384, 8192, 8192, "bf16", H100)
    assert t == pytest.approx(3.1085e-3, rel=0.15)


def test_memory_time_is_bytes_over_calibrated_bandwidth():
    eff = params_for(H100, "memory", "bf16").memory_efficiency
    assert 0.7 < eff <= 1.0  # weight-streaming fit (kernels.yaml)
    assert memory_time_s(1e9, H100) == pytest.approx(1e9 / (3.35e12 * eff))


def test_mean_attended_matches_brute_force():
    # causal chunk of n new tokens ending at context c, optional sliding window w
    for n, c, w in [(1, 100, None), (64, 64, None), (100, 1000, None), (50, 1000, 128),
                    (300, 300, 128), (10, 100, 128)]:
        positions = np.arange(c - n + 1, c + 1)
        expected = np.mean(np.minimum(positions, w) if w else positions)
        assert mean_attended(n, c, w) == pytest.approx(expected)


def test_decode_attention_reads_the_whole_kv():
    # batch 64 at 100K context, 8 KV heads x (128 + 128) dims x 2 B = 4 KiB per token per layer:
    # 64 * 100000 * 4096 B = 26.2 GB... per layer -> >= 7.8 ms at 3.35 TB/s
    kv_bytes = 64 * 100_000 * 8 * 256 * 2
    t = attention_time_s("gqa", "decode", 64, 1, 100_000, GQA, "bf16", H100)
    assert t >= kv_bytes / 3.35e12
    # fp8 KV halves the bytes: faster, but not below half the bf16 bound
    t8 = attention_time_s("gqa", "decode", 64, 1, 100_000, GQA, "fp8", H100)
    assert kv_bytes / 2 / 3.35e12 <= t8 < t


def test_prefill_attention_flops_are_causal():
    # 8192 new tokens, no prefix, 64 heads x (128 + 128): 2 * 8192 * 64 * 256 * (8192 + 1) / 2
    flops, _, _ = attention_flops_bytes("gqa", "prefill", 1, 8192, 8192, GQA, 2.0)
    assert flops == pytest.approx(2 * 8192 * 64 * 256 * 8193 / 2)
    t = attention_time_s("gqa", "prefill", 1, 8192, 8192, GQA, "bf16", H100)
    assert t >= flops / 989.4e12


def test_mla_decode_reads_the_latent_once_for_all_heads():
    # absorbed MLA: 576 cached dims per token, shared by all heads; tp shards heads only
    _, b1, _ = attention_flops_bytes("mla", "decode", 32, 1, 50_000, MLA, 1.0, tp=1)
    _, b8, _ = attention_flops_bytes("mla", "decode", 32, 1, 50_000, MLA, 1.0, tp=8)
    kv = 32 * 50_001 * 576 * 1.0
    assert b1 >= kv and b8 >= kv  # latent replicated under TP (vLLM MLA)


def test_sparse_attention_is_bounded_by_top_k():
    dsa = Attention("dsa", 128, 1, 192, 128, (), kv_lora_rank=512, qk_rope_head_dim=64,
                    indexer=Indexer(64, 128, 2048, cache_dtype="fp8"))
    short = attention_time_s("dsa", "decode", 16, 1, 4_000, dsa, "fp8", H100)
    long = attention_time_s("dsa", "decode", 16, 1, 400_000, dsa, "fp8", H100)
    dense = attention_time_s("mla", "decode", 16, 1, 400_000, MLA, "fp8", H100)
    assert short < long < dense  # indexer grows with context; the MLA part is capped at top_k


def test_moe_touched_experts():
    # E (1 - (1 - k/E)^T): one token touches exactly k experts; many tokens touch all E
    assert experts_touched(1, 8, 256) == pytest.approx(8)
    assert experts_touched(100_000, 8, 256) == pytest.approx(256)


def test_moe_decode_is_bounded_by_touched_expert_weights():
    # DeepSeek-V3 layer, EP8: 32 local experts of 3 * 7168 * 2048 fp8 weights; 64 tokens touch
    # 256 (1 - (1 - 8/256)^64) = 221.6 experts, 1/8 of them local -> >= 27.7 * 44 MB / 3.35 TB/s
    touched_local = experts_touched(64, 8, 256) / 8
    bound = touched_local * 3 * 7168 * 2048 * (8 + 32 / 16384) / 8 / 3.35e12
    t = moe_time_s(64, 7168, 2048, 8, 32, 1, 8, "fp8_block", H100)
    assert t >= bound


def test_unknown_kind_and_phase_are_user_errors():
    with pytest.raises(Infeasible, match="allowed"):
        attention_time_s("sliding", "decode", 1, 1, 10, GQA, "bf16", H100)
    with pytest.raises(Infeasible, match="allowed"):
        attention_time_s("gqa", "verify", 1, 1, 10, GQA, "bf16", H100)


def test_transfer_rule_gb300_between_physics_and_scaled_b200():
    # GB300 has no kernel measurements: calibration_reference b200_sxm. Its large-GEMM time must
    # be >= its own physics bound and equal to the B200 time rescaled by the peak ratio and the
    # MAMF ratio (GB300 has no sourced MAMF -> ratio 1), i.e. <= the B200 time.
    gb300 = load_hardware("gb300-nvl72")
    m = n = k = 16384
    t_gb300 = gemm_time_s(m, n, k, "fp8", gb300)
    t_b200 = gemm_time_s(m, n, k, "fp8", B200)
    assert t_gb300 >= 2 * m * n * k / gb300.peak("fp8")
    assert t_gb300 <= t_b200
    scaled = t_b200 * B200.peak("fp8") / gb300.peak("fp8")
    assert t_gb300 == pytest.approx(scaled, rel=0.02)  # compute-bound: only peaks differ
    assert params_for(gb300, "gemm", "fp8").source == "transfer:b200_sxm"


def test_transfer_rule_scales_by_mamf_ratio():
    # MI355X: sourced bf16 MAMF 62.6% vs B200 77.6% (hardware/*.yaml mamf_efficiency, S03) -> ceiling x 0.807
    mi355x = load_hardware("mi355x")
    ref = params_for(B200, "gemm", "bf16").compute_efficiency_max
    got = params_for(mi355x, "gemm", "bf16").compute_efficiency_max
    assert got == pytest.approx(ref * 0.626 / 0.776, rel=1e-6)
