"""Parameter counts and weight bytes of an Architecture.

Conventions (stated because publishers differ):
- `total` counts the main stack, the embedding table and the LM head (once when tied); MTP /
  draft layers are excluded (DeepSeek V3's 671B excludes its 14B MTP module; the HF card's
  685B includes it). `total_with_mtp` adds them.
- `active` counts what one token touches in the main stack: attention, dense MLPs, shared
  experts, routers and top_k routed experts, plus the LM head; the input embedding is a table
  lookup, not a matmul, and is left out (gpt-oss-120b card: 5.1B active; this convention gives
  5.13B, with the embedding 5.71B). `active_with_embedding` adds it (Qwen and Meta count it).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from model.specs.dtypes import dtype
from model.specs.layers import Architecture, Layer, Linear


@dataclass(frozen=True)
class ParamCounts:
    total: int
    active: int
    embedding: int  # input embedding table (the LM head is in by_component["lm_head"])
    by_component: dict[str, int] = field(default_factory=dict)
    total_with_mtp: int = 0
    active_with_embedding: int = 0


def _layer_components(layer: Layer) -> dict[str, int]:
    mlp = layer.mlp
    out = {"attention": layer.attention.params, "norms_and_mixers": layer.extra_params}
    if mlp.experts is not None:
        out["routed_experts"] = mlp.experts.params
        shared = sum(p.params for p in mlp.projections if "shared" in p.name)
        router = sum(p.params for p in mlp.projections if p.name.endswith(("gate", "router")))
        out["shared_experts"] = shared
        out["routers"] = router
        out["moe_other"] = mlp.params - mlp.experts.params - shared - router
    else:
        out["dense_mlp"] = mlp.params
    return out


def parameter_counts(arch: Architecture) -> ParamCounts:
    by: dict[str, int] = {}
    active = 0
    for layer in arch.main_layers:
        for key, value in _layer_components(layer).items():
            by[key] = by.get(key, 0) + value
        active += layer.attention.params + layer.mlp.active_params + layer.extra_params
    embedding = arch.embedding.params
    head = 0 if arch.tie_word_embeddings else arch.lm_head.params
    by["embedding"] = embedding
    by["lm_head"] = head
    mtp = sum(layer.attention.params + layer.mlp.params + layer.extra_params
              for layer in arch.mtp_layers)
    by = {k: v for k, v in by.items() if v}
    if mtp:
        by["mtp"] = mtp
    total = sum(v for k, v in by.items() if k != "mtp")
    # the LM head is a matmul every token pays even when its weights are the embedding table
    active_head = arch.lm_head.params
    return ParamCounts(total=total, active=active + active_head, embedding=embedding,
                       by_component=by, total_with_mtp=total + mtp,
                       active_with_embedding=active + active_head + (0 if arch.tie_word_embeddings
                                                                     else embedding))


def linear_bytes(linear: Linear) -> float:
    return linear.params * dtype(linear.dtype).bytes


def layer_weight_bytes(layer: Layer) -> float:
    """Stored bytes of one layer: each Linear and the routed experts at their own format; norms
    and mixers at bf16."""
    mlp = layer.mlp
    out = sum(linear_bytes(p) for p in layer.attention.projections + mlp.projections)
    if mlp.experts is not None:
        out += mlp.experts.params * dtype(mlp.experts.dtype).bytes
    return out + layer.extra_params * 2.0


def weight_bytes(arch: Architecture, include_mtp: bool = False) -> float:
    """Checkpoint bytes of the served weights (scale overheads included via model.specs.dtypes)."""
    layers = arch.layers if include_mtp else arch.main_layers
    out = sum(layer_weight_bytes(layer) for layer in layers) + linear_bytes(arch.embedding)
    if not arch.tie_word_embeddings:
        out += linear_bytes(arch.lm_head)
    return out


def weight_bytes_by_dtype(arch: Architecture) -> dict[str, float]:
    """Main-stack weight bytes grouped by storage format (embedding and head included)."""
    out: dict[str, float] = {}

    def add(fmt: str, params: int) -> None:
        out[fmt] = out.get(fmt, 0.0) + params * dtype(fmt).bytes

    for layer in arch.main_layers:
        for p in layer.attention.projections + layer.mlp.projections:
            add(p.dtype, p.params)
        if layer.mlp.experts is not None:
            add(layer.mlp.experts.dtype, layer.mlp.experts.params)
        add("bf16", layer.extra_params)
    add(arch.embedding.dtype, arch.embedding.params)
    if not arch.tie_word_embeddings:
        add(arch.lm_head.dtype, arch.lm_head.params)
    return out
