"""The post's parallelism lessons as the model computes them (nothing here is written into the
model): which strategy a plan represents, one request's prefill time by plan (PCP vs TP on a cold
prompt, PP on a warm turn), decode-only saturation per family (DCP vs DEP vs TP), DEP vs TP+EP
decode steps, and the screening's best deployment per family."""

from __future__ import annotations

import numpy as np
import pandas as pd

from model.perf.parallel import ParallelPlan, enumerate_plans
from model.perf.step import build_step_model
from model.plan.disagg import DECODE_BATCHES
from model.plan.plan_models import load_specs, step_model
from model.specs.defaults import MAX_NUM_BATCHED_TOKENS
from model.specs.errors import Infeasible
from model.specs.recipes import recipe_settings


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
    (chunks + pp - 1) stage times (papers/research/theory.md §4.4)."""
    pp = step.plan.pp
    n = int(np.ceil(new_tokens / chunk))
    sizes = np.full(n, float(chunk))
    sizes[-1] = new_tokens - chunk * (n - 1)
    ctx = cached_tokens + np.cumsum(sizes)
    t = np.asarray(step.step_time_s(sizes, ctx, 0.0, 0.0, 1.0), float)
    if pp == 1:
        return float(t.sum())
    return float((t.sum() + (pp - 1) * t.max()) / pp)


def best_by_family(candidates: pd.DataFrame, slo: float, mode: str = "aggregated"
                   ) -> pd.DataFrame:
    """The screening's best TPGS meeting the SLO per parallel family (of the replica, or of the
    decode workers), from a plan's screening candidates."""
    model_column = "_model" if mode == "aggregated" else "_decode_model"
    df = candidates[(candidates["mode"] == mode) & candidates["feasible"]
                    & (candidates["p90_interactivity_tok_s"] >= slo)].copy()
    if df.empty:
        return df
    column = "plan" if mode == "aggregated" else "decode_plan"
    df["family"] = [plan_family(m.plan) for m in df[model_column]]
    best = df.sort_values("tpgs", ascending=False).groupby("family", as_index=False).first()
    return best[["family", column, "tpgs", "p90_interactivity_tok_s", "p90_ttft_s",
                 "concurrency"]].sort_values("tpgs", ascending=False).reset_index(drop=True)


def decode_capacity_by_family(arch, hardware, gpus: int, context: float, output_tokens: float,
                              slo: float) -> pd.DataFrame:
    """Decode-only saturation (stage 1) of every decode plan of `gpus` GPUs at `context`:
    the largest request rate with P90 interactivity >= slo within KV capacity, per plan."""
    a, hw, _ = load_specs(arch, hardware)
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
    a, hw, _ = load_specs(arch, hardware)
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
