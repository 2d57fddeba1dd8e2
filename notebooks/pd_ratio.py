# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% tags=["parameters"]
arch: str = "deepseek-v4-pro"  # architecture slug, HF id or config.json path
hardware: str = "gb300-nvl72"  # chip for decode workers (and prefill unless prefill_hardware)
prefill_hardware: str = ""  # a different chip for prefill workers (empty: same)
gpus: int = 12  # GPU budget for prefill + decode workers
workload: str = "agentx"  # workload profile name or YAML path
slo_p90_interactivity: float = 50.0  # minimum P90 tokens/s per user on decode workers
max_gpus: int = 0  # largest GPU budget on the ratio sweep (0 means 4 x gpus)
top_plans: int = 8  # plans per phase on the stage-1 chart
allow_beyond_window: bool = False  # serve workload requests past the model's context window (stated)
output_dir: str = "."  # where figures and headline.json go

# %% [markdown]
# # Prefill/decode ratio: the AgentX two-stage method
#
# Stage 1 (saturation): the maximum request rate of every prefill-only and decode-only
# configuration (parallel plan x size), decode under the interactivity SLO and its KV capacity.
# Stage 2 (ratio): x prefill + y decode instances serve min(x*lam_P, y*lam_D) requests/s, so
# TPGS depends on the P:D ratio x/y alone and peaks at the rate-matched ratio lam_D/lam_P
# (papers/research/theory.md §7). A GPU budget only admits the (x, y) that fill it exactly, so the
# sweep runs over every budget up to `max_gpus` (`model.plan.disagg.ratio_sweep`). The search
# (`model/plan/planner.py`) then charges what the two stages leave out: finite prefix cache, prefill
# queueing and the KV hand-off in TTFT; its screening tier ranks the deployments at the budget
# (diamonds) and its full tier (`model.serve.pools`) serves the chosen one (the headline).

# %%
# ruff: noqa: E402, B018  (notebook: imports after the parameters cell, cells end in a display)
from pathlib import Path

import numpy as np
import pandas as pd

from model.frontends import charts, nbio
from model.plan.disagg import ratio_sweep, xpyd_rates
from model.plan.planner import plan

result = plan(arch=arch, hardware=hardware, gpus=gpus, workload=workload,
              slo_p90_interactivity=slo_p90_interactivity, modes=("disaggregated",),
              prefill_hardware=prefill_hardware or None,
              allow_beyond_window=allow_beyond_window)
traffic = result.traffic
tokens_per_request = traffic.mean_context_tokens + traffic.mean_output_tokens  # TPGS counts cached input
sat = result.saturation
prefill_sat = sat[sat.phase == "prefill"].sort_values("max_rps_per_gpu", ascending=False)
decode_sat = sat[sat.phase == "decode"].sort_values("max_rps_per_gpu", ascending=False)
best_p, best_d = prefill_sat.iloc[0], decode_sat.iloc[0]
rate_matched = best_d["max_rps"] / best_p["max_rps"]  # prefill instances per decode instance
sat.sort_values(["phase", "max_rps_per_gpu"], ascending=[True, False]).head(12)

# %% [markdown]
# ## Stage 1: how many requests per second one worker of each plan sustains

# %%
top = pd.concat([prefill_sat.head(top_plans), decode_sat.head(top_plans)])
top = top.assign(worker=top["phase"] + "  " + top["plan"] + " (" + top["gpus"].astype(str)
                 + " GPUs)")
chart = charts.bar_chart(
    top, "worker", "max_rps_per_gpu", "phase", horizontal=True, value_format=".3~g",
    y_title="saturation rate (requests/s per GPU)", color_title="phase",
    title=f"Stage 1: a {best_d['plan']} decode worker serves "
          f"{best_d['max_rps_per_gpu']:.2f} req/s per GPU, a {best_p['plan']} prefill worker "
          f"{best_p['max_rps_per_gpu']:.2f}",
    subtitle=[f"{arch} on {hardware}, {workload}; the best {top_plans} plans of each phase",
              f"decode at P90 >= {slo_p90_interactivity:g} tok/s within its KV capacity; "
              f"prefill in full chunks, {traffic.mean_uncached_tokens:,.0f} uncached tokens per "
              "request"])
