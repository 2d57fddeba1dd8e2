"""Reproduce a publication's quantitative claims with the model: `papers/<paper>/claims.yaml`.

Each claim names a predictor (a function registered here) and its arguments; the predictor
computes the quantity from the model's modules (workload profile, plan search, serving, step
model, KV layout). A predictor that cannot produce a number (a module missing, the quantity is
outside the model, an infeasible configuration) gives `predicted: null` with its `reason`; the
other claims still run. Comparison per claim: `approx` (|rel_error| <= tolerance), `at_least`
(predicted >= published * (1 - tolerance)) or `at_most` (0 < predicted <= published *
(1 + tolerance), for "up to" claims).
"""

from __future__ import annotations

import fnmatch
import math
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from model import ROOT
from model.specs.errors import ServecastError, SpecError
from model.specs.specio import write_atomic
from model.validate.parallel import fork_context

PAPERS = ROOT / "papers"
COMPARISONS = ("approx", "at_least", "at_most")
CLAIM_KEYS = {"id", "quantity", "published", "unit", "tolerance", "comparison", "source", "also",
              "note", "predictor", "args"}
REQUIRED = ("id", "quantity", "published", "unit", "tolerance", "source", "predictor")


class NotModeled(ServecastError):
    """The claim is about something the analytical model deliberately does not represent."""


@dataclass(frozen=True)
class Claim:
    id: str
    quantity: str
    published: float
    unit: str
    tolerance: float
    source: dict[str, str]
    predictor: str
    args: dict[str, Any] = field(default_factory=dict)
    comparison: str = "approx"
    note: str = ""

    def judge(self, predicted: float | None) -> tuple[float | None, bool | None]:
        """(rel_error, within_tolerance) of a prediction; (None, None) when there is none."""
        if predicted is None:
            return None, None
        rel = (predicted - self.published) / self.published
        eps = 1e-12
        if self.comparison == "at_least":
            ok = predicted >= self.published * (1 - self.tolerance) - eps
        elif self.comparison == "at_most":
            ok = 0 < predicted <= self.published * (1 + self.tolerance) + eps
        else:
            ok = abs(rel) <= self.tolerance + eps
        return rel, bool(ok)


@dataclass(frozen=True)
class Paper:
    name: str
    title: str
    path: Path
    documents: dict[str, dict[str, str]]
    defaults: dict[str, Any]
    claims: tuple[Claim, ...]


def list_papers() -> list[str]:
    return sorted(p.parent.name for p in PAPERS.glob("*/claims.yaml"))


def load_paper(name: str) -> Paper:
    """Read and validate `papers/<name>/claims.yaml` (or a path to a claims file)."""
    path = Path(name) if name.endswith((".yaml", ".yml")) else PAPERS / name / "claims.yaml"
    if not path.is_file():
        raise ServecastError(f"unknown paper {name!r}; allowed: {', '.join(list_papers())}")
    raw = yaml.safe_load(path.read_text())
    if not isinstance(raw, dict) or not isinstance(raw.get("claims"), list):
        raise SpecError(path, "claims", "expected a list of claims")
    documents = raw.get("documents") or {}
    claims, seen = [], set()
    for i, item in enumerate(raw["claims"]):
        where = f"claims[{i}]"
        if not isinstance(item, dict):
            raise SpecError(path, where, "expected a mapping")
        where = f"claims[{i}] ({item.get('id', '?')})"
        unknown = sorted(set(item) - CLAIM_KEYS)
        if unknown:
            raise SpecError(path, f"{where}.{unknown[0]}",
                            f"unknown key; allowed: {', '.join(sorted(CLAIM_KEYS))}")
        for key in REQUIRED:
            if key not in item:
                raise SpecError(path, f"{where}.{key}", "missing")
        if item["id"] in seen:
            raise SpecError(path, f"{where}.id", "duplicate id")
        seen.add(item["id"])
        published, tol = item["published"], item["tolerance"]
        if isinstance(published, bool) or not isinstance(published, (int, float)) or not published:
            raise SpecError(path, f"{where}.published", f"a non-zero number, got {published!r}")
        if isinstance(tol, bool) or not isinstance(tol, (int, float)) or not 0 <= tol <= 1:
            raise SpecError(path, f"{where}.tolerance", f"a fraction in [0, 1], got {tol!r}")
        comparison = item.get("comparison", "approx")
        if comparison not in COMPARISONS:
            raise SpecError(path, f"{where}.comparison", f"allowed: {', '.join(COMPARISONS)}")
        if item["predictor"] not in PREDICTORS:
            raise SpecError(path, f"{where}.predictor",
                            f"unknown predictor; allowed: {', '.join(sorted(PREDICTORS))}")
        source = item["source"]
        if not isinstance(source, dict) or source.get("doc") not in documents or \
                not source.get("quote"):
            raise SpecError(path, f"{where}.source",
                            f"needs doc (one of {', '.join(documents)}) and quote")
        claims.append(Claim(item["id"], item["quantity"], float(published), item["unit"],
                            float(tol), dict(source), item["predictor"],
                            dict(item.get("args") or {}), comparison, item.get("note", "")))
    return Paper(raw.get("paper", path.parent.name), raw.get("title", ""), path, documents,
                 dict(raw.get("defaults") or {}), tuple(claims))


