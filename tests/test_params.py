"""Parameter counts against published numbers (within 3%) and weight bytes by hand.

`total` = main stack + embedding + LM head, MTP excluded. Publishers count active parameters
two ways; each case uses the convention its publisher documents:
- `active` (LM head, no input embedding): OpenAI's gpt-oss card (5.1B; 5.13B here) fits it;
  used for DeepSeek, whose V4-Flash 13B only fits this way (with the embedding: 13.8B).
- `active_with_embedding`: Qwen's cards (e.g. Qwen3-30B-A3B: "3.3B activated", with
  "non-embedding" counts listed separately), Meta's Llama 4 (17B), Moonshot's K2 (32.6B).
- `active_without_head` (neither embedding nor LM head): MiniMax; M1's 45.9B comes out at
  45.94B this way (47.17B with the head).
"""

from __future__ import annotations

import pytest

from model.perf.params import parameter_counts, weight_bytes, weight_bytes_by_dtype
from model.specs.architecture import load_architecture
from model.specs.dtypes import dtype

B = 1e9

# name, published total, published active (None: not published / not sourced), source
PUBLISHED = [
    # DeepSeek-V3 report arXiv 2412.19437: "671B total parameters with 37B activated"
    ("deepseek-v3", 671 * B, 37 * B, "active"),
    # DeepSeek-V4 model card / HF blog: Pro 1.6T total, 49B activated; Flash 284B, 13B
    ("deepseek-v4-pro", 1600 * B, 49 * B, "active"),
    ("deepseek-v4-flash", 284 * B, 13 * B, "active"),
    # Kimi K3 tech report Table 1: K2 1.04T / 32.6B
    ("kimi-k2", 1040 * B, 32.6 * B, "active_with_embedding"),
    # Llama 3.1 model card: 405B, 70B, 8B
    ("llama-3.1-405b", 405 * B, None, None),
    ("llama-3.1-70b", 70 * B, None, None),
    ("meta-llama/Llama-3.1-8B", 8 * B, None, None),
    # vLLM AgentX post (seeds/): Kimi K3 2.8T, MiniMax M3 428B
    ("kimi-k3", 2800 * B, None, None),
    ("minimax-m3", 428 * B, None, None),
    # gpt-oss model card (OpenAI, 2025-08): 120b 116.8B total / 5.1B active; 20b 21B / 3.6B
    ("gpt-oss-120b", 116.8 * B, 5.1 * B, "active"),
    ("gpt-oss-20b", 21 * B, 3.6 * B, "active"),
    # Mistral "Mixtral of experts" (2023-12): 46.7B total, 12.9B per token; 8x22B 141B / 39B
    ("mixtral-8x7b", 46.7 * B, 12.9 * B, "active"),
    ("mistralai/Mixtral-8x22B-v0.1", 141 * B, 39 * B, "active"),
    # Qwen3 model cards: 235B / 22B activated; 30.5B / 3.3B; Qwen3-32B 32.8B
    ("qwen3-235b-a22b", 235 * B, 22 * B, "active_with_embedding"),
    ("Qwen/Qwen3-30B-A3B", 30.5 * B, 3.3 * B, "active_with_embedding"),
    ("qwen3-32b", 32.8 * B, None, None),
    # MiniMax-M1 README: 456B total, 45.9B activated; MiniMax-M2 README: 230B total, 10B active
    ("minimax-m1", 456 * B, 45.9 * B, "active_without_head"),
    ("minimax-m2", 230 * B, 10 * B, "active_without_head"),
    # Kimi Linear README: 48B total (A3B)
    ("kimi-linear-48b", 48 * B, None, None),
    # GLM-5 release (Z.ai, 2026-02): 744B total, 40B active
    ("zai-org/GLM-5", 744 * B, 40 * B, "active"),
    # Llama 4 (Meta, 2025-04): Maverick 400B / 17B active, Scout 109B / 17B active
    ("meta-llama/Llama-4-Maverick-17B-128E-Instruct", 400 * B, 17 * B, "active_with_embedding"),
    ("meta-llama/Llama-4-Scout-17B-16E-Instruct", 109 * B, 17 * B, "active_with_embedding"),
    # Xiaomi MiMo-V2-Flash card: 309B total, 15B active
    ("XiaomiMiMo/MiMo-V2-Flash", 309 * B, 15 * B, "active"),
    # Qwen3-Next blog (vLLM 2025-09): 80B total
    ("qwen3-next-80b-a3b", 80 * B, None, None),
    # Gemma 4 card (Google, 2026-04): 26B A4B 25.2B total / 3.8B active (text model; tied
    # embeddings, so the head matmul is the embedding table); 31B dense
    ("google/gemma-4-26B-A4B", 25.2 * B, 3.8 * B, "active"),
    ("nvidia/Gemma-4-31B-IT-NVFP4", 31 * B, None, None),
]


