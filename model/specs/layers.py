"""The normalized per-layer description of an architecture: the one shape every calculator reads.

Family-specific knowledge (how a DeepSeek V4 or Kimi K3 config spells its layers) lives only in
the loader (`model.specs.architecture`); everything downstream works on these frozen records:
- projections are plain matrices (`Linear`), so FLOPs and weight bytes are generic;
- the attention core is described by its kind and the few numbers its KV and FLOPs depend on;
- routed experts are described once per layer (`Experts`), shared experts and routers are
  ordinary always-active `Linear`s.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from functools import cached_property
from typing import Literal

AttentionKind = Literal[
    "gqa",  # softmax attention over all tokens; MHA (kv_heads == heads) and MQA (kv_heads == 1)
    "swa",  # softmax attention over a sliding window of `window` tokens
    "mla",  # multi-head latent attention: caches kv_lora_rank + qk_rope_head_dim per token
    "dsa",  # DeepSeek V3.2 sparse MLA: indexer over all tokens picks top_k tokens
    "csa",  # DeepSeek V4 compressed sparse: ratio-4 compressed KV, indexer top_k, plus window
    "hca",  # DeepSeek V4 heavily compressed: ratio-128 compressed KV (dense), plus window
    "msa",  # MiniMax sparse attention: index keys score blocks, top_k blocks of GQA KV
    "linear",  # fixed-size recurrent state (KDA, lightning, GDN, Mamba): state_elements per seq
]
MlpKind = Literal["dense", "moe", "none"]


def _hashed_once(cls: type) -> type:
    """Give a frozen dataclass a hash computed once per object. Layers and architectures key
    the per-architecture caches of model.perf, and rehashing ~100 nested layers on every lookup
    would dominate a deployment search. The cached hash is left out of pickles (string hashes
    differ between processes)."""
    def _hash(self) -> int:
        return hash(tuple(getattr(self, f.name) for f in fields(self)))

    cached = cached_property(_hash)
    cached.__set_name__(cls, "_hash")
    cls._hash = cached
    cls.__hash__ = lambda self: self._hash
    cls.__getstate__ = lambda self: {k: v for k, v in self.__dict__.items() if k != "_hash"}
    return cls


@dataclass(frozen=True)
class Linear:
    """A weight matrix applied to every token that reaches it: y[out] = W[out, in] x[in]."""

    name: str
    in_features: int
    out_features: int
    dtype: str  # storage format name from model.specs.dtypes
    count: int = 1  # identical copies applied to each token (e.g. 2 shared experts)

    @property
    def params(self) -> int:
        return self.in_features * self.out_features * self.count


@dataclass(frozen=True)
class Indexer:
    """Selector that scores cached entries and keeps the top_k (DSA, CSA lightning indexer, MSA)."""

    num_heads: int
    head_dim: int
    top_k: int  # entries kept per query: tokens (dsa), compressed entries (csa), blocks (msa)
    block_size: int = 1  # tokens per selected unit (msa: 128-token blocks; scored per token)
    cache_dtype: str = "bf16"  # dtype of the cached index keys (fp8 / fp4 in production)


@dataclass(frozen=True)
class Attention:
    kind: AttentionKind
    num_heads: int  # query heads
    num_kv_heads: int  # cached KV heads (MLA-family and linear: 1 latent / n/a)
    head_dim: int  # q.k dims per head (MLA: nope + rope)
    v_head_dim: int
    projections: tuple[Linear, ...]  # q/k/v/o, LoRA, gates, indexer and compressor weights
    window: int | None = None  # sliding window tokens (swa; csa/hca local window)
    kv_lora_rank: int | None = None  # MLA latent width
    qk_rope_head_dim: int | None = None  # MLA decoupled RoPE dims
    kv_entry_dims: int | None = None  # elements per cached entry when not 2*kv_heads*head_dim
    compress_ratio: int | None = None  # csa / hca sequence compression
    indexer: Indexer | None = None
    state_elements: int = 0  # linear: recurrent state per sequence (all heads)
    conv_elements: int = 0  # linear: short-convolution state per sequence

    @property
    def params(self) -> int:
        return sum(p.params for p in self.projections)


@dataclass(frozen=True)
class Experts:
    """Routed experts of one MoE layer; each expert is gate+up (gated) and down projections."""

    num_experts: int
    top_k: int
    hidden_size: int  # width the experts read and write (latent width for Kimi K3)
    intermediate_size: int
    dtype: str
    gated: bool = True  # gate and up (3 matrices) vs up only (2 matrices)
    hash_routed: bool = False  # DeepSeek V4 first layers: fixed hash routing, no learned router

    @property
    def params_per_expert(self) -> int:
        return (3 if self.gated else 2) * self.hidden_size * self.intermediate_size

    @property
    def params(self) -> int:
        return self.num_experts * self.params_per_expert

    @property
    def active_params(self) -> int:
        return self.top_k * self.params_per_expert


@dataclass(frozen=True)
class Mlp:
    kind: MlpKind
    projections: tuple[Linear, ...]  # dense FFN, shared experts, router, latent projections
    experts: Experts | None = None

    @property
    def params(self) -> int:
        return sum(p.params for p in self.projections) + (self.experts.params if self.experts else 0)

    @property
    def active_params(self) -> int:
        routed = self.experts.active_params if self.experts else 0
        return sum(p.params for p in self.projections) + routed


@_hashed_once
@dataclass(frozen=True)
class Layer:
    index: int
    attention: Attention
    mlp: Mlp
    mtp: bool = False  # multi-token-prediction module (draft), not in the main stack
    extra_params: int = 0  # norms, hyper-connection mixers: counted, not GEMM-shaped


@_hashed_once
@dataclass(frozen=True)
class Architecture:
    name: str  # short slug, e.g. deepseek-v4-pro
    hf_id: str  # e.g. deepseek-ai/DeepSeek-V4-Pro
    family: str  # loader family that normalized it, e.g. deepseek_v4
    source: str  # path of the config.json it was read from
    hidden_size: int
    vocab_size: int
    layers: tuple[Layer, ...]  # main stack then MTP layers (flagged mtp=True)
    embedding: Linear
    lm_head: Linear  # same matrix as embedding when tie_word_embeddings
    tie_word_embeddings: bool
    max_context: int
    weight_dtype: str  # dominant non-expert weight format
    default_kv_dtype: str = "bf16"
    hyper_connections: int = 1  # residual stream width multiplier (DeepSeek V4 mHC: 4)
    aliases: tuple[str, ...] = field(default=())

    @cached_property
    def main_layers(self) -> tuple[Layer, ...]:
        return tuple(layer for layer in self.layers if not layer.mtp)

    @cached_property
    def mtp_layers(self) -> tuple[Layer, ...]:
        return tuple(layer for layer in self.layers if layer.mtp)
