"""Shared pieces of the family loaders: required-key checks, Linear construction at the
checkpoint's precision, and the standard attention / MLP / MoE blocks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from model.specs.errors import SpecError
from model.specs.families.quant import QuantScheme
from model.specs.layers import Attention, Experts, Indexer, Layer, Linear, Mlp


@dataclass(frozen=True)
class Parts:
    """What a family loader returns; `model.specs.architecture` adds names and provenance."""

    layers: tuple[Layer, ...]
    hidden_size: int
    vocab_size: int
    tie_word_embeddings: bool
    max_context: int
    default_kv_dtype: str = "bf16"
    hyper_connections: int = 1
    embedding_names: tuple[str, str] = ("embed_tokens", "lm_head")


# Shape fields that must be non-negative integers (a "7168" string or 7168.0 is a malformed
# config, not something to coerce)
INT_KEYS = frozenset({
    "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
    "intermediate_size", "moe_intermediate_size", "vocab_size", "n_routed_experts", "num_experts",
    "num_local_experts", "num_experts_per_tok", "num_experts_per_token", "experts_per_token",
    "n_shared_experts", "num_shared_experts", "kv_lora_rank", "q_lora_rank", "qk_nope_head_dim",
    "qk_rope_head_dim", "v_head_dim", "first_k_dense_replace", "num_nextn_predict_layers",
    "index_n_heads", "index_head_dim", "index_topk", "sliding_window", "o_groups", "o_lora_rank",
    "shared_intermediate_size", "shared_expert_intermediate_size", "dense_intermediate_size",
    "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
    "linear_value_head_dim", "linear_conv_kernel_dim", "mamba_num_heads", "mamba_head_dim",
    "ssm_state_size", "n_groups", "conv_kernel", "moe_latent_size", "routed_expert_hidden_size",
    "num_hash_layers", "hc_mult", "max_position_embeddings", "global_head_dim",
    "num_global_key_value_heads", "top_k_experts", "share_expert_dim", "attention_chunk_size",
    "intermediate_size_mlp", "interleave_moe_layer_step", "decoder_sparse_step",
})

# sizes and counts a model cannot have zero of (where the config states them): a zero here
# would price a model with no parameters, or read as unset and multiply the KV
POSITIVE_KEYS = frozenset({
    "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
    "intermediate_size", "moe_intermediate_size", "vocab_size", "n_routed_experts", "num_experts",
    "num_local_experts", "num_experts_per_tok", "kv_lora_rank", "qk_rope_head_dim", "v_head_dim",
    "max_position_embeddings",
})


# above these a config.json value is a typo, refused before any layer is built (the largest
# shipped: max_position_embeddings 10,485,760 in Llama 4 Scout; num_hidden_layers 126 in
# Llama 3.1 405B); a billion layers would take minutes and gigabytes to build
MAX_INT_VALUE = 2**26
MAX_LAYERS = 1024
EXPERT_COUNT_KEYS = ("n_routed_experts", "num_experts", "num_local_experts")
TOP_K_KEYS = ("num_experts_per_tok", "num_experts_per_token", "experts_per_token")


@dataclass(frozen=True)
class Builder:
    """A config dict plus its quant scheme; builds Linears named like the checkpoint's modules."""

    cfg: dict[str, Any]
    path: str
    family: str
    quant: QuantScheme
    layer_prefix: str = "layers"
    mtp_prefix: str | None = None  # V4 names MTP modules `mtp.K.*` after num_hidden_layers

    def __post_init__(self) -> None:
        # every integer field the config states is checked, read by this family or not: a
        # config with an impossible value anywhere is refused, not half-read
        for key in sorted(INT_KEYS & set(self.cfg)):
            if self.cfg[key] is not None:
                self._checked(key, self.cfg[key])
        self._check_relations()

    def _check_relations(self) -> None:
        """Shapes that cannot go together: query heads in whole groups per KV head, no more
        experts routed to per token than the layer has."""
        heads, kv_heads = self.cfg.get("num_attention_heads"), self.cfg.get("num_key_value_heads")
        if heads and kv_heads and heads % kv_heads:
            raise SpecError(self.path, "num_key_value_heads", f"{kv_heads} does not divide "
                            f"num_attention_heads {heads}; allowed: a divisor of {heads}")
        experts = next((self.cfg[k] for k in EXPERT_COUNT_KEYS if self.cfg.get(k)), None)
        for key in TOP_K_KEYS:
            if experts and (self.cfg.get(key) or 0) > experts:
                raise SpecError(self.path, key, f"{self.cfg[key]} experts per token exceeds the "
                                f"{experts} routed experts; allowed: 1..{experts}")

    def need(self, *keys: str) -> None:
        missing = [k for k in keys if self.cfg.get(k) is None]
        if missing:
            raise SpecError(self.path, ", ".join(missing),
                            f"missing for family {self.family}: the loader needs "
                            f"{', '.join(keys)}")

    def get(self, key: str, default: Any = None) -> Any:
        value = self.cfg.get(key)
        return default if value is None else self._checked(key, value)

    def __getitem__(self, key: str) -> Any:
        self.need(key)
        return self._checked(key, self.cfg[key])

    def _checked(self, key: str, value: Any) -> Any:
        if key not in INT_KEYS:
            return value
        low = 1 if key in POSITIVE_KEYS else 0
        high = MAX_LAYERS if key == "num_hidden_layers" else MAX_INT_VALUE
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            problem = "must be a non-negative integer"
        elif value < low:
            problem = "must be an integer >= 1"
        elif value > high:
            problem = "is too large for any model"
        else:
            return value
        raise SpecError(self.path, key, f"{problem}; got {value!r}; allowed: {low}..{high:,}")

    def module(self, layer: int, local: str) -> str:
        main = self.cfg.get("num_hidden_layers") or 0
        if self.mtp_prefix and layer >= main:
            return f"{self.mtp_prefix}.{layer - main}.{local}"
        return f"{self.layer_prefix}.{layer}.{local}"

    def lin(self, layer: int, local: str, in_features: int, out_features: int, count: int = 1,
            quantizable: bool = True, dtype: str | None = None) -> Linear:
        fmt = dtype or self.quant.dtype_for(self.module(layer, local), quantizable)
        return Linear(local, int(in_features), int(out_features), fmt, count)

    def experts_dtype(self, layer: int, local: str) -> str:
        return self.quant.dtype_for(self.module(layer, local))

    def parts(self, layers: list[Layer], *, tie_default: bool = False,
              max_context: int | None = None, default_kv_dtype: str = "bf16",
              hyper_connections: int = 1,
              embedding_names: tuple[str, str] = ("embed_tokens", "lm_head")) -> Parts:
        """The Parts of a finished layer stack; tied embeddings and the context length as the
        config states them (`tie_default` where it does not say)."""
        context = (int(self.get("max_position_embeddings", 0)) if max_context is None
                   else int(max_context))
        return Parts(tuple(layers), self["hidden_size"], self["vocab_size"],
                     bool(self.get("tie_word_embeddings", tie_default)), context,
                     default_kv_dtype, hyper_connections, embedding_names)


