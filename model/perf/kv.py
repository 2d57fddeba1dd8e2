"""KV-cache and recurrent-state bytes per sequence, per layer kind, at any context length.

Stored bytes of one layer for one sequence at context L (tokens in the cache):
- gqa / mla:   L entries
- dsa:         L entries + L indexer keys (DeepSeek V3.2, GLM-5)
- msa:         L entries + L index keys (MiniMax M3: side index-K cache, one head per token)
- swa:         min(L, window) entries
- csa:         min(L, window) + floor(L/4) entries + floor(L/4) indexer keys  (DeepSeek V4)
- hca:         min(L, window) + floor(L/128) entries                          (DeepSeek V4)
- linear:      no growing part; a fixed recurrent state (+ short-conv state) per sequence
plus, for csa / hca, the compressor's rolling residual (fixed per sequence).

Bytes per entry (`entry_layout` says which applies, with its source):
- plain KV (gqa / swa / msa): kv_heads * (head_dim + v_head_dim) elements at the KV dtype
  (vLLM fp8 KV: e4m3 with per-tensor scales, so 1 B per element).
- MLA latent (mla / dsa): bf16 (kv_lora_rank + rope) * 2 B = 1152 B; fp8 = FlashMLA/vLLM V3.2
  layout 512 fp8 + 4 fp32 scales + 64 bf16 rope = 656 B (vLLM blog 2025-09-29).
- DeepSeek V4 shared K=V entry (csa / hca / swa with kv_entry_dims): bf16 512 * 2 = 1024 B; fp8 =
  FlashMLA "MODEL1" layout 448 fp8 + 64 bf16 rope + 7 ue8m0 scales + 1 pad = 584 B
  (FlashMLA csrc/api/sparse_decode.h, 2026-04).
- index keys: bf16 head_dim * 2 = 256 B; fp8 head_dim + 4 B fp32 scale = 132 B (DeepGEMM / vLLM
  V3.2); mxfp4 head_dim/2 + head_dim/32 = 68 B (vLLM PR #44577 packed indexer row).
  With a bf16 / fp16 / fp32 KV dtype the index keys use it too; with a quantized KV dtype they
  use the indexer's production `cache_dtype` (V3.2 fp8, V4 mxfp4, M3 bf16).
Block padding: a full-attention sequence holds ceil(L/B) blocks of B tokens; a compressed kind
holds ceil(L/B) blocks of B/ratio entries; a window holds the blocks that overlap its last
`window` tokens (vLLM hybrid KV cache manager; 10 full + 20 SW layers, block 16, window 32,
L 112 -> 7 + 2 + 2 blocks per group).
MTP layers are excluded unless include_mtp=True (DeepSeek V3's 70,272 B/token is 61 layers).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

from model.specs.architecture import load_architecture
from model.specs.dtypes import dtype
from model.specs.errors import ServecastError
from model.specs.layers import Architecture, Attention, Indexer

FULL_PRECISION = ("bf16", "fp16", "fp32")
# DeepSeek V4 reference inference, Compressor.setup_caches: kv_state and score_state, each
# (coff * ratio, coff * head_dim) in float32 per sequence (coff = 2 for overlapping ratio-4)
COMPRESSOR_STATE_DTYPE = "fp32"


@dataclass(frozen=True)
class KVFootprint:
    total_bytes: float | np.ndarray  # one sequence, all layers, growing part + fixed state
    by_kind: dict[str, float | np.ndarray]  # attention kind -> bytes (state included)
    state_bytes: float  # context-independent part (linear state, compressor residuals)
    indexer_bytes: float | np.ndarray = 0.0  # part of total held by index keys
    by_component: dict[str, float | np.ndarray] = field(default_factory=dict)


def _kv_dtype(name: str) -> str:
    return dtype(name).name


def entry_layout(attention: Attention) -> str:
    """Which byte layout an attention kind's cached entry uses (see module docstring)."""
    if attention.kind == "linear":
        return "state"
    if attention.kv_lora_rank:
        return "mla_latent"
    if attention.kv_entry_dims and attention.qk_rope_head_dim and attention.num_kv_heads == 1:
        return "v4_shared_kv"
    return "plain"


