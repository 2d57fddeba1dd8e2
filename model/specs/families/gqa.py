"""Softmax-attention (MHA / GQA / MQA, optional sliding windows) decoder stacks with a dense or
MoE MLP: Llama 3.x, Qwen3 / Qwen3-VL, MiMo, Mixtral, Qwen3-MoE, MiniMax M2, gpt-oss."""

from __future__ import annotations

from model.specs.errors import SpecError
from model.specs.families.common import Builder, Parts, dense_mlp, gqa, layer_types, moe_mlp, norms
from model.specs.layers import Layer

BASE_KEYS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size")


def _head_dim(b: Builder) -> int:
    if b.get("head_dim"):
        return int(b["head_dim"])
    hidden, heads = b["hidden_size"], b["num_attention_heads"]
    if hidden % heads:
        raise SpecError(b.path, "hidden_size", f"{hidden} is not a whole number of "
                        f"num_attention_heads {heads} heads and no head_dim is given; allowed: a "
                        f"multiple of {heads}, or a head_dim")
    return hidden // heads


def _window(b: Builder, i: int, n: int) -> int | None:
    """Sliding window of layer i, or None for full attention."""
    types = layer_types(b, n)
    window = b.get("sliding_window")
    if types is not None:
        return window if types[i] == "sliding_attention" else None
    if window and b.get("use_sliding_window", True) is not False:
        # Qwen2-style `max_window_layers`: layers at or above it use the window
        limit = b.get("max_window_layers")
        if limit is None or i >= limit:
            return int(window) if window < b.get("max_position_embeddings", 1 << 62) else None
    return None


def build_dense(b: Builder) -> Parts:
    """llama / qwen3 / qwen3_vl_text / mistral / mimo: every layer attention + dense SwiGLU."""
    b.need(*BASE_KEYS, "intermediate_size")
    return _build(b, moe=None)


def _moe_spec(b: Builder) -> dict:
    experts = b.get("num_local_experts") or b.get("num_experts")
    top_k = b.get("num_experts_per_tok") or b.get("experts_per_token")
    if experts is None or top_k is None:
        b.need("num_experts", "num_experts_per_tok")
    return {"experts": experts, "top_k": top_k,
            "inter": b.get("moe_intermediate_size") or b["intermediate_size"]}


def build_moe(b: Builder) -> Parts:
    """mixtral / qwen3_moe / qwen3_vl_moe_text / minimax_m2 / gpt_oss: routed experts per layer."""
    b.need(*BASE_KEYS)
    return _build(b, moe=_moe_spec(b))


def _build(b: Builder, moe: dict | None) -> Parts:
    n, hidden = b["num_hidden_layers"], b["hidden_size"]
    if any(t != 1 for t in b.get("attn_type_list") or []):
        raise SpecError(b.path, "attn_type_list",
                        f"non-softmax layers in a {b.family} config; this loader handles only "
                        "1 (softmax); MiniMax M1-style lightning layers need model_type minimax_m1")
    heads, kv_heads = b["num_attention_heads"], b.get("num_key_value_heads") or b[
        "num_attention_heads"]
    hd = _head_dim(b)
    family = b.family
    # module naming of the checkpoints (for quantization ignore lists)
    mlp_prefix = "block_sparse_moe" if family in ("mixtral", "minimax_m2") else "mlp"
    router = "router" if family == "gpt_oss" else "gate"
    only_dense = set(b.get("mlp_only_layers") or [])
    step = int(b.get("decoder_sparse_step") or 1)
    n_mtp = _mtp_layers(b)
    layers = []
    for i in range(n + n_mtp):
        window = _window(b, min(i, n - 1), n)
        attention = gqa(b, i, heads, kv_heads, hd, hidden, kind="swa" if window else "gqa",
                        window=window)
        if moe and i not in only_dense and (i + 1) % step == 0:
            mlp = moe_mlp(b, i, hidden, experts=moe["experts"], top_k=moe["top_k"],
                          inter=moe["inter"], prefix=mlp_prefix, router=router,
                          shared_inter=int(b.get("shared_intermediate_size") or 0))
        else:
            mlp = dense_mlp(b, i, hidden, b["intermediate_size"])
        extra = norms(hidden)
        if b.get("attention_bias"):
            extra += heads * hd + 2 * kv_heads * hd + hidden
        if family == "gpt_oss":
            extra += heads  # attention sinks: one learned logit per head
        layers.append(Layer(i, attention, mlp, mtp=i >= n, extra_params=extra))
    return b.parts(layers)


def _mtp_layers(b: Builder) -> int:
    if b.get("num_nextn_predict_layers"):
        return int(b["num_nextn_predict_layers"])
    if b.get("use_mtp"):  # MiniMax M2: num_mtp_modules x mtp_transformer_layers
        return int(b.get("num_mtp_modules", 1)) * int(b.get("mtp_transformer_layers", 1))
    return 0
