"""DeepSeek-style MLA + MoE stacks: DeepSeek V3 / R1 / V3.1 (and Kimi K2.x, same modeling
code), DeepSeek V3.2 and GLM-5.x (MLA + lightning indexer = DSA), and DeepSeek V4 (CSA / HCA
compressed attention, grouped low-rank output, hash-routed first layers, mHC residual).

Module names follow the checkpoints (`self_attn.q_a_proj`, `mlp.experts`; V4: `attn.wq_a`,
`ffn.experts`) so quantization ignore lists resolve against them.
"""

from __future__ import annotations

from dataclasses import replace

from model.specs.errors import SpecError
from model.specs.families.common import Builder, Parts, dense_mlp, moe_mlp, norms
from model.specs.layers import Attention, Indexer, Layer, Linear, Mlp

MLA_KEYS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "kv_lora_rank",
            "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "vocab_size")
MOE_KEYS = ("n_routed_experts", "num_experts_per_tok", "moe_intermediate_size",
            "intermediate_size")


def _mla(b: Builder, i: int, *, indexer: Indexer | None, kind: str) -> Attention:
    hidden, heads = b["hidden_size"], b["num_attention_heads"]
    nope, rope, v_dim = b["qk_nope_head_dim"], b["qk_rope_head_dim"], b["v_head_dim"]
    kv_rank, q_rank = b["kv_lora_rank"], b.get("q_lora_rank")
    qk = nope + rope
    p = "self_attn"
    projections: list[Linear] = []
    if q_rank:
        projections += [b.lin(i, f"{p}.q_a_proj", hidden, q_rank),
                        b.lin(i, f"{p}.q_b_proj", q_rank, heads * qk)]
    else:
        projections.append(b.lin(i, f"{p}.q_proj", hidden, heads * qk))
    projections += [b.lin(i, f"{p}.kv_a_proj_with_mqa", hidden, kv_rank + rope),
                    b.lin(i, f"{p}.kv_b_proj", kv_rank, heads * (nope + v_dim)),
                    b.lin(i, f"{p}.o_proj", heads * v_dim, hidden)]
    if indexer is not None:
        # lightning indexer (DeepSeek V3.2 inference/model.py Indexer): wq_b from the q latent,
        # one shared key head wk, per-head weights
        q_in = q_rank or hidden
        projections += [b.lin(i, f"{p}.indexer.wq_b", q_in, indexer.num_heads * indexer.head_dim),
                        b.lin(i, f"{p}.indexer.wk", hidden, indexer.head_dim),
                        b.lin(i, f"{p}.indexer.weights_proj", hidden, indexer.num_heads,
                              quantizable=False)]
    return Attention(kind=kind, num_heads=heads, num_kv_heads=1, head_dim=qk, v_head_dim=v_dim,
                     projections=tuple(projections), kv_lora_rank=kv_rank,
                     qk_rope_head_dim=rope, indexer=indexer)


def _is_moe_layer(b: Builder, i: int) -> bool:
    types = b.get("mlp_layer_types")
    if types is not None and i < len(types):
        return types[i] == "sparse"
    freq = b.get("moe_layer_freq", 1)
    return i >= b.get("first_k_dense_replace", 0) and i % max(int(freq), 1) == 0


def _mlp(b: Builder, i: int) -> Mlp:
    hidden = b["hidden_size"]
    if not _is_moe_layer(b, i):
        return dense_mlp(b, i, hidden, b["intermediate_size"])
    return moe_mlp(b, i, hidden, experts=b["n_routed_experts"], top_k=b["num_experts_per_tok"],
                   inter=b["moe_intermediate_size"],
                   shared_inter=b.get("n_shared_experts", 0) * b["moe_intermediate_size"])


def _mtp_extra(b: Builder, i: int, hidden: int) -> tuple[Linear, ...]:
    # MTP module = eh_proj(concat(norm(h), norm(emb))) + one decoder layer; embed/head shared
    return (b.lin(i, "eh_proj", 2 * hidden, hidden),)


def build_mla(b: Builder) -> Parts:
    """deepseek_v3 / kimi_k2 (MLA), deepseek_v32 / glm_moe_dsa (MLA + indexer = DSA)."""
    b.need(*MLA_KEYS, *MOE_KEYS)
    n, hidden = b["num_hidden_layers"], b["hidden_size"]
    sparse = b.get("index_topk") is not None
    indexer_types = b.get("indexer_types")
    layers = []
    for i in range(n + b.get("num_nextn_predict_layers", 0)):
        mtp = i >= n
        idx = None
        if sparse:
            b.need("index_n_heads", "index_head_dim")
            # GLM-5.3 `shared` indexer layers reuse an earlier layer's top-k: no keys of their own
            own = indexer_types is None or mtp or indexer_types[i] == "full"
            idx = Indexer(b["index_n_heads"], b["index_head_dim"], b["index_topk"],
                          cache_dtype="fp8") if own else None
        attention = _mla(b, i, indexer=idx, kind="dsa" if sparse else "mla")
        if mtp:
            attention = _with_extra(attention, _mtp_extra(b, i, hidden))
        layers.append(Layer(i, attention, _mlp(b, i), mtp=mtp,
                            extra_params=norms(hidden) + (3 * hidden if mtp else 0)))
    return b.parts(layers)


