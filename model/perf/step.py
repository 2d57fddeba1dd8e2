"""Engine step latency of one replica for a batch composition.

    step = (sum over layers of kernel times (model.perf.roofline, on one GPU's shard)) x the
           engine's phase scale + collectives the plan adds (model.perf.parallel, timed by
           model.perf.comm) + the host-link reads of weights kept in host memory
           (model.perf.host_weights) + a fixed per-step engine overhead
           (model.perf.engine_factors)

That is a step replayed as one CUDA graph. Launched kernel by kernel (`kernel_launch`), the
host issues each of the step's kernels (`kernels_per_step`) itself: in `eager` mode it runs
ahead of the GPU, so the GPU work and the host's launches overlap (the slower one sets the step);
in `eager-blocking` mode (CUDA_LAUNCH_BLOCKING=1) each launch waits for its kernel, so the GPU
idles for every launch and the two add.

Conventions of `step_time_s(prefill_tokens, prefill_context, decode_seqs, decode_context)`:
- counts are replica totals, spread evenly over the `dp` attention ranks (and prefill tokens over
  `pcp` ranks); the MoE group sees all of them;
- `prefill_context` is each prefilling sequence's length after the chunk (cached + new tokens);
  causal masking inside the chunk is handled by the kernel model;
- `decode_context` is the mean context of the decoding sequences;
- with pp > 1 this is the time one batch takes through all stages (the pipeline latency).
All arguments broadcast with numpy; the result is an array of seconds.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property, lru_cache

import numpy as np

from model.perf import roofline
from model.perf.comm import collective_time_s
from model.perf.engine_factors import EngineFactors, engine_factors
from model.perf.expert_balance import hot_rank_load_factor
from model.perf.host_weights import NO_HOST_WEIGHTS, HostWeights, host_weights
from model.perf.memory import activation_bytes, kv_specs, unpadded_sequence_bytes
from model.perf.ops import (
    Step,
    grouped_layers,
    model_ops,
)
from model.perf.parallel import (
    ParallelPlan,
    decode_attention_split,
    experts_per_rank,
    index_key_shard,
    kv_shard,
    layer_collectives,
    linear_shard,
    normalize_plan,
    pipeline_collectives,
    validate_plan,
    weight_bytes_per_gpu,
)
from model.perf.step_inputs import check_choices, check_speculation, offload_gib
from model.specs.defaults import (
    ATTENTION_BACKEND,
    DRAFT_ATTENTION_BACKEND,
    EAGER_LAUNCH_S,
    GPU_MEMORY_UTILIZATION,
    KERNEL_LAUNCH,
    MAX_NUM_BATCHED_TOKENS,
    SYNC_ROUND_TRIP_S,
)
from model.specs.dtypes import dtype as lookup_dtype
from model.specs.errors import Infeasible
from model.specs.layers import Architecture, Layer
from model.specs.precision import with_precision

ACTIVATION_RESERVE_BYTES = 4e9  # CUDA graphs, activations, workspace at 8K batched tokens (vLLM)
EAGLE_DRAFT_VOCAB = 32000  # EAGLE-3 drafts predict over a reduced vocabulary (SpecForge default)
# Kernels one entry of the op list launches per layer, by kind: a GEMM is one kernel; attention
# is the KV-cache write and the attention kernel; the routed experts (vLLM's fused MoE, Marlin
# on Hopper) are top-k routing, block alignment, the two grouped GEMMs, the activation and the
# top-k sum; a collective is one NCCL kernel; a memory op is one kernel, except `norms`, the
# layer's two fused residual-add RMSNorms. Rotary embedding, sampling and the input preparation
# copies are not in the op list and are not counted.
KERNELS_PER_OP = {"gemm": 1, "attention": 2, "moe": 6, "network": 1, "memory": 1, "host": 0}
ADDED_KINDS = ("network", "host")  # waits added to the scaled kernels: collectives, host reads
NORM_KERNELS = 2


# ---- the step model ------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)  # compared and hashed by identity: tables are kept per model
class StepModel:
    """Step latency of one replica: `arch` under `plan` on `hw`, with the engine `factors`."""

    arch: Architecture
    hw: object
    plan: ParallelPlan
    kv_dtype: str
    backend: str = "vllm"
    factors: EngineFactors = field(default_factory=EngineFactors)
    spec_tokens: int = 0  # draft tokens per decode step (vLLM num_speculative_tokens)
    spec_acceptance: float = 0.0  # per-position acceptance rate (when no acceptance length)
    acceptance_length: float = 0.0  # measured mean tokens per verification step (1 + accepted)
    spec_method: str = "mtp"  # mtp (checkpoint's MTP layer) | eagle3 | dspark (external draft)
    max_num_batched_tokens: int = MAX_NUM_BATCHED_TOKENS  # per step and DP rank
    kernel_launch: str = KERNEL_LAUNCH  # cuda-graphs | eager | eager-blocking
    cpu_offload_gib: float = 0.0  # weights per GPU kept in host memory (vLLM --cpu-offload-gb)
    attention_backend: str = ATTENTION_BACKEND  # default | triton (vLLM --attention-backend)
    draft_attention_backend: str = DRAFT_ATTENTION_BACKEND  # same | default | triton
    # (batch grid, E[longest decoding context] / mean) where kernels wait for the longest
    # (model.perf.context_spread); () = every context at the mean
    decode_context_max_ratio: tuple = ()

    @cached_property
    def host_weights(self) -> HostWeights:
        """The decoder layers `cpu_offload_gib` moves to host memory (model.perf.host_weights)."""
        if self.cpu_offload_gib <= 0:
            return NO_HOST_WEIGHTS
        return host_weights(self.arch, self.plan, self._groups, self.cpu_offload_gib)

    @cached_property
    def activation_reserve_bytes(self) -> float:
        """HBM held outside weights and KV: the reserve measured at vLLM's default budget, plus
        the activations a larger token budget adds to one forward pass
        (model.perf.memory.activation_bytes)."""
        extra = (activation_bytes(self.arch, self.plan, self.max_num_batched_tokens)
                 - activation_bytes(self.arch, self.plan, MAX_NUM_BATCHED_TOKENS))
        return ACTIVATION_RESERVE_BYTES + max(extra, 0.0)

    @cached_property
    def _groups(self) -> list:
        """(layer, count) groups of identical main layers."""
        return grouped_layers(self.arch.main_layers)

    @cached_property
    def weight_bytes_per_gpu(self) -> float:
        """Weights one GPU holds in HBM: the sharded model, with the MTP layer or an external
        draft model's layer and head when speculative decoding uses them, less what
        `cpu_offload_gib` keeps in host memory."""
        mtp = self.spec_tokens > 0 and self.spec_method == "mtp" and bool(self.arch.mtp_layers)
        total = weight_bytes_per_gpu(self.arch, self.plan, with_mtp=mtp)
        if self.spec_tokens > 0 and not mtp:  # an external draft model's layer and head
            layer, rows = self.draft_layer
            total += sum(lin.params * lookup_dtype(lin.dtype).bytes / linear_shard(lin, self.plan)
                         for lin in layer.attention.projections + layer.mlp.projections)
            total += (rows * self.arch.lm_head.in_features
                      * lookup_dtype(self.arch.lm_head.dtype).bytes / self.plan.tp)
        return total - self.host_weights.bytes_per_gpu

    @property
    def gpus(self) -> int:
        return self.plan.gpus

    @property
    def tokens_per_decode_step(self) -> float:
        """Expected tokens a sequence gains per decode step with speculative decoding."""
        if self.spec_tokens and self.acceptance_length:
            return float(min(self.acceptance_length, 1.0 + self.spec_tokens))
        a, n = self.spec_acceptance, self.spec_tokens
        return 1.0 + sum(a ** i for i in range(1, n + 1))

    # -- per-op times on one GPU --------------------------------------------------------------
    def _layer_times(self, layer, count, tag, pre, pctx, dec, q, dctx, pseqs, pranks=None,
                     ideal=False):
        """(name, kind, count, seconds) of one layer group on the busiest GPU: `pre` prefill
        tokens of `pseqs` sequences at `pctx` spread over `pranks` of the dp ranks (default all),
        `dec` decoding sequences pushing `q` tokens each at `dctx` spread over all dp ranks
        (replica totals). The expert group sees every rank's tokens; lock-stepped ranks wait for
        the busiest, so that rank's attention, dense GEMMs and sends set the step. `ideal`:
        each kernel's physical floor (model.perf.roofline), no collectives."""
        p, hw, arch = self.plan, self.hw, self.arch
        pranks = p.dp if pranks is None else pranks
        dec_tok = dec * q
        pre_r = pre / (pranks * p.pcp)
        dec_r = dec / p.dp
        tok_r = pre_r + dec_tok / p.dp
        pseqs_r = np.maximum(pseqs / pranks, np.where(pre_r > 0, 1.0, 0.0))
        new_per_seq = np.where(pseqs_r > 0, pre_r / np.maximum(pseqs_r, 1e-9), 0.0)
        has_pre = pre_r > 0
        has_dec = dec_r > 0
        out = []
        att = layer.attention
        lins = att.projections + layer.mlp.projections
        shapes = [(lin.out_features * lin.count / linear_shard(lin, p), lin.in_features, lin.dtype)
                  for lin in lins]
        times = roofline.gemm_times_s(tok_r, shapes, hw, ideal)
        times = np.where(tok_r > 0, times, 0.0)
        out += [(f"{tag}:{lin.name}", "gemm", count, t) for lin, t in zip(lins, times, strict=True)]
        heads_split, ctx_split = decode_attention_split(att, p)
        if np.any(has_pre):
            t = roofline.attention_time_s(att.kind, "prefill", pseqs_r, new_per_seq,
                                          np.maximum(pctx, new_per_seq), att, self.kv_dtype, hw,
                                          p.tp, ideal)
            out.append((f"{tag}:attn_prefill", "attention", count, np.where(has_pre, t, 0.0)))
        if np.any(has_dec):
            t = roofline.attention_time_s(att.kind, "decode", dec_r, q,
                                          np.maximum(dctx, 1.0) / ctx_split, att, self.kv_dtype,
                                          hw, heads_split, ideal)
            if self.attention_backend == "triton" and not ideal:
                longest = np.maximum(dctx, 1.0) / ctx_split * self._longest_ratio(dec_r)
                t = np.maximum(t, roofline.serial_walk_s(att.kind, dec_r, q, longest, att,
                                                         heads_split))
            out.append((f"{tag}:attn_decode", "attention", count, np.where(has_dec, t, 0.0)))
        ex = layer.mlp.experts
        if ex is not None:
            tokens_group = (pre + dec_tok) if p.dp > 1 or p.ep > 1 else tok_r
            # the busiest EP rank sets the layer's time (ideal: perfectly balanced)
            hot = 1.0 if ideal else hot_rank_load_factor(
                p.ep, ex.num_experts, p.redundant_experts, tokens_group * ex.top_k / p.ep)
            t = roofline.moe_time_s(tokens_group, ex.hidden_size, ex.intermediate_size,
                                    ex.top_k, experts_per_rank(ex.num_experts, p), p.moe_tp,
                                    p.ep, ex.dtype, hw, ideal, hot)
            out.append((f"{tag}:experts", "moe", count, np.where(tokens_group > 0, t, 0.0)))
        width = arch.hidden_size * arch.hyper_connections
        norm_bytes = 2 * 2 * 2.0 * tok_r * width / (p.tp if p.sp else 1)
        out.append((f"{tag}:norms", "memory", count,
                    roofline.memory_time_s(norm_bytes, hw, ideal)))
        if ideal:
            return out
        for c in layer_collectives(layer, count, p, hw, arch.hidden_size, pre, dec_tok,
                                   prefill_ranks=pranks, prefill_context=pctx,
                                   prefill_seqs=pseqs):
            t = collective_time_s(c.op, c.bytes, c.gpus, hw, c.scope, c.algorithm)
            if c.skip_empty:
                t = np.where(np.asarray(c.bytes) > 0, t, 0.0)
            out.append((f"{tag}:{c.name}", "network", c.count, t))
        return out

    def _longest_ratio(self, batch):
        """E[longest decoding context] / mean at `batch` sequences per rank (1 if unset)."""
        if not self.decode_context_max_ratio:
            return 1.0
        grid, ratio = self.decode_context_max_ratio
        return np.interp(np.maximum(batch, 1.0), grid, ratio)

    def _op_times(self, pre, pctx, dec, dctx, pseqs, pranks=None, ideal=False):
        """List of (name, kind, count, seconds-array) for the busiest GPU over all layers
        (`ideal`: the kernels' physical floors, no collectives)."""
        p, hw, arch = self.plan, self.hw, self.arch
        pranks = p.dp if pranks is None else pranks
        q = 1.0 + self.spec_tokens  # tokens each decode sequence pushes through the model
        out = []
        for layer, count in self._groups:
            out += self._layer_times(layer, count, f"{layer.attention.kind}/{layer.mlp.kind}",
                                     pre, pctx, dec, q, dctx, pseqs, pranks, ideal)
        pre_r = pre / (pranks * p.pcp)
        dec_r = dec / p.dp
        has_pre = pre_r > 0
        pseqs_r = np.maximum(pseqs / pranks, np.where(has_pre, 1.0, 0.0))
        logits_r = dec_r + pseqs_r * has_pre
        t = roofline.gemm_time_s(logits_r * q, arch.lm_head.out_features / p.tp,
                                 arch.lm_head.in_features, arch.lm_head.dtype, hw, ideal)
        out.append(("lm_head", "gemm", 1, t))
        emb = roofline.memory_time_s((pre_r + dec * q / p.dp) * arch.hidden_size * 2 * 2.0, hw,
                                     ideal)
        out.append(("embedding", "memory", 1, emb))
        if self.spec_tokens:
            out += self._draft_times(dec, dctx, ideal)
        if ideal:
            return out
        if self.host_weights.bytes_per_gpu > 0:
            tokens = pre_r + dec * q / p.dp
            tokens_group = pre + dec * q if p.dp > 1 or p.ep > 1 else tokens
            out.append(("host_weights", "host", 1, self.host_weights.read_s(
                self._groups, p, hw, tokens_group, tokens > 0)))
        for c in pipeline_collectives(p, hw, arch.hidden_size, pre_r * p.pcp * p.dp, dec * q):
            out.append((c.name, "network", c.count,
                        collective_time_s(c.op, c.bytes, c.gpus, hw, c.scope, c.algorithm)))
        return out

    def _draft_times(self, dec, dctx, ideal=False):
        """The drafter's `spec_tokens` sequential passes, one token per decoding sequence each:
        the checkpoint's MTP layer (method mtp), else an EAGLE-3-style draft (one decoder layer
        shaped like the target's first layer, routed experts excluded, and a reduced-vocabulary
        head; EAGLE-3 paper, Li et al. 2025; SpecForge default draft_vocab_size 32000)."""
        p, arch = self.plan, self.arch
        layer, head_rows = self.draft_layer
        out = [(f"draft:{n.split(':', 1)[1]}", kind, c * self.spec_tokens, t)
               for n, kind, c, t in self._layer_times(layer, 1, "draft", 0.0 * dec, 0.0 * dec,
                                                      dec, 1.0, dctx, 0.0 * dec,
                                                      ideal=ideal)]
        t = roofline.gemm_time_s(dec / p.dp, head_rows / p.tp, arch.lm_head.in_features,
                                 arch.lm_head.dtype, self.hw, ideal)
        out.append(("draft:lm_head", "gemm", self.spec_tokens, np.where(dec > 0, t, 0.0)))
        drafter = self.draft_attention_backend
        if (self.attention_backend if drafter == "same" else drafter) == "triton" and not ideal:
            # the first pass takes each sequence's verified tokens: the 2D path's walk
            att = layer.attention
            heads_split, ctx_split = decode_attention_split(att, p)
            longest = np.maximum(dctx, 1.0) / ctx_split * self._longest_ratio(dec / p.dp)
            t = roofline.serial_walk_s(att.kind, dec / p.dp, self.tokens_per_decode_step,
                                       longest, att, heads_split)
            out.append(("draft:attn_walk", "attention", 1, np.where(dec > 0, t, 0.0)))
        return out

    @property
    def draft_layer(self) -> tuple[Layer, int]:
        """(layer the drafter runs per pass, rows of its vocabulary head)."""
        if self.spec_method == "mtp" and self.arch.mtp_layers:
            return self.arch.mtp_layers[0], self.arch.lm_head.out_features
        first = self.arch.main_layers[0]
        dense = replace(first.mlp, experts=None)
        return (replace(first, mlp=dense),
                min(self.arch.lm_head.out_features, EAGLE_DRAFT_VOCAB))

    def _combine(self, times, pre, dec, floor):
        """Engine step = (kernels + scaled routed experts) x phase scale + network + overhead,
        the phase factors weighted by the step's prefill share of tokens (as model.serve.closed_loop
        combines the same factors for the pure steps it was fitted on). The scaled kernels never
        go below `floor` (`kernel_floor_s`): a fitted factor below 1 makes the engine's kernels
        faster than the measured ones, never faster than the chip. Launched eagerly, the host's
        launches (`kernels_per_step` x model.specs.defaults.EAGER_LAUNCH_S, plus SYNC_ROUND_TRIP_S
        each when blocking) add to the GPU time (blocking) or bound it from below (eager)."""
        f = self.factors
        pre_share = pre / np.maximum(pre + dec * (1 + self.spec_tokens), 1e-9)
        scale = f.prefill_scale * pre_share + f.decode_scale * (1 - pre_share)
        moe = f.moe_prefill_scale * pre_share + f.moe_scale * (1 - pre_share)
        kernel = sum(np.asarray(t) * c * (moe if kind == "moe" else 1.0)
                     for _, kind, c, t in times if kind not in ADDED_KINDS)
        network = sum((np.asarray(t) * c for _, kind, c, t in times if kind in ADDED_KINDS),
                      0.0 * pre)
        overhead = f.step_overhead_s
        kernel = np.maximum(kernel * scale, floor)
        gpu = kernel + network
        if self.kernel_launch == "eager-blocking":
            gpu = gpu + kernels_per_step(times) * (EAGER_LAUNCH_S + SYNC_ROUND_TRIP_S)
        elif self.kernel_launch == "eager":
            gpu = np.maximum(gpu, kernels_per_step(times) * EAGER_LAUNCH_S)
        return gpu + overhead, kernel, network, overhead

    def _args(self, prefill_tokens, prefill_context, decode_seqs, decode_context, prefill_seqs):
        arrs = np.broadcast_arrays(*(np.asarray(a, float) for a in (
            prefill_tokens, prefill_context, decode_seqs, decode_context, prefill_seqs)))
        return arrs

    def _pranks(self, prefill_ranks):
        """DP ranks the prefill tokens are spread over: None = all; 1 = one rank carries them."""
        if prefill_ranks is None:
            return None
        return np.clip(np.asarray(prefill_ranks, float), 1.0, float(self.plan.dp))

    def step_parts(self, prefill_tokens=0.0, prefill_context=0.0, decode_seqs=0.0,
                   decode_context=0.0, prefill_seqs=1.0, prefill_ranks=None):
        """(non-MoE kernel s, network s, routed-expert kernel s) of a step, before engine factors
        (what `model.serve.estimate` components and the engine fit are made of)."""
        pre, pctx, dec, dctx, pseqs = self._args(prefill_tokens, prefill_context, decode_seqs,
                                                 decode_context, prefill_seqs)
        times = self._op_times(pre, pctx, dec, dctx, pseqs, self._pranks(prefill_ranks))
        kernel = sum(np.asarray(t) * c for _, kind, c, t in times
                     if kind not in ADDED_KINDS + ("moe",))
        moe = sum((np.asarray(t) * c for _, kind, c, t in times if kind == "moe"), 0.0 * pre)
        network = sum((np.asarray(t) * c for _, kind, c, t in times if kind in ADDED_KINDS),
                      0.0 * pre)
        busy = (pre > 0) | (dec > 0)
        return (np.where(busy, kernel, 0.0), np.where(busy, network, 0.0),
                np.where(busy, moe, 0.0))

    def kernel_floor_s(self, prefill_tokens=0.0, prefill_context=0.0, decode_seqs=0.0,
                       decode_context=0.0, prefill_seqs=1.0, prefill_ranks=None):
        """Kernel seconds of a step at its physical floor: every op's FLOPs at the chip's peak
        and its bytes at the full HBM bandwidth, no launch cost (theory.md section 3), the bound
        no engine factor may push a step's kernels below."""
        pre, pctx, dec, dctx, pseqs = self._args(prefill_tokens, prefill_context, decode_seqs,
                                                 decode_context, prefill_seqs)
        return self._floor(pre, pctx, dec, dctx, pseqs, self._pranks(prefill_ranks))

    def _floor(self, pre, pctx, dec, dctx, pseqs, pranks=None):
        times = self._op_times(pre, pctx, dec, dctx, pseqs, pranks, ideal=True)
        return np.where((pre > 0) | (dec > 0), sum(np.asarray(t) * c for _, _, c, t in times), 0.0)

    def step_time_s(self, prefill_tokens=0.0, prefill_context=0.0, decode_seqs=0.0,
                    decode_context=0.0, prefill_seqs=1.0, prefill_ranks=None):
        """Seconds of one engine step (see the module docstring); `prefill_ranks`: how many of
        the dp ranks carry the prefill tokens (None: all, evenly; 1: a single rank, the others
        decode and wait for it in lock-step)."""
        pre, pctx, dec, dctx, pseqs = self._args(prefill_tokens, prefill_context, decode_seqs,
                                                 decode_context, prefill_seqs)
        pranks = self._pranks(prefill_ranks)
        times = self._op_times(pre, pctx, dec, dctx, pseqs, pranks)
        total, *_ = self._combine(times, pre, dec, self._floor(pre, pctx, dec, dctx, pseqs, pranks))
        return np.where((pre > 0) | (dec > 0), total, 0.0)

    def breakdown(self, prefill_tokens=0.0, prefill_context=0.0, decode_seqs=0.0,
                  decode_context=0.0, prefill_seqs=1.0) -> dict:
        """Per-op table for one scalar step, its FLOPs / bytes per GPU and the bottleneck label."""
        pre, pctx, dec, dctx, pseqs = (float(np.asarray(a).ravel()[0]) for a in self._args(
            prefill_tokens, prefill_context, decode_seqs, decode_context, prefill_seqs))
        args = tuple(np.asarray(v) for v in (pre, pctx, dec, dctx, pseqs))
        times = self._op_times(*args)
        total, kernel, network, overhead = self._combine(times, args[0], args[2],
                                                         self._floor(*args))
        rows = [{"op": n, "kind": kind, "count": c, "time_s": float(np.asarray(t)) * c}
                for n, kind, c, t in times]
        merged: dict[str, dict] = {}
        for r in rows:
            m = merged.setdefault(r["op"], {**r, "time_s": 0.0})
            m["time_s"] += r["time_s"]
        counts = self.counts_per_gpu(pre, pctx, dec, dctx, pseqs)
        bound = self._bound_shares(times, counts)
        host = sum(float(np.asarray(t)) * c for _, kind, c, t in times if kind == "host")
        bound["network"] = float(network) - host
        if host:
            bound["host_link"] = host
        bound["overhead"] = float(overhead)
        label = max(bound, key=bound.get)
        return {"step_time_s": float(total), "ops": sorted(merged.values(),
                key=lambda r: -r["time_s"]), "time_by_bound_s": bound, "bottleneck": label,
                **counts}

    def op_table(self, prefill_tokens=0.0, prefill_context=0.0, decode_seqs=0.0,
                 decode_context=0.0, prefill_seqs=1.0):
        """One row per op on one GPU: FLOPs, HBM bytes (model.perf.ops counts, sharded by the plan),
        modeled time and attained FLOP/s: the points of a roofline chart."""
        import pandas as pd  # only the roofline table needs it: the step model stays numpy-only

        p = self.plan
        pre, pctx, dec, dctx, pseqs = (float(np.asarray(a).ravel()[0]) for a in self._args(
            prefill_tokens, prefill_context, decode_seqs, decode_context, prefill_seqs))
        times = {n: float(np.asarray(t)) for n, _, _, t in self._op_times(
            *(np.asarray(v) for v in (pre, pctx, dec, dctx, pseqs)))}
        ops = model_ops(self.arch, Step(pre, pctx, dec * (1 + self.spec_tokens), dctx, pseqs),
                        self.kv_dtype)
        rows = []
        for o in ops:
            tokens_split = p.dp * p.pcp
            if o.kind == "moe":
                flops_div = weight_div = p.moe_tp * p.ep
            elif o.kind == "linear" and "linear" in o.shape:
                flops_div = tokens_split * linear_shard(o.shape["linear"], p)
                weight_div = linear_shard(o.shape["linear"], p)
            else:
                flops_div = p.attention_gpus
                weight_div = p.tp
            kv_div = p.attention_gpus
            if "attention" in o.shape:
                shard = index_key_shard(p) if o.kind == "indexer" else \
                    kv_shard(o.shape["attention"], p)
                kv_div = kv_div / (p.tp / shard)
            flops = float(np.asarray(o.flops)) / flops_div
            by = (float(np.asarray(o.weight_bytes)) / weight_div
                  + float(np.asarray(o.kv_read_bytes + o.kv_write_bytes)) / kv_div
                  + float(np.asarray(o.act_bytes)) / flops_div)
            t = times.get(o.name)
            if flops <= 0 or by <= 0 or not t:
                continue
            rows.append({"op": o.name, "kind": o.kind, "layers": o.count, "flops": flops,
                         "bytes": by, "time_s": t, "intensity_flop_per_byte": flops / by,
                         "attained_flop_per_s": flops / t})
        return pd.DataFrame(rows)

    def _bound_shares(self, times, counts) -> dict:
        """Kernel time split into compute-bound and HBM-bound by each op's own roofline."""
        hw = self.hw
        peak = roofline.compute_rate(self.arch.weight_dtype, hw)[1]
        bw = hw.hbm_bandwidth_bytes_per_s
        shares = {"compute": 0.0, "hbm": 0.0}
        ridge = peak / bw
        for name, kind, c, t in times:
            if kind in ADDED_KINDS:
                continue
            t = float(np.asarray(t)) * c
            intensity = counts["op_intensity"].get(name)
            below_ridge = intensity is not None and intensity < ridge
            if kind == "memory" or below_ridge or (kind == "attention" and "decode" in name):
                shares["hbm"] += t
            else:
                shares["compute"] += t
        return shares

    def counts_per_gpu(self, pre, pctx, dec, dctx, pseqs) -> dict:
        """FLOPs and HBM bytes per GPU from the closed-form op counts (model.perf.ops)."""
        p = self.plan
        step = Step(pre, pctx, dec * (1 + self.spec_tokens), dctx, pseqs)
        ops = model_ops(self.arch, step, self.kv_dtype)
        g = p.attention_gpus
        flops = sum(float(np.asarray(o.flops)) * o.count for o in ops) / g
        kv = sum(float(np.asarray(o.kv_read_bytes + o.kv_write_bytes)) * o.count for o in ops)
        dup = np.mean([p.tp / kv_shard(ly.attention, p) for ly in self.arch.main_layers])
        kv_gpu = kv * dup / g
        act = sum(float(np.asarray(o.act_bytes)) * o.count for o in ops) / g
        intensity = {}
        for o in ops:
            by = float(np.asarray(o.hbm_bytes))
            intensity[o.name] = float(np.asarray(o.flops)) / by if by > 0 else None
        return {"flops_per_gpu": flops, "weight_bytes_read_per_gpu": self._weights_read(pre, dec),
                "kv_bytes_per_gpu": kv_gpu, "activation_bytes_per_gpu": act,
                "op_intensity": intensity}

    def _weights_read(self, pre, dec) -> float:
        ops = model_ops(self.arch, Step(pre, 0.0, dec, 0.0, 1.0), self.kv_dtype)
        dense = sum(float(np.asarray(o.weight_bytes)) * o.count for o in ops if o.kind != "moe")
        moe = sum(float(np.asarray(o.weight_bytes)) * o.count for o in ops if o.kind == "moe")
        return dense / self.plan.tp / self.plan.pp + moe / (self.plan.moe_tp * self.plan.ep) \
            / self.plan.pp

    # -- memory ---------------------------------------------------------------------------------
    def kv_bytes_per_seq_per_gpu(self, context) -> np.ndarray:
        """KV one sequence stores on each GPU that holds it, at `context` tokens: the pool's own
        rule (model.perf.memory.kv_specs), before block rounding."""
        return unpadded_sequence_bytes(kv_specs(self.arch, self.plan, self.kv_dtype),
                                       np.asarray(context, float))

    @property
    def kv_pool_bytes_per_gpu(self) -> float:
        """vLLM caps all memory at 90% of HBM; TensorRT-LLM and SGLang give 90% of what is left
        after weights and activations to the KV cache (their default fractions)."""
        free = self.hw.hbm_bytes - self.weight_bytes_per_gpu - self.activation_reserve_bytes
        if self.backend == "vllm":
            return free - (1 - GPU_MEMORY_UTILIZATION) * self.hw.hbm_bytes
        return GPU_MEMORY_UTILIZATION * free

    def kv_capacity_tokens(self, context) -> np.ndarray:
        """Tokens of KV the replica's pool holds when sequences are `context` long."""
        ctx = np.maximum(np.asarray(context, float), 1.0)
        pool = max(self.kv_pool_bytes_per_gpu, 0.0)
        seqs_per_rank = pool / np.maximum(self.kv_bytes_per_seq_per_gpu(ctx), 1e-9)
        return seqs_per_rank * ctx * self.plan.dp

    def memory_bytes_per_gpu(self, seqs, context) -> np.ndarray:
        """Weights + activation reserve + KV of `seqs` sequences (replica total) at `context`."""
        per_rank = np.asarray(seqs, float) / self.plan.dp
        return (self.weight_bytes_per_gpu + self.activation_reserve_bytes
                + per_rank * self.kv_bytes_per_seq_per_gpu(context))