# ---------------------------------------------------------------- predictors

PREDICTORS: dict[str, Callable[..., float]] = {}


def predictor(fn: Callable[..., float]) -> Callable[..., float]:
    PREDICTORS[fn.__name__] = fn
    return fn


class Context:
    """Shared, memoized model results for one reproduction run (one plan search per deployment)."""

    def __init__(self, defaults: dict[str, Any] | None = None):
        self.defaults = {"workload": "agentx", "slo_p90_interactivity": 50.0, **(defaults or {})}
        self._memo: dict[Any, Any] = {}

    def memo(self, key: Any, compute: Callable[[], Any]) -> Any:
        if key not in self._memo:
            try:
                self._memo[key] = (True, compute())
            except Exception as err:  # remembered, so claims sharing the result fail alike
                self._memo[key] = (False, err)
        ok, value = self._memo[key]
        if not ok:
            raise value
        return value

    def plan_summary(self, arch: str, hardware: str, gpus: int, precision: str | None = None,
                     concurrency: int | None = None) -> dict[str, float]:
        key = ("plan", arch, hardware, int(gpus), precision, concurrency)
        return self.memo(key, lambda: plan_summary(arch, hardware, int(gpus),
                                                   self.defaults["workload"],
                                                   float(self.defaults["slo_p90_interactivity"]),
                                                   precision, concurrency))

    def prefetch_plans(self, keys: list[tuple[str, str, int, str | None, int | None]],
                       workers: int) -> None:
        """Run the independent plan searches in parallel processes (they dominate the run)."""
        todo = [k for k in dict.fromkeys(keys) if ("plan", *k) not in self._memo]
        if workers <= 1 or len(todo) <= 1:
            return
        wl, slo = self.defaults["workload"], float(self.defaults["slo_p90_interactivity"])
        with ProcessPoolExecutor(max_workers=min(workers, len(todo)),
                                 mp_context=fork_context()) as pool:
            futures = {k: pool.submit(plan_summary, *k[:3], wl, slo, *k[3:]) for k in todo}
            for k, fut in futures.items():
                try:
                    self._memo[("plan", *k)] = (True, fut.result())
                except Exception as err:
                    self._memo[("plan", *k)] = (False, err)


def plan_summary(arch: str, hardware: str, gpus: int, workload: str,
                 slo_p90_interactivity: float, precision: str | None = None,
                 concurrency: int | None = None) -> dict[str, float]:
    """The plan's best deployment (the full tier's numbers) as plain numbers (picklable);
    `concurrency` fixes the client lanes (else searched)."""
    from model.plan.planner import plan

    result = plan(arch, hardware, gpus, workload, slo_p90_interactivity, precision=precision,
                  concurrency=None if concurrency is None else [int(concurrency)])
    contract = result.contract()
    return {
        "tpgs": contract["tpgs"],
        "p90_interactivity_tok_s": contract["p90_interactivity_tok_s"],
        "p90_ttft_s": contract["p90_ttft_s"],
        "concurrency": float(contract["deployment"]["concurrency"]),
        "tco_usd_per_hour": contract["tco_usd_per_hour"],
        "api_equivalent_usd_per_hour": contract["api_equivalent_usd_per_hour"],
        "cost_advantage": contract["cost_advantage"],
        "usd_per_mtok": contract["usd_per_mtok"],
        "deployment": contract["deployment"].get("label", "")}


def _number(value: Any, what: str) -> float:
    if value is None or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ServecastError(f"{what}: the model gave no finite number ({value!r})")
    return float(value)


