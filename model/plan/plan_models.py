"""The step model, KV pool and screening step table of every parallel plan a search considers.

`plan_models(...)` enumerates the valid plans of the replica sizes asked for
(`model.perf.parallel.enumerate_plans`) and builds one `PlanModel` each: the plan's step model as
`plan` serves it (precision, KV dtype, speculative decoding), the tokens of KV its HBM pool holds,
and (on first use) its screening step table. Everything is a pure function of its arguments,
memoized: the same arch, chip, plan, precision, context and budget give the same object, so a
process that plans again reuses the tables. Plans whose weights or KV do not fit are left out and
the last reason is returned with the models.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from model.perf.host_weights import offloaded_bytes_per_gpu
from model.perf.kv import kv_bytes_per_token
from model.perf.parallel import (
    ParallelPlan,
    enumerate_plans,
    normalize_plan,
    tp_crosses_domain,
    validate_plan,
    weight_bytes_per_gpu,
)
from model.perf.step import build_step_model
from model.perf.step_table import StepTable, step_grid
from model.plan.search_cache import replica_capacities
from model.plan.traffic import Keyed
from model.specs.architecture import load_architecture
from model.specs.defaults import ATTENTION_BACKEND, DRAFT_ATTENTION_BACKEND, MAX_NUM_BATCHED_TOKENS
from model.specs.errors import Infeasible, ServecastError
from model.specs.hardware import load_hardware
from model.specs.precision import with_precision
from model.specs.recipes import SPEC_OFF, recipe_settings

# the step tables' shared grid: prefill tokens up to the budget x DP ranks, decode sequences to
# 65,536, 32 log1p-spaced cells each
GRID_PREFILL_TOKENS_PER_RANK = MAX_NUM_BATCHED_TOKENS
GRID_DECODE_SEQS = 65536
GRID_POINTS = 32
Spec = tuple[int, float, str]  # (draft tokens, acceptance length, method)


@dataclass(frozen=True, eq=False)  # hashed by identity: memoized, one object per inputs
class PlanModel:
    """One parallel plan as the search serves it."""

    plan: ParallelPlan
    hardware: str
    step: object  # model.perf.step.StepModel
    kv_tokens: float  # tokens of KV the replica's HBM pool holds at `context_tokens`
    tokens_per_step: float  # decode tokens per sequence per step (speculative decoding)
    context_tokens: float  # mean input tokens per request the table is built at
    chunk_tokens: float  # max_num_batched_tokens per DP rank
    grid: tuple  # the step table's (prefill tokens, decode seqs) grid


@functools.lru_cache(maxsize=1024)
def step_table(model: PlanModel) -> StepTable:
    """The plan's screening step table (prefill-only workers never need one)."""
    return StepTable(model.step, model.context_tokens, model.chunk_tokens, 0, 0,
                     grid=model.grid)


@functools.lru_cache(maxsize=4096)
def prefill_step_s(model: PlanModel, tokens: float) -> float:
    """A prefill-only step carrying `tokens` over the DP ranks in chunks of the budget, at the
    table's context (what a prefill pool's rate needs)."""
    ctx = model.context_tokens
    return float(model.step.step_time_s(tokens, ctx, 0.0, ctx,
                                        max(tokens / model.chunk_tokens, 1.0)))


def load_specs(arch, hardware, workload=None):
    """(architecture, hardware, workload) from names or as given."""
    from model.specs.workload import load_workload

    a = load_architecture(arch) if isinstance(arch, str) else arch
    h = load_hardware(hardware) if isinstance(hardware, str) else hardware
    w = load_workload(workload) if isinstance(workload, str) else workload
    return a, h, w


def hardware_name(hw) -> str:
    return hw.name if hasattr(hw, "name") else str(hw)  # str() of a pydantic spec is slow


def plan_models(arch, hw, sizes, phases, context_tokens: float, precision, kv_dtype,
                chunk_tokens: int, max_dp: int, spec: Spec = SPEC_OFF,
                only: tuple[ParallelPlan, ...] | None = None, cpu_offload_gib: float = 0.0,
                attention_backend: str = ATTENTION_BACKEND,
                draft_attention_backend: str = DRAFT_ATTENTION_BACKEND
                ) -> tuple[list[PlanModel], str]:
    """(a PlanModel for every valid plan of the replica sizes `sizes` and `phases`, the last
    reason a plan was left out). All tables share one grid, so aggregated and disaggregated
    candidates reuse them. `only`: these plans instead of the enumerated ones (normalized for
    the architecture and validated); `cpu_offload_gib`: weights per GPU each engine keeps in
    host memory (vLLM --cpu-offload-gb, model.perf.host_weights); `attention_backend` /
    `draft_attention_backend`: the target's and the drafter's attention kernels the step models
    time (model.specs.defaults.ATTENTION_BACKENDS, DRAFT_ATTENTION_BACKENDS)."""
    grid_top = float(max(GRID_PREFILL_TOKENS_PER_RANK, chunk_tokens) * max_dp)
    akey = Keyed.arch(arch)
    offload = float(cpu_offload_gib)
    plans = _listed_plans(akey, hw, precision, only) if only is not None else [
        p for g in sizes for phase in phases
        for p in _enumerated(akey, hw, precision, g, phase, offload)]
    out, rejected = [], ""
    for plan in dict.fromkeys(plans):
        model = _plan_model(akey, hw, plan, precision, kv_dtype, float(context_tokens),
                            int(chunk_tokens), grid_top, tuple(spec), offload,
                            attention_backend, draft_attention_backend)
        if isinstance(model, str):
            rejected = model
        else:
            out.append(model)
    return out, rejected