def build_step_model(arch: Architecture, hw, plan: ParallelPlan, precision: str | None = None,
                     kv_dtype: str | None = None, backend: str = "vllm", spec_tokens: int = 0,
                     spec_acceptance: float = 0.0, factors: EngineFactors | None = None,
                     check_fit: bool = True, moe_precision: str | None = None,
                     cross_domain_tp: bool = False, acceptance_length: float = 0.0,
                     spec_method: str = "mtp",
                     max_num_batched_tokens: int = MAX_NUM_BATCHED_TOKENS,
                     kernel_launch: str = KERNEL_LAUNCH,
                     cpu_offload_gib: float = 0.0,
                     attention_backend: str = ATTENTION_BACKEND,
                     draft_attention_backend: str = DRAFT_ATTENTION_BACKEND) -> StepModel:
    """Validate the plan and build the step model; raises Infeasible if the plan breaks a rule
    or the weights leave no KV cache. `factors`: the engine factors (default: the backend's
    stored ones, `model.perf.engine_factors`). `kernel_launch`: CUDA graphs, eager or eager with
    blocking launches (model.specs.defaults.KERNEL_LAUNCH_MODES). `cpu_offload_gib`: weights per
    GPU kept in host memory and read over the host link each step (model.perf.host_weights,
    vLLM --cpu-offload-gb). `attention_backend` / `draft_attention_backend`: the target's and
    the drafter's attention kernels (model.specs.defaults.ATTENTION_BACKENDS,
    DRAFT_ATTENTION_BACKENDS). Memoized: the same inputs give
    the same object."""
    check_speculation(spec_tokens, spec_acceptance, acceptance_length)
    check_choices(kernel_launch=kernel_launch, attention_backend=attention_backend,
                  draft_attention_backend=draft_attention_backend)
    return _build(arch, hw, plan, precision, kv_dtype, backend, spec_tokens, spec_acceptance,
                  factors or engine_factors(backend), check_fit, moe_precision, cross_domain_tp,
                  acceptance_length, spec_method, int(max_num_batched_tokens), kernel_launch,
                  offload_gib(cpu_offload_gib), attention_backend, draft_attention_backend)


