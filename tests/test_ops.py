"""Closed-form op counts (model.perf.ops) against hand derivations."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest

from model.perf import ops
from model.perf.ops import Step, attention_core_op, linear_op, model_ops, moe_op, totals
from model.specs.errors import Infeasible
from model.specs.layers import Architecture, Attention, Experts, Indexer, Layer, Linear, Mlp


# ---- small hand-built architectures, shared by the perf-model tests --------------------------------
def dense_layer(i: int, hidden=4096, heads=32, kv=8, hd=128, inter=14336, dt="bf16") -> Layer:
    att = Attention("gqa", heads, kv, hd, hd, (
        Linear("q_proj", hidden, heads * hd, dt), Linear("k_proj", hidden, kv * hd, dt),
        Linear("v_proj", hidden, kv * hd, dt), Linear("o_proj", heads * hd, hidden, dt)))
    mlp = Mlp("dense", (Linear("gate_proj", hidden, inter, dt), Linear("up_proj", hidden, inter, dt),
                        Linear("down_proj", inter, hidden, dt)))
    return Layer(i, att, mlp)


def llama8b(dt="bf16") -> Architecture:
    """Llama-3.1-8B shapes (meta-llama/Llama-3.1-8B config.json: 32 layers, hidden 4096,
    32 heads, 8 KV heads, head 128, FFN 14336, vocab 128256, untied)."""
    layers = tuple(dense_layer(i, dt=dt) for i in range(32))
    return Architecture("toy-llama-8b", "meta-llama/Llama-3.1-8B", "llama", "test", 4096, 128256,
                        layers, Linear("embed_tokens", 128256, 4096, "bf16"),
                        Linear("lm_head", 4096, 128256, "bf16"), False, 131072, dt)


def mla_moe_layer(i: int, dt="fp8_block") -> Layer:
    """DeepSeek-V3 layer shapes (config.json: hidden 7168, 128 heads, q_lora 1536, kv_lora 512,
    rope 64, nope 128, v 128, 256 experts top-8 of width 2048, 1 shared expert)."""
    h = 128
    att = Attention("mla", h, 1, 192, 128, (
        Linear("q_a_proj", 7168, 1536, dt), Linear("q_b_proj", 1536, h * 192, dt),
        Linear("kv_a_proj_with_mqa", 7168, 576, dt), Linear("kv_b_proj", 512, h * 256, dt),
        Linear("o_proj", h * 128, 7168, dt)), kv_lora_rank=512, qk_rope_head_dim=64)
    mlp = Mlp("moe", (Linear("router", 7168, 256, "bf16"),
                      Linear("shared_gate_up", 7168, 2 * 2048, dt),
                      Linear("shared_down", 2048, 7168, dt)),
              Experts(256, 8, 7168, 2048, dt))
    return Layer(i, att, mlp)


def deepseek_v3_like(n_layers=61) -> Architecture:
    layers = tuple(mla_moe_layer(i) for i in range(n_layers))
    return Architecture("toy-dsv3", "deepseek-ai/DeepSeek-V3", "deepseek_v3", "test", 7168, 129280,
                        layers, Linear("embed_tokens", 129280, 7168, "bf16"),
                        Linear("lm_head", 7168, 129280, "bf16"), False, 163840, "fp8_block")


@dataclass(frozen=True, eq=False)
class ToyHardware:
    """A stand-in for model.specs.hardware.Hardware (hashable by identity, as the kernel caches
    need) with round H100 SXM figures of hardware/h100-sxm.yaml: 990 / 2,000 TFLOP/s bf16 / fp8,
    3.35 TB/s HBM, 80 GB, NVLink 450 GB/s per direction, 8-GPU domain, 400 Gbit/s NIC per GPU.
    No calibration reference: kernel efficiencies are model.perf.kernels' defaults."""

    name: str = "toy-h100"
    aliases: tuple = ()
    calibration_reference: str = ""
    mamf_efficiency: dict = field(default_factory=dict)
    hbm_bytes: float = 80e9
    hbm_bandwidth_bytes_per_s: float = 3.35e12
    scale_up_bandwidth_bytes_per_s: float = 450e9
    scale_up_domain_gpus: int = 8
    scale_out_bandwidth_bytes_per_s: float = 50e9
    peak_flops_per_s: dict = field(default_factory=lambda: {
        "bf16": 9.9e14, "fp8": 2.0e15, "fp32": 6.7e13, "int8": 2.0e15})

    def peak(self, rate: str) -> float:
        if rate not in self.peak_flops_per_s:
            raise Infeasible(f"no {rate} rate")
        return self.peak_flops_per_s[rate]


def toy_hw(**over) -> ToyHardware:
    return ToyHardware(**over)


# ---- tests --------------------------------------------------------------------------------------
def test_linear_counts_hand_derived():
    # q_proj of Llama-8B for 100 tokens: 2*100*4096*4096 = 3.3554e9 FLOPs;
    # weights 4096*4096*2 B = 33.554 MB; activations 2 B*100*(4096+4096) = 1.6384 MB.
    op = linear_op(Linear("q_proj", 4096, 4096, "bf16"), 100)
    assert float(op.flops) == pytest.approx(3.3554432e9)
    assert float(op.weight_bytes) == pytest.approx(33554432)
    assert float(op.act_bytes) == pytest.approx(1638400)


def test_fp4_weights_count_scale_bytes():
    # nvfp4: 4 bits + one 8-bit scale per 16 elements = 4.5 bits -> 4096*4096*4.5/8 bytes
    op = linear_op(Linear("w", 4096, 4096, "nvfp4"), 1)
    assert float(op.weight_bytes) == pytest.approx(4096 * 4096 * 4.5 / 8)