def entry_bytes(attention: Attention, kv_dtype: str) -> float:
    """Bytes of one cached main entry (token or compressed token) of this attention."""
    fmt = _kv_dtype(kv_dtype)
    layout = entry_layout(attention)
    if layout == "state":
        return 0.0
    if layout == "mla_latent":
        rank, rope = attention.kv_lora_rank, attention.qk_rope_head_dim or 0
        if fmt == "fp8":
            return rank + rank / 128 * 4 + rope * 2  # FlashMLA fp8: 656 B at 512 + 64
        return (rank + rope) * dtype(fmt).bytes
    if layout == "v4_shared_kv":
        dims, rope = attention.kv_entry_dims, attention.qk_rope_head_dim
        if fmt == "fp8":
            nope = dims - rope
            return nope + rope * 2 + nope / 64 + 1  # FlashMLA MODEL1: 584 B at 512 / 64
        return dims * dtype(fmt).bytes
    elements = attention.kv_entry_dims or attention.num_kv_heads * (
        attention.head_dim + attention.v_head_dim)
    return elements * dtype(fmt).bytes


LAYOUT_SOURCES = {
    "plain": "kv_heads x (head_dim + v_head_dim) elements at the KV dtype",
    "mla_latent": "bf16 (rank + rope) x 2 B; fp8 FlashMLA/vLLM V3.2 layout 512 + 16 + 128 = 656 B",
    "v4_shared_kv": "bf16 512 x 2 B; fp8 FlashMLA MODEL1 layout 448 + 128 + 7 + 1 = 584 B",
    "state": "fixed recurrent state per sequence, no per-token entries",
}


def entry_layouts(arch: Architecture, kv_dtype: str | None = None,
                  indexer_dtype: str | None = None) -> dict[str, dict]:
    """Per attention kind: which byte layout its entries use, bytes per entry and per index key."""
    fmt = kv_dtype or arch.default_kv_dtype
    out: dict[str, dict] = {}
    for att, _ in _groups(arch, False):
        layout = entry_layout(att)
        out.setdefault(att.kind, {
            "layout": layout, "source": LAYOUT_SOURCES[layout],
            "entry_bytes": entry_bytes(att, fmt),
            "index_key_bytes": indexer_key_bytes(att.indexer, fmt, indexer_dtype)
            if att.indexer else 0.0,
            "compress_ratio": att.compress_ratio or 1, "window": att.window})
    return out


def indexer_key_bytes(indexer: Indexer, kv_dtype: str, indexer_dtype: str | None = None) -> float:
    fmt = _kv_dtype(indexer_dtype) if indexer_dtype else (
        _kv_dtype(kv_dtype) if _kv_dtype(kv_dtype) in FULL_PRECISION else
        _kv_dtype(indexer.cache_dtype))
    d = indexer.head_dim
    if fmt == "fp8":
        return d + 4.0
    if fmt == "mxfp4":
        return d / 2 + d / 32
    return d * dtype(fmt).bytes


def state_bytes(attention: Attention, state_dtype: str = "fp32", conv_dtype: str = "bf16") -> float:
    """Fixed per-sequence bytes: recurrent + conv state (linear), compressor residual (csa/hca)."""
    if attention.kind == "linear":
        return (attention.state_elements * dtype(state_dtype).bytes
                + attention.conv_elements * dtype(conv_dtype).bytes)
    if attention.kind in ("csa", "hca") and attention.compress_ratio:
        # rolling residual of uncompressed kv + gate scores (vLLM blog: 8 overlapped tokens for
        # C4, 128 for C128): kv_state + score_state of (coff*ratio, coff*head_dim), see above
        ratio = attention.compress_ratio
        coff = 2 if ratio == 4 else 1
        width = coff * (attention.kv_entry_dims or attention.head_dim)
        out = coff * ratio * width * 2
        if attention.indexer is not None:
            out += coff * ratio * coff * attention.indexer.head_dim * 2
        return out * dtype(COMPRESSOR_STATE_DTYPE).bytes
    return 0.0


