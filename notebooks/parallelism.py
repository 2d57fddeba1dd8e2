# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% tags=["parameters"]
arch: str = "deepseek-v4-pro"  # architecture slug, HF id or config.json path
hardware: str = "gb300-nvl72"  # chip / system name or alias
gpus: int = 8  # GPUs per replica for the strategy comparisons
workload: str = "agentx"  # workload profile name or YAML path
slo_p90_interactivity: float = 50.0  # minimum P90 tokens/s per user
long_prompt_tokens: int = 32768  # cold prompt for the PCP vs TP prefill comparison
warm_new_tokens: int = 2048  # new tokens of a warm turn (PP lesson)
warm_cached_tokens: int = 100_000  # cached prefix of that warm turn
allow_beyond_window: bool = False  # serve workload requests past the model's context window (stated)
output_dir: str = "."  # where figures and headline.json go

# %% [markdown]
# # Which parallelism, and why (the post's lessons, computed)
#
# - PCP vs TP on a long cold prefill (post: PCP8 2.65x faster than TP8 at 32K, DeepSeek V4);
# - PP: fine for cold long prefills, adds latency to warm prefix-heavy turns;
# - DCP vs DEP/TP for decode at agentic context (post: DCP helps Kimi K3, not DeepSeek V4);
# - the best family for mixed (aggregated) traffic under the SLO (post: DEP).

# %%
# ruff: noqa: E402, B018  (notebook: imports after the parameters cell, cells end in a display)
from pathlib import Path

import numpy as np
import pandas as pd

from model.frontends import charts, nbio
from model.perf.parallel import ParallelPlan
from model.plan.lessons import (
    best_by_family,
    decode_capacity_by_family,
    dep_vs_tp_decode,
    plan_family,
    prefill_time_s,
)
from model.plan.plan_models import step_model
from model.plan.planner import plan
from model.plan.traffic import traffic_for
from model.specs.errors import Infeasible
from model.specs.workload import load_workload

traffic = traffic_for(load_workload(workload))


def prefill_row(label, p, new, cached):
    try:
        return {"plan": label, "prefill_s": prefill_time_s(step_model(arch, hardware, p), new,
                                                            cached)}
    except Infeasible:
        return None


