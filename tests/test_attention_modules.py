"""Shapes of the measured attention modules (model.fit.attention_modules), read from the published
configs in data/architectures/hf/ and cut to the query heads one GPU runs; every expected number
is written out from the config.json named in the test."""

from __future__ import annotations

import pytest

from model.fit.attention_modules import MODULE_TABLES, module_config
from model.fit.kernel_tables import table
from model.specs.architecture import load_architecture
from model.specs.layers import Attention, Indexer

HEADS = (1, 2, 4, 8, 16, 32, 64, 128)  # num_heads values of the mla_* / msa_* tables


@pytest.mark.parametrize("h", HEADS)
@pytest.mark.parametrize("kv", ["bf16", "fp8"])
def test_deepseek_v3_mla_module(h, kv):
    # deepseek-ai--DeepSeek-V3_config.json: hidden 7168, 128 heads, q_lora_rank 1536,
    # kv_lora_rank 512, qk_nope_head_dim 128, qk_rope_head_dim 64, v_head_dim 128
    att, shapes = module_config("mla", "deepseek-ai/DeepSeek-V3", h, kv)
    assert att == Attention("mla", h, 1, 192, 128, (), kv_lora_rank=512, qk_rope_head_dim=64)
    # q_a (replicated), q_b (per head 192), kv_a_with_mqa (512 + 64, replicated),
    # kv_b (per head 128 + 128), o (per head 128 in)
    assert shapes == ((1536, 7168), (h * 192, 1536), (576, 7168), (h * 256, 512), (7168, h * 128))


@pytest.mark.parametrize("h", HEADS)
def test_minimax_m3_msa_module(h):
    # MiniMaxAI--MiniMax-M3_config.json: hidden 6144, 64 heads, 4 KV heads, head_dim 128;
    # sparse_attention_config: 4 index heads x 128, top 16 blocks of 128 tokens. The tables also
    # time 128 heads per GPU (twice the model's): the same rule scales every per-head width.
    att, shapes = module_config("msa", "MiniMaxAI/MiniMax-M3", h, "bf16")
    kv_heads = max(1, h * 4 // 64)  # whole KV heads: one per GPU below TP 16
    assert att == Attention("msa", h, kv_heads, 128, 128, (),
                            indexer=Indexer(4, 128, top_k=16, block_size=128))
    # q, k + v fused, o (row parallel), index q (4 x 128) + index k (128) fused and replicated
    assert shapes == ((h * 128, 6144), (2 * kv_heads * 128, 6144), (6144, h * 128),
                      (5 * 128, 6144))


V4 = {  # (hidden, q_lora_rank, heads, o_groups, index_topk) of the configs in data/architectures/hf
    "deepseek-ai/DeepSeek-V4-Pro": (7168, 1536, 128, 16, 1024),
    "sgl-project/DeepSeek-V4-Pro-FP8": (7168, 1536, 128, 16, 1024),
    "sgl-project/DeepSeek-V4-Flash-FP8": (4096, 1024, 64, 8, 512),
}


# the dsv4_* tables time 8-64 heads per GPU for Flash (64 heads) and 16-128 for Pro (128 heads)
V4_HEADS = [(model, h) for model in sorted(V4) for h in (8, 16, 32, 64, 128) if h <= V4[model][2]]


@pytest.mark.parametrize("model, h", V4_HEADS)
@pytest.mark.parametrize("kind", ["csa", "hca"])
def test_deepseek_v4_modules(model, kind, h):
    # DeepSeek-V4 configs: head_dim 512 (one shared K=V head), qk_rope_head_dim 64, window 128,
    # o_lora_rank 1024, indexer 64 heads x 128; compress_ratios 4 (csa) and 128 (hca)
    hidden, q_lora, heads, o_groups, topk = V4[model]
    att, shapes = module_config(kind, model, h, "fp8")
    groups = max(1, o_groups * h // heads)
    indexer = Indexer(64, 128, topk, cache_dtype="fp8") if kind == "csa" else None
    assert att == Attention(kind, h, 1, 512, 512, (), window=128, qk_rope_head_dim=64,
                            kv_entry_dims=512, compress_ratio=4 if kind == "csa" else 128,
                            indexer=indexer)
    # wq_a, wq_b, wkv, wo_a (o_groups block-diagonal copies), wo_b, compressor wkv + wgate
    # (two overlapping windows at ratio 4); csa adds the indexer's wq_b, weights_proj and
    # compressor wkv + wgate
    expected = [(q_lora, hidden), (h * 512, q_lora), (512, hidden),
                (1024 * groups, h * 512 // groups), (hidden, 1024 * groups),
                (2 * 512 * (2 if kind == "csa" else 1), hidden)]
    if kind == "csa":
        expected += [(64 * 128, q_lora), (64, hidden), (2 * 2 * 128, hidden)]
    assert shapes == tuple(expected)


def test_every_table_model_resolves_to_a_published_config():
    # the `model` column of every module table names a config under data/architectures/hf/
    for family, names in MODULE_TABLES.items():
        for chip in ("h100_sxm", "h200_sxm", "b200_sxm"):
            for name in names:
                for model in table(chip, name).model.unique():
                    arch = load_architecture(model)
                    assert arch.source.endswith(model.replace("/", "--") + "_config.json")
                    assert any(ly.attention.kind == family for ly in arch.main_layers)
