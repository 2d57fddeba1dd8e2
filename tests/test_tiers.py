"""KV tiers: link rates from the hardware specs, reload vs recompute, prefetch during gaps."""

from __future__ import annotations

import numpy as np
import pytest

from model import ROOT
from model.perf import tiers
from model.perf.parallel import ParallelPlan
from model.serve import cache_replay as cache
from model.specs.architecture import load_architecture
from model.specs.hardware import load_hardware

AGENTX = ROOT / "data" / "traces" / "cc_traces_weka_042026_sample"
CHIPS = ("h200-sxm", "b200", "gb300-nvl72")


def test_reload_vs_recompute_hand_example():
    # 100K tokens of Kimi-K2.5-class KV (3.8e9 B, vLLM x Mooncake blog) at 50 GB/s (vLLM KV
    # offloading blog, PCIe Gen5 one way) take
    # 76 ms; recomputing with 32e9 active params at 4.5e15 FLOP/s and MFU 0.5 takes 2.84 s.
    host = tiers.Tier("host", 1e12, 50e9, 0.0, "pcie")
    assert float(host.transfer_time_s(3.8e9)) == pytest.approx(0.076, rel=1e-9)
    assert tiers.recompute_time_physics_s(32e9, 1e5, 4.5e15, 0.5) == pytest.approx(2.844, rel=1e-3)
    # kappa = 2 N W / (C b_kv) (arXiv 2601.19910) by hand: Llama-3.1-8B 6.17, DeepSeek-V3 53.2
    assert tiers.kappa(8e9, 50e9, 989e12, 131072) == pytest.approx(6.17, rel=1e-3)
    assert tiers.kappa(37e9, 50e9, 989e12, 70272) == pytest.approx(53.2, rel=1e-3)


def test_tier_links_from_hardware():
    # H200: PCIe Gen5 x16 64 GB/s x (50/64 measured DMA, vLLM offload blog) = 50 GB/s; NVMe
    # 6.5 GB/s per GPU (staged through host, which is faster); RDMA 50 GB/s x 0.9.
    t = tiers.tiers_for(load_hardware("h200-sxm"))
    assert t["host"].bandwidth_bytes_per_s == pytest.approx(50e9)
    assert t["host"].link == "pcie"
    assert t["nvme"].bandwidth_bytes_per_s == pytest.approx(6.5e9)
    assert t["remote"].bandwidth_bytes_per_s == pytest.approx(45e9)
    # GB300: NVLink-C2C 225 GB/s per GPU per direction (hardware/gb300-nvl72.yaml)
    g = tiers.tiers_for(load_hardware("gb300-nvl72"))
    assert g["host"].link == "nvlink-c2c"
    assert g["host"].bandwidth_bytes_per_s == pytest.approx(225e9 * 50 / 64)


def test_turn_load_time_deepseek_r1():
    # MLA keeps the whole 576-dim bf16 latent on every TP rank: 61 layers x 1152 B per token,
    # so 100K tokens are 7.0272e9 B per GPU; over 50 GB/s plus 10 us: 0.14055 s.
    arch = load_architecture("deepseek-r1")
    t = tiers.kv_load_time_s(arch, load_hardware("h200-sxm"), ParallelPlan(tp=8), 1e5, "host")
    assert float(t) == pytest.approx(10e-6 + 61 * 1152 * 1e5 / 50e9, rel=1e-9)


@pytest.mark.parametrize("chip", CHIPS)
def test_reload_beats_recompute_for_mla_from_host(chip):
    # Per GPU, recomputing costs at least 2 x (36.6e9 / 8) FLOP per token at peak while loading
    # costs 70,272 B per token over the host link: on H200 that is >= 9.3 us vs 1.4 us, and the
    # 10 us latency is covered already at one 16-token block, so reloading wins at every context.
    be = tiers.break_even(load_architecture("deepseek-r1"), load_hardware(chip),
                          ParallelPlan(tp=8), "host")
    assert be.reload_wins_above_tokens == 16.0 and be.reload_wins_everywhere
    assert np.all(be.speedup > 1)


@pytest.mark.parametrize("chip", CHIPS)
def test_remote_break_even_small_moe(chip):
    # Qwen3-30B-A3B (3.04e9 active, 48 layers x 32 heads x 128, 96 KiB bf16 KV per token) on one
    # GPU from the RDMA pool: load = 1 ms lookup + c x 98,304 B / (0.9 x NIC). Recompute can
    # never beat its peak-FLOP bound (2 N c + 2 L H d c^2) / peak_bf16, so from the first grid
    # context where that bound exceeds the load, reloading must win for good: the break-even
    # is at or below it (H200: bound 6.7 ms vs load 3.2 ms at 1,024 tokens; B200 at 2,048: 6.3
    # vs 5.5 ms), whatever the step model's calibration. At 128K the speedup is at least
    # bound / load.
    arch = load_architecture("qwen3-30b-a3b")
    hw = load_hardware(chip)
    be = tiers.break_even(arch, hw, ParallelPlan(), "remote")
    c = be.contexts_tokens
    bound = (2 * 3.04e9 * c + 2 * 48 * 32 * 128 * c * c) / hw.peak("bf16")
    load = 1e-3 + c * 98304 / (hw.scale_out_bandwidth_bytes_per_s * 0.9)
    assert be.load_s == pytest.approx(load, rel=1e-9)
    assert np.all(be.recompute_s >= bound * 0.999)
    first_sure = c[np.flatnonzero(bound > load)[0]]
    assert first_sure <= 2048
    assert be.load_wins_at_max and be.reload_wins_above_tokens <= first_sure
    i = int(np.flatnonzero(c == 131072)[0])
    assert be.speedup[i] >= bound[i] / load[i] > 5


def test_prefetch_hides_loads_shorter_than_the_gap():
    # Replay with a small HBM pool and a host tier; DeepSeek-R1 MLA at TP8 moves 70,272 B per
    # token per GPU over 50 GB/s: a 100K-token reload takes 0.14 s, shorter than most tool-call
    # gaps (AgentX median think time 10 s), so prefetch hides most lower-tier traffic.
    stream = cache.stream_for(AGENTX)
    res = cache.replay(stream, {"hbm": 3e5, "host": 4e6})
    t = tiers.tiers_for(load_hardware("h200-sxm"))
    with_prefetch = tiers.prefetch(res, stream, t, 70272.0)
    without = tiers.prefetch(res, stream, t, 70272.0, prefetch=False)
    assert with_prefetch.lower_tier_tokens == res.hit_tokens_by_tier["host"]
    assert without.hidden_tokens == 0
    assert 0.5 < with_prefetch.hidden_fraction <= 1.0
    assert with_prefetch.exposed_load_s < without.exposed_load_s
