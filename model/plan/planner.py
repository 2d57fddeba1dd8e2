"""`plan(...)`: the best deployment of a model on a chip for a workload under an interactivity SLO.

Pipeline: the inputs resolved once (`model.plan.inputs`: recipe, cache, traffic); the screening
tier ranks every candidate (model.plan.screening_search: every valid parallel plan per replica
size, aggregated replicas x concurrency x engine knobs, disaggregated prefill plan x decode plan x
xPyD ratio x concurrency, vectorized); the full tier (model.plan.full_tier: serve() per replica,
model.serve.pools for disaggregated workers) evaluates the shortlisted deployments, moves each to
the SLO's edge and picks the highest TPGS under the SLO. Every number reported for the chosen
deployment and its Pareto points is the full tier's; the screening's numbers for the chosen
deployment stay beside them (`PlanResult.screening`). Cost (`model.plan.cost`) and launch commands
(`model.plan.launch`) follow; the two-stage P/D saturation is its own table.

Documented assumptions (the same for every model and chip, no per-row factors):
- traffic: the workload's request mix (the screening's moments over 200K requests, the full
  tier's `request_mix_for`), think gaps capped at 300 s, the AgentX system idle cap;
- deployment recipe per model family (data/deployments/, model.specs.recipes): served weight
  precision, KV-cache dtype, speculative decoding (off unless an acceptance rate is sourced);
- prefix caching answers to capacity and policy: each replica's (prefill worker's) HBM pool plus
  host DRAM (tiered offload, as the post runs Mooncake), LRU by default, sticky sessions;
- engine: vLLM defaults (8192 batched tokens, 256 seqs per DP rank), the calibrated engine
  factors of `model.perf.step` (disaggregated decode workers: their own decode factor);
  thresholds searched among {off, 512, 2048}, prefill interval among {1, 2, 4, 8};
- KV hand-off: only the turn's new tokens move (sticky sessions on decode), packed layout;
- cost: owned TCO (SemiAnalysis `costh`, the post's basis); API equivalent from the workload's
  own token mix at Opus 5 prices.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from model.perf.params import weight_bytes
from model.plan import evaluate, plan_models, search_cache
from model.plan import traffic as traffic_moments
from model.plan.cost import CostSummary
from model.plan.deployment import (
    Deployment,
    DeploymentShape,
    PhaseConfig,
    parse_deployment_label,
)
from model.plan.evaluate import evaluate_deployment
from model.plan.full_tier import (
    SLO_MARGIN,
    TPGS_MARGIN,
    FullTierPoint,
    Slo,
    at_peak,
    at_slo,
    best_point,
    full_tier_front,
    shortlist,
)
from model.plan.inputs import PlanInputs, ServingChoices, resolve_inputs
from model.plan.launch import launch_commands
from model.plan.report import (
    assumptions,
    bottleneck,
    gpu_time_shares,
    plan_cost,
    point_row,
    runner_up,
    serving_format,
    why,
)
from model.plan.screening import best_under_slo, pareto_front
from model.plan.screening_search import screen_candidates
from model.plan.search_cache import DEFAULT_TIERS
from model.plan.traffic import Traffic
from model.serve.deployment import DeploymentServing
from model.specs.defaults import (
    ATTENTION_BACKEND,
    DEFAULT_API_MODEL,
    DRAFT_ATTENTION_BACKEND,
    MAX_NUM_BATCHED_TOKENS,
    MODES,
)
from model.specs.errors import Infeasible, ServecastError
from model.specs.precision import with_precision

# the GPU budget the search enumerates at most: replica sizes are the budget's divisors, and a
# budget past a few racks only adds replicas of the same units
MAX_SEARCH_GPUS = 576
THRESHOLDS = (0, 512, 2048)
INTERVALS = (1, 2, 4, 8)  # prefill_schedule_interval (InferenceX DSv4 AgentX DEP lane: 8)
PARETO_COLUMNS = ("mode", "plan", "decode_plan", "replicas", "x", "y", "concurrency",
                  "threshold", "interval", "tpgs", "p90_interactivity_tok_s", "p90_ttft_s",
                  "limit", "gpus")


@dataclass(frozen=True, eq=False)
class PlanResult:
    best: pd.Series  # the chosen deployment, full tier
    screening: pd.Series  # the screening's numbers for the same deployment and sessions
    deployment: Deployment
    serving: DeploymentServing  # the full tier's whole result for it
    candidates: pd.DataFrame  # every screened candidate
    pareto: pd.DataFrame  # full-tier points no other evaluated point beats
    saturation: pd.DataFrame  # stage 1 of the two-stage P/D method
    cost: CostSummary
    launch_commands: dict[str, list[str]]
    bottleneck: str
    why: str
    traffic: Traffic
    inputs: PlanInputs
    assumptions: tuple[str, ...] = ()
    search_seconds: float = 0.0
    evaluated: tuple[FullTierPoint, ...] = ()  # every full-tier point behind the answer

    def full_tier_peak(self, metric: str) -> FullTierPoint:
        """The full tier's largest `metric` (tpgs | p90_interactivity_tok_s) with no SLO, the
        points behind the answer included (`peak_point`)."""
        return peak_point(self.inputs, self.candidates, metric, self.evaluated)

    def contract(self) -> dict[str, object]:
        """The `servecast plan --json` object (DESIGN.md command-line contract)."""
        b, s = self.best, self.screening
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
            "meets_slo": bool(b["meets_slo"]),
            "tier": "full",
            "hit_rate": float(b["hit_rate"]),
            "serving": self.serving.as_dict(),
            "screening": {k: _number(s.get(k)) for k in (
                "tpgs", "p90_interactivity_tok_s", "p90_ttft_s", "hit_rate", "concurrency")},
            "candidates": int(len(self.candidates)),
            "pareto_points": int(len(self.pareto)),
            "full_tier_evaluations": len(self.evaluated),
            "search_seconds": self.search_seconds,
            "assumptions": list(self.assumptions),
        }


def _number(v) -> float | None:
    return None if v is None or (isinstance(v, float) and np.isnan(v)) else float(v)


def plan(arch="deepseek-v4-pro", hardware="gb300-nvl72", gpus: int | None = 12,
         workload="agentx", slo_p90_interactivity: float = 50.0,
         long_prefill_token_threshold: int | None = None, modes=MODES,
         prefill_hardware: str | None = None, precision: str | None = None,
         kv_dtype: str | None = None, api_model: str = DEFAULT_API_MODEL,
         cost_basis: str = "owned", concurrency=None, hit_rate: float | None = None,
         max_num_batched_tokens: int = MAX_NUM_BATCHED_TOKENS, traffic: Traffic | None = None,
         spec_tokens: int | None = None, acceptance_length: float | None = None,
         spec_method: str | None = None, cache_policy: str = "lru",
         cache_tiers=DEFAULT_TIERS, finite_cache: bool = True, recipe: bool = True,
         slo_p90_ttft_s: float | None = None, deployment: str | None = None,
         prefill_schedule_interval: int | None = None, pareto_points: int = 0,
         allow_beyond_window: bool = False, cpu_offload_gib: float = 0.0,
         frontend: str | None = None, attention_backend: str = ATTENTION_BACKEND,
         draft_attention_backend: str = DRAFT_ATTENTION_BACKEND) -> PlanResult:
    """Search deployments of `arch` on `gpus` x `hardware` for `workload`; the best under the SLO.

    `slo_p90_ttft_s`: also require P90 TTFT at most this;
    `long_prefill_token_threshold` / `prefill_schedule_interval`: fix the knob (else searched
    over THRESHOLDS / INTERVALS); `concurrency`: fix the client sessions (one value or a list;
    else searched, and the full tier moves them to the SLO's edge);
    `deployment`: restrict the plan to this deployment label (`dp8-ep8`, `2x[tp4]`,
    `1P[dp4-ep4]1D[dp8-ep8]`; replicas of a bare plan follow `gpus`; `gpus=None`: the
    deployment's own GPUs); its numbers
    are then what `servecast serve --deployment` reports with the same engine settings, and
    when no setting meets the SLO the closest is reported (`meets_slo` false);
    `prefill_hardware`: a different chip for disaggregated prefill workers;
    `spec_tokens` / `acceptance_length` / `spec_method`: speculative decoding (draft tokens per
    step, measured mean tokens per verification step, mtp | eagle3 | dspark); unset ones come
    from the recipe (sourced acceptance lengths), else off;
    `cache_policy` / `cache_tiers`: prefix retention and tiers; the hit rate then answers to each
    deployment's capacity (`finite_cache=False`: the workload's infinite-cache hit rate);
    `recipe`: take precision, KV dtype and speculative decoding left unset from the model
    family's deployment recipe (data/deployments/, model.specs.recipes);
    `pareto_points`: evaluate this many more points along the screening's Pareto front with
    the full tier (the reported front is always the full tier's evaluated points);
    `allow_beyond_window`: serve a workload whose requests pass the model's context window
    (else refused), and state it among the assumptions; `cpu_offload_gib`: weights per GPU every
    engine keeps in host memory (vLLM --cpu-offload-gb, model.perf.host_weights): plans whose
    weights fit only then become candidates, each step reads them over the host link, and the
    KV pool takes the HBM they leave; `frontend`: the request front end the full tier puts before
    the engines (Deployment.frontend; None: its tokenization alone); `attention_backend` /
    `draft_attention_backend`: the engines' and their drafters' attention kernels
    (model.specs.defaults.ATTENTION_BACKENDS, DRAFT_ATTENTION_BACKENDS)."""
    started = time.perf_counter()
    shape, gpus = _shape(deployment, gpus, modes)
    slo = _slo(slo_p90_interactivity, slo_p90_ttft_s, modes)
    choices = ServingChoices(precision, kv_dtype, spec_tokens, acceptance_length, spec_method,
                             recipe, cache_policy, tuple(cache_tiers), finite_cache, hit_rate,
                             allow_beyond_window=allow_beyond_window)
    inputs = resolve_inputs(arch, hardware, workload, choices, prefill_hardware,
                            max_num_batched_tokens, traffic, cpu_offload_gib, frontend,
                            attention_backend, draft_attention_backend)
    modes = (shape.mode,) if shape is not None else tuple(modes)
    fixed = None if concurrency is None else tuple(sorted({int(c) for c in concurrency}))
    grid = fixed or session_grid(gpus)
    cands, saturation, rejected = screen_candidates(
        inputs, gpus, modes, grid, _knob(long_prefill_token_threshold, THRESHOLDS),
        _knob(prefill_schedule_interval, INTERVALS), slo.p90_interactivity_tok_s,
        slo.p90_ttft_s, shape)
    if cands.empty:
        raise _no_plan(inputs, gpus, rejected)
    chosen, points = _choose(inputs, cands, slo, fixed, shape is not None)
    points = points + _pareto_extra(inputs, cands, pareto_points)
    return _result(inputs, chosen, points, cands, saturation, slo, api_model, cost_basis,
                   time.perf_counter() - started)


def screen(arch, hardware, gpus: int, workload, slo_p90_interactivity: float = 50.0,
           modes=MODES, concurrency=None) -> pd.DataFrame:
    """The screening tier's candidates alone, as `plan` ranks them (no full tier): for tables
    that compare many deployments, such as the best per parallel family."""
    inputs = resolve_inputs(arch, hardware, workload)
    return screen_candidates(inputs, gpus, tuple(modes), concurrency or session_grid(gpus),
                             THRESHOLDS, INTERVALS, slo_p90_interactivity)[0]


def session_grid(gpus: int) -> np.ndarray:
    """The client sessions the screening tries: 40 points from half the GPUs to 96 per GPU."""
    return np.unique(np.round(np.geomspace(max(gpus // 2, 1), 96 * gpus, 40)))


def peak_point(inputs: PlanInputs, candidates: pd.DataFrame, metric: str,
               known=(), count: int = 2) -> FullTierPoint:
    """The full tier's largest `metric` (tpgs | p90_interactivity_tok_s) with no SLO: the
    screening's `count` best deployments by it (and each mode's best), each climbed from the
    concurrency where the screening peaks (`at_peak`), and the `known` points."""
    points = list(known)
    for curve in shortlist(candidates, Slo(0.0), count=count, rank_by=metric, reserve=0)[0]:
        template = deployment_of(curve.iloc[0], inputs)
        points += at_peak(_evaluator(inputs, template), curve, metric)
    return max(points, key=lambda p: getattr(p, metric))


def full_tier_peak(arch, hardware, gpus: int, workload, metric: str,
                   precision: str | None = None) -> FullTierPoint:
    """`peak_point` of a scenario without an SLO search: the screening, then the full tier on
    its best deployments for `metric`."""
    inputs = resolve_inputs(arch, hardware, workload, ServingChoices(precision))
    cands = screen_candidates(inputs, gpus, MODES, session_grid(gpus), THRESHOLDS, INTERVALS,
                              0.0)[0]
    return peak_point(inputs, cands, metric)


def _shape(label: str | None, gpus: int | None, modes) -> tuple[DeploymentShape | None, int]:
    if label is None:
        if gpus is None or not 1 <= gpus <= MAX_SEARCH_GPUS:
            raise ServecastError(f"--gpus {gpus}: the search covers 1..{MAX_SEARCH_GPUS:,} GPUs "
                                 f"(its candidates grow faster than the budget); plan a unit "
                                 f"and replicate it, or give --deployment LABEL")
        return None, int(gpus)
    shape, total = parse_deployment_label(label).resolve(gpus)
    if shape.mode not in modes:
        raise ServecastError(f"--deployment {label!r}: a {shape.mode} deployment, but --mode "
                             f"allows {', '.join(modes)}")
    return shape, total


def _slo(interactivity: float, ttft_s: float | None, modes) -> Slo:
    if ttft_s is not None and not ttft_s > 0:
        raise ServecastError(f"slo_p90_ttft_s={ttft_s!r}: must be a positive number of seconds")
    for m in modes:
        if m not in MODES:
            raise ServecastError(f"mode {m!r}: allowed {', '.join(MODES)}")
    return Slo(float(interactivity), ttft_s)


def _knob(value: int | None, searched: tuple[int, ...]) -> tuple[int, ...]:
    return searched if value is None else (int(value),)


def _no_plan(inputs: PlanInputs, gpus: int, rejected: str) -> Infeasible:
    hw, served = inputs.hardware, with_precision(inputs.arch, inputs.precision)
    return Infeasible(
        f"no parallel plan of {inputs.arch.name} fits {gpus} x {hw.name}: weights "
        f"{weight_bytes(served) / 1e9:,.0f} GB at {inputs.precision or inputs.arch.weight_dtype}"
        f" vs {gpus * hw.hbm_bytes / 1e9:,.0f} GB HBM" + (f" (e.g. {rejected})" if rejected else "")
        + "; add GPUs, serve a smaller checkpoint (--precision fp8 / mxfp8 / nvfp4) or keep "
        "weights in host memory (--cpu-offload-gb)")


def deployment_of(row: pd.Series, inputs: PlanInputs) -> Deployment:
    """The deployment a screening row describes, behind the plan's front end."""
    common = {"arch": inputs.arch.name, "concurrency": int(row["concurrency"]),
              "max_num_batched_tokens": inputs.max_num_batched_tokens,
              "frontend": inputs.frontend,
              "long_prefill_token_threshold": int(row["threshold"]),
              "prefill_schedule_interval": int(row["interval"]),
              "cpu_offload_gib": float(row["_model"].step.cpu_offload_gib),
              "attention_backend": row["_model"].step.attention_backend,
              "draft_attention_backend": row["_model"].step.draft_attention_backend}
    if row["mode"] == "aggregated":
        pm = row["_model"]
        return Deployment(mode="aggregated", replica=PhaseConfig(
            pm.hardware, pm.step.plan, int(row["replicas"])), **common)
    ppm, dpm = row["_model"], row["_decode_model"]
    return Deployment(mode="disaggregated",
                      prefill=PhaseConfig(ppm.hardware, ppm.step.plan, int(row["x"])),
                      decode=PhaseConfig(dpm.hardware, dpm.step.plan, int(row["y"])), **common)


def _evaluator(inputs: PlanInputs, template: Deployment):
    """Full-tier points of `template` by sessions. The search reads TPGS, interactivity and
    TTFT; the E2E law waits for the point the plan reports (`_result`)."""
    def evaluate(concurrency: int) -> FullTierPoint:
        dep = replace(template, concurrency=int(concurrency))
        return FullTierPoint(dep, evaluate_deployment(inputs.setup, dep, e2e=False))
    return evaluate


def _choose(inputs: PlanInputs, cands: pd.DataFrame, slo: Slo, fixed, restricted: bool
            ) -> tuple[tuple[FullTierPoint, pd.Series], list[FullTierPoint]]:
    """The full tier's pick among the screening's shortlist, and its reserve in turn while no
    point meets the SLO: (the chosen point and its screening row, every point evaluated).
    Restricted to one deployment whose settings all miss the SLO, the closest is the pick."""
    primary, reserve = shortlist(cands, slo)
    if not primary and restricted:
        primary, reserve = shortlist(cands, Slo(0.0), rank_by="p90_interactivity_tok_s")
    if not primary:
        best_under_slo(cands, slo.p90_interactivity_tok_s, slo.p90_ttft_s)  # names the gap
        raise Infeasible("no candidate comes near the SLO")
    evaluated: list[tuple[FullTierPoint, pd.Series]] = []
    best = None
    for i, curve in enumerate(primary + reserve):
        if i >= len(primary) and best is not None:
            break  # the reserve only while nothing meets the SLO
        near = curve["p90_interactivity_tok_s"] >= (1.0 - SLO_MARGIN) * slo.p90_interactivity_tok_s
        if best is not None and float(curve.loc[near, "tpgs"].max()) < (1.0 - TPGS_MARGIN) \
                * best[0].tpgs:
            continue
        template = deployment_of(curve.iloc[0], inputs)
        evaluated += [(p, curve.iloc[0]) for p in at_slo(_evaluator(inputs, template), curve,
                                                         slo, fixed)]
        top = best_point([p for p, _ in evaluated], slo)
        best = next(e for e in evaluated if e[0] is top) if top is not None else best
    points = [p for p, _ in evaluated]
    if best is None:
        closest = max(evaluated, key=lambda e: (e[0].stable, e[0].p90_interactivity_tok_s,
                                                e[0].tpgs))
        if not restricted:
            raise Infeasible(
                f"no shortlisted deployment reaches P90 interactivity "
                f"{slo.p90_interactivity_tok_s:g} tok/s in the full tier (closest "
                f"{closest[0].p90_interactivity_tok_s:.1f} tok/s: "
                f"{closest[0].deployment.label()}); lower --slo-p90-interactivity or add GPUs")
        best = closest
    return best, points


def _pareto_extra(inputs: PlanInputs, cands: pd.DataFrame, count: int) -> list[FullTierPoint]:
    """`count` points spread along the screening's Pareto front (by P90 interactivity),
    evaluated by the full tier."""
    if count <= 0:
        return []
    front = pareto_front(cands[cands["feasible"]])
    if front.empty:
        return []
    pick = np.unique(np.linspace(0, len(front) - 1, min(count, len(front))).round().astype(int))
    return [_evaluator(inputs, deployment_of(row, inputs))(row["concurrency"])
            for _, row in front.iloc[pick].iterrows()]


def _result(inputs: PlanInputs, chosen: tuple[FullTierPoint, pd.Series],
            points: list[FullTierPoint], cands: pd.DataFrame, saturation: pd.DataFrame,
            slo: Slo, api_model: str, cost_basis: str, seconds: float) -> PlanResult:
    point, screening_row = chosen
    point = replace(point, serving=point.serving.with_e2e())
    best = point_row(point, screening_row, slo)
    deployment = replace(point.deployment, serving=serving_format(
        inputs.arch.name if inputs.recipe else "", inputs.hardware, inputs.precision,
        inputs.kv_dtype, inputs.spec))
    result = point.serving.result
    shares = gpu_time_shares(best, float(result.prefill_step_share or 0.0), inputs.traffic)
    cost = plan_cost(best, deployment, inputs, api_model, cost_basis, shares)
    label = bottleneck(best, inputs.traffic)
    front = full_tier_front(points)
    pareto = pd.DataFrame([point_row(p, screening_row, slo)[list(PARETO_COLUMNS)]
                           .to_dict() | _columns_of(p.deployment) for p in front])
    return PlanResult(
        best=best, screening=screening_at(inputs, point.deployment), deployment=deployment,
        serving=point.serving, candidates=cands, pareto=pareto, saturation=saturation,
        cost=cost, launch_commands=launch_commands(deployment), bottleneck=label,
        why=why(best, label, slo) + runner_up(points, best, slo), traffic=inputs.traffic,
        inputs=inputs,
        assumptions=tuple(assumptions(inputs, cost, best, point.serving.assumptions,
                                      len(points))),
        search_seconds=seconds, evaluated=tuple(points))


def _columns_of(dep: Deployment) -> dict[str, object]:
    """The screening frame's deployment columns for a deployment."""
    if dep.mode == "aggregated":
        label = dep.replica.plan.label()
        return {"mode": dep.mode, "plan": label, "decode_plan": label,
                "replicas": dep.replica.instances, "x": 0, "y": dep.replica.instances,
                "threshold": dep.long_prefill_token_threshold,
                "interval": dep.prefill_schedule_interval}
    return {"mode": dep.mode, "plan": dep.prefill.plan.label(),
            "decode_plan": dep.decode.plan.label(), "replicas": 0,
            "x": dep.prefill.instances, "y": dep.decode.instances,
            "threshold": dep.long_prefill_token_threshold,
            "interval": dep.prefill_schedule_interval}


def shape_of(dep: Deployment) -> DeploymentShape:
    if dep.mode == "aggregated":
        return DeploymentShape("aggregated", dep.replica.plan, dep.replica.instances)
    return DeploymentShape("disaggregated", prefill=dep.prefill.plan,
                           prefill_workers=dep.prefill.instances, decode=dep.decode.plan,
                           decode_workers=dep.decode.instances)


def screening_at(inputs: PlanInputs, dep: Deployment) -> pd.Series:
    """The screening tier's numbers for `dep` at its concurrency (its own candidate row)."""
    cands, _, _ = screen_candidates(
        inputs, dep.gpus, (dep.mode,), [int(dep.concurrency)],
        (dep.long_prefill_token_threshold,), (dep.prefill_schedule_interval,), 0.0, None,
        shape_of(dep))
    return cands.iloc[0] if len(cands) else pd.Series(dtype=object)


def clear_search_caches() -> None:
    """Forget what searches memoized (plans, step models' tables, cache-model answers, full-tier
    evaluations): a benchmark's cold start."""
    for fn in (plan_models._plan_model, plan_models._enumerated, plan_models.step_table,
               plan_models.prefill_step_s, search_cache._capacities,
               search_cache._reload_s_per_token, search_cache._tier_hit_points,
               search_cache._grid_hits, traffic_moments._chunk_mix, traffic_moments._traffic_for,
               evaluate._evaluate):
        fn.cache_clear()
