"""Hybrid stacks that mix softmax attention with linear / recurrent layers or sparse selection:
Kimi Linear and Kimi K3 (KDA + gated MLA), MiniMax M1 (lightning + softmax), MiniMax M3 (GQA +
MSA sparse attention with index keys), Qwen3-Next / Qwen3.5 / 3.6 (Gated DeltaNet + gated
attention), Nemotron-H / Nemotron 3 (Mamba-2 + attention, MoE with latent projections).

Recurrent state per layer (elements, one sequence), from each model's recurrence:
- KDA (Kimi Linear report, S_t in R^{dk x dv} per head): heads * dk * dv; short conv on q, k, v
  keeps (kernel - 1) columns of 3 * heads * dk.
- lightning attention (MiniMax M1, linear attention KV state per head): heads * hd * hd.
- Gated DeltaNet (Qwen3-Next): value heads * dk * dv; conv over q, k, v channels
  (2 * nk * dk + nv * dv) x (kernel - 1).
- Mamba-2 (Nemotron-H): heads * head_dim * ssm_state_size; conv over
  d_inner + 2 * n_groups * state x (kernel - 1).
"""

from __future__ import annotations

from dataclasses import replace

from model.specs.errors import SpecError
from model.specs.families.common import Builder, Parts, dense_mlp, gqa, layer_types, moe_mlp, norms
from model.specs.layers import Attention, Indexer, Layer, Linear, Mlp


def _linear_attention(projections: list[Linear], heads: int, dk: int, dv: int, state: int,
                      conv: int) -> Attention:
    return Attention(kind="linear", num_heads=heads, num_kv_heads=heads, head_dim=dk,
                     v_head_dim=dv, projections=tuple(projections), state_elements=int(state),
                     conv_elements=int(conv))


# --- Kimi Linear / Kimi K3 ---------------------------------------------------------------------

def _kda(b: Builder, i: int, hidden: int, lac: dict) -> Attention:
    """Kimi Delta Attention (modeling_kimi_linear.py KimiDeltaAttention): q/k/v projections,
    forget gate f (low rank through head_dim, or full rank when use_full_rank_gate), beta b,
    output gate g (low rank), o_proj; short convs on q, k, v."""
    heads, hd = lac["num_heads"], lac["head_dim"]
    kernel = lac.get("short_conv_kernel_size", 4)
    width = heads * hd
    p = "self_attn"
    proj = [b.lin(i, f"{p}.q_proj", hidden, width), b.lin(i, f"{p}.k_proj", hidden, width),
            b.lin(i, f"{p}.v_proj", hidden, width)]
    if lac.get("use_full_rank_gate"):
        proj.append(b.lin(i, f"{p}.f_proj", hidden, width))
    else:
        proj += [b.lin(i, f"{p}.f_a_proj", hidden, hd), b.lin(i, f"{p}.f_b_proj", hd, width)]
    proj += [b.lin(i, f"{p}.b_proj", hidden, heads),
             b.lin(i, f"{p}.g_a_proj", hidden, hd), b.lin(i, f"{p}.g_b_proj", hd, width),
             b.lin(i, f"{p}.o_proj", width, hidden)]
    return _linear_attention(proj, heads, hd, hd, heads * hd * hd,
                             3 * width * (kernel - 1))


def _kimi_mla(b: Builder, i: int, hidden: int) -> Attention:
    heads = b["num_attention_heads"]
    nope, rope, v_dim = b["qk_nope_head_dim"], b["qk_rope_head_dim"], b["v_head_dim"]
    kv_rank, q_rank = b["kv_lora_rank"], b.get("q_lora_rank")
    p = "self_attn"
    proj = []
    if q_rank:
        proj += [b.lin(i, f"{p}.q_a_proj", hidden, q_rank),
                 b.lin(i, f"{p}.q_b_proj", q_rank, heads * (nope + rope))]
    else:
        proj.append(b.lin(i, f"{p}.q_proj", hidden, heads * (nope + rope)))
    proj += [b.lin(i, f"{p}.kv_a_proj_with_mqa", hidden, kv_rank + rope),
             b.lin(i, f"{p}.kv_b_proj", kv_rank, heads * (nope + v_dim)),
             b.lin(i, f"{p}.o_proj", heads * v_dim, hidden)]
    if b.get("mla_use_output_gate"):
        proj.append(b.lin(i, f"{p}.g_proj", hidden, heads * v_dim))
    # NoPE checkpoints still produce and cache the 64 rope dims (standard MLA kernels need them)
    return Attention(kind="mla", num_heads=heads, num_kv_heads=1, head_dim=nope + rope,
                     v_head_dim=v_dim, projections=tuple(proj), kv_lora_rank=kv_rank,
                     qk_rope_head_dim=rope)


