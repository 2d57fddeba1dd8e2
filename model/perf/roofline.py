"""Kernel times on one GPU: roofline physics x calibrated efficiency (+ launch overhead).

    t = max(flops / (peak(rate) * eff(m)), bytes / (hbm_bandwidth * memory_efficiency)) + overhead

FLOPs and bytes are closed-form counts per op (below); the efficiency curves come from
`model.perf.kernels` (fitted on the measured kernel tables, or transferred from
`hw.calibration_reference` for chips without measurements; see that module's docstring).
All functions broadcast over numpy arrays and return seconds. With `ideal=True` they return the
op's physical floor instead: the same FLOPs and bytes at the chip's peak and full HBM bandwidth,
no launch cost (`IDEAL`), what no kernel and no engine factor can beat.

Conventions:
- `context_tokens` is the sequence length after this step (cached + new tokens); queries are
  causal, so the new tokens of a prefill chunk attend on average to context - (new - 1)/2 keys.
- activations are bf16 unless the GEMM runs at an 8/4-bit rate (then quantized like the weights);
  GEMM outputs are bf16.
- 4-bit weight formats on a chip without an fp4 rate run weight-only (dequantized to bf16, Marlin
  style): compute at the bf16 peak, weights streamed at 4 bits.
"""

from __future__ import annotations

import math
from dataclasses import replace
from functools import lru_cache

import numpy as np

from model.perf import kernels
from model.perf.kernels import KernelParams, params_for
from model.specs.defaults import TRITON_2D_TILE_S, TRITON_2D_TILE_TOKENS, TRITON_3D_MAX_GRID
from model.specs.dtypes import dtype as _dtype
from model.specs.errors import Infeasible

ACT_BYTES = 2.0  # bf16 activations and outputs
STATE_BYTES = 4.0  # fp32 recurrent state of linear attention (KDA/GDN kernels keep it in fp32)

# Indexer scores in an 8-bit cache run on the fp8 tensor path, twice the bf16 rate on every
# GPU of hardware/*.yaml; counted as bf16-equivalent FLOPs.
INDEXER_RATE_FACTOR = {"fp8": 0.5, "fp4": 0.25}

LINEAR_CHUNK = 64  # chunk length of chunked linear-attention prefill kernels (FLA, flashkda)
MSA_GROUP_TILE = 16  # minimum tl.dot rows in the Triton MSA kernel
IDEAL = KernelParams(1.0, 0.0, 1.0, 0.0, source="ideal")  # peak FLOP/s, full bandwidth, no launch
SPARSE_HEAD_TILE = 64  # query heads per CTA in FlashMLA sparse / DSV4 attention kernels

# Attention kind -> calibrated family (the measured table whose fit it uses).
ATTENTION_FAMILY = {"gqa": "gqa", "swa": "gqa", "mla": "mla", "dsa": "mla", "csa": "csa",
                    "hca": "hca", "msa": "msa", "linear": "linear"}
PHASES = ("prefill", "decode")


@lru_cache(maxsize=1024)
def compute_rate(dtype_name: str, hw) -> tuple[str, float]:
    """(rate key, peak FLOP/s) a GEMM in this storage format runs at on `hw`."""
    return _compute_rate(dtype_name, hw)


def clear_cache() -> None:
    """Forget loaded kernel parameters and everything built from them (after
    `python -m model.fit.calibrate` rewrites kernels.yaml)."""
    kernels.clear_cache()
    for cached in (compute_rate, _capped, _gemm_columns):
        cached.cache_clear()


def _compute_rate(dtype_name: str, hw) -> tuple[str, float]:
    d = lookup_dtype(dtype_name)
    try:
        return d.rate, hw.peak(d.rate)
    except Infeasible:
        if d.rate in ("fp4", "fp8", "int8"):  # weight-only: dequantize, compute in bf16
            return "bf16", hw.peak("bf16")
        raise


