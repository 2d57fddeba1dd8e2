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

from model import charts, nbio
from model.errors import Infeasible
from model.parallel import ParallelPlan
from model.plan import (
    best_by_family,
    decode_capacity_by_family,
    dep_vs_tp_decode,
    plan,
    prefill_time_s,
    step_model,
    traffic_for,
)
from model.workload import load_workload

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
prefill = pd.concat([cold.assign(turn=f"cold {long_prompt_tokens}"),
                     warm.assign(turn=f"warm {warm_new_tokens}+{warm_cached_tokens} cached")])
chart = charts.bar_chart(prefill, "turn", "prefill_s", "plan", log_y=True,
                         title=f"{arch}: prefill time by parallelism ({gpus} x {hardware})")
charts.save(chart, Path(output_dir) / "prefill_by_plan")
prefill

# %% [markdown]
# ## Decode at agentic context: DCP vs TP vs DEP (stage-1 saturation under the SLO)

# %%
decode = decode_capacity_by_family(arch, hardware, gpus, traffic.context_mean,
                                   traffic.output_mean, slo_p90_interactivity)
best_decode = decode.groupby("family", as_index=False).first().sort_values(
    "decode_tokens_per_s_per_gpu", ascending=False)
chart = charts.bar_chart(best_decode, "family", "decode_tokens_per_s_per_gpu",
                         title=f"{arch}: best decode throughput per family at the SLO")
charts.save(chart, Path(output_dir) / "decode_by_family")
best_decode

# %% [markdown]
# ## Mixed traffic: best aggregated deployment per family

# %%
result = plan(arch=arch, hardware=hardware, gpus=gpus, workload=workload,
              slo_p90_interactivity=slo_p90_interactivity, modes=("aggregated",))
families = best_by_family(result, slo_p90_interactivity)
families

# %% [markdown]
# ## DEP vs TP+EP for decode: KV capacity against per-step cost
#
# DEP keeps a sequence's KV on one rank (TP copies MLA-style latent KV to every rank), so more
# sequences fit and each GPU reads less KV per step; it replicates attention weights per rank and
# adds all-to-all. Below the crossover batch TP+EP steps faster; the SLO fixes the batch.

# %%
try:
    dep = dep_vs_tp_decode(arch, hardware, gpus, traffic.context_mean)
except Infeasible as err:  # e.g. the weights do not fit a DP rank
    dep = {"reason": str(err), "table": pd.DataFrame()}
if not dep["table"].empty:
    chart = charts.line_chart(dep["table"].melt("batch", ["tp_step_s", "dep_step_s"], "plan",
                                                "step_s"), "batch", "step_s", "plan",
                              log_x=True, title=f"{arch}: decode step, {dep['tp_plan']} vs "
                              f"{dep['dep_plan']}")
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
    "best_mixed_family": families.iloc[0]["family"] if len(families) else None,
    "best_mixed_tpgs": float(families.iloc[0]["tpgs"]) if len(families) else None,
    "dep_kv_capacity_ratio": dep["dep_kv_sequences"] / dep["tp_kv_sequences"]
    if "dep_kv_sequences" in dep else None,
    # None: DEP never steps faster over the batches compared
    "dep_crossover_batch": dep["crossover_batch"]
    if np.isfinite(dep.get("crossover_batch", np.inf)) else None,
}
nbio.write_headline(output_dir, headline)
headline