def build_kimi_linear(b: Builder) -> Parts:
    b.need("hidden_size", "num_hidden_layers", "num_attention_heads", "linear_attn_config",
           "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "vocab_size",
           "num_experts", "num_experts_per_token", "moe_intermediate_size", "intermediate_size")
    n, hidden = b["num_hidden_layers"], b["hidden_size"]
    lac = b["linear_attn_config"]
    kda = {int(x) - 1 for x in lac.get("kda_layers") or []}  # config ids are 1-based
    full = {int(x) - 1 for x in lac.get("full_attn_layers") or []}
    if kda | full != set(range(n)) or kda & full:
        raise SpecError(b.path, "linear_attn_config",
                        "kda_layers and full_attn_layers must partition layers 1..num_hidden_layers")
    latent = b.get("routed_expert_hidden_size")
    first_dense = b.get("first_k_dense_replace", 0)
    layers = []
    for i in range(n):
        attention = _kda(b, i, hidden, lac) if i in kda else _kimi_mla(b, i, hidden)
        if i < first_dense:
            mlp = dense_mlp(b, i, hidden, b["intermediate_size"])
        else:
            inter = b["moe_intermediate_size"]
            extra = ()
            if latent:
                # Kimi K3 latent MoE: routed experts run at routed_expert_hidden_size; down/up
                # projections around them stay high precision (K3 report, quantization section)
                extra = (b.lin(i, "mlp.latent_down_proj", hidden, latent, dtype=b.quant.unquantized),
                         b.lin(i, "mlp.latent_up_proj", latent, hidden, dtype=b.quant.unquantized))
            mlp = moe_mlp(b, i, hidden, experts=b["num_experts"], top_k=b["num_experts_per_token"],
                          inter=inter, shared_inter=b.get("num_shared_experts", 0) * inter,
                          expert_hidden=latent, extra=extra)
        layers.append(Layer(i, attention, mlp, extra_params=norms(hidden)))
    max_ctx = b.get("max_position_embeddings") or b.get("model_max_length") or 0
    return b.parts(layers, max_context=max_ctx)


# --- MiniMax M1 (lightning) and M3 (MSA) -------------------------------------------------------