@predictor
def workload_statistic(ctx: Context, statistic: str, sessions: int = 2000, seed: int = 0,
                       workload: str | None = None) -> float:
    """A statistic of sessions drawn from the workload profile (model.fit.workload); `workload`
    overrides the paper's default profile."""
    from model.fit.workload import sample_statistics
    from model.specs.workload import load_workload

    name = workload or ctx.defaults["workload"]
    stats = ctx.memo(("workload", name, sessions, seed),
                     lambda: sample_statistics(load_workload(name), sessions, seed))
    if statistic not in stats:
        raise ServecastError(f"workload statistic {statistic!r}; allowed: {', '.join(stats)}")
    return _number(stats[statistic], statistic)


@predictor
def plan_metric(ctx: Context, arch: str, hardware: str, gpus: int, metric: str,
                precision: str | None = None, concurrency: int | None = None) -> float:
    """A number of the best deployment under the SLO (`servecast plan`), at a fixed client
    `concurrency` when one is given."""
    summary = ctx.plan_summary(arch, hardware, gpus, precision, concurrency)
    if metric not in summary:
        raise ServecastError(f"plan metric {metric!r}; allowed: {', '.join(summary)}")
    return _number(summary[metric], metric)


@predictor
def plan_peak(ctx: Context, arch: str, hardware: str, gpus: int, metric: str,
              precision: str | None = None) -> float:
    """The largest `metric` with no SLO: the full tier climbed from where the screening's best
    deployments for it peak (model.plan.planner.full_tier_peak)."""
    from model.plan.planner import full_tier_peak

    point = ctx.memo(("peak", arch, hardware, int(gpus), precision, metric),
                     lambda: full_tier_peak(arch, hardware, int(gpus), ctx.defaults["workload"],
                                            metric, precision))
    return _number(getattr(point, metric), metric)


def _step_model(arch: str, hardware: str, plan: dict[str, Any], serving: bool = False):
    """The step model of `plan` with the family's recipe (weights, KV dtype; with `serving`
    also its speculative decoding, as `servecast plan` serves it)."""
    from model.perf.parallel import ParallelPlan, validate_plan
    from model.plan.plan_models import step_model
    from model.specs.architecture import load_architecture
    from model.specs.hardware import load_hardware

    a, hw, p = load_architecture(arch), load_hardware(hardware), ParallelPlan(**plan)
    validate_plan(a, hw, p)
    return step_model(a, hw, p, speculative=serving)


@predictor
def threshold_effect(ctx: Context, arch: str, hardware: str, plan: dict[str, Any],
                     threshold: int, metric: str, interval: int = 1) -> float:
    """TPGS gain at the SLO / P90 interactivity ratio of `--long-prefill-token-threshold`
    (model.serve.engine.threshold_effect, closed form), both policies at prefill cadence `interval`.
    The ratio is taken at the load the threshold-on engine serves best under the SLO."""
    from model.serve import engine as serving
    from model.serve.policy import EnginePolicy
    from model.specs.workload import load_workload

    def compute():
        step = _step_model(arch, hardware, plan, serving=True)
        return serving.threshold_effect(step, load_workload(ctx.defaults["workload"]),
                                        EnginePolicy(prefill_schedule_interval=int(interval)),
                                        threshold=threshold, slo_p90_interactivity=float(
                                            ctx.defaults["slo_p90_interactivity"]))

    out = ctx.memo(("threshold", arch, hardware, tuple(sorted(plan.items())), threshold,
                    interval), compute)
    if out.get(metric) is None:
        raise ServecastError(f"threshold effect: no concurrency meets P90 >= "
                             f"{ctx.defaults['slo_p90_interactivity']} tok/s with and without "
                             f"the threshold on {arch} / {hardware}")
    return _number(out[metric], metric)


@predictor
def prefill_plan_ratio(ctx: Context, arch: str, hardware: str, prompt_tokens: int,
                       plan: dict[str, Any], baseline: dict[str, Any]) -> float:
    """Per-GPU prefill throughput of `plan` over `baseline` for fresh `prompt_tokens` prompts
    (= the speed-up when both use the same GPUs). With pp > 1 the step model gives the pipeline
    latency; in steady state `pp` chunks are in flight, so throughput is pp / latency."""

    def per_gpu(p: dict[str, Any]) -> float:
        step = _step_model(arch, hardware, p)
        t = float(step.step_time_s(prompt_tokens, prompt_tokens, 0, 0))
        return prompt_tokens * step.plan.pp / (t * step.gpus)

    return per_gpu(plan) / per_gpu(baseline)


