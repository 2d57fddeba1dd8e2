"""HBM budget of one GPU: weights, activations, runtime reserve, and the KV pool left over; how
many sequences that pool holds at a context, under vLLM's hybrid allocator or static partitions.

Budget (vLLM `--gpu-memory-utilization`, default 0.9): everything the engine allocates must fit
in utilization x HBM; the KV pool is what remains after weights, the activation peak of a
`max_num_batched_tokens` forward pass, and the runtime reserve (CUDA context, CUDA graphs, NCCL
buffers).

Allocators (vLLM docs/design/hybrid_kv_cache_manager.md):
- `hybrid`: one block pool, one page size. The page is the largest per-layer block any KV spec
  needs at the base block size; every other spec scales its block (in tokens or compressed
  entries) up to fill the page, and a linear-attention state takes one page per layer (attention
  blocks grow past the base size when the state is larger, as vLLM does). Full attention holds
  ceil(L/B) pages, a window only the pages overlapping its last `window` tokens.
- `static`: the window-unaware baseline (vLLM before the hybrid manager, or with
  --disable-hybrid-kv-cache-manager): every spec in exact-size blocks of its own, but window
  layers keep every block like full attention.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from model.perf.host_weights import offloaded_bytes_per_gpu
from model.perf.kv import entry_bytes, indexer_key_bytes, state_bytes
from model.perf.ops import grouped_layers
from model.perf.parallel import ParallelPlan, index_key_shard, kv_shard, normalize_plan
from model.perf.parallel import weight_bytes_per_gpu as sharded_weight_bytes
from model.specs.defaults import GPU_MEMORY_UTILIZATION, MAX_NUM_BATCHED_TOKENS, MAX_NUM_SEQS
from model.specs.dtypes import dtype
from model.specs.errors import Infeasible, ServecastError
from model.specs.layers import Architecture, Attention

BASE_BLOCK_TOKENS = 16  # vLLM default block size for CUDA attention backends
# Runtime reserve (assumed, not fitted; typical vLLM start-up logs): CUDA context and allocator
# slack ~0.5 GiB, CUDA graph pool ~1 GiB, ~0.5 GiB of NCCL buffers per communicator.
CUDA_CONTEXT_BYTES = 0.5 * 2**30
CUDA_GRAPH_BYTES = 1.0 * 2**30
NCCL_BYTES_PER_GROUP = 0.5 * 2**30
ALLOCATORS = ("hybrid", "static")
SINGLE_GPU = ParallelPlan()


@dataclass(frozen=True)
class KVSpec:
    """One kind of cached unit of one set of identical layers, on one GPU."""

    name: str  # e.g. "gqa", "swa", "csa.compressed", "csa.window", "linear"
    layers: float  # layers of this spec held by one GPU (after pipeline split)
    unit_bytes: float  # bytes per cached unit (token or compressed entry) per layer, per GPU
    unit_tokens: int  # tokens per unit (compress ratio; 1 for plain tokens)
    window: int | None = None  # sliding window in tokens (window specs)
    state_bytes: float = 0.0  # fixed bytes per sequence per layer, per GPU (linear state)

    def units(self, context_tokens: np.ndarray) -> np.ndarray:
        if self.unit_tokens > 1:
            return np.floor(context_tokens / self.unit_tokens)
        return context_tokens


@lru_cache(maxsize=1024)
def kv_specs(arch: Architecture, plan: ParallelPlan = SINGLE_GPU, kv_dtype: str | None = None,
             indexer_dtype: str | None = None) -> tuple[KVSpec, ...]:
    """The KV specs of one GPU's share of the main layers (MTP excluded); pure in its frozen
    inputs, so memoized (a deployment search asks for every plan's)."""
    fmt = kv_dtype or arch.default_kv_dtype
    counts: dict[Attention, int] = {}
    for layer, n in grouped_layers(arch.main_layers):
        counts[layer.attention] = counts.get(layer.attention, 0) + n
    specs: list[KVSpec] = []
    for att, count in counts.items():
        layers = count / plan.pp
        shard = kv_shard(att, plan)
        if att.kind == "linear":
            specs.append(KVSpec("linear", layers, 0.0, 1, state_bytes=state_bytes(att) / shard))
            continue
        entry = entry_bytes(att, fmt) / shard
        key = indexer_key_bytes(att.indexer, fmt, indexer_dtype) / index_key_shard(plan) \
            if att.indexer else 0.0
        if att.kind in ("gqa", "mla", "dsa", "msa"):
            specs.append(KVSpec(att.kind, layers, entry + key, 1))
        elif att.kind == "swa":
            specs.append(KVSpec("swa", layers, entry, 1, window=att.window))
        elif att.kind in ("csa", "hca"):
            specs.append(KVSpec(f"{att.kind}.compressed", layers, entry + key, att.compress_ratio))
            if att.window:
                specs.append(KVSpec(f"{att.kind}.window", layers, entry, 1, window=att.window))
            # the compressor's rolling residual is registered as sliding-window KV (vLLM DSV4
            # blog): coff*ratio tokens of fp32 state (coff = 2 for overlapping ratio-4 windows)
            residual = state_bytes(att) / shard
            if residual:
                tokens = (2 if att.compress_ratio == 4 else 1) * att.compress_ratio
                specs.append(KVSpec(f"{att.kind}.residual", layers, residual / tokens, 1,
                                    window=tokens))
        else:
            raise ServecastError(f"attention kind {att.kind!r} has no KV layout")
    return tuple(_merge(specs))


def _merge(specs: list[KVSpec]) -> list[KVSpec]:
    """Identical specs from different Attention objects become one (layers added)."""
    out: dict[tuple, KVSpec] = {}
    for s in specs:
        key = (s.name, s.unit_bytes, s.unit_tokens, s.window, s.state_bytes)
        if key in out:
            prev = out[key]
            out[key] = KVSpec(s.name, prev.layers + s.layers, s.unit_bytes, s.unit_tokens,
                              s.window, s.state_bytes)
        else:
            out[key] = s
    return list(out.values())


def _blocks(spec: KVSpec, context_tokens: np.ndarray, block_units: float) -> np.ndarray:
    """Blocks one layer of this spec holds for a sequence of `context_tokens`."""
    if spec.unit_bytes == 0:
        return np.ones_like(context_tokens)  # linear state: one page
    if spec.window is not None:
        block_tokens = block_units * spec.unit_tokens
        first = np.maximum(context_tokens - spec.window, 0) // block_tokens
        last = np.maximum(context_tokens - 1, 0) // block_tokens
        return np.where(context_tokens > 0, last - first + 1, 0)
    return np.ceil(spec.units(context_tokens) / block_units)


def page_layout(specs: tuple[KVSpec, ...], block_size: int = BASE_BLOCK_TOKENS) -> tuple[float, dict]:
    """Hybrid allocator: (page bytes, units per block for each spec name)."""
    need = [s.unit_bytes * block_size + s.state_bytes if s.unit_bytes else s.state_bytes
            for s in specs]
    page = max(need) if need else 0.0
    units = {}
    for s in specs:
        if s.unit_bytes == 0:
            units[s.name] = 1.0
            continue
        # scale the block up in multiples of the base size while it still fits the page
        fit = (page - s.state_bytes) / s.unit_bytes
        units[s.name] = max(block_size, math.floor(fit / block_size) * block_size)
    return page, units


def hybrid_sequence_bytes(specs: tuple[KVSpec, ...], context_tokens,
                          block_size: int = BASE_BLOCK_TOKENS):
    """Bytes one sequence occupies in the hybrid pool (whole pages), per GPU."""
    ctx = np.asarray(context_tokens, dtype=float)
    page, units = page_layout(specs, block_size)
    pages = sum(s.layers * _blocks(s, ctx, units[s.name]) for s in specs)
    return pages * page


def exact_sequence_bytes(specs: tuple[KVSpec, ...], context_tokens,
                         block_size: int = BASE_BLOCK_TOKENS,
                         by_spec: bool = False, free_windows: bool = True):
    """Bytes one sequence needs with each spec in its own exact-size blocks. With
    free_windows=False a window layer keeps every block, as a window-unaware allocator does."""
    ctx = np.asarray(context_tokens, dtype=float)
    parts = {}
    for s in specs:
        if s.unit_bytes == 0:
            parts[s.name] = s.layers * s.state_bytes + 0 * ctx
            continue
        spec = s if free_windows else KVSpec(s.name, s.layers, s.unit_bytes, s.unit_tokens)
        parts[s.name] = s.layers * (_blocks(spec, ctx, block_size) * block_size * s.unit_bytes
                                    + s.state_bytes)
    return parts if by_spec else sum(parts.values())


def unpadded_sequence_bytes(specs: tuple[KVSpec, ...], context_tokens):
    """Bytes with no block rounding at all: the floor every layout pads above."""
    ctx = np.asarray(context_tokens, dtype=float)
    total = 0.0 * ctx
    for s in specs:
        units = s.units(np.minimum(ctx, s.window)) if s.window is not None else s.units(ctx)
        total = total + s.layers * (units * s.unit_bytes + s.state_bytes)
    return total


def kv_bytes_per_gpu(arch: Architecture, plan: ParallelPlan, context_tokens,
                     kv_dtype: str | None = None,
                     block_size: int | None = BASE_BLOCK_TOKENS) -> float | np.ndarray:
    """KV one sequence holds on each GPU that holds it (exact per-spec blocks; no padding with
    block_size=None): the bytes a tier transfer moves per GPU."""
    specs = kv_specs(arch, plan, kv_dtype)
    out = unpadded_sequence_bytes(specs, context_tokens) if block_size is None else \
        exact_sequence_bytes(specs, context_tokens, block_size)
    return float(out) if np.ndim(out) == 0 else out


def activation_bytes(arch: Architecture, plan: ParallelPlan, max_num_batched_tokens: int,
                     max_num_seqs: int = MAX_NUM_SEQS) -> float:
    """Peak activation memory of one forward pass of `max_num_batched_tokens` tokens per GPU:
    the widest layer's live tensors (residual stream x4, attention projections, MLP or routed
    expert intermediates) in bf16, plus fp32 logits for up to `max_num_seqs` sampled rows."""
    tokens = max_num_batched_tokens / max(plan.dp * plan.pcp, 1)
    widest = 0.0
    for layer in arch.main_layers:
        att = sum(p.out_features * p.count for p in layer.attention.projections) / plan.tp
        mlp = sum(p.out_features * p.count for p in layer.mlp.projections) / plan.tp
        ex = layer.mlp.experts
        if ex is not None:
            # each token is copied to top_k experts; a rank holds its 1/ep share of the copies
            mlp += ex.top_k * (3 if ex.gated else 2) * ex.intermediate_size / (plan.moe_tp * plan.ep) \
                * plan.dp * plan.pcp
        widest = max(widest, att + mlp)
    residual = 4 * arch.hidden_size * arch.hyper_connections
    logits = min(max_num_seqs, max_num_batched_tokens) * arch.vocab_size / plan.tp * 4.0
    return tokens * (residual + widest) * 2.0 + logits


def runtime_reserve_bytes(plan: ParallelPlan) -> float:
    groups = sum(1 for g in (plan.tp * plan.dcp, plan.dp * plan.pcp, plan.ep, plan.pp) if g > 1)
    return CUDA_CONTEXT_BYTES + CUDA_GRAPH_BYTES + NCCL_BYTES_PER_GROUP * groups


@dataclass(frozen=True)
class HbmBudget:
    hbm_bytes: float  # per GPU (usable, from the hardware spec)
    gpu_memory_utilization: float
    weight_bytes: float
    activation_bytes: float
    reserve_bytes: float
    kv_pool_bytes: float  # per GPU
    allocator: str
    block_size: int
    page_bytes: float  # hybrid page (static: largest of the per-spec pages)
    specs: tuple[KVSpec, ...]
    dp: int  # attention data-parallel ranks: each holds its own sequences

    @property
    def usable_bytes(self) -> float:
        return self.hbm_bytes * self.gpu_memory_utilization

    def sequence_bytes(self, context_tokens) -> np.ndarray:
        """Pool bytes one sequence takes on each GPU holding it, padding included."""
        if self.allocator == "hybrid":
            return hybrid_sequence_bytes(self.specs, context_tokens, self.block_size)
        return exact_sequence_bytes(self.specs, context_tokens, self.block_size, free_windows=False)

    def max_sequences(self, context_tokens) -> np.ndarray:
        """Concurrent sequences of `context_tokens` the replica's KV pools hold (all DP ranks)."""
        ctx = np.maximum(np.asarray(context_tokens, dtype=float), 1.0)
        per_rank = np.floor(self.kv_pool_bytes / np.maximum(self.sequence_bytes(ctx), 1e-9))
        out = per_rank * self.dp
        return float(out) if np.ndim(out) == 0 else out

    def kv_capacity_tokens(self, context_tokens) -> np.ndarray:
        """Tokens the replica holds when every sequence is `context_tokens` long."""
        ctx = np.maximum(np.asarray(context_tokens, dtype=float), 1.0)
        return self.max_sequences(context_tokens) * ctx

    def padding_fraction(self, context_tokens) -> np.ndarray:
        """Share of a sequence's pool bytes that is block and page padding."""
        used = self.sequence_bytes(context_tokens)
        return 1.0 - unpadded_sequence_bytes(self.specs, context_tokens) / np.maximum(used, 1e-9)

    def summary(self) -> dict:
        return {"hbm_bytes": self.hbm_bytes, "usable_bytes": self.usable_bytes,
                "weight_bytes": self.weight_bytes, "activation_bytes": self.activation_bytes,
                "reserve_bytes": self.reserve_bytes, "kv_pool_bytes": self.kv_pool_bytes,
                "allocator": self.allocator, "block_size": self.block_size,
                "page_bytes": self.page_bytes}


def hbm_budget(arch: Architecture, hw, plan: ParallelPlan = SINGLE_GPU,
               weight_bytes_per_gpu: float | None = None, kv_dtype: str | None = None,
               max_num_batched_tokens: int = MAX_NUM_BATCHED_TOKENS, allocator: str = "hybrid",
               gpu_memory_utilization: float = GPU_MEMORY_UTILIZATION,
               block_size: int = BASE_BLOCK_TOKENS, indexer_dtype: str | None = None,
               cpu_offload_gib: float = 0.0) -> HbmBudget:
    """Per-GPU HBM budget; raises Infeasible when weights + activations + reserve do not fit.
    `cpu_offload_gib`: weights per GPU kept in host memory (vLLM --cpu-offload-gb,
    model.perf.host_weights), whose HBM the KV pool takes."""
    if allocator not in ALLOCATORS:
        raise ServecastError(f"unknown allocator {allocator!r}; allowed: {', '.join(ALLOCATORS)}")
    if not 0 < gpu_memory_utilization <= 1:
        raise ServecastError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}")
    if kv_dtype is not None:
        dtype(kv_dtype)  # validates the name
    plan = normalize_plan(arch, plan)
    weights = weight_bytes_per_gpu if weight_bytes_per_gpu is not None else \
        sharded_weight_bytes(arch, plan)
    weights -= offloaded_bytes_per_gpu(arch, plan, cpu_offload_gib)
    act = activation_bytes(arch, plan, max_num_batched_tokens)
    reserve = runtime_reserve_bytes(plan)
    usable = hw.hbm_bytes * gpu_memory_utilization
    pool = usable - weights - act - reserve
    if pool <= 0:
        raise Infeasible(
            f"{arch.name} under {plan.label()} on {getattr(hw, 'name', 'this chip')}: weights "
            f"{weights / 1e9:.1f} GB + activations {act / 1e9:.1f} GB + reserve {reserve / 1e9:.1f} GB "
            f"exceed {gpu_memory_utilization:.0%} of {hw.hbm_bytes / 1e9:.0f} GB HBM per GPU")
    specs = kv_specs(arch, plan, kv_dtype, indexer_dtype)
    page = page_layout(specs, block_size)[0] if allocator == "hybrid" else max(
        (s.unit_bytes * block_size or s.state_bytes) for s in specs)
    return HbmBudget(
        hbm_bytes=float(hw.hbm_bytes), gpu_memory_utilization=gpu_memory_utilization,
        weight_bytes=float(weights), activation_bytes=float(act), reserve_bytes=float(reserve),
        kv_pool_bytes=float(pool), allocator=allocator, block_size=block_size, page_bytes=page,
        specs=specs, dp=plan.dp
    )


