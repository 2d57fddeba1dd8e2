"""How a plan explains its choice: the full tier's operating point as a row (`point_row`), the step
bottleneck there, the 'why it wins' line, the cost (owned TCO, $/Mtok by token class, API
equivalent), the assumptions, and the serving format the launch lines carry."""

from __future__ import annotations

import numpy as np
import pandas as pd

from model.plan.cost import CostSummary, TokenMix, gpu_hour_usd, summarize_cost, token_mix
from model.plan.deployment import Deployment, ServingFormat
from model.plan.full_tier import FullTierPoint, Slo
from model.plan.inputs import PlanInputs
from model.plan.traffic import Traffic
from model.specs.architecture import load_architecture
from model.specs.defaults import SYSTEM_IDLE_CAP_S, TURN_GAP_CAP_S
from model.specs.errors import ServecastError
from model.specs.precision import parse_precision
from model.specs.prices import api_price
from model.specs.recipes import recipe_for

LIMITS = {"lanes": "client concurrency (every lane is served; more lanes break the SLO)",
          "kv_capacity": "KV capacity (the decoding batch's contexts fill the HBM pool)",
          "max_num_seqs": "max_num_seqs (the running batch is full)",
          "prefill_rate": "prefill workers' saturation rate"}


def point_row(point: FullTierPoint, screening: pd.Series, slo: Slo) -> pd.Series:
    """The full tier's numbers for a deployment, with the deployment's columns (and the
    `PlanModel`s behind it) from its screening row."""
    r = point.serving.result
    dep = point.deployment
    phase = dep.replica if dep.mode == "aggregated" else dep.decode
    keep = ("mode", "plan", "decode_plan", "replicas", "x", "y", "threshold", "interval",
            "_model", "_decode_model")
    row = {k: screening[k] for k in keep if k in screening.index}
    row.update({
        "concurrency": int(dep.concurrency), "gpus": int(dep.gpus),
        "tpgs": point.tpgs, "p90_interactivity_tok_s": point.p90_interactivity_tok_s,
        "p90_ttft_s": point.p90_ttft_s, "mean_ttft_s": float(r.mean_ttft_s or np.nan),
        "hit_rate": float(r.hit_rate), "rate_rps": float(r.requests_per_s or 0.0),
        "decode_batch": float(r.decode_batch_per_rank or 0.0) * phase.plan.dp,
        "step_time_s": float(r.mean_tpot_s or 0.0) * _tokens_per_step(screening),
        "limit": r.bounded_by or "lanes", "feasible": point.stable,
        "meets_slo": slo.met_by(point), "tier": "full"})
    return pd.Series(row)


def _tokens_per_step(row: pd.Series) -> float:
    model = row.get("_decode_model") if row.get("mode") == "disaggregated" else row.get("_model")
    return float(getattr(model, "tokens_per_step", 1.0) or 1.0)


def bottleneck(row: pd.Series, traffic: Traffic) -> str:
    """The step model's bottleneck label at the chosen operating point."""
    model = row["_decode_model"] if row["mode"] == "disaggregated" else row["_model"]
    try:
        b = max(float(row.get("decode_batch", 1.0)), 1.0)
        pre = 0.0 if row["mode"] == "disaggregated" else \
            float(row["rate_rps"]) / max(row.get("replicas", 1), 1) \
            * traffic.mean_uncached_tokens * float(row["step_time_s"])
        ctx = traffic.mean_context_tokens
        return str(model.step.breakdown(pre, ctx, b, ctx).get("bottleneck", "unknown"))
    except Exception:  # the label is explanatory; never fail the plan over it
        return "unknown"


def runner_up(points: list[FullTierPoint], best: pd.Series, slo: Slo) -> str:
    """The best full-tier point meeting the SLO in the other mode, for the 'why' line."""
    other = [p for p in points if p.deployment.mode != best["mode"] and slo.met_by(p)]
    if not other:
        return ""
    o = max(other, key=lambda p: p.tpgs)
    return (f"; best {o.deployment.mode} alternative {o.deployment.shape_label()} at "
            f"{o.tpgs:,.0f} TPGS (the chosen deployment serves {best['tpgs'] / o.tpgs:.2f}x "
            "more)")


