"""Per-op counts for one engine step: FLOPs, HBM bytes and the entries attention touches.

Each formula below is one Python expression over its named arguments: numpy evaluates it
directly (vectorized sweeps, no symbolic algebra on the hot path), and `expression(name)` hands
the same function sympy symbols to get the symbolic form that `latex(name)` renders for notebooks.
Sympy is imported only there, so the command line starts without it.

Counts are for the whole replica (no parallel sharding; `model.perf.parallel` divides them). A step is
`prefill_tokens` new prompt tokens spread over `prefill_seqs` sequences attending a mean context
`prefill_context` (cached + new), plus `decode_seqs` sequences each adding one token at mean context
`decode_context`. Activations are bf16 (2 bytes); the KV entry dtype is the caller's.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from functools import cache, lru_cache

import numpy as np

from model.specs.dtypes import dtype
from model.specs.layers import Architecture, Attention, Experts, Layer, Linear

ACT_BYTES = 2.0  # bf16 activations between kernels
STATE_BYTES = 4.0  # linear-attention recurrent state is kept in fp32 (KDA / GDN kernels)

#: name -> (formula, meaning). Everything else in this module evaluates these.
FORMULAS = {
    # generic projection y = W x for T tokens
    "linear_flops": (lambda T, d_in, d_out, copies: 2 * T * d_in * d_out * copies,
                     "2 T d_in d_out per copy"),
    "linear_weight_bytes": (lambda d_in, d_out, copies, w_bits: d_in * d_out * copies * w_bits / 8,
                            "weights read once per step"),
    "linear_act_bytes": (lambda T, d_in, d_out, copies: 2 * T * (d_in + d_out * copies),
                         "read input, write output (bf16)"),
    # softmax attention core: T queries each attend S entries with h heads
    "attn_flops": (lambda T, h, d_qk, d_v, S: 2 * T * h * (d_qk + d_v) * S, "QK^T and PV"),
    "attn_kv_read_bytes": (lambda seqs, S, e_bytes: seqs * S * e_bytes,
                           "each sequence's attended entries read once"),
    "attn_kv_write_bytes": (lambda T, e_bytes: T * e_bytes, "one new entry per new token"),
    "attn_act_bytes": (lambda T, h, d_qk, d_v: 2 * T * h * (d_qk + d_v), "read q, write o (bf16)"),
    # MLA without weight absorption: up-project cached latents to per-head K and V
    "mla_kv_up_flops": (lambda c, r, h, d_qk, d_v: 2 * c * r * h * (d_qk + d_v),
                        "latent -> K_nope, V per cached token"),
    # indexer (DSA / CSA lightning indexer, MSA block scorer): score `units` cached units
    "indexer_flops": (lambda T, i_heads, i_dim, units: 2 * T * i_heads * i_dim * units,
                      "q_idx . k_idx over all units"),
    "indexer_read_bytes": (lambda seqs, units, i_dim, e_bytes: seqs * units * i_dim * e_bytes,
                           "index keys read once per sequence"),
    # linear attention (delta rule): S k, state update, S^T q per token; state read+written per seq
    "linear_state_flops": (lambda T, n_state: 6 * T * n_state,
                           "3 state-sized matvec/outer products per token"),
    "linear_state_bytes": (lambda seqs, n_state: 2 * seqs * n_state * STATE_BYTES,
                           "fp32 state read and written"),
    # routed experts: T tokens, top-k of E; weights of the distinct experts touched are read
    "experts_touched": (lambda E, k, T: E * (1 - (1 - k / E) ** T),
                        "expected distinct experts a batch touches"),
    "moe_flops": (lambda T, k, n_mat, d_model, d_ff: 2 * T * k * n_mat * d_model * d_ff,
                  "k experts per token, n_mat matrices"),
    "moe_act_bytes": (lambda T, k, d_model, d_ff, n_mat: 2 * T * k * (2 * d_model
                                                                   + (n_mat - 1) * d_ff),
                      "dispatch in, out (bf16)"),
    # RMSNorm / residual adds: elementwise, memory bound
    "norm_flops": (lambda T, d_model: 4 * T * d_model, "square, sum, scale, multiply"),
    "norm_bytes": (lambda T, d_model: 2 * 2 * T * d_model, "read and write bf16"),
}


def compiled(name: str):
    """The numpy function of formula `name`, positional args in the order of `arguments(name)`."""
    return FORMULAS[name][0]


def arguments(name: str) -> tuple[str, ...]:
    return tuple(inspect.signature(FORMULAS[name][0]).parameters)


@cache
def expression(name: str):
    """Formula `name` as a sympy expression over positive symbols named as its arguments."""
    import sympy as sp  # only notebooks and tests render formulas

    return FORMULAS[name][0](*sp.symbols(arguments(name), positive=True))


def latex(name: str) -> str:
    """LaTeX of one formula, for notebooks."""
    import sympy as sp

    return sp.latex(expression(name))


def render() -> list[dict[str, str]]:
    """Every formula as {name, latex, meaning}: the table notebooks show."""
    return [{"name": n, "latex": latex(n), "meaning": m} for n, (_, m) in FORMULAS.items()]


def f(name: str, *args):
    return FORMULAS[name][0](*args)


# ---- ops ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Op:
    """One kernel-sized piece of a step, counted for the whole replica.

    `kind` decides which kernel model times it: linear | attention | indexer | linear_attention |
    moe | norm | embedding. `shape` carries what the kernel model needs (GEMM n/k, heads, ...).
    """

    name: str
    kind: str
    count: int  # identical layers this op stands for
    flops: np.ndarray
    weight_bytes: np.ndarray
    kv_read_bytes: np.ndarray
    kv_write_bytes: np.ndarray
    act_bytes: np.ndarray
    shape: dict = field(default_factory=dict, compare=False)

    @property
    def hbm_bytes(self):
        return self.weight_bytes + self.kv_read_bytes + self.kv_write_bytes + self.act_bytes


@dataclass(frozen=True)
class Step:
    """A batch composition (numpy-broadcast arrays)."""

    prefill_tokens: np.ndarray | float = 0.0
    prefill_context: np.ndarray | float = 0.0
    decode_seqs: np.ndarray | float = 0.0
    decode_context: np.ndarray | float = 0.0
    prefill_seqs: np.ndarray | float = 1.0

    @property
    def tokens(self):
        return np.asarray(self.prefill_tokens, float) + np.asarray(self.decode_seqs, float)

    @property
    def logit_seqs(self):
        """Sequences whose last position needs logits this step."""
        pre = np.where(np.asarray(self.prefill_tokens) > 0, self.prefill_seqs, 0.0)
        return np.asarray(self.decode_seqs, float) + pre


def linear_op(lin: Linear, tokens, count: int = 1, prefix: str = "") -> Op:
    bits = dtype(lin.dtype).streamed_bytes * 8.0  # what each call reads, not what HBM stores
    z = np.zeros_like(np.asarray(tokens, float))
    return Op(f"{prefix}{lin.name}", "linear", count,
              flops=f("linear_flops", tokens, lin.in_features, lin.out_features, lin.count),
              weight_bytes=z + f("linear_weight_bytes", lin.in_features, lin.out_features,
                                 lin.count, bits),
              kv_read_bytes=z, kv_write_bytes=z,
              act_bytes=f("linear_act_bytes", tokens, lin.in_features, lin.out_features, lin.count),
              shape={"n": lin.out_features * lin.count, "k": lin.in_features, "dtype": lin.dtype,
                     "linear": lin})


def entry_elements(att: Attention) -> float:
    """Elements of one cached attention entry (one token or one compressed entry, one layer)."""
    if att.kv_entry_dims:
        return float(att.kv_entry_dims)
    if att.kind in ("mla", "dsa") and att.kv_lora_rank:
        return float(att.kv_lora_rank + (att.qk_rope_head_dim or 0))
    return float(att.num_kv_heads * (att.head_dim + att.v_head_dim))


def attended_entries(att: Attention, context_tokens):
    """Entries each query reads from the cache at `context_tokens` (per attention kind)."""
    ctx = np.asarray(context_tokens, float)
    window = float(att.window) if att.window else np.inf
    ratio = float(att.compress_ratio or 1)
    top_k = float(att.indexer.top_k) if att.indexer else np.inf
    if att.kind == "gqa" or att.kind == "mla":
        return ctx
    if att.kind == "swa":
        return np.minimum(ctx, window)
    if att.kind == "dsa":
        return np.minimum(ctx, top_k)
    if att.kind == "csa":
        local = np.minimum(ctx, window) if att.window else 0.0
        return np.minimum(ctx / ratio, top_k) + local
    if att.kind == "hca":
        local = np.minimum(ctx, window) if att.window else 0.0
        return ctx / ratio + local
    if att.kind == "msa":
        return np.minimum(ctx, top_k * att.indexer.block_size)
    return 0.0 * ctx  # linear


def indexer_units(att: Attention, context_tokens):
    """Cached units the indexer scores per query (0 when the kind has no indexer)."""
    if att.indexer is None:
        return 0.0 * np.asarray(context_tokens, float)
    ctx = np.asarray(context_tokens, float)
    if att.kind == "csa":
        return ctx / float(att.compress_ratio or 1)
    # msa scores every cached token with its one shared index key and max-pools the scores per
    # 128-token block (sparse_score_type max; TensorRT-LLM's M3 index-K cache holds one key per
    # token): its units are tokens, like dsa's; only the selection is per block
    return ctx


def _core_dims(att: Attention, absorbed: bool) -> tuple[float, float]:
    """(q.k dims, v dims) per head of the attention core."""
    if att.kind in ("mla", "dsa") and att.kv_lora_rank and absorbed:
        return float(att.kv_lora_rank + (att.qk_rope_head_dim or 0)), float(att.kv_lora_rank)
    return float(att.head_dim), float(att.v_head_dim)


def attention_core_op(att: Attention, phase: str, tokens, seqs, context_tokens, kv_dtype: str,
                      count: int = 1, absorbed: bool | None = None) -> list[Op]:
    """Core attention (no projections) for `tokens` queries over `seqs` sequences at
    `context_tokens`.

    MLA absorbs kv_b into q/o for decode (vLLM default); prefill runs unabsorbed and up-projects
    the cached latents. Sparse kinds (dsa/csa/msa) add their indexer op.
    """
    tokens = np.asarray(tokens, float)
    z = np.zeros_like(tokens + np.asarray(context_tokens, float))
    kv_b = dtype(kv_dtype).bytes
    if absorbed is None:
        absorbed = phase == "decode" or att.kind in ("dsa", "csa", "hca")
    ops: list[Op] = []
    if att.kind == "linear":
        n = float(att.state_elements + att.conv_elements)
        ops.append(Op(f"attn_{phase}", "linear_attention", count,
                      flops=z + f("linear_state_flops", tokens, n),
                      weight_bytes=z, kv_read_bytes=z + f("linear_state_bytes", seqs, n) / 2,
                      kv_write_bytes=z + f("linear_state_bytes", seqs, n) / 2,
                      act_bytes=z + 2 * ACT_BYTES * tokens * att.num_heads * att.head_dim,
                      shape={"attention": att, "phase": phase}))
        return ops
    dqk, dv = _core_dims(att, absorbed)
    s_att = attended_entries(att, context_tokens)
    e_bytes = entry_elements(att) * kv_b
    ops.append(Op(f"attn_{phase}", "attention", count,
                  flops=z + f("attn_flops", tokens, att.num_heads, dqk, dv, s_att),
                  weight_bytes=z,
                  kv_read_bytes=z + f("attn_kv_read_bytes", seqs, s_att, e_bytes),
                  kv_write_bytes=z + f("attn_kv_write_bytes", tokens, e_bytes)
                  / (float(att.compress_ratio) if att.compress_ratio else 1.0),
                  act_bytes=z + f("attn_act_bytes", tokens, att.num_heads, dqk, dv),
                  shape={"attention": att, "phase": phase, "absorbed": absorbed}))
    if att.kind == "mla" and not absorbed and att.kv_lora_rank:
        cached = np.maximum(np.asarray(context_tokens, float) * seqs - tokens, 0.0)
        nope = float(att.head_dim - (att.qk_rope_head_dim or 0))
        ops.append(Op(f"mla_kv_up_{phase}", "linear", count,
                      flops=z + f("mla_kv_up_flops", cached, att.kv_lora_rank, att.num_heads,
                                  nope, att.v_head_dim),
                      weight_bytes=z, kv_read_bytes=z + cached * e_bytes, kv_write_bytes=z,
                      act_bytes=z + ACT_BYTES * cached * att.num_heads * (nope + att.v_head_dim),
                      shape={"n": att.num_heads * (nope + att.v_head_dim),
                             "k": att.kv_lora_rank, "dtype": "bf16", "m_from": "cached"}))
    if att.indexer is not None:
        idx = att.indexer
        u = indexer_units(att, context_tokens)
        ib = dtype(idx.cache_dtype).bytes
        ops.append(Op(f"indexer_{phase}", "indexer", count,
                      flops=z + f("indexer_flops", tokens, idx.num_heads, idx.head_dim, u),
                      weight_bytes=z,
                      kv_read_bytes=z + f("indexer_read_bytes", seqs, u, idx.head_dim, ib),
                      kv_write_bytes=z + tokens * idx.head_dim * ib
                      / (float(att.compress_ratio or 1) if att.kind == "csa" else
                         float(idx.block_size) if att.kind == "msa" else 1.0),
                      act_bytes=z + ACT_BYTES * tokens * idx.num_heads * idx.head_dim,
                      shape={"attention": att, "phase": phase}))
    return ops


def moe_op(ex: Experts, tokens, count: int = 1) -> Op:
    tokens = np.asarray(tokens, float)
    n_mat = 3 if ex.gated else 2
    touched = f("experts_touched", ex.num_experts, ex.top_k, np.maximum(tokens, 0.0))
    bits = dtype(ex.dtype).bits
    z = np.zeros_like(tokens)
    return Op("experts", "moe", count,
              flops=f("moe_flops", tokens, ex.top_k, n_mat, ex.hidden_size, ex.intermediate_size),
              weight_bytes=touched * ex.params_per_expert * bits / 8,
              kv_read_bytes=z, kv_write_bytes=z,
              act_bytes=f("moe_act_bytes", tokens, ex.top_k, ex.hidden_size,
                          ex.intermediate_size, n_mat),
              shape={"experts": ex, "touched": touched})


def norm_op(width: int, tokens, count: int, name: str = "norms") -> Op:
    tokens = np.asarray(tokens, float)
    z = np.zeros_like(tokens)
    return Op(name, "norm", count, flops=f("norm_flops", tokens, width),
              weight_bytes=z, kv_read_bytes=z, kv_write_bytes=z,
              act_bytes=f("norm_bytes", tokens, width), shape={})


def layer_signature(layer: Layer) -> tuple:
    """Layers with equal signatures have identical op counts (so a step sums each once)."""
    return (layer.attention, layer.mlp, layer.mtp)


def grouped_layers(layers) -> tuple[tuple[Layer, int], ...]:
    """(layer, count) per distinct layer signature, in first-seen order (cached per tuple of
    layers: a layer's hash is computed once, see `model.specs.layers.Layer`)."""
    return _grouped(tuple(layers))


@lru_cache(maxsize=512)
def _grouped(layers: tuple[Layer, ...]) -> tuple[tuple[Layer, int], ...]:
    groups: dict[tuple, list] = {}
    for layer in layers:
        groups.setdefault(layer_signature(layer), [layer, 0])[1] += 1
    return tuple((g[0], g[1]) for g in groups.values())


def layer_ops(layer: Layer, count: int, step: Step, kv_dtype: str, width: int,
              phase_split: bool = True) -> list[Op]:
    """Ops of one layer (times `count` identical layers) for a step composition."""
    tokens = step.tokens
    att = layer.attention
    out: list[Op] = []
    tag = f"{att.kind}/{layer.mlp.kind}:"
    for lin in att.projections:
        out.append(_tag(linear_op(lin, tokens, count), tag))
    if phase_split:
        for op in attention_core_op(att, "prefill", step.prefill_tokens, step.prefill_seqs,
                                    step.prefill_context, kv_dtype, count):
            out.append(_tag(op, tag))
        for op in attention_core_op(att, "decode", step.decode_seqs, step.decode_seqs,
                                    step.decode_context, kv_dtype, count):
            out.append(_tag(op, tag))
    for lin in layer.mlp.projections:
        out.append(_tag(linear_op(lin, tokens, count), tag))
    if layer.mlp.experts is not None:
        out.append(_tag(moe_op(layer.mlp.experts, tokens, count), tag))
    out.append(_tag(norm_op(width, tokens, 2 * count), tag))
    return out


def _tag(op: Op, prefix: str) -> Op:
    return Op(prefix + op.name, op.kind, op.count, op.flops, op.weight_bytes, op.kv_read_bytes,
              op.kv_write_bytes, op.act_bytes, op.shape)


def model_ops(arch: Architecture, step: Step, kv_dtype: str | None = None,
              include_mtp: bool = False) -> list[Op]:
    """All ops of one forward step of the whole model (one replica, unsharded)."""
    kv = kv_dtype or arch.default_kv_dtype
    width = arch.hidden_size * arch.hyper_connections
    ops: list[Op] = []
    tokens = step.tokens
    z = np.zeros_like(tokens)
    emb_bytes = dtype(arch.embedding.dtype).bytes
    ops.append(Op("embedding", "embedding", 1, flops=z, weight_bytes=tokens * arch.hidden_size
                  * emb_bytes, kv_read_bytes=z, kv_write_bytes=z,
                  act_bytes=tokens * arch.hidden_size * ACT_BYTES, shape={}))
    layers = arch.layers if include_mtp else arch.main_layers
    for layer, count in grouped_layers(layers):
        ops.extend(layer_ops(layer, count, step, kv, width))
    ops.append(linear_op(arch.lm_head, step.logit_seqs, 1, ""))
    return ops


def totals(ops: list[Op]) -> dict[str, np.ndarray]:
    """Sum of each count over ops (each op times its layer multiplicity)."""
    keys = ("flops", "weight_bytes", "kv_read_bytes", "kv_write_bytes", "act_bytes")
    return {key: sum(np.asarray(getattr(op, key)) * op.count for op in ops) for key in keys}
