"""Attention "module" tables (MLA, DeepSeek V4 CSA / HCA, MiniMax M3 MSA): the whole attention
block timed at once, projections included.

A row names its model (`model`, an id of data/architectures/) and the query heads one GPU runs
(`num_heads`). The module's shapes come from that model's architecture, read by the same loader
as everything else (`model.specs.architecture`): the first layer of the table's attention kind,
cut to `num_heads` of its query heads. Its projections are predicted with the chip's fitted
GEMM curve, a fitted `module_overhead_s` absorbs norms / rope / quantization launches, and only
the core-attention parameters are kept for `model.perf.roofline.attention_time_s`.

How a module runs `h` of the model's `H` query heads on one GPU (tensor parallelism, as the
tables' `tp_size` says), per projection of the layer:
- per query head on the output side (column parallel: q, q_b, kv_b, wq_b, wo_a): out x h / H
  (wo_a's o_groups block-diagonal copies: o_groups x h / H of them, at least one);
- per query head on the input side (row parallel: o_proj, wo_b): in x h / H;
- per KV head (k_proj, v_proj): whole heads, max(1, kv_heads x h / H) of them;
- everything else whole (latent down-projections, compressors, indexers).
Projections that read the same input run as one GEMM (`FUSED`). The DeepSeek V4 modules were
measured with 8-bit index keys (the tables' `kv_cache_dtype`, fp8): their indexer takes it.
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

import numpy as np

from model.fit.kernel_tables import (
    DTYPE,
    Samples,
    attention_rows,
    best_kernel,
    chip_spec,
    gemm_operands,
    query_tokens,
    shape_groups,
    table,
)
from model.perf import roofline
from model.perf.kernels import KernelParams
from model.specs.architecture import load_architecture
from model.specs.layers import Attention

MODULE_TABLES = {"mla": ("mla_context", "mla_generation"),
                 "csa": ("dsv4_csa_context", "dsv4_csa_generation"),
                 "hca": ("dsv4_hca_context", "dsv4_hca_generation"),
                 "msa": ("msa_context", "msa_generation")}

# Projection (its name after the attention prefix) -> how it is split over query heads.
SPLIT = {"q_proj": "heads_out", "q_b_proj": "heads_out", "kv_b_proj": "heads_out",
         "wq_b": "heads_out", "wo_a": "heads_out", "o_proj": "heads_in", "wo_b": "heads_in",
         "k_proj": "kv_heads_out", "v_proj": "kv_heads_out"}
# Projections the measured modules run as one GEMM: (first, second) -> the first's position.
FUSED = {"v_proj": "k_proj", "index_k_proj": "index_q_proj",
         "compressor.wgate": "compressor.wkv",
         "indexer.compressor.wgate": "indexer.compressor.wkv"}


def _gemm_shape(att: Attention, local: str, lin, h: int) -> tuple[int, int]:
    """(n, k) of one projection on a GPU that runs `h` of the layer's query heads."""
    heads, kv = att.num_heads, att.num_kv_heads
    split = SPLIT.get(local)
    if split == "heads_out" and lin.count > 1:
        return lin.out_features * max(1, lin.count * h // heads), lin.in_features
    if split == "heads_out":
        return lin.out_features * h // heads, lin.in_features
    if split == "heads_in":
        return lin.out_features, lin.in_features * h // heads
    if split == "kv_heads_out":
        return lin.out_features // kv * max(1, kv * h // heads), lin.in_features
    return lin.out_features * lin.count, lin.in_features


def module_shapes(att: Attention, h: int) -> list[tuple[int, int]]:
    """GEMM shapes (n, k) of a layer's attention projections with `h` query heads per GPU, in
    the layer's order, fused pairs as one."""
    shapes: dict[str, tuple[int, int]] = {}
    for lin in att.projections:
        local = lin.name.split(".", 1)[1]
        n, k = _gemm_shape(att, local, lin, h)
        if local in FUSED:
            first = FUSED[local]
            n0, k0 = shapes[first]
            if k0 != k:
                raise ValueError(f"fused {first} and {local} read different widths")
            shapes[first] = (n0 + n, k)
        else:
            shapes[local] = (n, k)
    return list(shapes.values())


@lru_cache(maxsize=256)
def module_config(family: str, model: str, h: int,
                  kv_dtype: str) -> tuple[Attention, tuple[tuple[int, int], ...]]:
    """(core Attention with `h` query heads, projection GEMM shapes) of the first `family`
    attention layer of `model` (an id of data/architectures/)."""
    arch = load_architecture(model)
    att = next(layer.attention for layer in arch.main_layers if layer.attention.kind == family)
    shapes = tuple(module_shapes(att, h))
    indexer = att.indexer
    if indexer is not None and family in ("csa", "hca"):
        indexer = replace(indexer, cache_dtype=kv_dtype)
    core = replace(att, num_heads=h, num_kv_heads=max(1, att.num_kv_heads * h // att.num_heads),
                   projections=(), indexer=indexer)
    return core, shapes


def projection_time_s(gemm: KernelParams, peak_flops_per_s: float, bandwidth_bytes_per_s: float,
                      tokens, shapes, weight_bytes: float, act_bytes: float):
    """Projections of an attention module as GEMMs on the chip's fitted curve, without the
    per-call overheads (a module runs them back to back; module_overhead_s absorbs launches)."""
    lean = replace(gemm, overhead_s=0.0, per_row_s=0.0)
    total = 0.0
    for n, k in shapes:
        flops = 2.0 * tokens * n * k
        hbm_bytes = tokens * k * act_bytes + n * k * weight_bytes + tokens * n * roofline.ACT_BYTES
        total = total + roofline.roofline_time_s(flops, hbm_bytes, peak_flops_per_s,
                                                 bandwidth_bytes_per_s, lean, tokens, k,
                                                 roofline.gemm_tile_factor(n))
    return total


def module_samples(chip: str, family: str, phase: str, kv_dtype: str, gemm_fits: dict) -> Samples:
    """Whole-module rows: core attention (fitted here) + projections (chip's GEMM curve)."""
    hw = chip_spec(chip)
    df = table(chip, MODULE_TABLES[family][0 if phase == "prefill" else 1])
    df = df[df.kv_cache_dtype.map(DTYPE) == kv_dtype]
    df = best_kernel(df, ["model", "gemm_type", "num_heads", "batch_size", "isl", "step"])
    b, new, ctx = query_tokens(df, phase, step_is_context=True)
    extra = np.zeros(len(df))
    configs = [(module_config(family, model, int(h), kv_dtype)[0], kv_dtype)
               for model, h in zip(df.model, df.num_heads, strict=True)]
    for (model, gemm_type, h), idx in df.groupby(["model", "gemm_type", "num_heads"]).indices.items():
        shapes = module_config(family, model, int(h), kv_dtype)[1]
        gname = DTYPE[gemm_type]
        weight, act, peak = gemm_operands(gname, hw)
        gfit = gemm_fits.get(gname) or gemm_fits.get("fp8_block") or gemm_fits["bf16"]
        extra[idx] = projection_time_s(gfit, peak, hw.hbm_bandwidth_bytes_per_s,
                                       b[idx] * new[idx], shapes, weight, act)
    f, by, r = attention_rows(family, phase, configs, b, new, ctx)
    # per_row_s: the per-query work a module does whatever the context (rope, quantizing the
    # new KV, the compressor's pooling, output scaling); without it the fit explains that time
    # as attention FLOPs at a low efficiency, which grows too fast with context
    return Samples(f, by, r, hw.peak("bf16"), hw.hbm_bandwidth_bytes_per_s, extra,
                   df.latency.to_numpy() * 1e-3,
                   shape_groups(df, ["model", "gemm_type", "num_heads"]),
                   fit_module_overhead=True, row_count=b * new)