@predictor
def dcp_exchange_gain(ctx: Context, arch: str, hardware: str, plan: dict[str, Any],
                      seqs: float, context_tokens: float) -> float:
    """1 - latency of one DCP attention layer (its projections, core attention, query gather,
    partial-output merge and output all-reduce) with the symmetric-memory exchange / with
    NCCL's all-gather + reduce-scatter, `seqs` sequences at `context_tokens` (no prefill)."""
    from model.perf.comm import collective_time_s
    from model.perf.ops import grouped_layers
    from model.perf.parallel import layer_collectives

    step = _step_model(arch, hardware, plan)
    layer = next(ly for ly, _ in grouped_layers(step.arch.main_layers)
                 if ly.attention.kind != "linear")
    tag = f"{layer.attention.kind}/{layer.mlp.kind}:"
    ops = [o for o in step.breakdown(0, 0, seqs, context_tokens)["ops"]
           if o["op"].startswith(tag)]
    attention = sum(float(o["time_s"]) / o["count"] for o in ops
                    if "self_attn." in o["op"] or o["op"].endswith(("attn_decode", "dcp_q_all_gather",
                                                                    "dcp_out_merge")))
    # one of the layer's two TP all-reduces follows the attention output projection
    attention += sum(float(o["time_s"]) / o["count"] for o in ops
                     if o["op"].endswith("tp_all_reduce")) / 2
    swap = 0.0
    for c in layer_collectives(layer, 1, step.plan, step.hw, step.arch.hidden_size, 0.0, seqs):
        if c.name.startswith("dcp_"):
            swap += float(collective_time_s(c.op, c.bytes, c.gpus, step.hw, c.scope)
                          - collective_time_s(c.op, c.bytes, c.gpus, step.hw, c.scope, c.algorithm))
    if swap <= 0.0:
        raise ServecastError(f"plan {plan}: no symmetric-memory DCP exchange to compare")
    return swap / (attention + swap)


@predictor
def packed_layout_saving(ctx: Context, arch: str) -> float:
    """KV bytes saved by one packed allocation per block with MXFP4 index keys (model.perf.memory)."""
    from model.perf.memory import packed_layout_saving as saving
    from model.specs.architecture import load_architecture

    return _number(saving(load_architecture(arch)), "packed layout saving")


@predictor
def kv_cache_tensor_count(ctx: Context, arch: str) -> float:
    """Per-type layout: one KV (or state) tensor per attention layer, MTP layers included, plus
    one index-key tensor per layer with an indexer."""
    from model.specs.architecture import load_architecture

    layers = load_architecture(arch).layers
    return float(sum(1 + (layer.attention.indexer is not None) for layer in layers))


@predictor
def architecture_max_context(ctx: Context, archs: list[str]) -> float:
    """The smallest `max_context` among the named architectures (each reaches at least it)."""
    from model.specs.architecture import load_architecture

    return float(min(load_architecture(a).max_context for a in archs))


@predictor
def not_modeled(ctx: Context, reason: str) -> float:
    raise NotModeled(f"not modeled: {reason}")


# ---------------------------------------------------------------- running a reproduction


def evaluate(claim: Claim, ctx: Context) -> dict[str, Any]:
    """One claim's row: published vs predicted, or `predicted: null` with the reason."""
    started = time.perf_counter()
    predicted: float | None
    reason = ""
    try:
        predicted = float(PREDICTORS[claim.predictor](ctx, **claim.args))
    except NotModeled as err:
        predicted, reason = None, str(err)
    except ServecastError as err:
        predicted, reason = None, f"{type(err).__name__}: {err}"
    except ImportError as err:
        predicted, reason = None, f"module not available yet: {err}"
    except Exception as err:  # a bug elsewhere must not sink the other claims; say so plainly
        predicted, reason = None, f"error in predictor {claim.predictor}: " \
                                  f"{type(err).__name__}: {err}"
    rel, ok = claim.judge(predicted)
    row = {"id": claim.id, "quantity": claim.quantity, "published": claim.published,
           "predicted": predicted, "rel_error": rel, "within_tolerance": ok,
           "unit": claim.unit, "tolerance": claim.tolerance, "comparison": claim.comparison,
           "predictor": claim.predictor, "source": claim.source,
           "seconds": round(time.perf_counter() - started, 3)}
    if reason:
        row["reason"] = " ".join(reason.split())
    if claim.note:
        row["note"] = claim.note
    return row


