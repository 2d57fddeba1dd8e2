"""`plan(...)`: the best deployment of a model on a chip for a workload under an interactivity SLO.

Pipeline: workload -> traffic moments; every valid parallel plan per replica size
(`model.perf.parallel.enumerate_plans`) -> one step table each (`model.perf.step`); candidates:
aggregated (replicas x concurrency x engine knobs) and disaggregated (prefill plan x decode plan x
xPyD ratio x concurrency), evaluated vectorized (`model.plan.search`); the Pareto front of TPGS vs P90
interactivity; the best candidate meeting the SLO; its cost (`model.plan.cost`) and launch commands
(`model.plan.launch`). The two-stage P/D method (`model.plan.disagg`) is reported as its own table.

Documented assumptions (the same for every model and chip, no per-row factors):
- traffic: the workload's request mix (200K requests, seed 0), think gaps capped at 300 s;
- deployment recipe per model family (data/deployments/, model.specs.recipes): served weight precision,
  KV-cache dtype, speculative decoding (off unless an acceptance rate is sourced);
- prefix caching answers to capacity and policy (model.plan.search_cache): each candidate's HBM pool
  (model.perf.memory via model.perf.tiers) plus host DRAM (tiered offload, as the post runs Mooncake), LRU
  by default, sticky sessions; the hit rate by tier at the candidate's sessions per replica from
  model.serve.cache_model; evicted prefixes are recomputed, host hits reloaded (model.perf.tiers);
- engine: vLLM defaults (8192 batched tokens, 256 seqs per DP rank), the calibrated engine factors
  of `model.perf.step` (disaggregated decode workers: their own decode factor); thresholds searched
  among {off, 512, 2048}, prefill interval among {1, 2};
- KV hand-off: only the turn's new tokens move (sticky sessions on decode), packed layout;
- cost: owned TCO (SemiAnalysis `costh`, the post's basis); API equivalent from the workload's
  own token mix at Opus 5 prices.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd

from model.perf.parallel import ParallelPlan
from model.perf.step_table import StepTable, step_grid
from model.plan.cost import (
    CostSummary,
    OwnedCostInputs,
    TokenMix,
    gpu_hour_usd,
    summarize_cost,
    token_mix,
)
from model.plan.disagg import Deployment, PhaseConfig, xpyd_grid
from model.plan.search import (
    Traffic,
    best_under_slo,
    evaluate_aggregated,
    evaluate_disaggregated,
    meets_slo,
    pareto_front,
    traffic_from_workload,
)
from model.plan.search_cache import (
    DEFAULT_TIERS,
    CacheSetup,
    reload_s_per_token,
    replica_capacities,
    tier_hits_interp,
)
from model.specs.defaults import MAX_NUM_BATCHED_TOKENS
from model.specs.errors import Infeasible, ServecastError

DEFAULT_SCENARIO = {"arch": "deepseek-v4-pro", "hardware": "gb300-nvl72", "gpus": 12,
                    "workload": "agentx", "slo_p90_interactivity": 50.0}
DEFAULT_API_MODEL = "claude-opus-5"
THRESHOLDS = (0, 512, 2048)
INTERVALS = (1, 2, 4, 8)  # prefill_schedule_interval (InferenceX DSv4 AgentX DEP lane: 8)
DECODE_BATCHES = np.unique(np.round(np.geomspace(1, 1024, 40)))
MODES = ("aggregated", "disaggregated")


@dataclass
class PlanResult:
    best: pd.Series
    deployment: Deployment
    candidates: pd.DataFrame
    pareto: pd.DataFrame
    saturation: pd.DataFrame
    cost: CostSummary
    launch_commands: dict[str, list[str]]
    bottleneck: str
    why: str
    traffic: Traffic
    assumptions: list[str] = field(default_factory=list)
    search_seconds: float = 0.0
    serving_check: dict | None = None  # engineer E's serve() on the best aggregated candidate

    def contract(self) -> dict[str, object]:
        """The `servecast plan --json` object (DESIGN.md command-line contract)."""
        b = self.best
        return {
            "tpgs": float(b["tpgs"]),
            "p90_interactivity_tok_s": float(b["p90_interactivity_tok_s"]),
            "p90_ttft_s": float(b["p90_ttft_s"]),
            "deployment": self.deployment.as_dict(),
            "tco_usd_per_hour": self.cost.tco_usd_per_hour,
            "usd_per_mtok": self.cost.usd_per_mtok,
            "usd_per_mtok_by_class": self.cost.usd_per_mtok_by_class,
            "api_equivalent_usd_per_hour": self.cost.api_equivalent_usd_per_hour,
            "api_model": self.cost.api_model,
            "cost_advantage": self.cost.cost_advantage,
            "launch_commands": self.launch_commands,
            "bottleneck": self.bottleneck,
            "why": self.why,
            "candidates": int(len(self.candidates)),
            "pareto_points": int(len(self.pareto)),
            "search_seconds": self.search_seconds,
            "hit_rate": float(b.get("hit_rate", self.traffic.hit_rate)),
            "serving_check": self.serving_check,
            "assumptions": self.assumptions,
        }


# ---------------------------------------------------------------- loading helpers

def _load(arch, hardware, workload):
    from model.specs.architecture import load_architecture
    from model.specs.hardware import load_hardware
    from model.specs.workload import load_workload

    a = load_architecture(arch) if isinstance(arch, str) else arch
    h = load_hardware(hardware) if isinstance(hardware, str) else hardware
    w = load_workload(workload) if isinstance(workload, str) else workload
    return a, h, w


def _hw_name(hw) -> str:
    return hw.name if hasattr(hw, "name") else str(hw)  # str() of a pydantic spec is slow


def api_price(name: str):
    """Dated API price from `model.specs.prices` (data/prices/)."""
    from model.specs.prices import api_price as lookup

    return lookup(name)


def _kv_bytes_per_token(arch, kv_dtype) -> float:
    from model.perf.kv import kv_bytes_per_token

    return float(kv_bytes_per_token(arch, kv_dtype))


def _sizes(budget: int, divisors_only: bool) -> list[int]:
    if divisors_only:
        return [g for g in range(1, budget + 1) if budget % g == 0]
    pow2 = [2**i for i in range(0, 12) if 2**i <= budget]
    return sorted(set(pow2 + [g for g in range(1, budget + 1) if budget % g == 0]))


# ---------------------------------------------------------------- the search

@dataclass
class _PlanModel:
    plan: ParallelPlan
    hardware: str
    step: object
    table_factory: Callable[[], StepTable]  # built on first use (`table`)
    kv_tokens: float
    tokens_per_step: float
    table_context: float = 0.0  # mean input tokens per request the table is built at
    chunk: float = float(MAX_NUM_BATCHED_TOKENS)  # max_num_batched_tokens per DP rank
    _prefill_steps: dict = field(default_factory=dict, repr=False, compare=False)

    @functools.cached_property
    def table(self) -> StepTable:
        """The plan's step table; prefill-only workers never build one (`prefill_step_s`), and
        they are 87 of the default search's 200 plans."""
        return self.table_factory()

    def prefill_step_s(self, tokens: float) -> float:
        """A prefill-only step carrying `tokens` over the DP ranks in chunks of `chunk`, at the
        table's context, evaluated directly (what a prefill pool's rate needs)."""
        if tokens not in self._prefill_steps:  # kept: every search of the process asks again
            ctx = self.table_context
            self._prefill_steps[tokens] = float(self.step.step_time_s(
                tokens, ctx, 0.0, ctx, max(tokens / self.chunk, 1.0)))
        return self._prefill_steps[tokens]