@functools.lru_cache(maxsize=256)
def _enumerated(arch: Keyed, hw, precision, gpus: int, phase: str, cpu_offload_gib: float = 0.0
                ) -> tuple[ParallelPlan, ...]:
    # the weights left in HBM must fit at the serving precision
    sized = with_precision(arch.value, precision)

    def in_hbm(plan: ParallelPlan) -> float:
        return weight_bytes_per_gpu(sized, plan) - offloaded_bytes_per_gpu(sized, plan,
                                                                           cpu_offload_gib)
    return tuple(enumerate_plans(sized, hw, gpus, phase, in_hbm))


def _listed_plans(arch: Keyed, hw, precision, plans) -> list[ParallelPlan]:
    sized = with_precision(arch.value, precision)
    out = []
    for plan in plans:
        plan = normalize_plan(sized, plan)
        validate_plan(sized, hw, plan, cross_domain_tp=True)  # a listed plan may span domains
        out.append(plan)
    return out


@functools.lru_cache(maxsize=2048)
def _plan_model(arch: Keyed, hw, plan: ParallelPlan, precision, kv_dtype, context_tokens: float,
                chunk_tokens: int, grid_top: float, spec: Spec, cpu_offload_gib: float = 0.0,
                attention_backend: str = ATTENTION_BACKEND,
                draft_attention_backend: str = DRAFT_ATTENTION_BACKEND) -> PlanModel | str:
    """The plan's model, or the reason it cannot serve (a string)."""
    try:
        step = build_step_model(arch.value, hw, plan, precision=precision, kv_dtype=kv_dtype,
                                spec_tokens=spec[0], acceptance_length=spec[1],
                                spec_method=spec[2],
                                cross_domain_tp=tp_crosses_domain(plan, hw),
                                cpu_offload_gib=cpu_offload_gib,
                                attention_backend=attention_backend,
                                draft_attention_backend=draft_attention_backend)
    except Infeasible as err:
        return str(err)
    sized = with_precision(arch.value, precision)
    kv = kv_capacity_tokens(sized, hw, plan, kv_dtype, step, context_tokens, cpu_offload_gib)
    if kv <= 0:
        return f"{plan.label()}: no KV pool left"
    grid = step_grid(grid_top, GRID_DECODE_SEQS, GRID_POINTS)
    return PlanModel(plan, hardware_name(hw), step, kv,
                     float(getattr(step, "tokens_per_decode_step", 1.0)), context_tokens,
                     float(chunk_tokens), grid)


def kv_capacity_tokens(sized_arch, hw, plan: ParallelPlan, kv_dtype, step,
                       context_tokens: float, cpu_offload_gib: float = 0.0) -> float:
    """Tokens of KV one replica's HBM pool holds at `context_tokens`: model.perf.memory's budget
    (weights less those kept in host memory, activations, runtime reserve, allocator pages) via
    model.perf.tiers, the same number the cache model gets; the step model's own pool estimate
    when the budget cannot be formed (0 = infeasible)."""
    try:
        return replica_capacities(sized_arch, hw, plan, kv_dtype, ("hbm",),
                                  context_tokens, cpu_offload_gib)["hbm"]
    except Infeasible:
        return 0.0
    except (ServecastError, ValueError, AttributeError):
        return float(np.asarray(step.kv_capacity_tokens(context_tokens)))


def host_reload_s_per_token(hw, kv_bytes_per_token_: float, plan: ParallelPlan) -> float:
    """Seconds per token to fetch an offloaded session's KV from host memory: each GPU pulls its
    shard over its own host link."""
    link = float(getattr(hw, "host_link_bandwidth_bytes_per_s", 0.0) or 0.0)
    if link <= 0:
        return float("inf")
    return kv_bytes_per_token_ / (link * plan.attention_gpus)


def served_kv_bytes_per_token(arch, precision, kv_dtype) -> float:
    """KV bytes per token of context of the architecture as served."""
    return float(kv_bytes_per_token(with_precision(arch, precision), kv_dtype))


def step_model(arch, hardware, plan: ParallelPlan, precision=None, kv_dtype=None,
               speculative: bool = True):
    """The step model of `plan` as `plan()` serves it: unset precision, KV dtype and (with
    `speculative`) speculative decoding from the family's recipe (data/deployments/)."""
    a, hw, _ = load_specs(arch, hardware)
    precision, kv_dtype, spec = recipe_settings(a.name, precision, kv_dtype, speculative, hw)
    spec = spec or SPEC_OFF
    return build_step_model(a, hw, plan, precision=precision, kv_dtype=kv_dtype,
                            spec_tokens=spec[0], acceptance_length=spec[1], spec_method=spec[2])