def build_minimax_m1(b: Builder) -> Parts:
    b.need("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
           "attn_type_list", "num_local_experts", "num_experts_per_tok", "intermediate_size",
           "vocab_size")
    n, hidden = b["num_hidden_layers"], b["hidden_size"]
    heads, kv, hd = b["num_attention_heads"], b["num_key_value_heads"], b.get(
        "head_dim", hidden // b["num_attention_heads"])
    types = b["attn_type_list"]
    layers = []
    for i in range(n):
        if types[i] == 1:
            attention = gqa(b, i, heads, kv, hd, hidden)
        else:
            # lightning attention (modeling_minimax_m1.py): fused qkv, output gate, out_proj
            width = heads * hd
            proj = [b.lin(i, "self_attn.qkv_proj", hidden, 3 * width),
                    b.lin(i, "self_attn.output_gate", hidden, width),
                    b.lin(i, "self_attn.out_proj", width, hidden)]
            attention = _linear_attention(proj, heads, hd, hd, heads * hd * hd, 0)
        mlp = moe_mlp(b, i, hidden, experts=b["num_local_experts"],
                      top_k=b["num_experts_per_tok"], inter=b["intermediate_size"],
                      prefix="block_sparse_moe",
                      shared_inter=int(b.get("shared_intermediate_size") or 0))
        layers.append(Layer(i, attention, mlp, extra_params=norms(hidden)))
    return b.parts(layers)


def build_minimax_m3(b: Builder) -> Parts:
    b.need("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
           "head_dim", "num_local_experts", "num_experts_per_tok", "vocab_size")
    if b.get("moe_intermediate_size") is None:  # NVIDIA's VL export names it intermediate_size
        b.need("intermediate_size")
        b = replace(b, cfg={**b.cfg, "moe_intermediate_size": b["intermediate_size"]})
    n, hidden = b["num_hidden_layers"], b["hidden_size"]
    heads, kv, hd = b["num_attention_heads"], b["num_key_value_heads"], b["head_dim"]
    sac = b.get("sparse_attention_config") or {}
    sparse = list(sac.get("sparse_attention_freq") or [0] * n) if sac.get(
        "use_sparse_attention", bool(sac)) else [0] * n
    moe_freq = b.get("moe_layer_freq")
    first_dense = b.get("first_k_dense_replace", 0)
    n_mtp = int(b.get("num_mtp_modules") or 0) * int(b.get("num_nextn_predict_layers") or 1) \
        if b.get("num_mtp_modules") else int(b.get("num_nextn_predict_layers") or 0)
    layers = []
    for i in range(n + n_mtp):
        main = min(i, n - 1)
        indexer, extra = None, ()
        if i < n and sparse[main]:
            # MSA (TensorRT-LLM MiniMaxM3SparseAttentionConfig): index branch with per-head q
            # and one replicated k of sparse_index_dim; scores 128-token blocks, keeps top-k
            ih, idim = sac["sparse_num_index_heads"], sac["sparse_index_dim"]
            indexer = Indexer(ih, idim, sac["sparse_topk_blocks"],
                              block_size=sac.get("sparse_block_size", 128), cache_dtype="bf16")
            extra = (b.lin(i, "self_attn.index_q_proj", hidden, ih * idim),
                     b.lin(i, "self_attn.index_k_proj", hidden, idim))
        attention = gqa(b, i, heads, kv, hd, hidden, kind="msa" if indexer else "gqa",
                        indexer=indexer, extra=extra)
        is_moe = (moe_freq[main] if isinstance(moe_freq, list) else i >= first_dense) or i >= n
        if is_moe:
            mlp = moe_mlp(b, i, hidden, experts=b["num_local_experts"],
                          top_k=b["num_experts_per_tok"], inter=b["moe_intermediate_size"],
                          prefix="block_sparse_moe",
                          shared_inter=int(b.get("shared_intermediate_size") or 0)
                          * int(b.get("n_shared_experts") or 1)
                          if b.get("shared_intermediate_size") else 0)
        else:
            mlp = dense_mlp(b, i, hidden, b.get("dense_intermediate_size")
                            or b["intermediate_size"])
        layers.append(Layer(i, attention, mlp, mtp=i >= n, extra_params=norms(hidden)))
    return b.parts(layers)


# --- Qwen3-Next / Qwen3.5 / Qwen3.6 (Gated DeltaNet) -------------------------------------------

def _gdn(b: Builder, i: int, hidden: int) -> Attention:
    nk, nv = b["linear_num_key_heads"], b["linear_num_value_heads"]
    dk, dv = b["linear_key_head_dim"], b["linear_value_head_dim"]
    kernel = b.get("linear_conv_kernel_dim", 4)
    qkv = 2 * nk * dk + nv * dv
    p = "linear_attn"
    proj = [b.lin(i, f"{p}.in_proj_qkv", hidden, qkv), b.lin(i, f"{p}.in_proj_z", hidden, nv * dv),
            b.lin(i, f"{p}.in_proj_b", hidden, nv), b.lin(i, f"{p}.in_proj_a", hidden, nv),
            b.lin(i, f"{p}.out_proj", nv * dv, hidden)]
    return _linear_attention(proj, nv, dk, dv, nv * dk * dv, qkv * (kernel - 1))


def build_qwen_next(b: Builder) -> Parts:
    b.need("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
           "head_dim", "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
           "linear_value_head_dim", "vocab_size")
    n, hidden = b["num_hidden_layers"], b["hidden_size"]
    types = layer_types(b, n)
    interval = b.get("full_attention_interval", 4)
    if types is None:
        types = ["full_attention" if (i + 1) % interval == 0 else "linear_attention"
                 for i in range(n)]
    heads, kv, hd = b["num_attention_heads"], b["num_key_value_heads"], b["head_dim"]
    moe = b.get("num_experts")
    n_mtp = int(b.get("mtp_num_hidden_layers") or b.get("num_nextn_predict_layers") or 0)
    gate = b.get("attn_output_gate", True)
    layers = []
    for i in range(n + n_mtp):
        if i < n and types[i] == "linear_attention":
            attention = _gdn(b, i, hidden)
        else:
            # gated attention: q_proj also emits the per-head output gate (attn_output_gate)
            attention = gqa(b, i, heads, kv, hd, hidden)
            if gate:
                q = attention.projections[0]
                attention = replace(attention, projections=(replace(
                    q, out_features=2 * q.out_features),) + attention.projections[1:])
        if moe:
            shared = int(b.get("shared_expert_intermediate_size") or 0)
            extra = (b.lin(i, "mlp.shared_expert_gate", hidden, 1, quantizable=False),) \
                if shared else ()
            mlp = moe_mlp(b, i, hidden, experts=moe, top_k=b["num_experts_per_tok"],
                          inter=b["moe_intermediate_size"], shared_inter=shared,
                          shared_name="shared_expert", extra=extra)
        else:
            mlp = dense_mlp(b, i, hidden, b["intermediate_size"])
        layers.append(Layer(i, attention, mlp, mtp=i >= n, extra_params=norms(hidden)))
    return b.parts(layers)


# --- Nemotron-H / Nemotron 3 (Mamba-2) ---------------------------------------------------------

_PATTERN = {"M": "mamba", "*": "attention", "-": "mlp", "E": "moe"}


def _mamba(b: Builder, i: int, hidden: int) -> Attention:
    heads, hd = b["mamba_num_heads"], b["mamba_head_dim"]
    groups, state = b.get("n_groups", 1), b["ssm_state_size"]
    kernel = b.get("conv_kernel", 4)
    inner = heads * hd
    conv = inner + 2 * groups * state
    proj = [b.lin(i, "mixer.in_proj", hidden, 2 * inner + 2 * groups * state + heads),
            b.lin(i, "mixer.out_proj", inner, hidden)]
    return _linear_attention(proj, heads, state, hd, heads * hd * state, conv * (kernel - 1))


def _nemotron_ffn(b: Builder, i: int, hidden: int, kind: str) -> Mlp:
    if kind == "mlp":
        return dense_mlp(b, i, hidden, b["intermediate_size"], prefix="mixer", gated=False)
    latent = b.get("moe_latent_size")
    extra = ()
    if latent:
        extra = (b.lin(i, "mixer.fc1_latent_proj", hidden, latent),
                 b.lin(i, "mixer.fc2_latent_proj", latent, hidden))
    return moe_mlp(b, i, hidden, experts=b["n_routed_experts"], top_k=b["num_experts_per_tok"],
                   inter=b["moe_intermediate_size"], prefix="mixer",
                   shared_inter=int(b.get("moe_shared_expert_intermediate_size") or 0),
                   gated=False, expert_hidden=latent, extra=extra)


def build_nemotron_h(b: Builder) -> Parts:
    """Nemotron-H blocks are single mixers (M, *, -, E); each mixer and the FFN block after it
    become one Layer (a mixer with no FFN after it gets an Mlp of kind none)."""
    b.need("hidden_size", "num_attention_heads", "num_key_value_heads", "mamba_num_heads",
           "mamba_head_dim", "ssm_state_size", "vocab_size")
    hidden = b["hidden_size"]
    blocks = b.get("layers_block_type") or [_PATTERN.get(c, c) for c in
                                            b.get("hybrid_override_pattern", "")]
    if not blocks:
        b.need("hybrid_override_pattern")
    mtp_blocks = b.get("mtp_layers_block_type") or [
        _PATTERN.get(c, c) for c in b.get("mtp_hybrid_override_pattern", "")]
    mtp_blocks = list(mtp_blocks) * int(b.get("num_nextn_predict_layers") or 0)
    heads, kv = b["num_attention_heads"], b["num_key_value_heads"]
    hd = b.get("head_dim") or hidden // heads
    layers: list[Layer] = []
    pending: tuple[Attention, bool] | None = None

    def flush(mlp: Mlp) -> None:
        nonlocal pending
        attention, mtp = pending
        layers.append(Layer(len(layers), attention, mlp, mtp=mtp,
                            extra_params=norms(hidden, 2 if mlp.kind != "none" else 1)))
        pending = None

    n_main = len(blocks)
    for j, kind in enumerate(list(blocks) + mtp_blocks):
        mtp = j >= n_main
        if kind not in ("mamba", "attention", "mlp", "moe"):
            raise SpecError(b.path, "layers_block_type",
                            f"block {kind!r}; allowed: mamba, attention, mlp, moe (M * - E)")
        if kind in ("mamba", "attention"):
            if pending:
                flush(Mlp("none", ()))
            mixer = _mamba(b, j, hidden) if kind == "mamba" else gqa(
                b, j, heads, kv, hd, hidden, prefix="mixer")
            pending = (mixer, mtp)
        else:
            if pending is None:
                raise SpecError(b.path, "hybrid_override_pattern",
                                f"FFN block {j} follows no mixer; expected M or * before - / E")
            flush(_nemotron_ffn(b, j, hidden, kind))
    if pending:
        flush(Mlp("none", ()))
    return b.parts(layers)