_MODEL_CACHE: dict[tuple, _PlanModel | None] = {}
_PLANS_CACHE: dict[tuple, tuple[ParallelPlan, ...]] = {}
_TRAFFIC_CACHE: dict[tuple, Traffic] = {}
_REJECTED: dict[tuple, str] = {}  # last reason a plan's step model was infeasible


def traffic_for(workload, hit_rate: float | None = None) -> Traffic:
    """Traffic moments of a workload profile (kept for the process: profiles are immutable)."""
    key = (workload.name, workload.source, workload.date, hit_rate)
    if key not in _TRAFFIC_CACHE:
        _TRAFFIC_CACHE[key] = traffic_from_workload(workload, hit_rate=hit_rate)
    return _TRAFFIC_CACHE[key]
GRID = {"p_max_per_rank": MAX_NUM_BATCHED_TOKENS, "b_max": 65536, "points": 32}


def _plan_models(arch, hw, sizes, phases, traffic, precision, kv_dtype, chunk,
                 max_dp: int, spec: tuple[int, float, str] = (0, 0.0, "mtp")
                 ) -> list[_PlanModel]:
    """A step model and step table for every valid plan of the given replica sizes. All tables
    share one grid, so aggregated and disaggregated candidates reuse them; built tables are kept
    for the process (same arch, chip, plan, precision, context and chunk)."""
    from model.perf.parallel import enumerate_plans
    from model.perf.step import build_step_model, with_precision

    sized = with_precision(arch, precision)  # weights must fit at the serving precision
    grid = step_grid(max(GRID["p_max_per_rank"], chunk) * max_dp, GRID["b_max"], GRID["points"])
    arch_key = (arch.name, arch.weight_dtype, arch.source)
    hw_name = _hw_name(hw)
    seen, out = set(), []
    for g in sizes:
        for phase in phases:
            plans_key = (arch_key, precision, hw_name, g, phase)
            if plans_key not in _PLANS_CACHE:
                _PLANS_CACHE[plans_key] = tuple(enumerate_plans(sized, hw, g, phase))
            for plan in _PLANS_CACHE[plans_key]:
                if plan in seen:
                    continue
                seen.add(plan)
                key = (arch_key, hw_name, plan, precision, kv_dtype, round(traffic.context_mean),
                       chunk, float(grid[0][-1]), spec)
                if key not in _MODEL_CACHE:
                    try:
                        step = build_step_model(arch, hw, plan, precision=precision,
                                                kv_dtype=kv_dtype, spec_tokens=spec[0],
                                                acceptance_length=spec[1],
                                                spec_method=spec[2])
                    except Infeasible as err:
                        _MODEL_CACHE[key] = None
                        _REJECTED[(arch_key, hw_name)] = str(err)
                        continue
                    kv = _kv_capacity_tokens(sized, hw, plan, kv_dtype, step,
                                             traffic.context_mean)
                    if kv <= 0:
                        _MODEL_CACHE[key] = None
                        _REJECTED[(arch_key, hw_name)] = f"{plan.label()}: no KV pool left"
                        continue
                    _MODEL_CACHE[key] = _PlanModel(
                        plan, hw_name, step, functools.partial(
                            StepTable, step, traffic.context_mean, chunk, 0, 0, grid=grid),
                        kv, float(getattr(step, "tokens_per_decode_step", 1.0)),
                        traffic.context_mean, chunk)
                if _MODEL_CACHE[key] is not None:
                    out.append(_MODEL_CACHE[key])
    return out


def _kv_capacity_tokens(sized_arch, hw, plan: ParallelPlan, kv_dtype, step,
                        context: float) -> float:
    """Tokens of KV one replica's HBM pool holds at `context`: model.perf.memory.hbm_budget (the memory
    owner's budget: weights, activations, runtime reserve, allocator pages) via
    model.perf.tiers.tier_capacity_tokens, the same number the cache model gets. Falls back to the step
    model's own pool estimate when the budget cannot be formed (budget 0 = infeasible)."""
    try:
        return replica_capacities(sized_arch, hw, plan, kv_dtype, ("hbm",), context)["hbm"]
    except Infeasible:
        return 0.0
    except (ServecastError, ValueError, AttributeError):
        return float(np.asarray(step.kv_capacity_tokens(context)))


def _host_reload_s_per_token(hw, kv_bytes_per_token: float, plan: ParallelPlan) -> float:
    """Seconds per token to fetch an offloaded session's KV from host memory: each GPU pulls its
    shard over its own host link."""
    link = float(getattr(hw, "host_link_bandwidth_bytes_per_s", 0.0) or 0.0)
    if link <= 0:
        return float("inf")
    return kv_bytes_per_token / (link * plan.attention_gpus)


def serving_check(cands: pd.DataFrame, models_by_id, workload, slo: float,
                  cache: CacheSetup) -> dict | None:
    """The best aggregated candidate under the SLO, re-evaluated by model.serve.engine.serve (same
    step model, engine policy and per-replica sessions; its own cache model call): the search's
    vectorized closed form and the serving model side by side. None when no aggregated candidate
    meets the SLO or the workload cannot be served per replica."""
    from model.serve.engine import serve
    from model.serve.policy import EnginePolicy
    from model.specs.workload import ClosedLoop

    agg = cands[(cands["mode"] == "aggregated") & cands["feasible"]
                & (cands["p90_interactivity_tok_s"] >= slo)]
    if agg.empty:
        return None
    b = agg.loc[agg["tpgs"].idxmax()]
    pm = models_by_id[int(b["_model"])]
    lanes = max(int(round(float(b["concurrency"]) / max(int(b["replicas"]), 1))), 1)
    try:
        res = serve(pm.step, workload, EnginePolicy(
            long_prefill_token_threshold=int(b["threshold"]),
            prefill_schedule_interval=int(b["interval"])), ClosedLoop(lanes),
            cache_policy=cache.policy, cache_tiers=cache.tiers)
    except ServecastError as err:
        return {"plan": str(b["plan"]), "reason": str(err)}
    p90 = (res.interactivity_tok_s or {}).get("p90")
    ttft = (res.ttft_s or {}).get("p90")
    return {"plan": str(b["plan"]), "concurrency_per_replica": lanes, "stable": res.stable,
            "reason": res.reason,
            "search": {"tpgs": float(b["tpgs"]),
                       "p90_interactivity_tok_s": float(b["p90_interactivity_tok_s"]),
                       "p90_ttft_s": float(b["p90_ttft_s"]), "hit_rate": float(b["hit_rate"])},
            "serving": {"tpgs": _num(res.tpgs), "p90_interactivity_tok_s": _num(p90),
                        "p90_ttft_s": _num(ttft), "hit_rate": _num(res.hit_rate),
                        "p90_e2e_interactivity_tok_s":
                            _num((res.e2e_interactivity_tok_s or {}).get("p90"))},
            "tpgs_rel_diff": (float(b["tpgs"]) / res.tpgs - 1) if res.tpgs else None,
            # the search pipelines pp microbatches (vLLM's virtual engines); serve() runs one
            # batch through all stages per step, so PP plans differ for that reason
            "note": "pp > 1: serve() does not pipeline microbatches" if pm.plan.pp > 1 else ""}