def why(row: pd.Series, bottleneck_label: str, slo: Slo) -> str:
    limit = str(row.get("limit", ""))
    text = LIMITS.get(limit, limit)
    if limit == "lanes" and float(row["p90_interactivity_tok_s"]) > 1.05 * \
            slo.p90_interactivity_tok_s and (slo.p90_ttft_s is None
                                             or float(row["p90_ttft_s"]) < 0.95 * slo.p90_ttft_s):
        # neither SLO binds: throughput itself peaks at these lanes
        text = ("the prefix cache and the prefill queue (TPGS peaks at these lanes: more "
                "sessions miss more prefixes and wait longer than they add)")
    ttft = f" and P90 TTFT <= {slo.p90_ttft_s:g} s" if slo.p90_ttft_s is not None else ""
    head = (f"highest full-tier TPGS among deployments with P90 interactivity >= "
            f"{slo.p90_interactivity_tok_s:g} tok/s{ttft}" if row.get("meets_slo", True)
            else f"no setting of this deployment reaches P90 interactivity >= "
                 f"{slo.p90_interactivity_tok_s:g} tok/s{ttft}; the closest is shown")
    return f"{head}; rate limited by {text}; step bottleneck: {bottleneck_label}"


def gpu_time_shares(row: pd.Series, prefill_step_share: float, traffic: Traffic
                    ) -> dict[str, float]:
    """Busy GPU time by token class at the chosen point, for $/Mtok by class: output = the
    decode part of the steps, and the prefill part split into uncached and cached input by the
    extra time a full-context chunk takes over a short-context one (its KV reads).
    Disaggregated: decode workers' GPUs are output's, prefill workers' are split that way."""
    try:
        prefill_model = row["_model"]
        chunk = float(prefill_model.chunk_tokens) * prefill_model.plan.dp
        short = max(traffic.mean_uncached_tokens, 1.0)
        full = float(prefill_model.step.step_time_s(chunk, traffic.mean_context_tokens, 0.0,
                                                    0.0, chunk / short))
        pre_short = float(prefill_model.step.step_time_s(chunk, short, 0.0, 0.0, chunk / short))
        cached = min(max(full - pre_short, 0.0) / full, 1.0) if full > 0 else 0.0
        if row["mode"] == "aggregated":
            share = min(max(float(prefill_step_share), 0.0), 1.0)
            return {"output": 1.0 - share, "uncached_input": share * (1.0 - cached),
                    "cached_input": share * cached}
        p_gpus = float(row["x"]) * prefill_model.plan.gpus
        return {"output": float(row["gpus"]) - p_gpus, "uncached_input": p_gpus * (1 - cached),
                "cached_input": p_gpus * cached}
    except Exception:  # explanatory split only; the totals never depend on it
        return {}


def served_mix(traffic: Traffic) -> TokenMix:
    return token_mix(traffic.mean_context_tokens, traffic.mean_output_tokens, traffic.hit_rate,
                     source=f"{traffic.name} request mix (means)")


def plan_cost(row: pd.Series, deployment: Deployment, inputs: PlanInputs, api_model: str,
              basis: str, shares: dict[str, float] | None = None) -> CostSummary:
    if deployment.mode == "disaggregated":
        usd_hour = (gpu_hour_usd(inputs.prefill_hardware, basis) * deployment.prefill.gpus
                    + gpu_hour_usd(inputs.hardware, basis) * deployment.decode.gpus)
        per_gpu = usd_hour / deployment.gpus
    else:
        per_gpu = gpu_hour_usd(inputs.hardware, basis)
    return summarize_cost(per_gpu, deployment.gpus, float(row["tpgs"]), api_price(api_model),
                          served_mix(inputs.traffic), api_model=api_model, basis=basis,
                          gpu_time_share=shares or None)