def _padded(tokens: np.ndarray, block: int | None) -> np.ndarray:
    return tokens if not block else np.ceil(tokens / block) * block


def _window_tokens(tokens: np.ndarray, window: int, block: int | None) -> np.ndarray:
    if not block:
        return np.minimum(tokens, window)
    first = np.maximum(tokens - window, 0) // block
    last = np.maximum(tokens - 1, 0) // block
    return np.where(tokens > 0, (last - first + 1) * block, 0)


def _compressed(tokens: np.ndarray, ratio: int, block: int | None) -> np.ndarray:
    if not block:
        return np.floor(tokens / ratio)
    return np.ceil(tokens / block) * (block / ratio)


def layer_kv_parts(attention: Attention, context_tokens, kv_dtype: str,
                   block_size: int | None = None, indexer_dtype: str | None = None,
                   state_dtype: str = "fp32") -> tuple[np.ndarray, np.ndarray, float]:
    """(main KV bytes, index-key bytes, fixed state bytes) of one layer for one sequence."""
    tokens = np.asarray(context_tokens, dtype=float)
    if np.any(tokens < 0) or not np.all(np.isfinite(tokens)):
        raise ServecastError(f"context_tokens must be finite and >= 0; got {context_tokens!r}")
    if block_size is not None and block_size <= 0:
        raise ServecastError(f"block_size must be a positive integer; got {block_size}")
    kind = attention.kind
    entry = entry_bytes(attention, kv_dtype)
    idx = attention.indexer
    key = indexer_key_bytes(idx, kv_dtype, indexer_dtype) if idx is not None else 0.0
    zero = np.zeros_like(tokens)
    fixed = state_bytes(attention, state_dtype)
    if kind == "linear":
        return zero, zero, fixed
    if kind in ("gqa", "mla", "dsa", "msa"):
        stored = _padded(tokens, block_size)
        return stored * entry, (stored * key if idx is not None else zero), fixed
    if kind == "swa":
        return _window_tokens(tokens, attention.window, block_size) * entry, zero, fixed
    if kind in ("csa", "hca"):
        window = _window_tokens(tokens, attention.window or 0, block_size)
        compressed = _compressed(tokens, attention.compress_ratio, block_size)
        index = compressed * key if idx is not None else zero
        return (window + compressed) * entry, index, fixed
    raise ServecastError(f"attention kind {kind!r} has no KV formula")


def layer_kv_bytes(attention: Attention, context_tokens, kv_dtype: str,
                   block_size: int | None = None, indexer_dtype: str | None = None,
                   state_dtype: str = "fp32"):
    """Stored bytes of one layer for one sequence at `context_tokens` (numpy-broadcast), fixed
    state included."""
    main, index, fixed = layer_kv_parts(attention, context_tokens, kv_dtype, block_size,
                                        indexer_dtype, state_dtype)
    out = main + index + fixed
    return float(out) if np.ndim(out) == 0 else out


@lru_cache(maxsize=512)
def _groups(arch: Architecture, include_mtp: bool) -> tuple[tuple[Attention, int], ...]:
    """Distinct attention specs and how many layers share each (cached: sweeps call this often)."""
    counts: dict[Attention, int] = {}
    for layer in arch.layers if include_mtp else arch.main_layers:
        counts[layer.attention] = counts.get(layer.attention, 0) + 1
    return tuple(counts.items())


def _scalar(x):
    return float(x) if np.ndim(x) == 0 else x