def roofline_time_s(flops, bytes_, peak_flops_per_s: float, bandwidth_bytes_per_s: float,
                    params: KernelParams, m, k=None, tile_factor=1.0, row_count=None):
    """The shared roofline form with a shape-dependent compute efficiency; `row_count` (default
    m) multiplies the per-row cost (GEMM activation rows, attention query tokens)."""
    eff = params.compute_efficiency(np.maximum(m, 1e-9), k) * tile_factor
    t_compute = flops / (peak_flops_per_s * eff)
    t_memory = bytes_ / (bandwidth_bytes_per_s * params.memory_efficiency)
    t = np.maximum(t_compute, t_memory) + params.overhead_s
    if params.per_row_s:
        t = t + params.per_row_s * (m if row_count is None else row_count)
    return t


# Isolated block-scaled fp8 GEMM timings (gemm.parquet, fp8_block) show a 60-190 us floor at
# every shape, yet the same kernels inside the measured attention modules (mla_generation,
# gemm_type fp8_block: the whole DeepSeek-V3 MLA block with five such GEMMs takes 0.15 ms at
# batch 1 on H100) cannot be paying it: it is host/JIT dispatch of the micro-benchmark, not GPU
# time under CUDA graphs. The fit keeps it (so the curve is not distorted); an engine step pays
# at most this per GEMM (the bf16 / fp8 fits land at 3-8 us on their own).
GEMM_OVERHEAD_CAP_S = 10e-6
GEMM_TILE_N = 128.0


@lru_cache(maxsize=256)
def _capped(params: KernelParams) -> KernelParams:
    if params.overhead_s > GEMM_OVERHEAD_CAP_S:
        return replace(params, overhead_s=GEMM_OVERHEAD_CAP_S)
    return params  # tensor-core CTA tile width: an n that is not a multiple wastes the rest


def gemm_tile_factor(n):
    n = np.maximum(n, 1.0)
    return n / (np.ceil(n / GEMM_TILE_N) * GEMM_TILE_N)


@lru_cache(maxsize=256)
def lookup_dtype(name: str):
    return _dtype(name)


def _params_key(name: str) -> str:
    return lookup_dtype(name).name


def _params(hw, op_class: str, rate: str, ideal: bool) -> KernelParams:
    return IDEAL if ideal else params_for(hw, op_class, rate)


def gemm_time_s(m, n, k, dtype: str, hw, ideal: bool = False):
    """y[m, n] = x[m, k] W[k, n] with W stored in `dtype`."""
    if np.ndim(n) == 0 and np.ndim(k) == 0:  # the hot path: m varies, the matrix is fixed
        return gemm_times_s(m, [(float(n), float(k), dtype)], hw, ideal)[0]
    d = lookup_dtype(dtype)
    rate, peak = compute_rate(dtype, hw)
    act = d.bytes if rate in ("fp8", "fp4", "int8") else ACT_BYTES
    m, n, k = (np.asarray(a, dtype=float) for a in (m, n, k))
    flops = 2.0 * m * n * k
    bytes_ = m * k * act + k * n * d.streamed_bytes + m * n * ACT_BYTES
    params = IDEAL if ideal else _capped(params_for(hw, "gemm", _params_key(dtype)))
    return roofline_time_s(flops, bytes_, peak, hw.hbm_bandwidth_bytes_per_s, params, m, k,
                           1.0 if ideal else gemm_tile_factor(n))


def gemm_times_s(m, shapes, hw, ideal: bool = False) -> np.ndarray:
    """gemm_time_s of several weight matrices that see the same rows `m`, in one array pass:
    `shapes` is a sequence of (n, k, dtype); returns shape (len(shapes),) + m.shape. The
    formula of roofline_time_s with each matrix's scalar factors folded into columns,
    flops / (peak * e_max * m/(m+h) * kfac * tile) = 2nk (m + h) / (peak * e_max * kfac * tile);
    a step model prices a dozen projections per layer group in one pass instead of a dozen."""
    m = np.asarray(m, dtype=float)
    shapes = tuple(shapes)
    columns = _gemm_columns(shapes, hw, ideal)
    c, half, per_m, fixed, overhead, per_row = (
        col.reshape((-1,) + (1,) * m.ndim) for col in columns)
    t_compute = c * (m + half) * (m > 0)
    t_memory = m * per_m + fixed
    return np.maximum(t_compute, t_memory) + overhead + per_row * m


