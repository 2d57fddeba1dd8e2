"""Softmax-attention stacks whose layers differ in window or head shape: Llama 4 (chunked local
attention + global NoPE layers, interleaved MoE), Gemma 4 (sliding + global layers with their own
head shape, K=V global layers, dense MLP beside the MoE block), Step-3.7 Flash and MiMo-V2-Flash
(sliding / full layer patterns with MoE)."""

from __future__ import annotations

from dataclasses import replace

from model.specs.families.common import Builder, Parts, dense_mlp, gqa, layer_types, moe_mlp, norms
from model.specs.layers import Layer, Mlp


def build_llama4(b: Builder) -> Parts:
    """Llama 4 (HF Llama4TextConfig defaults): layer i is global NoPE when (i+1) % 4 == 0, else
    chunked local attention over attention_chunk_size tokens (cached as a window of that size, an
    upper bound: a chunk needs only L mod chunk tokens); MoE every interleave_moe_layer_step-th
    layer with one shared expert, dense layers at intermediate_size_mlp."""
    b.need("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
           "num_local_experts", "num_experts_per_tok", "intermediate_size",
           "intermediate_size_mlp", "vocab_size")
    n, hidden = b["num_hidden_layers"], b["hidden_size"]
    heads, kv = b["num_attention_heads"], b["num_key_value_heads"]
    hd = b.get("head_dim") or hidden // heads
    rope = b.get("no_rope_layers") or [int((i + 1) % 4 != 0) for i in range(n)]
    step = int(b.get("interleave_moe_layer_step") or 1)
    moe_layers = set(b.get("moe_layers") or range(step - 1, n, step))
    chunk = b.get("attention_chunk_size")
    layers = []
    for i in range(n):
        window = chunk if rope[i] and chunk else None
        attention = gqa(b, i, heads, kv, hd, hidden, kind="swa" if window else "gqa",
                        window=window)
        if i in moe_layers:
            mlp = moe_mlp(b, i, hidden, experts=b["num_local_experts"],
                          top_k=b["num_experts_per_tok"], inter=b["intermediate_size"],
                          prefix="feed_forward", router="router",
                          shared_inter=b["intermediate_size"], shared_name="shared_expert")
        else:
            mlp = dense_mlp(b, i, hidden, b["intermediate_size_mlp"], prefix="feed_forward")
        layers.append(Layer(i, attention, mlp, extra_params=norms(hidden)))
    return b.parts(layers)


def build_gemma4(b: Builder) -> Parts:
    """Gemma 4: sliding layers (num_key_value_heads x head_dim, window sliding_window) and full
    layers (num_global_key_value_heads x global_head_dim). attention_k_eq_v: full layers reuse
    the key as value (no v_proj; sliding layers keep a real V). MoE layers run
    the dense MLP and the routed experts side by side (enable_moe_block)."""
    b.need("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
           "head_dim", "intermediate_size", "vocab_size", "layer_types")
    n, hidden = b["num_hidden_layers"], b["hidden_size"]
    types = layer_types(b, n)
    heads = b["num_attention_heads"]
    k_eq_v = bool(b.get("attention_k_eq_v"))
    layers = []
    for i in range(n):
        if types[i] == "sliding_attention":
            attention = gqa(b, i, heads, b["num_key_value_heads"], b["head_dim"], hidden,
                            kind="swa", window=b["sliding_window"])
        else:
            kv = b.get("num_global_key_value_heads") or b["num_key_value_heads"]
            hd = b.get("global_head_dim") or b["head_dim"]
            attention = gqa(b, i, heads, kv, hd, hidden)
            if k_eq_v:
                # no v_proj; engines still page K and V (V = K) through the standard attention
                # cache, so the KV entry keeps both halves
                q, k, _v, o = attention.projections[:4]
                attention = replace(attention, projections=(q, k, o))
        dense = dense_mlp(b, i, hidden, b["intermediate_size"])
        if b.get("enable_moe_block") and b.get("num_experts"):
            moe = moe_mlp(b, i, hidden, experts=b["num_experts"], top_k=b["top_k_experts"],
                          inter=b["moe_intermediate_size"], router="router", prefix="")
            mlp = Mlp("moe", dense.projections + moe.projections, moe.experts)
        else:
            mlp = dense
        layers.append(Layer(i, attention, mlp, extra_params=norms(hidden, 4)))
    return b.parts(layers, tie_default=True)