def _with_extra(attention: Attention, extra: tuple[Linear, ...]) -> Attention:
    return replace(attention, projections=attention.projections + extra)


V4_KEYS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "head_dim",
           "qk_rope_head_dim", "q_lora_rank", "o_groups", "o_lora_rank", "index_n_heads",
           "index_head_dim", "index_topk", "sliding_window", "compress_ratios",
           "n_routed_experts", "num_experts_per_tok", "moe_intermediate_size", "vocab_size")


def _v4_attention(b: Builder, i: int, ratio: int) -> Attention:
    """DeepSeek V4 attention (inference/model.py, 2026-04): shared K=V head of head_dim, q LoRA,
    grouped low-rank output (wo_a block-diagonal over o_groups, then wo_b); ratio-4 layers (CSA)
    add a lightning indexer, every compressed layer a compressor (wkv + wgate; ratio 4 overlaps
    two windows, so twice the width)."""
    hidden, heads, hd = b["hidden_size"], b["num_attention_heads"], b["head_dim"]
    q_rank, groups, o_rank = b["q_lora_rank"], b["o_groups"], b["o_lora_rank"]
    p = "attn"
    projections = [b.lin(i, f"{p}.wq_a", hidden, q_rank), b.lin(i, f"{p}.wq_b", q_rank, heads * hd),
                   b.lin(i, f"{p}.wkv", hidden, hd),
                   b.lin(i, f"{p}.wo_a", heads * hd // groups, o_rank, count=groups),
                   b.lin(i, f"{p}.wo_b", groups * o_rank, hidden)]
    indexer = None
    if ratio:
        coff = 2 if ratio == 4 else 1
        projections += [b.lin(i, f"{p}.compressor.wkv", hidden, coff * hd),
                        b.lin(i, f"{p}.compressor.wgate", hidden, coff * hd)]
    if ratio == 4:
        ih, idim = b["index_n_heads"], b["index_head_dim"]
        # production caches index keys in MXFP4 (vLLM blog 2026-04-24, use_fp4_indexer_cache)
        indexer = Indexer(ih, idim, b["index_topk"], cache_dtype="mxfp4")
        projections += [b.lin(i, f"{p}.indexer.wq_b", q_rank, ih * idim),
                        b.lin(i, f"{p}.indexer.weights_proj", hidden, ih, quantizable=False),
                        b.lin(i, f"{p}.indexer.compressor.wkv", hidden, 2 * idim),
                        b.lin(i, f"{p}.indexer.compressor.wgate", hidden, 2 * idim)]
    kind = {0: "swa", 4: "csa", 128: "hca"}.get(ratio)
    if kind is None:
        raise SpecError(b.path, "compress_ratios", f"ratio {ratio} at layer {i}; allowed: 0, 4, 128")
    return Attention(kind=kind, num_heads=heads, num_kv_heads=1, head_dim=hd, v_head_dim=hd,
                     projections=tuple(projections), window=b["sliding_window"],
                     qk_rope_head_dim=b["qk_rope_head_dim"], kv_entry_dims=hd,
                     compress_ratio=ratio or None, indexer=indexer)


def build_v4(b: Builder) -> Parts:
    b.need(*V4_KEYS)
    b = replace(b, mtp_prefix="mtp")
    n, hidden = b["num_hidden_layers"], b["hidden_size"]
    ratios = list(b["compress_ratios"])
    n_mtp = b.get("num_nextn_predict_layers", 0)
    ratios += [0] * (n + n_mtp - len(ratios))
    hc = b.get("hc_mult", 1)
    inter = b["moe_intermediate_size"]
    # routed experts: `expert_dtype: fp4` = FP4 e2m1 with ue8m0 scales per 32 (= MXFP4)
    expert_fmt = {"fp4": "mxfp4", "fp8": "fp8_block"}.get(b.get("expert_dtype", ""))
    layers = []
    for i in range(n + n_mtp):
        mtp = i >= n
        attention = _v4_attention(b, i, ratios[i])
        if mtp:
            attention = _with_extra(attention, (b.lin(i, "e_proj", hidden, hidden),
                                                b.lin(i, "h_proj", hidden, hidden)))
        mlp = moe_mlp(b, i, hidden, experts=b["n_routed_experts"], top_k=b["num_experts_per_tok"],
                      inter=inter, shared_inter=b.get("n_shared_experts", 0) * inter, prefix="ffn",
                      shared_names=("w1", "w3", "w2"), hash_routed=i < b.get("num_hash_layers", 0))
        if expert_fmt and mlp.experts is not None:
            quantized = b.quant.per_module and b.experts_dtype(i, "ffn.experts") != b.quant.quantized
            if not quantized:  # a MIXED_PRECISION export names its own expert format
                mlp = replace(mlp, experts=replace(mlp.experts, dtype=expert_fmt))
        # mHC mixers (hc_fn per attn and ffn: (2+hc)*hc outputs from hc*hidden inputs) and norms
        mix = 2 * (2 + hc) * hc * hc * hidden if hc > 1 else 0
        layers.append(Layer(i, attention, mlp, mtp=mtp, extra_params=norms(hidden) + mix))
    return b.parts(layers, default_kv_dtype="fp8", hyper_connections=int(hc),
                   embedding_names=("embed", "head"))
