"""The KV memory hierarchy below HBM: host memory, local NVMe, a distributed pool; transfer
times, reload vs recompute, and what tool-call gaps let a prefetch hide.

Tiers, per GPU (capacities and link rates from the Hardware spec):
- `hbm`: the KV pool (model.perf.memory.hbm_budget).
- `host`: CPU DRAM over PCIe, or NVLink-C2C on Grace systems (GB200/GB300); vLLM
  OffloadingConnector copies with DMA at ~50 of 64 GB/s on PCIe Gen5 when blocks are packed
  (vLLM blog "Inside vLLM's New KV Offloading Connector") ->
  model.perf.host_weights.HOST_DMA_EFFICIENCY.
- `nvme`: local drives, staged through host memory (vLLM TieringOffloadingSpec), so the rate is
  the slower of the drive and the host link.
- `remote`: a Mooncake-store style pool over RDMA: the GPU's scale-out NIC share.
Latencies are per transfer (assumed, order-of-magnitude; they only matter for tiny prefixes).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from model.perf.host_weights import HOST_DMA_EFFICIENCY
from model.perf.memory import hbm_budget, kv_bytes_per_gpu
from model.perf.parallel import ParallelPlan, normalize_plan
from model.perf.step import build_step_model
from model.specs.defaults import MAX_NUM_BATCHED_TOKENS
from model.specs.errors import ServecastError

RDMA_EFFICIENCY = 0.9  # assumed; DeepEP internode kernels reach ~90% of a 400G NIC (DeepEP README)
HOST_KV_FRACTION = 0.8  # assumed share of host DRAM given to the KV tier (rest: OS, weights, pinned)
LATENCY_S = {"hbm": 0.0, "host": 10e-6, "nvme": 100e-6, "remote": 1e-3}  # assumed: DMA launch,
# NVMe read, store lookup + RDMA setup (the Mooncake lookup the seed PRs move off the critical path)
TIER_NAMES = ("hbm", "host", "nvme", "remote")
BUSY_DECODE_SEQS = 64.0  # the "batched" recompute view: a replica already decoding 64 sequences
BUSY_DECODE_CONTEXT = 32768.0  # at 32K tokens of context each (assumed operating point)


@dataclass(frozen=True)
class Tier:
    name: str
    capacity_bytes: float  # per GPU
    bandwidth_bytes_per_s: float  # achieved, per GPU per direction, to/from HBM
    latency_s: float
    link: str

    def transfer_time_s(self, nbytes) -> np.ndarray:
        """Time to move `nbytes` (per GPU) between this tier and HBM."""
        b = np.asarray(nbytes, dtype=float)
        if self.name == "hbm":
            return np.zeros_like(b)
        return np.where(b > 0, self.latency_s + b / self.bandwidth_bytes_per_s, 0.0)


def host_link_name(hw) -> str:
    # a Grace-attached GPU's C2C share is well above any PCIe x16 generation's 128 GB/s
    return "nvlink-c2c" if hw.host_link_bandwidth_bytes_per_s > 128e9 else "pcie"


def tiers_for(hw, kv_pool_bytes_per_gpu: float | None = None,
              remote_pool_bytes_per_gpu: float | None = None,
              host_kv_fraction: float = HOST_KV_FRACTION) -> dict[str, Tier]:
    """The four tiers of one GPU of `hw`, fastest first."""
    host_bw = hw.host_link_bandwidth_bytes_per_s * HOST_DMA_EFFICIENCY
    host_cap = hw.host_memory_bytes_per_gpu * host_kv_fraction
    remote_cap = host_cap if remote_pool_bytes_per_gpu is None else remote_pool_bytes_per_gpu
    return {
        "hbm": Tier("hbm", kv_pool_bytes_per_gpu if kv_pool_bytes_per_gpu is not None
                    else hw.hbm_bytes, hw.hbm_bandwidth_bytes_per_s, 0.0, "hbm"),
        "host": Tier("host", host_cap, host_bw, LATENCY_S["host"], host_link_name(hw)),
        "nvme": Tier("nvme", hw.nvme_bytes_per_gpu,
                     min(hw.nvme_bandwidth_bytes_per_s_per_gpu, host_bw), LATENCY_S["nvme"],
                     "nvme via host"),
        "remote": Tier("remote", remote_cap,
                       hw.scale_out_bandwidth_bytes_per_s * RDMA_EFFICIENCY, LATENCY_S["remote"],
                       "rdma"),
    }


def kv_bytes_per_token_per_gpu(arch, plan: ParallelPlan, kv_dtype: str | None = None,
                               context_tokens: float = 131072.0) -> float:
    """Average KV bytes one token of context costs each GPU that holds its sequence, at a
    typical context (windows and fixed state amortized over it)."""
    plan = normalize_plan(arch, plan)
    return float(kv_bytes_per_gpu(arch, plan, context_tokens, kv_dtype, block_size=None)) \
        / context_tokens


def tier_capacity_tokens(arch, hw, plan: ParallelPlan, kv_dtype: str | None = None,
                         budget=None, remote_pool_bytes_per_gpu: float | None = None,
                         context_tokens: float = 131072.0,
                         cpu_offload_gib: float = 0.0) -> dict[str, float]:
    """Tokens of context one replica can keep in each tier (hbm from model.perf.memory.hbm_budget,
    with `cpu_offload_gib` of weights per GPU in host memory): what
    `model.serve.cache_model.hit_rate` takes as `capacity_tokens`. Attention-DP ranks hold
    different sequences, so their tiers add up; TP ranks hold shares of the same tokens."""
    plan = normalize_plan(arch, plan)
    budget = budget or hbm_budget(arch, hw, plan, kv_dtype=kv_dtype,
                                  cpu_offload_gib=cpu_offload_gib)
    per_token = kv_bytes_per_token_per_gpu(arch, plan, kv_dtype, context_tokens)
    t = tiers_for(hw, budget.kv_pool_bytes, remote_pool_bytes_per_gpu)
    ranks = plan.dp * plan.pcp
    return {name: tier.capacity_bytes / per_token * ranks for name, tier in t.items()}


def _tier(hw, tier: str | Tier) -> Tier:
    if isinstance(tier, Tier):
        return tier
    if tier not in TIER_NAMES:
        raise ServecastError(f"unknown tier {tier!r}; allowed: {', '.join(TIER_NAMES)}")
    return tiers_for(hw)[tier]


# ----------------------------------------------------------------------------- load vs recompute


def kv_load_time_s(arch, hw, plan: ParallelPlan, context_tokens, tier: str | Tier = "host",
                   kv_dtype: str | None = None) -> np.ndarray:
    """Time to bring one sequence's KV of `context_tokens` into HBM: every GPU of the replica
    that holds part of it pulls its share over its own link in parallel."""
    plan = normalize_plan(arch, plan)
    nbytes = kv_bytes_per_gpu(arch, plan, context_tokens, kv_dtype, block_size=None)
    return _tier(hw, tier).transfer_time_s(nbytes)


def recompute_time_s(arch, hw, plan: ParallelPlan, context_tokens, kv_dtype: str | None = None,
                     chunk_tokens: int = MAX_NUM_BATCHED_TOKENS, step_model=None,
                     mode: str = "batched", decode_seqs: float = BUSY_DECODE_SEQS,
                     decode_context: float = BUSY_DECODE_CONTEXT) -> np.ndarray:
    """Time to recompute a prefix of `context_tokens` by chunked prefill (chunks of
    `chunk_tokens`, chunk k attending to everything before it), from the step model's
    step_time_s:
    - mode "solo": the replica does nothing else (the latency of one cold turn);
    - mode "batched": the marginal cost on a busy engine already running `decode_seqs` decodes
      at `decode_context` (weights are streamed anyway, so only the extra work counts)."""
    if mode not in ("solo", "batched"):
        raise ServecastError(f"recompute mode {mode!r}; allowed: solo, batched")
    model = step_model or build_step_model(arch, hw, plan, kv_dtype=kv_dtype)
    dseq, dctx = (decode_seqs, decode_context) if mode == "batched" else (0.0, 0.0)
    base = float(np.asarray(model.step_time_s(0.0, 0.0, dseq, dctx))) if mode == "batched" else 0.0
    ctx = np.atleast_1d(np.asarray(context_tokens, dtype=float))
    out = np.zeros_like(ctx)
    for i, c in enumerate(ctx):
        if c <= 0:
            continue
        n = int(np.ceil(c / chunk_tokens))
        ends = np.minimum(np.arange(1, n + 1) * chunk_tokens, c)
        new = np.diff(np.r_[0.0, ends])
        out[i] = float(np.sum(model.step_time_s(new, ends, dseq, dctx) - base))
    return out if np.ndim(context_tokens) else out[0]


def recompute_time_physics_s(active_params: float, context_tokens, peak_flops_per_s: float,
                             mfu: float = 0.5, gpus: int = 1) -> np.ndarray:
    """Lower bound without attention: 2 * active params * tokens / (gpus * peak * MFU)
    (reload vs recompute: Meng, Lee, Wang, arXiv 2601.19910)."""
    return 2.0 * active_params * np.asarray(context_tokens, dtype=float) / (gpus * peak_flops_per_s * mfu)


def kappa(active_params: float, bandwidth_bytes_per_s: float, peak_flops_per_s: float,
          kv_bytes_per_token: float) -> float:
    """Load-to-recompute token-rate ratio before MFU: kappa = 2 N W / (C b_kv) (arXiv 2601.19910)."""
    return 2.0 * active_params * bandwidth_bytes_per_s / (peak_flops_per_s * kv_bytes_per_token)


@dataclass(frozen=True)
class BreakEven:
    hardware: str
    tier: str
    contexts_tokens: np.ndarray
    load_s: np.ndarray
    recompute_s: np.ndarray
    crossovers_tokens: tuple[float, ...]  # every context where the faster option changes
    load_wins_at_max: bool

    @property
    def reload_wins_above_tokens(self) -> float | None:
        """The break-even: smallest grid context from which reloading wins all the way up
        (the grid's first point if it always wins; None if recompute wins at the top)."""
        if not self.load_wins_at_max:
            return None
        return self.crossovers_tokens[-1] if self.crossovers_tokens else float(self.contexts_tokens[0])

    @property
    def reload_wins_everywhere(self) -> bool:
        """Reloading beats recomputing at every context of the grid, down to one KV block: there
        is no crossover to report, `reload_wins_above_tokens` is then the grid's first point."""
        return self.load_wins_at_max and not self.crossovers_tokens

    @property
    def speedup(self) -> np.ndarray:
        """recompute / load time at each context (>1: loading wins)."""
        return self.recompute_s / np.maximum(self.load_s, 1e-12)

    def summary(self) -> dict:
        return {"hardware": self.hardware, "tier": self.tier,
                "reload_wins_above_tokens": self.reload_wins_above_tokens,
                "reload_wins_everywhere": self.reload_wins_everywhere,
                "crossovers_tokens": list(self.crossovers_tokens),
                "load_wins_at_max": self.load_wins_at_max,
                "speedup_at": {int(c): float(s) for c, s in zip(self.contexts_tokens, self.speedup,
                                                                strict=True)}}


def break_even(arch, hw, plan: ParallelPlan, tier: str = "host", kv_dtype: str | None = None,
               contexts_tokens=None, step_model=None, mode: str = "batched") -> BreakEven:
    """Reload-vs-recompute on a log grid of contexts (16 .. 1M tokens: from one KV block, the
    prefix cache's unit, up); the crossover is interpolated in log space at the first context
    where the faster option changes. Below it the per-transfer latency makes recomputing
    cheaper; no crossover means one option wins on the whole grid (`load_wins_at_max` says
    which)."""
    ctx = np.asarray(contexts_tokens if contexts_tokens is not None else
                     2.0 ** np.arange(4, 21), dtype=float)
    load = np.atleast_1d(kv_load_time_s(arch, hw, plan, ctx, tier, kv_dtype))
    rec = np.atleast_1d(recompute_time_s(arch, hw, plan, ctx, kv_dtype, step_model=step_model,
                                         mode=mode))
    diff = np.log(rec) - np.log(np.maximum(load, 1e-15))
    cross = []
    for i in np.flatnonzero(np.sign(diff[1:]) != np.sign(diff[:-1])):
        f = diff[i] / (diff[i] - diff[i + 1])
        cross.append(float(np.exp(np.log(ctx[i]) + f * (np.log(ctx[i + 1]) - np.log(ctx[i])))))
    name = tier if isinstance(tier, str) else tier.name
    return BreakEven(getattr(hw, "name", "?"), name, ctx, load, rec, tuple(cross),
                     bool(diff[-1] > 0))


# ---------------------------------------------------------------------------- gaps and prefetch


@dataclass(frozen=True)
class PrefetchResult:
    lower_tier_tokens: int  # hit tokens served below HBM
    hidden_tokens: int  # of those, loaded during the client gap before the request
    exposed_load_s: float  # total transfer time left on requests' critical path
    requests_with_lower_hits: int

    @property
    def hidden_fraction(self) -> float:
        return self.hidden_tokens / self.lower_tier_tokens if self.lower_tier_tokens else 1.0


def prefetch(replay_result, stream, tiers: dict[str, Tier], kv_bytes_per_token_per_gpu: float,
             prefetch: bool = True) -> PrefetchResult:
    """Which lower-tier loads a session-aware prefetch hides: when a turn ends the router knows
    the session will come back, so its KV can start moving up during the tool call or think
    time; a load is hidden when its transfer time is shorter than the gap before the request.
    `replay_result` is a model.serve.cache_replay.ReplayResult whose tier names are keys of `tiers`."""
    names = list(replay_result.capacity_tokens)
    tokens = replay_result.request_tier_tokens.astype(float)  # requests x tiers
    time = np.zeros(len(tokens))
    lower = np.zeros(len(tokens))
    for k, name in enumerate(names):
        if name == "hbm":
            continue
        if name not in tiers:
            raise ServecastError(f"prefetch: tier {name!r} has no link; known: {', '.join(tiers)}")
        time += tiers[name].transfer_time_s(tokens[:, k] * kv_bytes_per_token_per_gpu)
        lower += tokens[:, k]
    gap = stream.think_time_s if prefetch else np.zeros(len(tokens))
    hidden = (time <= gap) & (lower > 0)
    return PrefetchResult(
        lower_tier_tokens=int(lower.sum()), hidden_tokens=int(lower[hidden].sum()),
        exposed_load_s=float(np.sum(np.where(hidden, 0.0, time))),
        requests_with_lower_hits=int(np.count_nonzero(lower)),
    )