def reproduce(paper: str = "vllm-agentx", only: list[str] | None = None,
              workers: int = 1) -> dict[str, Any]:
    """Evaluate every claim (or those whose id matches a glob in `only`); the CLI contract."""
    spec = load_paper(paper)
    claims = [c for c in spec.claims
              if not only or any(fnmatch.fnmatch(c.id, pattern) for pattern in only)]
    if only and not claims:
        raise ServecastError(f"--only {' '.join(only)} matches no claim of {spec.name}; ids: "
                             f"{', '.join(c.id for c in spec.claims)}")
    ctx = Context(spec.defaults)
    started = time.perf_counter()
    plan_keys = [(c.args["arch"], c.args["hardware"], int(c.args["gpus"]),
                  c.args.get("precision"), c.args.get("concurrency")) for c in claims
                 if c.predictor == "plan_metric"]
    ctx.prefetch_plans(plan_keys, workers)
    rows = [evaluate(c, ctx) for c in claims]
    predicted = [r for r in rows if r["predicted"] is not None]
    return {
        "paper": spec.name, "title": spec.title,
        "claims": rows,
        "summary": {"claims": len(rows), "predicted": len(predicted),
                    "within_tolerance": sum(1 for r in predicted if r["within_tolerance"]),
                    "not_predicted": len(rows) - len(predicted),
                    "seconds": round(time.perf_counter() - started, 2)},
    }


# ---------------------------------------------------------------- report


def _fmt(value: float | None, unit: str = "") -> str:
    if value is None:
        return "—"
    if unit in ("fraction",):
        return f"{value:.1%}"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.4g}"


def report_markdown(result: dict[str, Any]) -> str:
    """The report table: one row per claim, published vs predicted, verdict and reason."""
    s = result["summary"]
    lines = [
        f"# Reproduction: {result['title'] or result['paper']}",
        "",
        "Generated by `servecast reproduce " + result["paper"] + " --report`; do not edit.",
        "",
        f"{s['claims']} claims: {s['predicted']} predicted, {s['within_tolerance']} within "
        f"tolerance, {s['not_predicted']} without a prediction. Tolerances are relative and "
        "were set per kind of quantity before the predictions were run (see claims.yaml).",
        "",
        "| claim | quantity | published | predicted | rel. error | tolerance | verdict |",
        "|---|---|---:|---:|---:|---|---|",
    ]
    notes, assumptions = [], []
    for r in result["claims"]:
        tol = {"approx": "±", "at_least": "≥ −", "at_most": "≤ +"}[r["comparison"]]
        verdict = "—" if r["within_tolerance"] is None else (
            "✅ within" if r["within_tolerance"] else "❌ outside")
        rel = "—" if r["rel_error"] is None else f"{r['rel_error']:+.1%}"
        lines.append(f"| `{r['id']}` | {r['quantity']} | {_fmt(r['published'], r['unit'])} "
                     f"{'' if r['unit'] == 'fraction' else r['unit']} | "
                     f"{_fmt(r['predicted'], r['unit'])} | {rel} | {tol}{r['tolerance']:.0%} | "
                     f"{verdict} |")
        if r.get("reason"):
            notes.append(f"- `{r['id']}`: {r['reason']}")
        if r.get("note"):
            assumptions.append(f"- `{r['id']}`: {r['note']}")
    if notes:
        lines += ["", "## Claims without a prediction", "", *notes]
    if assumptions:
        lines += ["", "## Assumptions where the seed leaves a detail open", "", *assumptions]
    lines += ["", "Sources: `papers/" + result["paper"] + "/claims.yaml` quotes each claim from "
              "the seed documents.", ""]
    return "\n".join(lines)


def write_report(result: dict[str, Any], path: Path | None = None) -> Path:

    path = path or PAPERS / result["paper"] / "report.md"
    return write_atomic(path, report_markdown(result))


def bench_reproduce(full: bool = False) -> dict[str, float]:
    """Wall seconds of the reproduction: the claims that need no plan search or serving sweep
    (workload, KV layout, step-model ratios), and with `full` every claim (plan searches run
    in two processes)."""
    quick = ["workload.*", "kv.*", "arch.*", "pcp.*", "dcp.*", "prefill.*", "kernels.*"]
    started = time.perf_counter()
    quick_result = reproduce("vllm-agentx", only=quick, workers=1)
    out = {"reproduce_quick_s": time.perf_counter() - started,
           "reproduce_quick_claims": float(quick_result["summary"]["claims"])}
    if full:
        started = time.perf_counter()
        reproduce("vllm-agentx", workers=2)
        out["reproduce_full_s"] = time.perf_counter() - started
    return out