@lru_cache(maxsize=4096)
def _gemm_columns(shapes: tuple, hw, ideal: bool) -> tuple[np.ndarray, ...]:
    """Per-matrix factors of gemm_times_s (one entry per (n, k, dtype) of `shapes`); `ideal`:
    the floor (IDEAL, and no tile padding: only the useful FLOPs)."""
    cols = []
    for n, k, dtype in shapes:
        d = lookup_dtype(dtype)
        rate, peak = compute_rate(dtype, hw)
        act = d.bytes if rate in ("fp8", "fp4", "int8") else ACT_BYTES
        params = IDEAL if ideal else _capped(params_for(hw, "gemm", d.name))
        kfac = k / (k + params.half_k) if params.half_k else 1.0
        nn = max(n, 1.0)
        tile = 1.0 if ideal else nn / (math.ceil(nn / GEMM_TILE_N) * GEMM_TILE_N)
        c = 2.0 * n * k / (peak * params.compute_efficiency_max * kfac * tile)
        bw = hw.hbm_bandwidth_bytes_per_s * params.memory_efficiency
        cols.append((c, params.half_tokens, (k * act + n * ACT_BYTES) / bw,
                     k * n * d.streamed_bytes / bw, params.overhead_s, params.per_row_s))
    return tuple(np.array(col, float) for col in zip(*cols, strict=True))


def experts_touched(tokens, top_k, num_experts):
    """Expected distinct experts hit by `tokens` tokens each routed to top_k of num_experts
    (uniform routing): E (1 - (1 - k/E)^T), the expected number of occupied bins."""
    tokens = np.asarray(tokens, dtype=float)
    return num_experts * (1.0 - (1.0 - top_k / num_experts) ** tokens)


def moe_flops_bytes(tokens, hidden, inter, top_k, experts_per_gpu, moe_tp, ep, weight_bytes,
                    act_bytes, hot_load=1.0):
    """One MoE layer's routed-expert FLOPs and HBM bytes on one GPU (gated: gate+up, down).

    `tokens` are all tokens entering the layer in the EP group; with balanced routing this GPU
    computes tokens*top_k/ep token-expert pairs on its experts, each sharded 1/moe_tp;
    `hot_load` scales them to the busiest rank's (model.perf.expert_balance)."""
    tokens = np.asarray(tokens, dtype=float)
    num_experts = experts_per_gpu * ep
    pairs = tokens * top_k / ep * hot_load
    inter_local = inter / moe_tp
    flops = 2.0 * pairs * 3.0 * hidden * inter_local
    touched = experts_per_gpu * (1.0 - (1.0 - top_k / num_experts) ** tokens)
    weights = touched * 3.0 * hidden * inter_local * weight_bytes
    activations = pairs * (hidden * act_bytes + 2.0 * inter_local * ACT_BYTES
                           + hidden * ACT_BYTES)
    rows_per_expert = pairs / np.maximum(touched, 1e-9)
    return flops, weights + activations, rows_per_expert


def moe_time_s(tokens, hidden, inter, top_k, experts_per_gpu, moe_tp, ep, dtype: str, hw,
               ideal: bool = False, hot_load=1.0):
    """One MoE layer's routed-expert compute on one GPU (grouped GEMMs, routing excluded)."""
    d = lookup_dtype(dtype)
    rate, peak = compute_rate(dtype, hw)
    act = d.bytes if rate in ("fp8", "fp4", "int8") else ACT_BYTES
    flops, bytes_, rows = moe_flops_bytes(tokens, hidden, inter, top_k, experts_per_gpu, moe_tp,
                                          ep, d.bytes, act, hot_load)
    params = _params(hw, "moe", _params_key(dtype), ideal)
    # per_row_s: align / permute / masked-launch work over every token-expert pair entering the
    # layer (the fused kernels walk all of them, local expert or not)
    pairs = np.asarray(tokens, dtype=float) * top_k
    return roofline_time_s(flops, bytes_, peak, hw.hbm_bandwidth_bytes_per_s, params, rows,
                           row_count=pairs)


