"""HBM budget: weights, activations, reserve, KV pool; hybrid vs static allocators; packing."""

from __future__ import annotations

import numpy as np
import pytest

from model.perf import memory
from model.perf.parallel import ParallelPlan
from model.specs.architecture import load_architecture
from model.specs.errors import Infeasible
from model.specs.hardware import load_hardware
from model.specs.layers import Architecture, Attention, Layer, Linear, Mlp


def _toy(kinds: list[str], window: int = 32) -> Architecture:
    """bf16 GQA layers, 1 KV head of dim 64: 2 * 64 * 2 B = 256 B per token per layer."""
    emb = Linear("embed", 64, 1000, "bf16")
    layers = tuple(
        Layer(i, Attention(kind, 1, 1, 64, 64, (Linear("qkv", 64, 192, "bf16"),),
                           window=window if kind == "swa" else None),
              Mlp("dense", (Linear("up", 64, 256, "bf16"),)))
        for i, kind in enumerate(kinds))
    return Architecture("toy", "toy/toy", "toy", "-", 64, 1000, layers, emb, emb, True, 4096,
                        "bf16")


def test_hybrid_allocator_worked_example():
    # vLLM docs/design/hybrid_kv_cache_manager.md example: 10 full + 20 sliding-window
    # layers, block 16, window 32, request of 112 tokens -> 11 blocks per 10-layer group:
    # 7 (full: ceil(112/16)) + 2 + 2 (each SW group: the blocks of tokens 80..111).
    specs = memory.kv_specs(_toy(["gqa"] * 10 + ["swa"] * 20))
    page, units = memory.page_layout(specs, 16)
    assert page == 16 * 256 and units == {"gqa": 16, "swa": 16}
    layer_pages = memory.hybrid_sequence_bytes(specs, 112, 16) / page
    assert layer_pages == 10 * 7 + 20 * 2 == 11 * 10
    # a window-unaware allocator keeps all 7 blocks in every layer: 210 layer-pages
    assert memory.exact_sequence_bytes(specs, 112, 16, free_windows=False) == 30 * 7 * page


def test_linear_state_stretches_attention_blocks():
    # Qwen3-Next at TP2: the 36 linear layers' state is 2,146,304 B / 2 = 1,073,152 B per layer;
    # the page must hold it, so the full-attention block (1,024 B per token per layer at TP2)
    # grows to floor(1,073,152 / 1,024 / 16) * 16 = 1,040 tokens (vLLM: "past 400 tokens").
    specs = memory.kv_specs(load_architecture("qwen3-next-80b-a3b"), ParallelPlan(tp=2))
    page, units = memory.page_layout(specs, 16)
    assert page == 1_073_152
    assert units["gqa"] == 1040


def test_budget_adds_up_and_hybrid_doubles_gpt_oss_sequences():
    arch, hw = load_architecture("gpt-oss-120b"), load_hardware("h200-sxm")
    hybrid = memory.hbm_budget(arch, hw, ParallelPlan())
    static = memory.hbm_budget(arch, hw, ParallelPlan(), allocator="static")
    # vLLM --gpu-memory-utilization 0.9: weights + activations + reserve + KV pool = 0.9 x HBM
    total = hybrid.weight_bytes + hybrid.activation_bytes + hybrid.reserve_bytes + hybrid.kv_pool_bytes
    assert total == pytest.approx(0.9 * hw.hbm_bytes)
    # 18 full + 18 window-128 layers, 2,048 B per token per layer: at 8,192 tokens a sequence
    # holds 18 x 8192 + 18 x 128 token-layers (hybrid) vs 36 x 8192 (window-unaware)
    per_seq = 2048 * (18 * 8192 + 18 * 128)
    assert hybrid.max_sequences(8192) == np.floor(hybrid.kv_pool_bytes / per_seq)
    assert static.max_sequences(8192) == np.floor(hybrid.kv_pool_bytes / (2048 * 36 * 8192))
    assert hybrid.max_sequences(8192) / static.max_sequences(8192) == pytest.approx(1.98, abs=0.02)
    assert hybrid.kv_capacity_tokens(8192) == hybrid.max_sequences(8192) * 8192


def test_attention_data_parallel_multiplies_sequences():
    arch, hw = load_architecture("deepseek-r1"), load_hardware("b200")
    dep = memory.hbm_budget(arch, hw, ParallelPlan(dp=8, ep=8))
    per_rank = np.floor(dep.kv_pool_bytes / dep.sequence_bytes(32768))
    assert dep.max_sequences(32768) == 8 * per_rank


def test_weights_that_do_not_fit_are_infeasible():
    with pytest.raises(Infeasible, match="deepseek-r1 under single on h200-sxm: weights"):
        memory.hbm_budget(load_architecture("deepseek-r1"), load_hardware("h200-sxm"))


def test_packed_indexer_layout_saving_deepseek_v4():
    # Per token (vLLM PR #44577 packed layout): 30 CSA layers hold (584 B entry + index key)/4 and
    # 31 HCA layers 584/128. The fp8 index key is 128 + 4 B, the packed MXFP4 row 64 + 4 = 68 B:
    # 30 * 716 / 4 + 31 * 584 / 128 = 5,511.44 B vs 30 * 652 / 4 + 31 * 584 / 128 = 5,031.44 B,
    # a 8.71% smaller block from the layout alone; with each tensor's block padded to 512 B in the
    # per-tensor layout it is 9.9% (seed post: "about 10%"; PR #48993: -6.1% / -10.75% strides).
    arch = load_architecture("deepseek-v4-pro")
    assert memory.packed_layout_saving(arch) == pytest.approx(1 - 5031.4375 / 5511.4375, abs=1e-9)
    assert memory.packed_layout_saving(arch, alignment_bytes=512) == pytest.approx(0.0992, abs=5e-4)


def test_minimax_m3_index_keys_whole_on_every_tp_rank():
    # MiniMax M3 under TP4 with fp8 KV: the 4 KV heads split one per rank, 2 x 128 x 1 B = 256 B
    # per layer; MSA's index-K cache holds one 128-wide bf16 key per token ([slots, 1,
    # sparse_index_dim] in TensorRT-LLM's MiniMaxM3KVCacheManagerV2), so each rank keeps all of it:
    # 60 x 256 + 57 x 256 = 29,952 B per token per GPU (MiniMaxAI--MiniMax-M3_config.json)
    arch = load_architecture("minimax-m3")
    specs = memory.kv_specs(arch, ParallelPlan(tp=4, moe_tp=4), "fp8")
    assert memory.unpadded_sequence_bytes(specs, 1000.0) == pytest.approx(1000 * 29_952)
    # decode context parallelism is what splits the keys: DCP2 halves both parts
    specs = memory.kv_specs(arch, ParallelPlan(tp=4, moe_tp=4, dcp=2), "fp8")
    assert memory.unpadded_sequence_bytes(specs, 1000.0) == pytest.approx(1000 * 29_952 / 2)
