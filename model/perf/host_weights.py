"""Weights kept in host memory and read over the host link on every forward pass (vLLM
`--cpu-offload-gb`).

vLLM's offloader for `--cpu-offload-gb` is the UVA one (vllm/model_executor/offloader/base.py,
create_offloader: backend "auto" picks it when cpu_offload_gb > 0). As `make_layers` builds the
decoder layers in order, it moves each parameter to pinned host memory until the per-GPU budget
is spent (vllm/model_executor/offloader/uva.py, _maybe_offload_to_cpu), and leaves a zero-copy
device view in its place. The GPU's kernels then read those weights across the host link on
every forward pass. So:

- the first decoder layers of each pipeline stage live in host memory, whole; the layer where
  the budget runs out is split by parameter, counted here by its share of bytes;
- a step reads, from each of those layers, what its kernels touch: every dense projection, and
  the routed experts the step's tokens hit (model.perf.roofline.experts_touched);
- those bytes cross the host link at the DMA rate the KV tiers use
  (HOST_DMA_EFFICIENCY; that zero-copy kernel loads reach it is an assumption),
  in series with the step's kernels, which wait on them;
- the HBM the weights leave is the KV pool's.

Embeddings, the LM head and a draft model's layers are built outside the offloaded layer stack
and stay in HBM.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from model.perf.ops import grouped_layers, layer_signature
from model.perf.parallel import ParallelPlan, linear_shard
from model.perf.roofline import experts_touched
from model.specs.dtypes import dtype as lookup_dtype
from model.specs.layers import Architecture, Layer

GIB = 1024 ** 3
# Share of the host link's per-direction rate a transfer reaches: ~50 of 64 GB/s on PCIe Gen5 x16
# (H100), vLLM's OffloadingConnector copying packed KV blocks (vLLM blog "Inside vLLM's New KV
# Offloading Connector"). The KV tiers (model.perf.tiers) use it too.
HOST_DMA_EFFICIENCY = 50.0 / 64.0


@dataclass(frozen=True)
class HostWeights:
    """Per-GPU weights in host memory: `layers[i]` of the i-th (layer, count) group of
    `grouped_layers(arch.main_layers)` (fractional where the budget ends inside a layer), and
    their bytes."""

    layers: tuple[float, ...]
    bytes_per_gpu: float

    def read_s(self, groups, plan: ParallelPlan, hw, tokens_group, has_tokens) -> np.ndarray:
        """Seconds one step waits on the host link: the offloaded layers' dense weights and the
        experts `tokens_group` tokens (the tokens each MoE layer's group sees) touch."""
        read = 0.0 * np.asarray(tokens_group, float)
        for (layer, _), n in zip(groups, self.layers, strict=True):
            if n <= 0:
                continue
            dense, routed = layer_bytes_per_gpu(layer, plan)
            ex = layer.mlp.experts
            share = 0.0 if ex is None else experts_touched(
                tokens_group, ex.top_k, ex.num_experts) / ex.num_experts
            read = read + n * (dense + routed * share)
        bandwidth = hw.host_link_bandwidth_bytes_per_s * HOST_DMA_EFFICIENCY
        return np.where(has_tokens, read / bandwidth, 0.0)


NO_HOST_WEIGHTS = HostWeights((), 0.0)


def layer_bytes_per_gpu(layer: Layer, plan: ParallelPlan) -> tuple[float, float]:
    """(dense, routed-expert) weight bytes of one decoder layer on one GPU under `plan`, as
    model.perf.parallel.weight_bytes_per_gpu shards them."""
    dense = sum(lin.params * lookup_dtype(lin.dtype).bytes / linear_shard(lin, plan)
                for lin in layer.attention.projections + layer.mlp.projections)
    ex = layer.mlp.experts
    if ex is None:
        return dense, 0.0
    copies = (ex.num_experts + plan.redundant_experts) / ex.num_experts
    return dense, ex.params * lookup_dtype(ex.dtype).bytes * copies / (plan.moe_tp * plan.ep)


def host_weights(arch: Architecture, plan: ParallelPlan, groups, budget_gib: float
                 ) -> HostWeights:
    """The layers `budget_gib` GiB per GPU moves to host memory: in each pipeline stage (the
    decoder layers split in pp contiguous runs), its first layers until the budget is spent."""
    if budget_gib <= 0:
        return NO_HOST_WEIGHTS
    index = {layer_signature(layer): i for i, (layer, _) in enumerate(groups)}
    counts = [0.0] * len(groups)
    total = 0.0
    for stage in np.array_split(np.arange(len(arch.main_layers)), plan.pp):
        left = budget_gib * GIB
        for j in stage:
            layer = arch.main_layers[int(j)]
            size = sum(layer_bytes_per_gpu(layer, plan))
            if left <= 0 or size <= 0:
                break
            moved = min(size, left)
            counts[index[layer_signature(layer)]] += moved / size
            left -= moved
            total += moved
    return HostWeights(tuple(counts), total / plan.pp)


def offloaded_bytes_per_gpu(arch: Architecture, plan: ParallelPlan, budget_gib: float) -> float:
    """Weight bytes per GPU that `budget_gib` moves out of HBM (what the KV pool gains)."""
    if budget_gib <= 0:
        return 0.0
    return host_weights(arch, plan, grouped_layers(arch.main_layers), budget_gib).bytes_per_gpu