cold = [prefill_row(lbl, p, long_prompt_tokens, 0) for lbl, p in (
    (f"TP{gpus}", ParallelPlan(tp=gpus, moe_tp=gpus)),
    (f"PCP{gpus}", ParallelPlan(pcp=gpus, moe_tp=gpus)),
    (f"TP{gpus // 2}-PP2", ParallelPlan(tp=gpus // 2, pp=2, moe_tp=gpus // 2)))]
cold = pd.DataFrame([r for r in cold if r])
warm = [prefill_row(lbl, p, warm_new_tokens, warm_cached_tokens) for lbl, p in (
    (f"TP{gpus}", ParallelPlan(tp=gpus, moe_tp=gpus)),
    (f"TP{gpus // 2}-PP2", ParallelPlan(tp=gpus // 2, pp=2, moe_tp=gpus // 2)))]
warm = pd.DataFrame([r for r in warm if r])
prefill = pd.concat([
    cold.assign(turn=f"cold prompt: {long_prompt_tokens:,} tokens"),
    warm.assign(turn=f"warm turn: {warm_new_tokens:,} new on {warm_cached_tokens:,} cached")])
cold_s = dict(zip(cold.plan, cold.prefill_s, strict=True))
warm_s = dict(zip(warm.plan, warm.prefill_s, strict=True))
tp_l, pcp_l, pp_l = f"TP{gpus}", f"PCP{gpus}", f"TP{gpus // 2}-PP2"
lesson = []
if tp_l in cold_s and pcp_l in cold_s:
    lesson.append(f"PCP{gpus} prefills the cold prompt {cold_s[tp_l] / cold_s[pcp_l]:.2f}x "
                  f"faster than TP{gpus}")
if tp_l in warm_s and pp_l in warm_s:
    lesson.append(f"PP adds {warm_s[pp_l] / warm_s[tp_l] - 1:+.0%} to a warm turn")
chart = charts.bar_chart(prefill, "turn", "prefill_s", "plan", log_y=True, horizontal=True,
                         y_title="prefill time (s, log scale)", color_title="plan",
                         title=f"{arch}: " + "; ".join(lesson) if lesson else
                         f"{arch}: prefill time by parallelism",
                         subtitle=f"{gpus} x {hardware}; one request alone on the GPUs")
charts.save(chart, Path(output_dir) / "prefill_by_plan")
prefill

# %% [markdown]
# ## Decode at agentic context: DCP vs TP vs DEP (stage-1 saturation under the SLO)

# %%
decode = decode_capacity_by_family(arch, hardware, gpus, traffic.mean_context_tokens,
                                   traffic.mean_output_tokens, slo_p90_interactivity)
best_decode = decode.groupby("family", as_index=False).first().sort_values(
    "decode_tokens_per_s_per_gpu", ascending=False)
lead, tp_row = best_decode.iloc[0], best_decode[best_decode.family == "TP"]
gain = (f", {lead['decode_tokens_per_s_per_gpu'] / tp_row['decode_tokens_per_s_per_gpu'].iloc[0]:.1f}x"
        " TP" if len(tp_row) and tp_row['decode_tokens_per_s_per_gpu'].iloc[0] > 0
        and lead["family"] != "TP" else "")
chart = charts.bar_chart(
    best_decode, "family", "decode_tokens_per_s_per_gpu", x_title="parallelism family",
    y_title="decode throughput (output tok/s per GPU)",
    title=f"{arch}: {lead['family']} decodes the most per GPU at the SLO "
          f"({lead['decode_tokens_per_s_per_gpu']:,.0f} tok/s{gain})",
    subtitle=f"best plan of each family on {gpus} x {hardware}; P90 >= "
             f"{slo_p90_interactivity:g} tok/s per user within KV capacity at "
             f"{traffic.mean_context_tokens:,.0f} tokens of context")
charts.save(chart, Path(output_dir) / "decode_by_family")
best_decode

# %% [markdown]
# ## Mixed traffic: best aggregated deployment per family
#
# The screening tier ranks every family's deployments (the table); the full tier serves the
# chosen one (`plan`'s answer, whose numbers the headline reports).

# %%
result = plan(arch=arch, hardware=hardware, gpus=gpus, workload=workload,
              slo_p90_interactivity=slo_p90_interactivity, modes=("aggregated",),
              allow_beyond_window=allow_beyond_window)
families = best_by_family(result.candidates, slo_p90_interactivity)
print(f"full tier: {result.deployment.label()} at {result.best['tpgs']:,.0f} TPGS, P90 "
      f"{result.best['p90_interactivity_tok_s']:.1f} tok/s")
families

# %% [markdown]
# ## DEP vs TP+EP for decode: KV capacity against per-step cost
#
# DEP keeps a sequence's KV on one rank (TP copies MLA-style latent KV to every rank), so more
# sequences fit and each GPU reads less KV per step; it replicates attention weights per rank and
# adds all-to-all. Below the crossover batch TP+EP steps faster; the SLO fixes the batch.

# %%
try:
    dep = dep_vs_tp_decode(arch, hardware, gpus, traffic.mean_context_tokens)
except Infeasible as err:  # e.g. the weights do not fit a DP rank
    dep = {"reason": str(err), "table": pd.DataFrame()}
if not dep["table"].empty:
    names = {"tp_step_s": f"{dep['tp_plan']} (TP+EP)", "dep_step_s": f"{dep['dep_plan']} (DEP)"}
    steps = dep["table"].melt("batch", ["tp_step_s", "dep_step_s"], "plan", "step_s")
    steps = steps.assign(plan=steps["plan"].map(names), step_ms=steps["step_s"] * 1e3)
    rules = [("y", 1e3 / slo_p90_interactivity,
              f"SLO {slo_p90_interactivity:g} tok/s = {1e3 / slo_p90_interactivity:g} ms step")]
    for key, name in (("tp_kv_sequences", "TP"), ("dep_kv_sequences", "DEP")):
        if dep[key] <= steps["batch"].max():
            rules.append(("x", dep[key], f"{name} KV full"))
    cross = dep["crossover_batch"]
    chart = charts.line_chart(
        steps, "batch", "step_ms", "plan", log_x=True, x_title="decode batch (sequences)",
        y_title="decode step (ms)", color_title="plan", rules=rules,
        title=f"{arch}: DEP steps faster above a batch of {cross:g}" if np.isfinite(cross)
        else f"{arch}: TP+EP steps faster at every batch compared",
        subtitle=f"{gpus} x {hardware} at {traffic.mean_context_tokens:,.0f} tokens of context; KV "
                 f"fits {dep['tp_kv_sequences']:,.0f} sequences under TP, "
                 f"{dep['dep_kv_sequences']:,.0f} under DEP")
    charts.save(chart, Path(output_dir) / "dep_vs_tp_decode")
dep["table"]

# %%
t = {r.plan: r.prefill_s for r in cold.itertuples()}
w = {r.plan: r.prefill_s for r in warm.itertuples()}
tp, pcp, pp = f"TP{gpus}", f"PCP{gpus}", f"TP{gpus // 2}-PP2"
dcp = best_decode[best_decode.family == "DCP"]["decode_tokens_per_s_per_gpu"]
non_dcp = best_decode[best_decode.family != "DCP"]["decode_tokens_per_s_per_gpu"]
headline = {
    "pcp_speedup_vs_tp_cold": t[tp] / t[pcp] if pcp in t and tp in t else None,
    "pp_slowdown_warm": w[pp] / w[tp] if pp in w and tp in w else None,
    "pp_slowdown_cold": t[pp] / t[tp] if pp in t and tp in t else None,
    "dcp_gain_decode": float(dcp.max() / non_dcp.max()) if len(dcp) and len(non_dcp)
    and non_dcp.max() > 0 else None,
    "best_decode_family": best_decode.iloc[0]["family"],
    "best_mixed_family": plan_family(result.deployment.replica.plan),
    "best_mixed_tpgs": float(result.best["tpgs"]),
    "screening_best_family": families.iloc[0]["family"] if len(families) else None,
    "dep_kv_capacity_ratio": dep["dep_kv_sequences"] / dep["tp_kv_sequences"]
    if "dep_kv_sequences" in dep else None,
    # None: DEP never steps faster over the batches compared
    "dep_crossover_batch": dep["crossover_batch"]
    if np.isfinite(dep.get("crossover_batch", np.inf)) else None,
}
nbio.write_headline(output_dir, headline)
headline