def kernels_per_step(times) -> np.ndarray:
    """Kernels a step launches on one GPU: over the op list `times` ((name, kind, count,
    seconds) from `StepModel._op_times`), each entry's layers x its kernels (KERNELS_PER_OP) where
    the entry does work (seconds > 0)."""
    return sum(np.where(np.asarray(t) > 0, float(c), 0.0)
               * (NORM_KERNELS if name.endswith(":norms") else KERNELS_PER_OP[kind])
               for name, kind, c, t in times)


@lru_cache(maxsize=256)
def _build(arch: Architecture, hw, plan: ParallelPlan, precision: str | None,
           kv_dtype: str | None, backend: str, spec_tokens: int, spec_acceptance: float,
           factors: EngineFactors, check_fit: bool, moe_precision: str | None,
           cross_domain_tp: bool, acceptance_length: float, spec_method: str,
           max_num_batched_tokens: int, kernel_launch: str, cpu_offload_gib: float,
           attention_backend: str, draft_attention_backend: str) -> StepModel:
    arch = with_precision(arch, precision, moe_precision)
    plan = normalize_plan(arch, plan)
    validate_plan(arch, hw, plan, cross_domain_tp)
    model = StepModel(arch, hw, plan, kv_dtype or arch.default_kv_dtype, backend, factors,
                      spec_tokens, spec_acceptance, acceptance_length, spec_method,
                      max_num_batched_tokens, kernel_launch, cpu_offload_gib, attention_backend,
                      draft_attention_backend)
    if check_fit and model.kv_pool_bytes_per_gpu <= 0:
        raise Infeasible(f"{arch.name} weights need {model.weight_bytes_per_gpu / 1e9:.1f} GB per "
                         f"GPU under {plan.label()}: with the activations of "
                         f"{max_num_batched_tokens:,} batched tokens "
                         f"({model.activation_reserve_bytes / 1e9:.1f} GB with the runtime "
                         f"reserve) that leaves no KV cache in {hw.hbm_bytes / 1e9:.0f} GB HBM "
                         f"on {getattr(hw, 'name', 'the chip')}")
    return model