@pytest.mark.parametrize("name,total,active,convention", PUBLISHED)
def test_published_counts(name, total, active, convention):
    counts = parameter_counts(load_architecture(name))
    assert counts.total == pytest.approx(total, rel=0.03)
    if active is not None:
        value = (counts.active - counts.by_component.get("lm_head", 0)
                 if convention == "active_without_head" else getattr(counts, convention))
        assert value == pytest.approx(active, rel=0.03)


def test_deepseek_v3_components_by_hand():
    # attention per layer: q_a 7168x1536 + q_b 1536x(128x192) + kv_a 7168x576 + kv_b 512x(128x256)
    # + o 16384x7168 = 187,105,280; routed experts: 58 MoE layers x 256 x 3 x 7168 x 2048
    counts = parameter_counts(load_architecture("deepseek-v3"))
    attn = 7168 * 1536 + 1536 * 128 * 192 + 7168 * 576 + 512 * 128 * 256 + 128 * 128 * 7168
    assert counts.by_component["attention"] == 61 * attn
    assert counts.by_component["routed_experts"] == 58 * 256 * 3 * 7168 * 2048
    assert counts.embedding == 129_280 * 7168
    # MTP is excluded from total; the HF card's 685B adds the MTP layer and its embedding/head
    assert counts.total_with_mtp - counts.total == counts.by_component["mtp"]
    assert counts.total + counts.by_component["mtp"] + 2 * counts.embedding == pytest.approx(
        685e9, rel=0.01)


def test_bf16_weight_bytes_are_two_per_param():
    arch = load_architecture("llama-3.1-70b")
    assert weight_bytes(arch) == 2 * parameter_counts(arch).total


def test_scale_overheads_counted():
    # gpt-oss experts MXFP4: 4 bits + one 8-bit scale per 32 = 4.25 bits (OCP MX v1.0)
    arch = load_architecture("gpt-oss-120b")
    experts = sum(layer.mlp.experts.params for layer in arch.main_layers)
    assert weight_bytes_by_dtype(arch)["mxfp4"] == pytest.approx(experts * 4.25 / 8)
    # DeepSeek V3 fp8 block-128: 8 bits + one fp32 scale per 128x128 block
    v3 = load_architecture("deepseek-v3")
    fp8 = weight_bytes_by_dtype(v3)["fp8_block"]
    assert dtype("fp8_block").bits == 8 + 32 / 16384
    params_fp8 = sum(p.params for layer in v3.main_layers
                     for p in layer.attention.projections + layer.mlp.projections
                     if p.dtype == "fp8_block") + sum(
        layer.mlp.experts.params for layer in v3.main_layers if layer.mlp.experts)
    assert fp8 == pytest.approx(params_fp8 * (1 + 4 / 16384))


def test_weight_override_changes_bytes():
    # Llama 3.1 70B at NVFP4 (4.5 bits): all projections shrink, embeddings and head stay bf16
    arch = load_architecture("llama-3.1-70b", weight_dtype="nvfp4")
    counts = parameter_counts(arch)
    table = 128_256 * 8192
    norms = sum(layer.extra_params for layer in arch.main_layers)
    expected = (counts.total - 2 * table - norms) * 4.5 / 8 + 2 * table * 2 + norms * 2
    assert weight_bytes(arch) == pytest.approx(expected)