charts.save(chart, Path(output_dir) / "pd_saturation")
chart

# %% [markdown]
# ## Stage 2: TPGS of every xPyD ratio, for the plan pair the search chose
#
# Each point is a whole deployment of x prefill and y decode instances; the line is the same
# two-stage TPGS over a continuous ratio, peaking at the rate-matched ratio (dashed). Ringed and
# labelled: the deployments that fill the budget; diamonds: the screening tier's TPGS for those.

# %%
budget_max = max_gpus or 4 * gpus
best = result.best
chosen = (best["plan"], best["decode_plan"])
pairs = [chosen] + ([] if (best_p["plan"], best_d["plan"]) == chosen
                    else [(best_p["plan"], best_d["plan"])])


def stage1(phase: str, label: str) -> pd.Series:
    return sat[(sat.phase == phase) & (sat.plan == label)].iloc[0]


sweeps, curves, matched = [], [], []
for p_label, d_label in pairs:
    p, d = stage1("prefill", p_label), stage1("decode", d_label)
    name = f"{p_label} | {d_label}"
    sweep = ratio_sweep(p["max_rps"], int(p["gpus"]), d["max_rps"], int(d["gpus"]),
                        range(1, budget_max + 1), tokens_per_request)
    sweeps.append(sweep.assign(pair=name, prefill_plan=p_label, decode_plan=d_label))
    ratios = np.geomspace(sweep["p_per_d"].min(), sweep["p_per_d"].max(), 200)
    curves.append(xpyd_rates(ratios, 1.0, p["max_rps"], int(p["gpus"]), d["max_rps"],
                             int(d["gpus"]), tokens_per_request).assign(pair=name))
    matched.append({"pair": name, "p_per_d": d["max_rps"] / p["max_rps"]})
sweeps = pd.concat(sweeps, ignore_index=True)
# one point per (pair, ratio): 2P1D and 4P2D have the same TPGS; keep the smallest
points = sweeps.sort_values("gpus").drop_duplicates(["pair", "p_per_d"])
at_budget = sweeps[sweeps.gpus == gpus].assign(at_budget=True)
points = pd.concat([points.assign(at_budget=False), at_budget], ignore_index=True)
c = result.candidates.drop(columns=["_model", "_decode_model"])  # the frame's numbers only
ok = c[c.feasible & (c.p90_interactivity_tok_s >= slo_p90_interactivity)]
searched = (ok.merge(at_budget[["prefill_plan", "decode_plan", "x", "y", "pair", "p_per_d"]],
                     left_on=["plan", "decode_plan", "x", "y"],
                     right_on=["prefill_plan", "decode_plan", "x", "y"])
            .sort_values("tpgs", ascending=False).groupby(["pair", "x", "y"], as_index=False)
            .first())
chosen_name = f"{chosen[0]} | {chosen[1]}"
peak = sweeps[sweeps.pair == chosen_name].sort_values("tpgs", ascending=False).iloc[0]
here = at_budget[at_budget.pair == chosen_name].sort_values("tpgs", ascending=False)
chart = charts.pd_sweep_chart(
    pd.concat(curves, ignore_index=True), points, searched, pd.DataFrame(matched),
    title=f"Stage 2: TPGS peaks at the rate-matched P:D {matched[0]['p_per_d']:.2f}; "
          f"{gpus} GPUs allow {', '.join(here['label'])}",
    subtitle=[f"{arch} on {hardware}; TPGS = min(x*lam_P, y*lam_D) x "
              f"{tokens_per_request:,.0f} tokens / GPUs, deployments up to {budget_max} GPUs",
              "diamonds: the screening at the budget (finite prefix cache, TTFT, SLO); "
              f"the full tier serves {result.deployment.shape_label()} at "
              f"{best['tpgs'] / 1e3:,.1f}K"])