def memory_time_s(bytes_, hw, ideal: bool = False):
    """Streaming `bytes_` through HBM at the calibrated weight-streaming efficiency."""
    params = _params(hw, "memory", "bf16", ideal)
    return np.asarray(bytes_, dtype=float) / (hw.hbm_bandwidth_bytes_per_s
                                              * params.memory_efficiency)


# ---------------------------------------------------------------- attention (core only)

def mean_attended(new, context, window=None):
    """Mean number of keys each of the `new` causal queries attends to, the last at `context`."""
    new = np.maximum(np.asarray(new, dtype=float), 1.0)
    context = np.maximum(np.asarray(context, dtype=float), new)
    full = context - (new - 1.0) / 2.0
    if not window:
        return full
    w = float(window)
    first = context - new + 1.0
    partial = ((w + first) * (w - first + 1.0) / 2.0 + (context - w) * w) / new
    return np.where(context <= w, full, np.where(first >= w, w, partial))


def keys_read(new, context, window=None):
    """Cached entries a step must read per sequence (whole context, or window + chunk)."""
    context = np.asarray(context, dtype=float)
    if not window:
        return context
    return np.minimum(context, float(window) + np.asarray(new, dtype=float))


def entry_dims(attention) -> int:
    """Elements per cached entry per layer (all KV heads)."""
    if attention.kv_entry_dims:
        return int(attention.kv_entry_dims)
    if attention.kv_lora_rank:
        return int(attention.kv_lora_rank + (attention.qk_rope_head_dim or 0))
    return int(attention.num_kv_heads * (attention.head_dim + attention.v_head_dim))


def _indexer_counts(ix, b, n, scored, read_keys):
    """(flops, bytes) of an indexer scoring `scored` entries per query and reading `read_keys`
    cached index keys per sequence (bf16-equivalent FLOPs before INDEXER_RATE_FACTOR)."""
    return (2.0 * b * n * ix.num_heads * ix.head_dim * scored,
            b * read_keys * ix.head_dim * lookup_dtype(ix.cache_dtype).bytes)


