"""KV-cache and state bytes against hand-derived cases (derivation in each comment)."""

from __future__ import annotations

import numpy as np
import pytest

from model.perf.kv import (
    entry_bytes,
    indexer_key_bytes,
    kv_bytes_per_token,
    layer_kv_bytes,
    sequence_kv,
)
from model.specs.architecture import load_architecture
from model.specs.errors import ServecastError
from model.specs.layers import Attention, Indexer


def test_deepseek_v3_mla_per_token():
    # 61 layers x (kv_lora_rank 512 + rope 64) x 2 B = 70,272 B/token (deepseek-ai--DeepSeek-V3_config.json)
    arch = load_architecture("deepseek-v3")
    assert kv_bytes_per_token(arch, "bf16") == 61 * 576 * 2 == 70_272
    # fp8: FlashMLA layout 512 fp8 + 4 fp32 scales + 64 bf16 rope = 656 B; x 61 = 40,016
    assert kv_bytes_per_token(arch, "fp8") == 61 * 656 == 40_016
    # MTP layer caches too when asked (FlashMLA deep-dive counts 62 layers)
    assert kv_bytes_per_token(arch, "bf16", include_mtp=True) == 62 * 1152


def test_kimi_k2_fp8_cache_per_100k_tokens():
    # Kimi K2.5-class MLA at fp8: the vLLM blog "Serving Agentic Workloads at Scale with vLLM x
    # Mooncake" quotes ~3.8 GB per 100K tokens (naive 576 B x 61 = 3.51 GB). The FlashMLA layout (656 B, scales + bf16 rope)
    # gives 61 x 656 x 100,000 = 4.0016 GB, within 10% of the quote.
    arch = load_architecture("kimi-k2")
    assert sequence_kv(arch, 100_000, "fp8").total_bytes == 61 * 656 * 100_000
    assert sequence_kv(arch, 100_000, "fp8").total_bytes == pytest.approx(3.8e9, rel=0.10)


def test_deepseek_v32_indexer_keys():
    # V3.2: every layer caches MLA latent + one index key. bf16: 61 x (1152 + 128 x 2) = 85,888;
    # fp8: 61 x (656 + 128 + 4) = 48,068 (deepseek-ai--DeepSeek-V3.2_config.json: index_head_dim 128)
    arch = load_architecture("deepseek-v3.2")
    assert kv_bytes_per_token(arch, "bf16") == 85_888
    assert kv_bytes_per_token(arch, "fp8") == 48_068


def test_deepseek_v4_pro_per_token():
    # 30 CSA (ratio 4, + index key) and 31 HCA (ratio 128) layers (compress_ratios of
    # deepseek-ai--DeepSeek-V4-Pro_config.json):
    # bf16 (1024 B entry, 256 B key): 30 x (1024 + 256) / 4 + 31 x 1024 / 128 = 9,848
    # fp8 584 B entry + MXFP4 68 B key: 30 x (584 + 68) / 4 + 31 x 584 / 128 = 5,031.4375
    arch = load_architecture("deepseek-v4-pro")
    assert kv_bytes_per_token(arch, "bf16") == pytest.approx(9_848)
    assert kv_bytes_per_token(arch) == pytest.approx(5_031.4375)  # default KV dtype is fp8
    flash = load_architecture("deepseek-v4-flash")
    # Flash: 21 CSA + 20 HCA -> bf16 21 x 320 + 20 x 8 = 6,880; fp8 21 x 163 + 20 x 4.5625
    assert kv_bytes_per_token(flash, "bf16") == pytest.approx(6_880)
    assert kv_bytes_per_token(flash, "fp8") == pytest.approx(3_514.25)


def test_deepseek_v4_sequence_at_1m_tokens():
    # L = 2^20. Window: 61 layers x 128 x 584 = 4,559,872. CSA: 30 x 2^18 x (584 + 68) =
    # 5,127,536,640. HCA: 31 x 2^13 x 584 = 148,307,968. Compressor residuals (fp32 kv + score):
    # CSA 2x4 tokens x 1024 wide x 2 x 4 B = 65,536 + indexer 2x4 x 256 x 2 x 4 = 16,384;
    # HCA 128 x 512 x 2 x 4 = 524,288 -> 30 x 81,920 + 31 x 524,288 = 18,710,528.
    arch = load_architecture("deepseek-v4-pro")
    foot = sequence_kv(arch, 2**20, "fp8")
    assert foot.state_bytes == 18_710_528
    assert foot.indexer_bytes == 30 * 2**18 * 68
    assert foot.total_bytes == pytest.approx(4_559_872 + 5_127_536_640 + 148_307_968 + 18_710_528)
    assert foot.by_kind["hca"] == pytest.approx(31 * (128 * 584 + 2**13 * 584 + 524_288))


def test_minimax_m3_msa_keeps_full_kv_plus_index_keys():
    # 60 layers x 2 x 4 kv heads x 128 x 2 B = 122,880 + 57 MSA layers x 128 x 2 B index keys
    # = 14,592 -> 137,472 B/token (MiniMaxAI--MiniMax-M3_config.json, sparse_attention_config)
    arch = load_architecture("minimax-m3")
    assert kv_bytes_per_token(arch, "bf16") == 137_472
    # fp8 KV: the index-K cache stays bf16 (vLLM ships it bf16; FP8 indexer is roadmap)
    assert kv_bytes_per_token(arch, "fp8") == 60 * 1024 + 57 * 256