def _num(v) -> float | None:
    return None if v is None else float(v)


def _check_cache(cache: CacheSetup) -> None:
    from model.serve.cache_replay import check_policy

    check_policy(cache.policy)
    allowed = ("hbm", "host", "nvme")
    if not cache.tiers or cache.tiers[0] != "hbm" or any(t not in allowed for t in cache.tiers):
        raise ServecastError(f"cache tiers {','.join(cache.tiers) or '(none)'}: start with hbm, "
                             f"then any of {', '.join(allowed[1:])}")


def _cache_terms(pm: _PlanModel, arch, hw, kv_dtype, workload, sessions, cache: CacheSetup):
    """(recomputed miss tokens, lower-tier tokens) per request and the lower tier's reload time
    per token, for `sessions` live sessions per replica of plan `pm` (model.plan.search_cache)."""
    caps = replica_capacities(arch, hw, pm.plan, kv_dtype, cache.tiers, pm.table_context)
    hbm, low, inf = tier_hits_interp(workload, caps, sessions, cache.policy)
    ctx = pm.table_context
    lower = cache.tiers[1] if len(cache.tiers) > 1 else "host"
    return (np.maximum(inf - hbm - low, 0.0) * ctx, low * ctx, hbm + low,
            reload_s_per_token(arch, hw, pm.plan, kv_dtype, lower))


def search_aggregated(models: list[_PlanModel], hw, traffic: Traffic, gpus: int, concurrency,
                      thresholds, intervals, kv_bytes_per_token: float,
                      max_num_batched_tokens: int = MAX_NUM_BATCHED_TOKENS, cache_inputs=None,
                      slo: float | None = None, refine: int = 8,
                      slo_ttft: float | None = None) -> pd.DataFrame:
    """Every (plan, threshold, interval, concurrency) of aggregated replicas, in one array pass.
    `cache_inputs` = (arch, kv_dtype, workload, CacheSetup): hit rates answer to each plan's tier
    capacities and the policy (model.plan.search_cache); None keeps the infinite-cache hit rate.
    With `slo`, each (plan, knobs) gets `refine` more concurrencies at its SLO edge
    (`slo_edge_concurrencies`)."""
    usable = [pm for pm in models if gpus % pm.plan.gpus == 0]
    if not usable:
        return pd.DataFrame()
    table = StepTable.stack([pm.table for pm in usable])
    rows = []  # (model index, threshold, interval)
    for k, pm in enumerate(usable):
        for thr in thresholds:
            for interval in intervals:
                if interval > 1 and pm.plan.dp == 1:
                    continue  # the interval only aligns prefill across DP ranks
                rows.append((k, thr, interval))
    combo = np.array(rows, float)
    conc = np.sort(np.asarray(concurrency, float))
    which = np.repeat(np.arange(len(combo)), len(conc))
    args = (usable, table, hw, traffic, gpus, kv_bytes_per_token, max_num_batched_tokens,
            cache_inputs)
    frame = _aggregated_frame(*args, combo[which], np.tile(conc, len(combo)))
    if slo is None:
        return frame
    idx, fine = slo_edge_concurrencies(conc, meets_slo(frame, slo, slo_ttft).to_numpy(),
                                       refine)
    if not len(idx):
        return frame
    return pd.concat([frame, _aggregated_frame(*args, combo[idx], fine)], ignore_index=True)


def slo_edge_concurrencies(conc: np.ndarray, ok: np.ndarray, refine: int
                           ) -> tuple[np.ndarray, np.ndarray]:
    """`ok` is flat over (combo, sorted concurrency `conc`): for each combo whose last grid point
    meeting the SLO is not the grid's last, `refine` integer concurrencies between it and the next
    one. TPGS at the SLO is set by that edge, and a coarse grid would rank combos by where the
    grid happens to fall. Returns (combo index, concurrency) arrays."""
    empty = np.array([], int), np.array([], float)
    if refine <= 0 or len(conc) < 2:
        return empty
    ok = ok.reshape(-1, len(conc))
    edge = np.where(ok.any(axis=1), len(conc) - 1 - np.argmax(ok[:, ::-1], axis=1), -1)
    sel = (edge >= 0) & (edge < len(conc) - 1)
    if not sel.any():
        return empty
    lo, hi = conc[edge[sel]], conc[edge[sel] + 1]
    steps = np.arange(1, refine + 1) / (refine + 1)
    fine = np.round(lo[:, None] + (hi - lo)[:, None] * steps[None, :])
    keep = (fine > lo[:, None]) & (fine < hi[:, None])
    return np.repeat(np.flatnonzero(sel), refine)[keep.ravel()], fine.ravel()[keep.ravel()]