def sequence_kv(arch: Architecture, context_tokens, kv_dtype: str | None = None,
                block_size: int | None = None, indexer_dtype: str | None = None,
                state_dtype: str = "fp32", include_mtp: bool = False) -> KVFootprint:
    """KV + state of one sequence across all layers, by attention kind."""
    fmt = kv_dtype or arch.default_kv_dtype
    by_kind: dict[str, np.ndarray] = {}
    main_total = index_total = 0.0
    fixed_total = 0.0
    for attention, count in _groups(arch, include_mtp):
        main, index, fixed = layer_kv_parts(attention, context_tokens, fmt, block_size,
                                            indexer_dtype, state_dtype)
        by_kind[attention.kind] = by_kind.get(attention.kind, 0.0) + count * (main + index + fixed)
        main_total = main_total + count * main
        index_total = index_total + count * index
        fixed_total += count * fixed
    total = main_total + index_total + fixed_total
    return KVFootprint(total_bytes=_scalar(total),
                       by_kind={k: _scalar(v) for k, v in by_kind.items()},
                       state_bytes=fixed_total, indexer_bytes=_scalar(index_total),
                       by_component={"kv": _scalar(main_total), "index_keys": _scalar(index_total),
                                     "state": fixed_total})


def layer_bytes_per_token(attention: Attention, kv_dtype: str,
                          indexer_dtype: str | None = None) -> float:
    """Asymptotic growth of one layer's cache per added context token (windows contribute 0)."""
    kind = attention.kind
    entry = entry_bytes(attention, kv_dtype)
    idx = attention.indexer
    key = indexer_key_bytes(idx, kv_dtype, indexer_dtype) if idx is not None else 0.0
    if kind in ("gqa", "mla", "dsa", "msa"):
        return entry + key
    if kind in ("csa", "hca"):
        return (entry + key) / attention.compress_ratio
    return 0.0


def kv_bytes_per_token(arch: Architecture, kv_dtype: str | None = None,
                       indexer_dtype: str | None = None, include_mtp: bool = False) -> float:
    """Growing part of the cache per token, all layers (default KV dtype of the architecture)."""
    fmt = kv_dtype or arch.default_kv_dtype
    return float(sum(count * layer_bytes_per_token(att, fmt, indexer_dtype)
                     for att, count in _groups(arch, include_mtp)))


def kv_bytes_per_token_by_kind(arch: Architecture, kv_dtype: str | None = None,
                               indexer_dtype: str | None = None) -> dict[str, float]:
    fmt = kv_dtype or arch.default_kv_dtype
    out: dict[str, float] = {}
    for att, count in _groups(arch, False):
        out[att.kind] = out.get(att.kind, 0.0) + count * layer_bytes_per_token(att, fmt,
                                                                               indexer_dtype)
    return out


def footprint_table(archs: list[str], contexts_tokens, kv_dtype: str | None = None,
                    block_size: int | None = None, state_dtype: str = "fp32"):
    """Tidy DataFrame: one row per (architecture, context, component) with bytes per sequence.

    component is the attention kind's growing KV (`mla`, `csa`, ...), `index_keys`, or `state`
    (fixed recurrent / compressor state), so stacked bars add up to the sequence total."""
    import pandas as pd  # only this table needs pandas: kept off the hot import path

    contexts_tokens = np.atleast_1d(np.asarray(contexts_tokens, dtype=float))
    rows = []
    for name in archs:
        arch = load_architecture(name)
        fmt = kv_dtype or arch.default_kv_dtype
        for attention, count in _groups(arch, False):
            main, index, fixed = layer_kv_parts(attention, contexts_tokens, fmt, block_size,
                                                state_dtype=state_dtype)
            for i, ctx in enumerate(contexts_tokens):
                for component, value in ((attention.kind, main[i]), ("index_keys", index[i]),
                                         ("state", fixed)):
                    if value:
                        rows.append({"arch": arch.name, "kv_dtype": fmt, "context_tokens": ctx,
                                     "component": component, "bytes": count * float(value)})
    df = pd.DataFrame(rows, columns=["arch", "kv_dtype", "context_tokens", "component", "bytes"])
    return (df.groupby(["arch", "kv_dtype", "context_tokens", "component"], as_index=False,
                       sort=False)["bytes"].sum())