def _softmax_counts(kind, phase, b, n, c, a, heads, kv_bytes, tp, qo_bytes):
    """gqa / swa / msa: plain KV entries; msa's indexer keeps top_k blocks."""
    kv_heads = max(1, -(-a.num_kv_heads // tp))
    per_entry = kv_heads * (a.head_dim + a.v_head_dim) * kv_bytes
    window = a.window if kind == "swa" else None
    att = mean_attended(n, c, window)
    read = keys_read(n, c, window)
    idx_flops = idx_bytes = 0.0
    if kind == "msa" and a.indexer is not None:
        idx_flops, idx_bytes = _indexer_counts(a.indexer, b, n, mean_attended(n, c), c)
        selected = float(a.indexer.top_k * a.indexer.block_size)
        att = np.minimum(att, selected)
        if phase == "decode":
            read = np.minimum(read, selected + n)
    eff_heads = heads
    if kind == "msa":  # the sparse kernel runs a KV group's heads as one >= 16-row tile
        group = -(-heads // kv_heads)
        eff_heads = kv_heads * max(group, MSA_GROUP_TILE)
    flops = 2.0 * b * n * eff_heads * (a.head_dim + a.v_head_dim) * att
    bytes_ = b * (read * per_entry + n * per_entry) + qo_bytes
    # decode kernels pack the query heads of a KV group into one tile; prefill tiles queries
    rows = n * heads / kv_heads if phase == "decode" else n
    return flops, bytes_, rows, idx_flops, idx_bytes


def _latent_up_flops(b, read, a, heads):
    """FLOPs of up-projecting `read` cached latents per sequence to per-head K (nope) and V: the
    expanded (prefill) MLA kernel's GEMM over the cached rows."""
    latent = a.kv_lora_rank or a.v_head_dim
    nope = a.head_dim - (a.qk_rope_head_dim or 0)
    return 2.0 * b * read * latent * heads * (nope + a.v_head_dim)


def _latent_counts(kind, phase, b, n, c, a, heads, kv_bytes, qo_bytes):
    """mla / dsa: compressed latent entries; dsa's indexer keeps top_k tokens."""
    dims = entry_dims(a)
    latent = a.kv_lora_rank or a.v_head_dim
    att = mean_attended(n, c)
    read = c
    idx_flops = idx_bytes = 0.0
    if kind == "dsa" and a.indexer is not None:
        idx_flops, idx_bytes = _indexer_counts(a.indexer, b, n, att, c)
        att = np.minimum(att, float(a.indexer.top_k))
        if phase == "decode":  # prefill queries jointly touch the whole context
            read = np.minimum(c, float(a.indexer.top_k) + n)
    if phase == "decode":  # weight-absorbed: MQA over the latent (576 qk, 512 v)
        flops = 2.0 * b * n * heads * (dims + latent) * att
        rows = n * heads
    else:  # expanded: per-head nope+rope / v dims, plus up-projecting the cached latents
        flops = (2.0 * b * n * heads * (a.head_dim + a.v_head_dim) * att
                 + _latent_up_flops(b, read, a, heads))
        rows = n
    bytes_ = b * (read + n) * dims * kv_bytes + qo_bytes
    return flops, bytes_, rows, idx_flops, idx_bytes


def _compressed_counts(kind, b, n, c, a, heads, kv_bytes, qo_bytes):
    """csa / hca: compressed entries plus a local window; csa's indexer gathers top_k entries
    per query (token-level sparse)."""
    dims = entry_dims(a)
    ratio = float(a.compress_ratio or 1)
    window = a.window or 0
    att_local = mean_attended(n, c, window) if window else 0.0
    att_comp = mean_attended(n, c) / ratio
    read_comp = c / ratio
    idx_flops = idx_bytes = 0.0
    if kind == "csa" and a.indexer is not None:
        idx_flops, idx_bytes = _indexer_counts(a.indexer, b, n, att_comp, read_comp)
        att_comp = np.minimum(att_comp, float(a.indexer.top_k))
        read_comp = n * att_comp
    att = att_comp + att_local
    read = read_comp + (keys_read(n, c, window) if window else 0.0)
    # FlashMLA-style sparse kernels tile 64 query heads per CTA: fewer heads are padded
    padded = -(-heads // SPARSE_HEAD_TILE) * SPARSE_HEAD_TILE
    flops = 2.0 * b * n * padded * (a.head_dim + a.v_head_dim) * att
    bytes_ = b * (read + n) * dims * kv_bytes + qo_bytes
    return flops, bytes_, n * heads, idx_flops, idx_bytes


def _linear_counts(phase, b, n, a, heads, tp):
    """linear: a fixed recurrent state per sequence. Per token: decay + rank-1 delta update +
    readout ~ 6 flops per state element, plus (prefill, chunked form) intra-chunk attention
    over LINEAR_CHUNK tokens."""
    state = float(a.state_elements)
    flops = 6.0 * b * n * state / tp
    if phase == "prefill":
        flops = flops + 4.0 * b * n * LINEAR_CHUNK * heads * (a.head_dim + a.v_head_dim)
    io = b * n * 4.0 * heads * a.head_dim * ACT_BYTES  # q, k, v, gate in; o out ~ 4 vectors
    bytes_ = b * (2.0 * state * STATE_BYTES + 2.0 * a.conv_elements * ACT_BYTES) / tp + io
    return flops, bytes_, n, 0.0, 0.0


def attention_flops_bytes(kind: str, phase: str, batch, new_tokens, context_tokens, attention,
                          kv_bytes: float, tp: int = 1):
    """(flops, hbm bytes, rows m) of core attention for one layer on one GPU."""
    b = np.asarray(batch, dtype=float)
    n = np.asarray(new_tokens, dtype=float)
    c = np.maximum(np.asarray(context_tokens, dtype=float), n)
    a = attention
    heads = -(-a.num_heads // tp)
    qo_bytes = b * n * heads * (a.head_dim + a.v_head_dim) * ACT_BYTES
    if kind in ("gqa", "swa", "msa"):
        counts = _softmax_counts(kind, phase, b, n, c, a, heads, kv_bytes, tp, qo_bytes)
    elif kind in ("mla", "dsa"):
        counts = _latent_counts(kind, phase, b, n, c, a, heads, kv_bytes, qo_bytes)
    elif kind in ("csa", "hca"):
        counts = _compressed_counts(kind, b, n, c, a, heads, kv_bytes, qo_bytes)
    elif kind == "linear":
        counts = _linear_counts(phase, b, n, a, heads, tp)
    else:
        raise Infeasible(f"attention kind {kind!r} unknown; allowed: "
                         f"{', '.join(ATTENTION_FAMILY)}")
    flops, bytes_, rows, idx_flops, idx_bytes = counts
    if a.indexer is not None:
        idx_flops = idx_flops * INDEXER_RATE_FACTOR.get(lookup_dtype(a.indexer.cache_dtype).rate,
                                                        1.0)
    return flops + idx_flops, bytes_ + idx_bytes, rows


def serial_walk_s(kind: str, batch, new_tokens, context_tokens, attention, tp: int = 1):
    """Seconds one program of vLLM's Triton unified attention takes to walk a sequence's cached
    keys tile by tile, where the kernel runs its 2D path (a query length over 1, or more
    sequences per rank than its 3D grid takes): the decode kernel cannot end sooner
    (model.specs.defaults.TRITON_2D_TILE_S). 0 where it splits the context (3D), and for kinds
    that run their own kernels (latent, sparse, linear attention)."""
    b = np.asarray(batch, dtype=float)
    if ATTENTION_FAMILY.get(kind) != "gqa":
        return np.zeros_like(b)
    n = np.asarray(new_tokens, dtype=float)
    kv_heads = max(1, -(-attention.num_kv_heads // tp))
    two_d = (n > 1.0) | (b > TRITON_3D_MAX_GRID // kv_heads)
    window = attention.window if kind == "swa" else None
    tiles = np.ceil(keys_read(n, context_tokens, window) / TRITON_2D_TILE_TOKENS)
    return np.where(two_d & (b > 0), tiles * TRITON_2D_TILE_S, 0.0)


def attention_time_s(kind: str, phase: str, batch, new_tokens, context_tokens, attention,
                     kv_dtype: str, hw, tp: int = 1, ideal: bool = False):
    """Core attention (no projections) of one layer on one GPU, for `batch` sequences each
    adding `new_tokens` queries (decode: 1) at `context_tokens` total length."""
    if kind not in ATTENTION_FAMILY:
        raise Infeasible(f"attention kind {kind!r} unknown; allowed: "
                         f"{', '.join(ATTENTION_FAMILY)}")
    if phase not in PHASES:
        raise Infeasible(f"attention phase {phase!r} unknown; allowed: prefill, decode")
    kv = lookup_dtype(kv_dtype)
    flops, bytes_, rows = attention_flops_bytes(kind, phase, batch, new_tokens, context_tokens,
                                                attention, kv.bytes, tp)
    params = _params(hw, f"attention.{ATTENTION_FAMILY[kind]}.{phase}", kv.name, ideal)
    if phase == "prefill" and ATTENTION_FAMILY[kind] == "mla":
        # the cached latents' up-projection runs as a GEMM over the context's rows, not the new
        # ones: its FLOPs take the efficiency at the context (the same where nothing is cached,
        # as in every fitted mla_context sample)
        m = np.maximum(np.asarray(new_tokens, dtype=float), 1e-9)
        c = np.maximum(np.asarray(context_tokens, dtype=float), m)
        up = _latent_up_flops(np.asarray(batch, dtype=float), c, attention,
                              -(-attention.num_heads // tp))
        flops = flops - up * (1.0 - params.compute_efficiency(m) / params.compute_efficiency(c))
    queries = np.asarray(batch, dtype=float) * np.asarray(new_tokens, dtype=float)
    return roofline_time_s(flops, bytes_, hw.peak("bf16"), hw.hbm_bandwidth_bytes_per_s,
                           params, rows, row_count=queries)