def test_kimi_k3_state_and_mla():
    # 24 MLA layers x 576 x 2 B = 27,648 B/token. KDA state per layer 96 x 128 x 128 elements at
    # fp32 = 6,291,456 B, x 69 = 434,110,464; short conv 3 x 12288 x (4 - 1) bf16 = 221,184 B,
    # x 69 = 15,261,696 (moonshotai--Kimi-K3_config.json linear_attn_config; 434 MB at fp32)
    arch = load_architecture("kimi-k3")
    assert kv_bytes_per_token(arch, "bf16") == 27_648
    foot = sequence_kv(arch, 0, "bf16")
    assert foot.state_bytes == 434_110_464 + 15_261_696
    assert foot.by_kind["mla"] == 0
    # state is independent of context; bf16 state halves the recurrent part
    assert sequence_kv(arch, 100_000, "bf16").state_bytes == foot.state_bytes
    assert sequence_kv(arch, 0, state_dtype="bf16").state_bytes == 434_110_464 / 2 + 15_261_696


def test_gpt_oss_windows_capped():
    # gpt-oss-120b: 18 full layers x 2 x 8 x 64 x 2 B = 36,864 B/token; 18 sliding layers hold at
    # most 128 tokens: at L = 100,000: 36,864 x 100,000 + 18 x 2,048 x 128 = 3,691,118,592
    arch = load_architecture("gpt-oss-120b")
    assert kv_bytes_per_token(arch, "bf16") == 36_864
    foot = sequence_kv(arch, 100_000, "bf16")
    assert foot.total_bytes == 3_691_118_592
    assert foot.by_kind["swa"] == 18 * 2048 * 128
    # below the window the sliding layers grow like full ones: L = 100 -> 36 x 2,048 x 100
    assert sequence_kv(arch, 100, "bf16").total_bytes == 36 * 2048 * 100


def test_llama_70b_int8_kv_matches_scaling_book():
    # scaling book "Serving LLaMA" (jax-ml/scaling-book applied-inference.md): LLaMA-3-70B,
    # K=8, H=128, L=80, 1 B/element -> 163,840 B/token (~160 kB)
    arch = load_architecture("llama-3.1-70b")
    assert kv_bytes_per_token(arch, "int8") == 163_840
    assert kv_bytes_per_token(arch, "fp8") == 163_840


def test_hybrid_block_allocation():
    # vLLM docs/design/hybrid_kv_cache_manager.md example: block 16, window 32, L 112 -> a
    # full layer holds 7 blocks, a sliding layer 2 blocks (tokens 80..111 = blocks 5, 6)
    full = Attention("gqa", 8, 1, 64, 64, ())
    swa = Attention("swa", 8, 1, 64, 64, (), window=32)
    entry = 2 * 64 * 2  # K and V, one head of 64, bf16
    assert layer_kv_bytes(full, 112, "bf16", block_size=16) == 7 * 16 * entry
    assert layer_kv_bytes(swa, 112, "bf16", block_size=16) == 2 * 16 * entry
    # L 113: the window spans tokens 81..112 -> blocks 5, 6, 7
    assert layer_kv_bytes(swa, 113, "bf16", block_size=16) == 3 * 16 * entry
    assert layer_kv_bytes(full, 113, "bf16", block_size=16) == 8 * 16 * entry


def test_compressed_block_padding():
    # vLLM DeepSeek V4: 256-token logical blocks hold 64 c4 entries / 2 c128 entries. At L=1000:
    # 4 blocks -> 256 CSA entries (unpadded floor(1000/4) = 250), 8 HCA entries (7 unpadded)
    arch = load_architecture("deepseek-v4-pro")
    csa = arch.layers[2].attention
    entry, key = 584, 68
    window = 128 * entry  # tokens 872..999 lie in blocks 3 -> one 256-token block when padded
    assert layer_kv_bytes(csa, 1000, "fp8") == pytest.approx(window + 250 * (entry + key)
                                                            + 81_920)
    padded = layer_kv_bytes(csa, 1000, "fp8", block_size=256)
    assert padded == pytest.approx(256 * entry + 256 * (entry + key) + 81_920)


def test_entry_layouts():
    # the byte layouts named in model.perf.kv's docstring
    v3 = load_architecture("deepseek-v3").layers[0].attention
    v4 = load_architecture("deepseek-v4-pro").layers[0].attention
    assert entry_bytes(v3, "bf16") == 1152 and entry_bytes(v3, "fp8") == 656
    assert entry_bytes(v4, "bf16") == 1024 and entry_bytes(v4, "fp8") == 584
    idx = Indexer(64, 128, 2048)
    # bf16 256 B; fp8 128 + 4 B scale = 132; MXFP4 64 + 4 = 68 (vLLM PR #44577, packed indexer row)
    assert indexer_key_bytes(idx, "bf16") == 256
    assert indexer_key_bytes(idx, "fp8", "fp8") == 132
    assert indexer_key_bytes(idx, "fp8", "mxfp4") == 68


def test_broadcast_over_context():
    arch = load_architecture("gpt-oss-120b")
    contexts = np.array([0, 64, 1_000, 100_000])
    many = sequence_kv(arch, contexts, "bf16").total_bytes
    assert many.shape == (4,)
    assert list(many) == [sequence_kv(arch, int(c), "bf16").total_bytes for c in contexts]


def test_bad_inputs():
    arch = load_architecture("deepseek-v3")
    with pytest.raises(ServecastError, match="context_tokens must be finite and >= 0"):
        sequence_kv(arch, -1)
    with pytest.raises(ServecastError, match="unknown dtype"):
        sequence_kv(arch, 10, "fp7")
    with pytest.raises(ServecastError, match="block_size must be a positive"):
        sequence_kv(arch, 10, block_size=0)