def _aggregated_frame(usable, table, hw, traffic: Traffic, gpus: int, kv_bytes_per_token: float,
                      max_num_batched_tokens: int, cache_inputs, combos: np.ndarray,
                      c: np.ndarray) -> pd.DataFrame:
    """Candidates for explicit rows: combos (model index, threshold, interval) x concurrency."""
    k = combos[:, 0].astype(int)
    thr, interval = combos[:, 1], combos[:, 2]
    attr = lambda f: np.array([f(pm) for pm in usable], float)[k]  # noqa: E731
    replicas = attr(lambda pm: gpus // pm.plan.gpus)
    miss, lower, hit = 0.0, None, np.full(len(c), traffic.hit_rate)
    if cache_inputs is None:
        reload = attr(lambda pm: _host_reload_s_per_token(hw, kv_bytes_per_token, pm.plan))
    else:
        arch, kv_dtype, workload, setup = cache_inputs
        miss, lower, reload = np.zeros(len(c)), np.zeros(len(c)), np.zeros(len(c))
        for i, pm in enumerate(usable):
            sel = k == i
            if not sel.any():
                continue
            m, lo, h, rl = _cache_terms(pm, arch, hw, kv_dtype, workload,
                                        c[sel] / replicas[sel], setup)
            miss[sel], lower[sel], hit[sel], reload[sel] = m, lo, h, rl
    r = evaluate_aggregated(table, traffic, k, attr(lambda pm: pm.plan.dp),
                            attr(lambda pm: pm.plan.pp), replicas, c, thr, interval,
                            attr(lambda pm: pm.kv_tokens), attr(lambda pm: pm.tokens_per_step),
                            np.where(np.isfinite(reload), reload, 0.0), max_num_batched_tokens,
                            miss_tokens=miss, lower_tier_tokens=lower)
    labels = _text(np.array([pm.plan.label() for pm in usable], object)[k])
    ids = np.array([id(pm) for pm in usable], object)[k]
    return pd.DataFrame({
        "mode": _text(np.full(len(c), "aggregated", object)), "plan": labels,
        "decode_plan": labels,
        "replicas": replicas.astype(int), "x": 0, "y": replicas.astype(int),
        "concurrency": c.astype(int), "threshold": thr.astype(int),
        "interval": interval.astype(int), "gpus": gpus,
        "tpgs": r["tokens_per_s"] / gpus, "hit_rate": hit,
        **{key: r[key] for key in ("p90_interactivity_tok_s", "p90_ttft_s", "mean_ttft_s",
                                   "decode_batch", "step_time_s", "rate_rps", "feasible")},
        "limit": _text(r["limit"]), "_model": ids})


def _text(values) -> pd.Series:
    """A label column kept as Python strings (object dtype): pandas' default Arrow strings cost
    more to build, filter and concatenate than the search's numbers over 100K+ candidates."""
    return pd.Series(np.asarray(values, object), dtype=object, copy=False)


def search_disaggregated(prefill_models, decode_models, traffic: Traffic, gpus: int,
                         kv_bytes_per_token: float, link_bytes_per_s: float, chunk: int,
                         slo: float, concurrency, cache_inputs=None, prefill_hw=None,
                         max_num_seqs: int = 256, refine: int = 8,
                         slo_ttft: float | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Stage 1: saturation of every prefill-only and decode-only plan. Stage 2: every xPyD ratio
    of every plan pair that fills the budget, at each client concurrency (closed loop,
    `evaluate_disaggregated`), refined at each combo's SLO edge as in the aggregated search.
    `cache_inputs` = (arch, kv_dtype, workload, CacheSetup): the prefix cache lives on the
    prefill workers (sticky sessions), each holding concurrency / x sessions; evicted prefixes
    are recomputed and lower-tier hits reloaded before the prefill."""
    sat_rows = []
    if not prefill_models or not decode_models:
        return pd.DataFrame(), pd.DataFrame(columns=["phase", "plan", "hardware", "gpus",
                                                     "max_rps", "max_rps_per_gpu",
                                                     "at_interactivity_tok_s"])
    t_p = np.array([pm.prefill_step_s(chunk * pm.plan.dp) for pm in prefill_models])
    chunk_p = np.array([chunk * pm.plan.dp for pm in prefill_models], float)
    lam_p = chunk_p / t_p / traffic.uncached_mean
    for pm, lam in zip(prefill_models, lam_p, strict=True):
        sat_rows.append({"phase": "prefill", "plan": pm.plan.label(), "hardware": pm.hardware,
                         "gpus": pm.plan.gpus, "max_rps": lam, "max_rps_per_gpu": lam / pm.plan.gpus,
                         "at_interactivity_tok_s": np.nan})
    batches = np.array([DECODE_BATCHES * pm.plan.dp for pm in decode_models])
    # decode-only workers run slower than the same batch in an aggregated engine
    # (EngineFactors.disagg_decode_scale, fitted on the recorded disaggregated runs)
    d_scale = np.array([pm.step.factors.disagg_decode_scale for pm in decode_models])
    steps = np.array([pm.table(0.0, b) for pm, b in zip(decode_models, batches, strict=True)])
    steps = steps * d_scale[:, None]
    tps = np.array([pm.tokens_per_step for pm in decode_models])
    kv_batch = np.array([pm.kv_tokens / traffic.context_mean for pm in decode_models])
    b_cap = np.minimum(kv_batch, np.array([max_num_seqs * pm.plan.dp for pm in decode_models]))
    rate = batches * tps[:, None] / (traffic.output_mean * steps)
    inter = tps[:, None] / steps
    ok = (inter >= slo) & (batches <= b_cap[:, None])
    best = np.argmax(np.where(ok, rate, -1.0), axis=1)
    for k, pm in enumerate(decode_models):
        i, good = best[k], ok[k, best[k]]
        sat_rows.append({"phase": "decode", "plan": pm.plan.label(), "hardware": pm.hardware,
                         "gpus": pm.plan.gpus, "max_rps": rate[k, i] if good else 0.0,
                         "max_rps_per_gpu": (rate[k, i] if good else 0.0) / pm.plan.gpus,
                         "at_interactivity_tok_s": inter[k, i] if good else np.nan})
    # combos: (prefill plan, decode plan, x, y) filling the whole budget (idle GPUs serve nothing)
    p_size = np.array([pm.plan.gpus for pm in prefill_models])
    d_size = np.array([pm.plan.gpus for pm in decode_models])
    parts = []
    for gp in np.unique(p_size):
        for gd in np.unique(d_size):
            xs, ys = xpyd_grid(int(gp), int(gd), gpus, exact=True)
            if len(xs):
                pi, di, ri = np.meshgrid(np.flatnonzero(p_size == gp), np.flatnonzero(d_size == gd),
                                         np.arange(len(xs)), indexing="ij")
                parts.append(np.stack([pi.ravel(), di.ravel(), xs[ri.ravel()], ys[ri.ravel()]], 1))
    if not parts:
        return pd.DataFrame(), pd.DataFrame(sat_rows)
    combo = np.concatenate(parts)
    conc = np.sort(np.asarray(concurrency, float))
    args = (combo, prefill_models, decode_models,
            StepTable.stack([pm.table for pm in decode_models], d_scale),
            t_p, chunk_p, b_cap, tps, traffic, kv_bytes_per_token, link_bytes_per_s,
            cache_inputs, prefill_hw)
    frame = _disaggregated_frame(*args, np.repeat(np.arange(len(combo)), len(conc)),
                                 np.tile(conc, len(combo)))
    idx, fine = slo_edge_concurrencies(conc, meets_slo(frame, slo, slo_ttft).to_numpy(), refine)
    if len(idx):
        frame = pd.concat([frame, _disaggregated_frame(*args, idx, fine)], ignore_index=True)
    return frame, pd.DataFrame(sat_rows)


def _disaggregated_frame(combo, prefill_models, decode_models, table: StepTable, t_p, chunk_p,
                         b_cap, tps, traffic: Traffic, kv_bytes_per_token: float,
                         link_bytes_per_s: float, cache_inputs, prefill_hw, rows: np.ndarray,
                         c: np.ndarray) -> pd.DataFrame:
    """Candidates for explicit rows: combos (prefill plan, decode plan, x, y) x concurrency;
    `table` stacks the decode plans' step tables."""
    pi, di, x, y = (combo[rows, j] for j in range(4))
    miss, lower_s, hit = np.zeros(len(c)), np.zeros(len(c)), np.full(len(c), traffic.hit_rate)
    if cache_inputs is not None:
        arch, kv_dtype, workload, setup = cache_inputs
        for j in np.unique(pi):
            sel = pi == j
            m, lo, h, rl = _cache_terms(prefill_models[j], arch, prefill_hw, kv_dtype, workload,
                                        c[sel] / x[sel], setup)
            miss[sel], lower_s[sel], hit[sel] = m, lo * rl, h
    p_gpus = np.array([pm.plan.gpus for pm in prefill_models], float)
    senders = np.array([pm.plan.attention_gpus for pm in prefill_models], float)
    d_gpus = np.array([pm.plan.gpus for pm in decode_models], float)
    r = evaluate_disaggregated(t_p[pi], p_gpus[pi], senders[pi], table, di, d_gpus[di],
                               b_cap[di], x, y, c, traffic, chunk_p[pi], kv_bytes_per_token,
                               link_bytes_per_s, tps[di], miss, lower_s)
    p_labels = np.array([pm.plan.label() for pm in prefill_models], object)
    d_labels = np.array([pm.plan.label() for pm in decode_models], object)
    p_ids = np.array([id(pm) for pm in prefill_models], object)
    d_ids = np.array([id(pm) for pm in decode_models], object)
    r["limit"] = _text(r["limit"])
    out = pd.DataFrame({"mode": _text(np.full(len(c), "disaggregated", object)),
                        "plan": _text(p_labels[pi]), "decode_plan": _text(d_labels[di]),
                        "replicas": 0, "threshold": 0, "interval": 1, **r, "hit_rate": hit,
                        "_model": p_ids[pi], "_decode_model": d_ids[di]})
    out["concurrency"] = np.round(out["concurrency"]).astype(int)
    return out


def _bottleneck(pm: _PlanModel, row: pd.Series, traffic: Traffic) -> str:
    """The step model's bottleneck label at the chosen operating point."""
    try:
        b = max(float(row.get("decode_batch", 1.0)), 1.0)
        pre = 0.0 if row["mode"] == "disaggregated" else \
            float(row["rate_rps"]) / max(row.get("replicas", 1), 1) * traffic.uncached_mean \
            * float(row["step_time_s"])
        info = pm.step.breakdown(pre, traffic.context_mean, b, traffic.context_mean)
        return str(info.get("bottleneck", "unknown"))
    except Exception:  # the label is explanatory; never fail the plan over it
        return "unknown"


def _runner_up(cands: pd.DataFrame, best: pd.Series, slo: float,
               slo_ttft: float | None = None) -> str:
    """The best candidate meeting the SLO in the other mode, for the 'why it wins' line."""
    rows = np.flatnonzero(((cands["mode"] != best["mode"]) & meets_slo(cands, slo, slo_ttft))
                          .to_numpy())
    if not len(rows):
        return ""
    o = cands.iloc[rows[np.argmax(cands["tpgs"].to_numpy(float)[rows])]]
    name = o["plan"] if o["mode"] == "aggregated" else f"{o['plan']} -> {o['decode_plan']}"
    return (f"; best {o['mode']} alternative {name} at {o['tpgs']:,.0f} TPGS "
            f"(the chosen deployment serves {best['tpgs'] / o['tpgs']:.2f}x more)")


def _why(row: pd.Series, bottleneck: str, slo: float, slo_ttft: float | None = None) -> str:
    limit = {"lanes": "client concurrency (every lane is served; more lanes break the SLO)",
             "kv_capacity": "KV capacity (the decoding batch's contexts fill the HBM pool)",
             "prefill_budget": "the per-step token budget (prefill-bound)",
             "prefill_rate": "prefill workers' saturation rate",
             "decode_rate": "decode workers' saturation rate at the SLO"}.get(
        str(row.get("limit", "")), str(row.get("limit", "")))
    if str(row.get("limit", "")) == "lanes" and float(row["p90_interactivity_tok_s"]) > 1.05 * slo \
            and (slo_ttft is None or float(row["p90_ttft_s"]) < 0.95 * slo_ttft):
        # neither SLO binds: throughput itself peaks at these lanes
        limit = ("the prefix cache and the prefill queue (TPGS peaks at these lanes: more "
                 "sessions miss more prefixes and wait longer than they add)")
    ttft = f" and P90 TTFT <= {slo_ttft:g} s" if slo_ttft is not None else ""
    return (f"highest TPGS among candidates with P90 interactivity >= {slo:g} tok/s{ttft}; "
            f"rate limited by {limit}; step bottleneck: {bottleneck}")


def plan(arch="deepseek-v4-pro", hardware="gb300-nvl72", gpus: int = 12, workload="agentx",
         slo_p90_interactivity: float = 50.0, long_prefill_token_threshold: int | None = None,
         modes=MODES, prefill_hardware: str | None = None, precision: str | None = None,
         kv_dtype: str | None = None, api_model: str = DEFAULT_API_MODEL,
         cost_basis: str = "owned", concurrency=None, hit_rate: float | None = None,
         max_num_batched_tokens: int = MAX_NUM_BATCHED_TOKENS, traffic: Traffic | None = None,
         spec_tokens: int | None = None, acceptance_length: float | None = None,
         spec_method: str | None = None,
         cache_policy: str = "lru", cache_tiers=DEFAULT_TIERS, finite_cache: bool = True,
         recipe: bool = True, verify: bool = False,
         slo_p90_ttft_s: float | None = None) -> PlanResult:
    """Search deployments of `arch` on `gpus` x `hardware` for `workload`; the best under the SLO.

    `slo_p90_ttft_s`: also require P90 TTFT at most this (the post's SLO is interactivity alone,
    which lets a search fill a prefill pool and hold the extra lanes in its queue);
    `long_prefill_token_threshold`: fix the threshold (else searched over THRESHOLDS);
    `prefill_hardware`: a different chip for disaggregated prefill workers;
    `spec_tokens` / `acceptance_length` / `spec_method`: speculative decoding (draft tokens per
    step, measured mean tokens per verification step, mtp | eagle3 | dspark); unset ones come
    from the recipe (sourced acceptance lengths), else off;
    `cache_policy` / `cache_tiers`: prefix retention and tiers; the hit rate then answers to each
    candidate's capacity (`finite_cache=False`: the workload's infinite-cache hit rate);
    `recipe`: take precision, KV dtype and speculative decoding left unset from the model family's
    deployment recipe (data/deployments/, model.specs.recipes);
    `verify`: re-evaluate the best aggregated candidate with model.serve.engine.serve (engineer E's
    full closed form, per replica) and report both in `serving_check` (~1-2 s)."""
    started = time.perf_counter()
    a, hw, w = _load(arch, hardware, workload)
    if recipe:
        from model.specs.recipes import recipe_settings

        precision, kv_dtype, recipe_spec = recipe_settings(a.name, precision, kv_dtype, hw=hw)
        if spec_tokens is None and recipe_spec is not None:
            spec_tokens, acceptance_length, spec_method = recipe_spec
    spec = spec_setting(spec_tokens, acceptance_length, spec_method)
    if gpus < 1:
        raise ServecastError(f"gpus={gpus}: must be >= 1")
    if slo_p90_ttft_s is not None and not slo_p90_ttft_s > 0:
        raise ServecastError(f"slo_p90_ttft_s={slo_p90_ttft_s!r}: must be a positive number of "
                             "seconds")
    for m in modes:
        if m not in MODES:
            raise ServecastError(f"mode {m!r}: allowed {', '.join(MODES)}")
    traffic = traffic or traffic_for(w, hit_rate)
    from model.perf.step import with_precision

    served = with_precision(a, precision)  # weights and index-key cache as served
    kv_per_token = _kv_bytes_per_token(served, kv_dtype)
    thresholds = THRESHOLDS if long_prefill_token_threshold is None else (
        int(long_prefill_token_threshold),)
    if concurrency is None:
        concurrency = np.unique(np.round(np.geomspace(max(gpus // 2, 1), 96 * gpus, 40))).astype(int)
    chunk = max_num_batched_tokens
    cache = CacheSetup(cache_policy, tuple(cache_tiers))
    _check_cache(cache)
    cache_inputs = (served, kv_dtype, w, cache) if finite_cache and hit_rate is None else None
    frames, sat = [], pd.DataFrame()
    models_by_id: dict[int, _PlanModel] = {}
    if "aggregated" in modes:
        # PCP replicates decode-side state, so it belongs to dedicated prefill workers (post)
        agg_models = _plan_models(a, hw, _sizes(gpus, True), ("decode",), traffic, precision,
                                  kv_dtype, chunk, gpus, spec)
        models_by_id.update({id(m): m for m in agg_models})
        frames.append(search_aggregated(agg_models, hw, traffic, gpus, concurrency, thresholds,
                                        INTERVALS, kv_per_token, max_num_batched_tokens,
                                        cache_inputs, slo=slo_p90_interactivity,
                                        slo_ttft=slo_p90_ttft_s))
    if "disaggregated" in modes and gpus >= 2:
        phw = hw if prefill_hardware is None else _load(a, prefill_hardware, w)[1]
        sizes = _sizes(gpus - 1, False)
        p_models = _plan_models(a, phw, sizes, ("prefill",), traffic, precision, kv_dtype, chunk,
                                gpus)
        d_models = _plan_models(a, hw, sizes, ("decode",), traffic, precision, kv_dtype, chunk,
                                gpus, spec)
        models_by_id.update({id(m): m for m in p_models + d_models})
        link = min(float(phw.scale_out_bandwidth_bytes_per_s),
                   float(hw.scale_out_bandwidth_bytes_per_s))
        d_frame, sat = search_disaggregated(p_models, d_models, traffic, gpus, kv_per_token, link,
                                            chunk, slo_p90_interactivity, concurrency,
                                            cache_inputs, phw, slo_ttft=slo_p90_ttft_s)
        frames.append(d_frame)
    frames = [f for f in frames if not f.empty]
    if not frames:
        from model.perf.params import weight_bytes
        from model.perf.step import with_precision

        need = weight_bytes(with_precision(a, precision)) / 1e9
        last = _REJECTED.get(((a.name, a.weight_dtype, a.source), _hw_name(hw)))
        raise Infeasible(f"no parallel plan of {a.name} fits {gpus} x {getattr(hw, 'name', hw)}: "
                         f"weights {need:,.0f} GB at {precision or a.weight_dtype} vs "
                         f"{gpus * hw.hbm_bytes / 1e9:,.0f} GB HBM"
                         + (f" (e.g. {last})" if last else "")
                         + "; add GPUs or serve a smaller checkpoint (--precision fp8 / mxfp8 / "
                         "nvfp4)")
    cands = pd.concat(frames, ignore_index=True)
    cands["hit_rate"] = (cands["hit_rate"] if "hit_rate" in cands else pd.Series(
        np.nan, index=cands.index)).fillna(traffic.hit_rate)
    served = np.isfinite(cands["tpgs"]) & (cands["tpgs"] > 0)
    if not served.all():  # a full-frame copy costs 0.1 s at 170K candidates: only when needed
        cands = cands[served].reset_index(drop=True)
    front = pareto_front(cands.loc[cands["feasible"], [
        "mode", "plan", "decode_plan", "replicas", "x", "y", "concurrency", "threshold",
        "interval", "tpgs", "p90_interactivity_tok_s", "p90_ttft_s", "limit", "gpus"]])
    best = best_under_slo(cands, slo_p90_interactivity, slo_p90_ttft_s)
    deployment = _deployment(best, models_by_id, a.name, max_num_batched_tokens,
                             prefill_hardware or _hw_name(hw))
    deployment = replace(deployment, serving=serving_format(a.name if recipe else "", hw,
                                                            precision, kv_dtype, spec))
    shares = gpu_time_shares(best, models_by_id, traffic)
    cost = _cost(best, deployment, hw, prefill_hardware, a, traffic, api_model, cost_basis, shares)
    from model.plan.launch import launch_commands

    main_pm = models_by_id[int(best.get("_decode_model", best["_model"]))
                           if best["mode"] == "disaggregated" else int(best["_model"])]
    bottleneck = _bottleneck(main_pm, best, traffic)
    check = serving_check(cands, models_by_id, w, slo_p90_interactivity, cache) if verify \
        else None
    elapsed = time.perf_counter() - started
    return PlanResult(serving_check=check, best=best, deployment=deployment, candidates=cands, pareto=front,
                      saturation=sat, cost=cost, launch_commands=launch_commands(deployment),
                      bottleneck=bottleneck,
                      why=_why(best, bottleneck, slo_p90_interactivity, slo_p90_ttft_s)
                      + _runner_up(cands, best, slo_p90_interactivity, slo_p90_ttft_s),
                      traffic=traffic,
                      assumptions=_assumptions(traffic, cost)
                      + _deployment_assumptions(a.name if recipe else "", precision, kv_dtype,
                                                spec, cache, cache_inputs is not None, best, hw),
                      search_seconds=elapsed)


def spec_setting(tokens: int | None, acceptance_length: float | None,
                 method: str | None) -> tuple[int, float, str]:
    """(draft tokens, acceptance length, method), checked: one error line on bad input."""
    k = int(tokens or 0)
    al = float(acceptance_length or 0.0)
    m = method or "mtp"
    if k < 0 or m not in ("mtp", "eagle3", "dspark"):
        raise ServecastError(f"speculative decoding: spec_tokens {k} must be >= 0 and method "
                             f"{m!r} one of mtp, eagle3, dspark")
    if k and not 1.0 <= al <= 1.0 + k:
        raise ServecastError(f"speculative decoding: acceptance_length {al:g} must be in "
                             f"[1, 1 + spec_tokens = {1 + k}]")
    return (k, al if k else 0.0, m)


def serving_format(arch_name: str, hw, precision, kv_dtype, spec):
    """The launch lines' serving format: the recipe's checkpoint on this chip (when `precision`
    is its variant's), KV and index-key cache dtypes, speculative decoding with the recipe's
    draft checkpoint when the method is the recipe's."""
    from model.plan.launch import ServingFormat
    from model.specs.precision import parse_precision
    from model.specs.recipes import recipe_for

    r = recipe_for(arch_name) if arch_name else None
    checkpoint = r.checkpoint_on(hw) if r is not None and precision == r.precision_on(hw) \
        else None
    k, _, method = spec
    draft = r.draft_on(hw) if r is not None and method == r.spec_method else None
    return ServingFormat(checkpoint=checkpoint, kv_dtype=kv_dtype,
                         indexer_kv_dtype=parse_precision(precision).get("indexer_cache"),
                         spec_method=method if k else "none", spec_tokens=int(k),
                         draft_model=draft, extra_vllm=r.vllm_args if r is not None else ())


def _deployment(best: pd.Series, models_by_id, arch_name: str, budget_tokens: int,
                prefill_hw_name: str) -> Deployment:
    common = {"arch": arch_name, "concurrency": int(best["concurrency"]),
              "max_num_batched_tokens": budget_tokens,
              "long_prefill_token_threshold": int(best["threshold"]),
              "prefill_schedule_interval": int(best["interval"])}
    if best["mode"] == "aggregated":
        pm = models_by_id[int(best["_model"])]
        return Deployment(mode="aggregated", replica=PhaseConfig(pm.hardware, pm.step.plan,
                                                                 int(best["replicas"])), **common)
    ppm = models_by_id[int(best["_model"])]
    dpm = models_by_id[int(best["_decode_model"])]
    return Deployment(mode="disaggregated",
                      prefill=PhaseConfig(prefill_hw_name, ppm.step.plan, int(best["x"])),
                      decode=PhaseConfig(dpm.hardware, dpm.step.plan, int(best["y"])), **common)


def gpu_time_shares(best: pd.Series, models_by_id, traffic: Traffic) -> dict[str, float]:
    """Busy GPU time by token class at the chosen operating point, for $/Mtok by class:
    output = the decode part of the step, uncached input = the prefill part on a short context,
    cached input = the extra prefill time of attending the cached context (its KV reads).
    Disaggregated: decode workers' GPUs are output's, prefill workers' are split the same way."""
    try:
        s = traffic.context_mean
        short = max(traffic.uncached_mean, 1.0)
        if best["mode"] == "aggregated":
            pm = models_by_id[int(best["_model"])]
            b = float(best["decode_batch"]) / max(pm.plan.pp, 1)
            p = float(best["rate_rps"]) * traffic.uncached_mean * float(best["step_time_s"])
            full = float(pm.step.step_time_s(p, s, b, s, max(p / short, 1.0)))
            decode = float(pm.step.step_time_s(0.0, 0.0, b, s))
            pre_short = float(pm.step.step_time_s(p, short, 0.0, 0.0, max(p / short, 1.0)))
            pre_full = max(full - decode, 0.0)
            cached = min(max(pre_full - pre_short, 0.0), pre_full)
            return {"output": decode, "uncached_input": pre_full - cached, "cached_input": cached}
        ppm = models_by_id[int(best["_model"])]
        chunk = float(MAX_NUM_BATCHED_TOKENS) * ppm.plan.dp
        full = float(ppm.step.step_time_s(chunk, s, 0.0, 0.0, chunk / short))
        pre_short = float(ppm.step.step_time_s(chunk, short, 0.0, 0.0, chunk / short))
        p_gpus = float(best["x"]) * ppm.plan.gpus
        d_gpus = float(best["gpus"]) - p_gpus
        cached_frac = min(max(full - pre_short, 0.0) / full, 1.0) if full > 0 else 0.0
        return {"output": d_gpus, "uncached_input": p_gpus * (1 - cached_frac),
                "cached_input": p_gpus * cached_frac}
    except Exception:  # explanatory split only; the totals never depend on it
        return {}


def _cost(best, deployment: Deployment, hw, prefill_hardware, arch, traffic: Traffic,
          api_model: str, basis: str, shares: dict[str, float] | None = None) -> CostSummary:
    if deployment.mode == "disaggregated" and prefill_hardware:
        from model.specs.hardware import load_hardware

        phw = load_hardware(prefill_hardware)
        usd_hour = (gpu_hour_usd(phw, basis) * deployment.prefill.gpus
                    + gpu_hour_usd(hw, basis) * deployment.decode.gpus)
        per_gpu = usd_hour / deployment.gpus
    else:
        per_gpu = gpu_hour_usd(hw, basis)
    mix = served_mix(traffic)
    return summarize_cost(per_gpu, deployment.gpus, float(best["tpgs"]), api_price(api_model), mix,
                          api_model=api_model, basis=basis, gpu_time_share=shares or None)


def served_mix(traffic: Traffic) -> TokenMix:
    return token_mix(traffic.context_mean, traffic.output_mean, traffic.hit_rate,
                     source=f"{traffic.name} request mix (means)")


def _assumptions(traffic: Traffic, cost: CostSummary) -> list[str]:
    return [
        f"traffic {traffic.name}: mean input {traffic.context_mean:,.0f} tok, uncached "
        f"{traffic.uncached_mean:,.0f} (p90 {traffic.uncached_p90:,.0f}), output "
        f"{traffic.output_mean:,.0f}, think gap {traffic.gap_mean_s:.1f} s (capped 300 s; "
        f"while no request is in flight the replay skips idle time past 10 s, AgentX's system "
        f"idle cap), hit {traffic.hit_rate:.3f}",
        "sessions not resident in HBM reload KV from host memory (tiered offload)",
        "disaggregated: only new tokens' KV moves to decode (sticky sessions), packed layout",
        f"cost basis {cost.basis}; API equivalent at {cost.api_model} prices on the served mix",
    ]


def _deployment_assumptions(arch_name, precision, kv_dtype, spec, cache: CacheSetup,
                            finite: bool, best: pd.Series, hw=None) -> list[str]:
    from model.specs.recipes import recipe_for

    r = recipe_for(arch_name) if arch_name else None
    out = [f"served weights {precision or 'as checkpoint'}, KV cache {kv_dtype or 'arch default'}"
           + (f" ({r.assumptions(hw)})" if r else " (no deployment recipe)"),
           "speculative decoding " + (f"{spec[2]} {spec[0]} tokens, acceptance length "
                                      f"{spec[1]:g} tokens per step" if spec[0] else "off")]
    if finite:
        out.append(f"prefix cache: {cache.policy} over {'+'.join(cache.tiers)} per replica "
                   f"(model.serve.cache_model closed form), hit {float(best.get('hit_rate', 0)):.3f} at "
                   "the chosen point; evicted prefixes are recomputed, lower-tier hits reloaded")
    return out


def owned_cost_inputs_for(hw) -> OwnedCostInputs:
    """The owned-cost model's inputs from a hardware spec (capex, power)."""
    return OwnedCostInputs(capex_usd_per_gpu=float(hw.capex_usd_per_gpu),
                           power_kw_per_gpu=float(hw.power_w) / 1e3)


# ---------------------------------------------------------------- parallelism lessons

def plan_family(plan: ParallelPlan) -> str:
    """The strategy a plan represents, as the post names them."""
    if plan.pp > 1:
        return "PP"
    if plan.pcp > 1:
        return "PCP"
    if plan.dcp > 1:
        return "DCP"
    if plan.dp > 1 and plan.ep > 1:
        return "DEP"
    if plan.dp > 1:
        return "DP"
    return "TP+EP" if plan.ep > 1 else "TP"


def prefill_time_s(step, new_tokens: float, cached_tokens: float = 0.0,
                   chunk: int = MAX_NUM_BATCHED_TOKENS) -> float:
    """Time to prefill `new_tokens` after `cached_tokens` of cached prefix, one request alone,
    in chunks of `chunk` tokens (vLLM chunked prefill); with pp stages the chunks pipeline:
    (chunks + pp - 1) stage times (theory.md §4.4)."""
    pp = step.plan.pp
    n = int(np.ceil(new_tokens / chunk))
    sizes = np.full(n, float(chunk))
    sizes[-1] = new_tokens - chunk * (n - 1)
    ctx = cached_tokens + np.cumsum(sizes)
    t = np.asarray(step.step_time_s(sizes, ctx, 0.0, 0.0, 1.0), float)
    if pp == 1:
        return float(t.sum())
    return float((t.sum() + (pp - 1) * t.max()) / pp)


def step_model(arch, hardware, plan: ParallelPlan, precision=None, kv_dtype=None,
               speculative: bool = True):
    """The step model of `plan` as `plan()` serves it: unset precision, KV dtype and (with
    `speculative`) speculative decoding from the family's recipe (data/deployments/)."""
    from model.perf.step import build_step_model
    from model.specs.recipes import SPEC_OFF, recipe_settings

    a, hw, _ = _load(arch, hardware, None)
    precision, kv_dtype, spec = recipe_settings(a.name, precision, kv_dtype, speculative, hw)
    spec = spec or SPEC_OFF
    return build_step_model(a, hw, plan, precision=precision, kv_dtype=kv_dtype,
                            spec_tokens=spec[0], acceptance_length=spec[1], spec_method=spec[2])


def best_by_family(result: PlanResult, slo: float, mode: str = "aggregated") -> pd.DataFrame:
    """The best TPGS meeting the SLO per parallel family (of the replica, or of decode workers)."""
    models = {}
    for m in _MODEL_CACHE.values():
        if m is not None:
            models[m.plan.label()] = m.plan
    df = result.candidates[(result.candidates["mode"] == mode) & result.candidates["feasible"]
                           & (result.candidates["p90_interactivity_tok_s"] >= slo)].copy()
    if df.empty:
        return df
    column = "plan" if mode == "aggregated" else "decode_plan"
    df["family"] = [plan_family(models[label]) if label in models else "?" for label in df[column]]
    best = df.sort_values("tpgs", ascending=False).groupby("family", as_index=False).first()
    return best[["family", column, "tpgs", "p90_interactivity_tok_s", "p90_ttft_s",
                 "concurrency"]].sort_values("tpgs", ascending=False).reset_index(drop=True)


def decode_capacity_by_family(arch, hardware, gpus: int, context: float, output_tokens: float,
                              slo: float) -> pd.DataFrame:
    """Decode-only saturation (stage 1) of every decode plan of `gpus` GPUs at `context`:
    the largest request rate with P90 interactivity >= slo within KV capacity, per plan."""
    from model.perf.parallel import enumerate_plans

    a, hw, _ = _load(arch, hardware, None)
    rows = []
    for p in enumerate_plans(a, hw, gpus, "decode"):
        try:
            st = step_model(a, hw, p)
        except Infeasible:
            continue
        b = DECODE_BATCHES * p.dp
        t = np.asarray(st.step_time_s(0.0, 0.0, b, context), float)
        q = float(st.tokens_per_decode_step)
        kv_batch = float(np.asarray(st.kv_capacity_tokens(context))) / context
        rate = b * q / (output_tokens * t)
        ok = (q / t >= slo) & (b <= kv_batch)
        i = int(np.argmax(np.where(ok, rate, -1)))
        rows.append({"plan": p.label(), "family": plan_family(p),
                     "max_decode_batch": float(b[i]) if ok[i] else 0.0,
                     "kv_batch_capacity": kv_batch,
                     "decode_tokens_per_s_per_gpu": float(rate[i] * output_tokens / gpus)
                     if ok[i] else 0.0})
    return pd.DataFrame(rows).sort_values("decode_tokens_per_s_per_gpu", ascending=False)


# ---------------------------------------------------------------- the post's rows

# vLLM AgentX post, results and cost tables (seed 000; research/theory.md §1.0). The served
# precision and KV dtype come from each family's recipe (data/deployments/, model.specs.recipes); the
# traffic is AgentX v1.0 as SemiAnalysis states it (`agentx-v1`, model.fit.workload).
POST_ROWS = (
    {"arch": "deepseek-v4-pro", "hardware": "gb300-nvl72", "gpus": 12, "precision": None,
     "concurrency": 256, "tpgs": 83_000, "p90_interactivity_tok_s": 58.3,
     "tco_usd_per_hour": 27.72, "api_usd_per_hour": 2926, "cost_advantage": 106},
    {"arch": "minimax-m3", "hardware": "b300", "gpus": 2, "precision": None,
     "concurrency": 24, "tpgs": 70_000, "p90_interactivity_tok_s": 74.2,
     "tco_usd_per_hour": 4.52, "api_usd_per_hour": 384, "cost_advantage": 85},
    {"arch": "kimi-k3", "hardware": "gb300-nvl72", "gpus": 16, "precision": None,
     "concurrency": 48, "tpgs": 11_800, "p90_interactivity_tok_s": 62.7,
     "tco_usd_per_hour": 36.96, "api_usd_per_hour": 538, "cost_advantage": 14.6},
)


def reproduce_post(slo_p90_interactivity: float = 50.0, workload: str = "agentx-v1",
                   at_post_concurrency: bool = False, **plan_kwargs) -> pd.DataFrame:
    """Plan each of the post's three deployments (same model, chip and GPU count) and compare
    the predicted TPGS at the SLO with the published one. One row per deployment;
    `at_post_concurrency` fixes each row's client sessions to the post's (256, 24, 48)."""
    rows = []
    for post in POST_ROWS:
        out = {"arch": post["arch"], "hardware": post["hardware"], "gpus": post["gpus"],
               "published_tpgs": post["tpgs"],
               "published_p90_interactivity_tok_s": post["p90_interactivity_tok_s"]}
        try:
            kw = {**plan_kwargs, "concurrency": [post["concurrency"]]} if at_post_concurrency \
                else plan_kwargs
            r = plan(post["arch"], post["hardware"], post["gpus"], workload,
                     slo_p90_interactivity, precision=post["precision"], **kw)
            out.update({"predicted_tpgs": float(r.best["tpgs"]),
                        "predicted_p90_interactivity_tok_s":
                            float(r.best["p90_interactivity_tok_s"]),
                        "deployment": r.deployment.label(), "bottleneck": r.bottleneck,
                        "cost_advantage": r.cost.cost_advantage, "reason": ""})
        except ServecastError as err:
            out.update({"predicted_tpgs": float("nan"), "deployment": "", "reason": str(err)})
        out["rel_error"] = out["predicted_tpgs"] / post["tpgs"] - 1
        rows.append(out)
    return pd.DataFrame(rows)


# ---------------------------------------------------------------- DEP vs TP (the post's lesson)

def dep_vs_tp_decode(arch="deepseek-v4-pro", hardware="gb300-nvl72", gpus: int = 8,
                     context: float = 142_000.0, precision=None, kv_dtype=None,
                     batches=(8, 16, 32, 64, 128, 256, 512)) -> dict:
    """Decode-only comparison of DEP (dp=gpus, ep=gpus) with TP+EP (tp=gpus, ep=gpus) on the same
    GPUs: KV capacity (sequences at `context`), step time by total batch, and the batch above
    which DEP steps faster. DEP keeps each sequence's KV on one rank (no copy of MLA-style latent
    KV per TP rank: more sequences fit, fewer KV bytes read per GPU) but replicates attention
    weights on every rank and adds EP all-to-all, so it wins only once the batch is large.
    Precision and KV dtype default to the family's recipe (data/deployments/)."""
    from model.perf.step import build_step_model
    from model.specs.recipes import recipe_settings

    a, hw, _ = _load(arch, hardware, None)
    precision, kv_dtype, _ = recipe_settings(a.name, precision, kv_dtype, speculative=False,
                                             hw=hw)

    ep = gpus if any(ly.mlp.experts is not None for ly in a.layers) else 1  # dense: DP vs TP
    tp = build_step_model(a, hw, ParallelPlan(tp=gpus, ep=ep), precision=precision,
                          kv_dtype=kv_dtype)
    dep = build_step_model(a, hw, ParallelPlan(dp=gpus, ep=ep), precision=precision,
                           kv_dtype=kv_dtype)
    b = np.asarray(batches, float)
    t_tp = np.asarray(tp.step_time_s(0.0, 0.0, b, context), float)
    t_dep = np.asarray(dep.step_time_s(0.0, 0.0, b, context), float)
    faster = np.flatnonzero(t_dep < t_tp)
    table = pd.DataFrame({"batch": b, "tp_step_s": t_tp, "dep_step_s": t_dep,
                          "tp_interactivity_tok_s": 1 / t_tp,
                          "dep_interactivity_tok_s": 1 / t_dep, "dep_over_tp": t_dep / t_tp})
    return {"tp_plan": tp.plan.label(), "dep_plan": dep.plan.label(),
            "tp_kv_sequences": float(np.asarray(tp.kv_capacity_tokens(context))) / context,
            "dep_kv_sequences": float(np.asarray(dep.kv_capacity_tokens(context))) / context,
            "crossover_batch": float(b[faster[0]]) if len(faster) else float("inf"),
            "table": table}