def test_experts_touched_hand_values():
    # E (1 - (1 - k/E)^T) with E=256, k=8, T = 1 / 32 / 128 tokens -> 8; 163.3; 251.6 experts
    fn = ops.compiled("experts_touched")
    got = fn(256, 8, np.array([1.0, 32.0, 128.0]))
    assert got == pytest.approx([8.0, 163.3, 251.6], rel=5e-3)


def test_gqa_decode_attention_counts():
    # Llama-8B layer, decode of 16 seqs at 8192 context, bf16 KV:
    # entry = 8 kv heads * (128+128) * 2 B = 4096 B; reads 16*8192*4096 = 536.9 MB;
    # FLOPs = 2 * 16 * 32 heads * 256 * 8192 = 2.147e9
    att = dense_layer(0).attention
    core = attention_core_op(att, "decode", 16, 16, 8192, "bf16")[0]
    assert float(core.kv_read_bytes) == pytest.approx(16 * 8192 * 4096)
    assert float(core.flops) == pytest.approx(2 * 16 * 32 * 256 * 8192)
    assert float(core.kv_write_bytes) == pytest.approx(16 * 4096)


def test_mla_absorbed_vs_unabsorbed():
    # DeepSeek-V3 MLA decode (absorbed): per head q.k over 576 latent dims, v over 512;
    # one token at 4096 context: 2*128*(576+512)*4096 = 1.1408e9 FLOPs; entry 576 B in fp8.
    att = mla_moe_layer(0).attention
    core = attention_core_op(att, "decode", 1, 1, 4096, "fp8")[0]
    assert float(core.flops) == pytest.approx(2 * 128 * 1088 * 4096)
    assert float(core.kv_read_bytes) == pytest.approx(4096 * 576)
    # prefill unabsorbed: 192 qk + 128 v dims per head, and the cached latents are up-projected
    pre = attention_core_op(att, "prefill", 1024, 1, 4096, "fp8")
    names = [o.name for o in pre]
    assert names == ["attn_prefill", "mla_kv_up_prefill"]
    assert float(pre[0].flops) == pytest.approx(2 * 1024 * 128 * 320 * 4096)
    # 3072 cached tokens x 2*512*128*(128+128) flops
    assert float(pre[1].flops) == pytest.approx(3072 * 2 * 512 * 128 * 256)


def test_sparse_and_window_kinds_cap_attended_entries():
    # DSA keeps top_k=2048 tokens; a 131072-token context still attends 2048 (DeepSeek V3.2).
    idx = Indexer(64, 128, 2048, cache_dtype="fp8")
    att = Attention("dsa", 128, 1, 192, 128, (), kv_lora_rank=512, qk_rope_head_dim=64,
                    indexer=idx)
    assert float(ops.attended_entries(att, 131072)) == 2048
    # indexer scores every token: 2*1 query*64 heads*128 dims*131072 = 2.147e9 FLOPs
    ind = attention_core_op(att, "decode", 1, 1, 131072, "fp8")[-1]
    assert float(ind.flops) == pytest.approx(2 * 64 * 128 * 131072)
    swa = Attention("swa", 64, 8, 64, 64, (), window=128)
    assert float(ops.attended_entries(swa, 4096)) == 128
    # CSA (DeepSeek V4): ratio-4 compression, top_k 512 compressed entries + 128-token window
    csa = Attention("csa", 64, 1, 512, 512, (), window=128, compress_ratio=4,
                    indexer=Indexer(64, 128, 512))
    assert float(ops.attended_entries(csa, 100000)) == 512 + 128
    hca = Attention("hca", 64, 1, 512, 512, (), window=128, compress_ratio=128)
    assert float(ops.attended_entries(hca, 128000)) == 1000 + 128


def test_linear_attention_state_is_context_independent():
    att = Attention("linear", 32, 32, 128, 128, (), state_elements=32 * 128 * 128)
    a = attention_core_op(att, "decode", 8, 8, 1000, "bf16")[0]
    b = attention_core_op(att, "decode", 8, 8, 100000, "bf16")[0]
    assert float(a.kv_read_bytes) == float(b.kv_read_bytes) == 8 * 32 * 128 * 128 * 4.0


def test_moe_weight_bytes_follow_touched_experts():
    ex = Experts(256, 8, 7168, 2048, "fp8")
    one = moe_op(ex, 1)
    # one token touches 8 experts of 3*7168*2048 fp8 weights each
    assert float(one.weight_bytes) == pytest.approx(8 * 3 * 7168 * 2048)
    assert float(one.flops) == pytest.approx(2 * 8 * 3 * 7168 * 2048)


def test_model_decode_weight_bytes_match_parameter_count():
    # A bf16 Llama-8B decode step reads every weight once: 2 B x (32 layers x 218.1M + 2 x 525.3M
    # embedding/LM head) ~ 16.06e9 B (8.03B params; the embedding read is only the rows used).
    arch = llama8b()
    per_layer = 4096 * 4096 * 2 + 2 * 4096 * 1024 + 3 * 4096 * 14336
    t = totals(model_ops(arch, Step(decode_seqs=1, decode_context=1)))
    expect = 2 * (32 * per_layer + 4096 * 128256) + 4096 * 2  # LM head + one embedding row
    assert float(t["weight_bytes"]) == pytest.approx(expect, rel=1e-6)


def test_formulas_render_and_vectorize():
    table = ops.render()
    assert {r["name"] for r in table} >= {"linear_flops", "experts_touched", "attn_flops"}
    assert ops.latex("linear_flops") == "2 T copies d_{in} d_{out}"
    arr = ops.compiled("linear_flops")(np.arange(4.0), 10, 10, 1)
    assert list(arr) == [0, 200, 400, 600]
