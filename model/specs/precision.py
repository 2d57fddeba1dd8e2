"""Serving formats of a checkpoint: which weights (and side caches) run in which number format.

A precision is either one format name, applied to every GEMM weight (projections and routed
experts; `--precision fp8`), or a scheme of `part=format` pairs separated by commas, for the
checkpoints that quantize only part of the model, such as NVIDIA's experts-only NVFP4 exports
(`experts=nvfp4,indexer_cache=fp8`). Parts:

- `gemm`: every projection and the routed experts (what a bare format name means);
- `experts`: the routed experts and the shared-expert projections of MoE layers (ModelOpt's
  experts-only recipes), attention and dense MLPs keep the checkpoint's format;
- `indexer_cache`: the cached index keys of sparse-attention indexers (vLLM / TensorRT-LLM
  `indexer_kv_dtype`).

Routers and other small side paths keep their dtype, as vLLM's quantized checkpoints do.
"""

from __future__ import annotations

from dataclasses import replace

from model.specs.dtypes import dtype as lookup_dtype
from model.specs.errors import ServecastError
from model.specs.layers import Architecture, Experts, Layer, Linear

PARTS = ("gemm", "experts", "indexer_cache")
_KEEP_BF16 = ("router", "gate_router", "indexer", "compressor", "hc_")
_SHARED_EXPERT = ("shared_expert", "share_expert")


def parse_precision(precision: str | None) -> dict[str, str]:
    """{part: format} of a precision string (see the module docstring); {} for None."""
    if not precision:
        return {}
    text = str(precision).strip()
    if "=" not in text:
        lookup_dtype(text)
        return {"gemm": text}
    out: dict[str, str] = {}
    for item in text.split(","):
        part, sep, fmt = (s.strip() for s in item.partition("="))
        if not sep or part not in PARTS or not fmt:
            raise ServecastError(f"precision {precision!r}: {item.strip()!r} is not part=format; "
                                 f"parts: {', '.join(PARTS)}")
        lookup_dtype(fmt)
        out[part] = fmt
    return out


def with_precision(arch: Architecture, precision: str | None,
                   moe_precision: str | None = None) -> Architecture:
    """`arch` with its weights (and index-key cache) re-typed per `precision`; `moe_precision`
    re-types the routed experts on top of it."""
    parts = parse_precision(precision)
    if moe_precision:
        lookup_dtype(moe_precision)
        parts["moe"] = moe_precision
    if not parts:
        return arch
    gemm, experts = parts.get("gemm"), parts.get("experts")
    routed = parts.get("moe") or experts or gemm
    index = parts.get("indexer_cache")

    def lin(x: Linear) -> Linear:
        if any(k in x.name for k in _KEEP_BF16):
            return x
        if experts and any(k in x.name for k in _SHARED_EXPERT):
            return replace(x, dtype=experts)
        return replace(x, dtype=gemm) if gemm else x

    def layer(ly: Layer) -> Layer:
        att = replace(ly.attention, projections=tuple(lin(p) for p in ly.attention.projections))
        if index and att.indexer is not None:
            att = replace(att, indexer=replace(att.indexer, cache_dtype=index))
        ex = ly.mlp.experts
        mlp = replace(ly.mlp, projections=tuple(lin(p) for p in ly.mlp.projections),
                      experts=replace(ex, dtype=routed) if isinstance(ex, Experts) and routed
                      else ex)
        return replace(ly, attention=att, mlp=mlp)

    return replace(arch, layers=tuple(layer(ly) for ly in arch.layers),
                   weight_dtype=gemm or arch.weight_dtype)