def build_step3p7(b: Builder) -> Parts:
    """Step-3.7 Flash: layer_types full / sliding (sliding_window), first_k_dense_replace dense
    layers, then routed experts + share_expert_dim shared expert; MTP layers."""
    b.need("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
           "head_dim", "intermediate_size", "num_experts", "num_experts_per_tok",
           "moe_intermediate_size", "vocab_size", "layer_types")
    n, hidden = b["num_hidden_layers"], b["hidden_size"]
    types = layer_types(b, n)
    n_mtp = int(b.get("num_nextn_predict_layers") or 0)
    layers = []
    for i in range(n + n_mtp):
        sliding = i < n and types[i] == "sliding_attention"
        attention = gqa(b, i, b["num_attention_heads"], b["num_key_value_heads"], b["head_dim"],
                        hidden, kind="swa" if sliding else "gqa",
                        window=b["sliding_window"] if sliding else None)
        if i < b.get("first_k_dense_replace", 0):
            mlp = dense_mlp(b, i, hidden, b["intermediate_size"])
        else:
            shared = int(b.get("share_expert_dim") or 0) * int(b.get("n_shared_experts") or 1)
            mlp = moe_mlp(b, i, hidden, experts=b["num_experts"], top_k=b["num_experts_per_tok"],
                          inter=b["moe_intermediate_size"], shared_inter=shared,
                          shared_name="share_expert")
        layers.append(Layer(i, attention, mlp, mtp=i >= n, extra_params=norms(hidden)))
    return b.parts(layers)


def build_mimo_v2(b: Builder) -> Parts:
    """MiMo-V2-Flash: hybrid_layer_pattern 0 = full attention (num_key_value_heads), 1 = sliding
    (swa_* head shapes, window sliding_window, learned sinks); moe_layer_freq per layer."""
    b.need("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
           "head_dim", "hybrid_layer_pattern", "moe_layer_freq", "n_routed_experts",
           "num_experts_per_tok", "moe_intermediate_size", "intermediate_size", "vocab_size")
    n, hidden = b["num_hidden_layers"], b["hidden_size"]
    pattern, moe_freq = b["hybrid_layer_pattern"], b["moe_layer_freq"]
    layers = []
    for i in range(n):
        if pattern[i]:
            attention = gqa(b, i, b.get("swa_num_attention_heads", b["num_attention_heads"]),
                            b.get("swa_num_key_value_heads", b["num_key_value_heads"]),
                            b.get("swa_head_dim", b["head_dim"]), hidden, kind="swa",
                            window=b.get("sliding_window_size") or b["sliding_window"],
                            v_head_dim=b.get("swa_v_head_dim") or b.get("v_head_dim"))
        else:
            attention = gqa(b, i, b["num_attention_heads"], b["num_key_value_heads"],
                            b["head_dim"], hidden, v_head_dim=b.get("v_head_dim"))
        if moe_freq[i]:
            shared = int(b.get("n_shared_experts") or 0) * b["moe_intermediate_size"]
            mlp = moe_mlp(b, i, hidden, experts=b["n_routed_experts"],
                          top_k=b["num_experts_per_tok"], inter=b["moe_intermediate_size"],
                          shared_inter=shared)
        else:
            mlp = dense_mlp(b, i, hidden, b["intermediate_size"])
        layers.append(Layer(i, attention, mlp, extra_params=norms(hidden)))
    return b.parts(layers)