def packed_layout_saving(arch: Architecture, kv_dtype: str | None = None,
                         block_size: int = 256, unpacked_indexer_dtype: str = "fp8",
                         packed_indexer_dtype: str = "mxfp4", alignment_bytes: int = 1) -> float:
    """Fractional shrink of one KV block across all layers when the per-tensor layout (every
    layer's KV and index-key tensor its own allocation, fp8 index keys with an fp32 scale, 132 B
    at head_dim 128) becomes one packed allocation per block with MXFP4 index keys (68 B; vLLM
    PR #44577 / #48993). Derived from the entry layouts in model.perf.kv. `alignment_bytes` pads each
    tensor's share of a block in the per-tensor layout (default 1: no padding, the saving is the
    index-key format alone; 512 adds an assumed TMA-friendly stride padding)."""
    fmt = kv_dtype or arch.default_kv_dtype
    per_tensor = packed = 0.0
    for layer in arch.main_layers:
        att = layer.attention
        if att.kind == "linear":
            continue
        ratio = att.compress_ratio or 1
        entries = block_size / ratio if att.kind in ("csa", "hca") else block_size
        kv = entries * entry_bytes(att, fmt)
        per_tensor += math.ceil(kv / alignment_bytes) * alignment_bytes
        packed += kv
        if att.indexer is not None:
            unpacked_key = entries * indexer_key_bytes(att.indexer, fmt, unpacked_indexer_dtype)
            per_tensor += math.ceil(unpacked_key / alignment_bytes) * alignment_bytes
            packed += entries * indexer_key_bytes(att.indexer, fmt, packed_indexer_dtype)
    packed = math.ceil(packed / alignment_bytes) * alignment_bytes
    return 1.0 - packed / per_tensor if per_tensor else 0.0