def assumptions(inputs: PlanInputs, cost: CostSummary, row: pd.Series,
                full_tier_notes: tuple[str, ...], evaluations: int) -> list[str]:
    traffic, cache = inputs.traffic, inputs.cache
    r = recipe_for(inputs.arch.name) if inputs.recipe else None
    spec = inputs.spec
    out = [
        f"traffic {traffic.name}: mean input {traffic.mean_context_tokens:,.0f} tok, uncached "
        f"{traffic.mean_uncached_tokens:,.0f} (p90 {traffic.p90_uncached_tokens:,.0f}), output "
        f"{traffic.mean_output_tokens:,.0f}, think gap {traffic.mean_gap_s:.1f} s (capped "
        f"{TURN_GAP_CAP_S:.0f} s; while no request is in flight the replay skips idle time past "
        f"{SYSTEM_IDLE_CAP_S:.0f} s, AgentX's system idle cap), hit {traffic.hit_rate:.3f}",
        f"every number is the full tier's (model.serve.deployment; {evaluations} evaluations); "
        "the screening tier shortlisted and ranked the candidates (its numbers for the chosen "
        "deployment: `screening`)",
        "sessions not resident in HBM reload KV from host memory (tiered offload)",
        f"cost basis {cost.basis}; API equivalent at {cost.api_model} prices on the served mix",
        f"served weights {inputs.precision or 'as checkpoint'}, KV cache "
        f"{inputs.kv_dtype or 'arch default'}"
        + (f" ({r.assumptions(inputs.hardware)})" if r else " (no deployment recipe)"),
        "speculative decoding " + (f"{spec[2]} {spec[0]} tokens, acceptance length "
                                   f"{spec[1]:g} tokens per step" if spec[0] else "off")]
    if inputs.beyond_window:
        out.append(inputs.beyond_window)
    if inputs.cache_inputs is not None:
        out.append(f"prefix cache: {cache.policy} over {'+'.join(cache.tiers)} per replica "
                   f"(model.serve.cache_model closed form), hit {float(row['hit_rate']):.3f} "
                   "at the chosen point; evicted prefixes are recomputed, lower-tier hits "
                   "reloaded")
    return out + list(full_tier_notes)


def serving_format(arch_name: str, hw, precision, kv_dtype, spec) -> ServingFormat:
    """The launch lines' serving format: the recipe's checkpoint on this chip (when `precision`
    is its variant's), KV and index-key cache dtypes, speculative decoding with the recipe's
    draft checkpoint when the method is the recipe's."""
    r = recipe_for(arch_name) if arch_name else None
    checkpoint = r.checkpoint_on(hw) if r is not None and r.holds(hw, precision) else None
    k, _, method = spec
    draft = r.draft_on(hw) if r is not None and method == r.spec_method else None
    quantization, note = (None, None) if checkpoint else _online_quantization(arch_name,
                                                                             precision)
    return ServingFormat(checkpoint=checkpoint, kv_dtype=kv_dtype,
                         indexer_kv_dtype=parse_precision(precision).get("indexer_cache"),
                         spec_method=method if k else "none", spec_tokens=int(k),
                         draft_model=draft, extra_vllm=r.vllm_args if r is not None else (),
                         quantization=quantization, weights_note=note)


def _online_quantization(arch_name: str, precision) -> tuple[str | None, str | None]:
    """(the engines' --quantization value, a note) for weights served in another format than
    the architecture's own checkpoint holds: FP8 is quantized as the engine loads the weights
    (vLLM and SGLang `--quantization fp8`); other formats need a checkpoint in that format."""
    wanted = {f for part, f in parse_precision(precision).items() if part != "indexer_cache"}
    if not wanted or not arch_name:
        return None, None
    try:
        arch = load_architecture(arch_name)
    except ServecastError:
        return None, None
    own = {lin.dtype for layer in arch.layers
           for lin in layer.attention.projections + layer.mlp.projections}
    own |= {layer.mlp.experts.dtype for layer in arch.layers if layer.mlp.experts}

    def family(fmt: str) -> str:  # fp8_block and fp8 are one FP8 checkpoint to an engine
        return fmt.split("_")[0]

    missing = sorted(f for f in wanted if family(f) not in {family(o) for o in own})
    if not missing:
        return None, None
    if all(family(f) == "fp8" for f in missing):
        return "fp8", None
    return None, (f"weights {', '.join(missing)}: the checkpoint holds "
                  f"{', '.join(sorted(own))} and no engine flag converts it; serve a checkpoint "
                  f"in that format")