charts.save(chart, Path(output_dir) / "pd_ratio")
chart

# %% [markdown]
# ## Over GPU budgets: the best xPyD of that pair at each budget it can fill

# %%
per_budget = (sweeps[sweeps.pair == chosen_name].sort_values("tpgs", ascending=False)
              .groupby("budget_gpus", as_index=False).first()
              .assign(limited_by=lambda f: f["limit"] + "-bound",
                      text=lambda f: f["label"] + " " + (f["tpgs"] / 1e3).round().astype(int)
                      .astype(str) + "K"))
at_gpus = per_budget[per_budget.budget_gpus == gpus]
share = (f"{at_gpus['label'].iloc[0]} on {gpus} GPUs reaches "
         f"{at_gpus['tpgs'].iloc[0] / peak['tpgs']:.0%} of" if len(at_gpus) else
         f"{gpus} GPUs cannot be filled by")
chart = charts.bar_chart(
    per_budget.assign(budget=per_budget["budget_gpus"].astype(str)), "budget", "tpgs",
    "limited_by", x_title="GPU budget", color_title="limited by", text="text", horizontal=True,
    title=f"{chosen_name}: {share} the best ratio ({peak['label']}, {peak['gpus']} GPUs)",
    subtitle="best two-stage xPyD per budget; the slower stage limits, the faster one idles "
             "for the rest of its capacity")
charts.save(chart, Path(output_dir) / "pd_budgets")
per_budget[["budget_gpus", "label", "p_per_d", "tpgs", "rate_rps", "limit", "idle_fraction"]]

# %%
headline = {
    "best_prefill_plan": best_p["plan"], "best_decode_plan": best_d["plan"],
    "prefill_max_rps": float(best_p["max_rps"]), "decode_max_rps": float(best_d["max_rps"]),
    "prefill_max_rps_per_gpu": float(best_p["max_rps_per_gpu"]),
    "decode_max_rps_per_gpu": float(best_d["max_rps_per_gpu"]),
    "rate_matched_p_per_d": float(rate_matched),
    "joint_best": result.deployment.label(),
    "joint_x": int(best["x"]), "joint_y": int(best["y"]),
    "tpgs": float(best["tpgs"]), "p90_interactivity_tok_s": float(best["p90_interactivity_tok_s"]),
    "p90_ttft_s": float(best["p90_ttft_s"]), "screening_tpgs": float(result.screening["tpgs"]),
    "tokens_per_request": float(tokens_per_request),
    "sweep_pair": {"prefill_plan": chosen[0], "decode_plan": chosen[1],
                   "prefill_rps": float(stage1("prefill", chosen[0])["max_rps"]),
                   "prefill_gpus": int(stage1("prefill", chosen[0])["gpus"]),
                   "decode_rps": float(stage1("decode", chosen[1])["max_rps"]),
                   "decode_gpus": int(stage1("decode", chosen[1])["gpus"]),
                   "rate_matched_p_per_d": float(matched[0]["p_per_d"]),
                   "max_gpus": int(budget_max)},
    "sweep": sweeps[sweeps.pair == chosen_name][
        ["x", "y", "gpus", "p_per_d", "rate_rps", "tpgs", "limit"]].to_dict(orient="records"),
    "sweep_best": {"x": int(peak["x"]), "y": int(peak["y"]), "gpus": int(peak["gpus"]),
                   "p_per_d": float(peak["p_per_d"]), "tpgs": float(peak["tpgs"])},
    "at_budget": at_budget[at_budget.pair == chosen_name][
        ["x", "y", "p_per_d", "tpgs", "limit"]].to_dict(orient="records"),
    "searched_at_budget": searched[searched.pair == chosen_name][
        ["x", "y", "tpgs", "p90_interactivity_tok_s"]].to_dict(orient="records"),
}
nbio.write_headline(output_dir, headline)
{k: v for k, v in headline.items() if k not in ("sweep",)}