def gqa(b: Builder, i: int, heads: int, kv_heads: int, head_dim: int, hidden: int, *,
        kind: str = "gqa", window: int | None = None, prefix: str = "self_attn",
        v_head_dim: int | None = None, extra: tuple[Linear, ...] = (),
        names: tuple[str, str, str, str] = ("q_proj", "k_proj", "v_proj", "o_proj"),
        indexer: Indexer | None = None, kv_entry_dims: int | None = None) -> Attention:
    v_dim = v_head_dim or head_dim
    q, k, v, o = (f"{prefix}.{n}" for n in names)
    projections = (
        b.lin(i, q, hidden, heads * head_dim),
        b.lin(i, k, hidden, kv_heads * head_dim),
        b.lin(i, v, hidden, kv_heads * v_dim),
        b.lin(i, o, heads * v_dim, hidden),
    ) + extra
    return Attention(kind=kind, num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim,
                     v_head_dim=v_dim, projections=projections, window=window, indexer=indexer,
                     kv_entry_dims=kv_entry_dims)


def dense_mlp(b: Builder, i: int, hidden: int, inter: int, *, prefix: str = "mlp",
              gated: bool = True, names: tuple[str, str, str] = ("gate_proj", "up_proj",
                                                                 "down_proj")) -> Mlp:
    gate, up, down = (f"{prefix}.{n}" for n in names)
    projections = ((b.lin(i, gate, hidden, inter),) if gated else ()) + (
        b.lin(i, up, hidden, inter), b.lin(i, down, inter, hidden))
    return Mlp("dense", projections)


def moe_mlp(b: Builder, i: int, hidden: int, *, experts: int, top_k: int, inter: int,
            shared_inter: int = 0, prefix: str = "mlp", router: str = "gate",
            experts_name: str = "experts", shared_name: str = "shared_experts",
            shared_names: tuple[str, str, str] = ("gate_proj", "up_proj", "down_proj"),
            gated: bool = True, hash_routed: bool = False, expert_hidden: int | None = None,
            extra: tuple[Linear, ...] = (), router_linear: bool = True) -> Mlp:
    """Routed experts + optional fused shared expert of width `shared_inter` + router."""
    projections: list[Linear] = []
    pre = f"{prefix}." if prefix else ""  # Gemma 4 keeps router and experts at layer level
    if router_linear and not hash_routed:
        projections.append(b.lin(i, f"{pre}{router}", hidden, experts, quantizable=False))
    if shared_inter:
        g, u, d = (f"{pre}{shared_name}.{n}" for n in shared_names)
        if gated:
            projections.append(b.lin(i, g, hidden, shared_inter))
        projections += [b.lin(i, u, hidden, shared_inter), b.lin(i, d, shared_inter, hidden)]
    projections += list(extra)
    routed = Experts(num_experts=int(experts), top_k=int(top_k),
                     hidden_size=int(expert_hidden or hidden), intermediate_size=int(inter),
                     dtype=b.experts_dtype(i, f"{pre}{experts_name}"), gated=gated,
                     hash_routed=hash_routed)
    return Mlp("moe", tuple(projections), routed)


def norms(hidden: int, count: int = 2) -> int:
    """RMSNorm weights of one layer (input and post-attention norms)."""
    return count * hidden


def layer_types(b: Builder, n: int) -> list[str] | None:
    """HF `layer_types` list ('full_attention' / 'sliding_attention' / 'linear_attention')."""
    types = b.cfg.get("layer_types")
    if types is None:
        return None
    if len(types) < n:
        raise SpecError(b.path, "layer_types", f"{len(types)} entries for {n} layers")
    return list(types[:n])
