# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% tags=["parameters"]
hardware: list = ["h100-sxm", "h200-sxm", "b200", "b300", "gb200-nvl72", "gb300-nvl72"]  # chips
api_model: str = "claude-opus-5"  # API for the API-equivalent cost
hit_rates: list = [0.90, 0.93, 0.95, 0.96, 0.97]  # cache-hit assumptions for the sensitivity
output_dir: str = "."  # where figures and headline.json go

# %% [markdown]
# # Cost per GPU-hour, per million tokens, and the advantage over an API
#
# GPU-hour price on three bases: owned TCO (SemiAnalysis `costh`, what the vLLM AgentX post
# used), an owned-cost model from capex and power (`model/plan/cost.py`), and observed rental.
# Then the post's own cost table: from its TPGS and TCO, the API-equivalent cost and the cost
# advantage at the documented token mix (`cost.AGENTX_POST_MIX`), and how the advantage moves
# with the cache-hit assumption.

# %%
# ruff: noqa: E402, B018  (notebook: imports after the parameters cell, cells end in a display)
import contextlib
from pathlib import Path

import pandas as pd

from model.frontends import charts, nbio
from model.plan.cost import (
    AGENTX_POST_MIX,
    POST_MIX_INPUT_TOKENS,
    POST_MIX_OUTPUT_TOKENS,
    api_equivalent_usd_per_hour,
    cost_advantage,
    gpu_hour_usd,
    token_mix,
    usd_per_mtok,
)
from model.specs.errors import ServecastError
from model.specs.hardware import load_hardware
from model.specs.prices import api_price
from model.validate.reproduce import load_paper

rows = []
for name in hardware:
    hw = load_hardware(name)
    for basis in ("owned", "owned_model", "rental_low", "rental_high"):
        with contextlib.suppress(ServecastError):  # no sourced figure for this basis
            rows.append({"hardware": name, "basis": basis,
                         "usd_per_gpu_hour": gpu_hour_usd(hw, basis)})
per_hour = pd.DataFrame(rows)
BASES = {"owned": "owned TCO (SemiAnalysis)", "owned_model": "owned, capex + power model",
         "rental_low": "rental, low quote", "rental_high": "rental, high quote"}
wide = per_hour.pivot(index="hardware", columns="basis", values="usd_per_gpu_hour")
markup = (wide["rental_low"] / wide["owned"]).dropna() if {"owned", "rental_low"} <= set(wide) \
    else pd.Series(dtype=float)
chart = charts.bar_chart(
    per_hour.assign(basis=per_hour["basis"].map(BASES)), "hardware", "usd_per_gpu_hour",
    "basis", value_format="$.2f", x_title="", color_title="cost basis", horizontal=True,
    title=(f"Renting costs {markup.min():.1f}-{markup.max():.1f}x the owned TCO per GPU-hour"
           if len(markup) else "GPU-hour price by cost basis"),
    subtitle="USD per GPU-hour; low rental quote over owned TCO, per chip "
             "(hardware/*.yaml, each value sourced)")
charts.save(chart, Path(output_dir) / "gpu_hour")
per_hour.pivot(index="hardware", columns="basis", values="usd_per_gpu_hour")

# %% [markdown]
# ## The post's cost table, recomputed

# %%
price = api_price(api_model)
post_claims = {}  # the post's results and cost tables (papers/vllm-agentx/claims.yaml)
for claim in load_paper("vllm-agentx").claims:
    if claim.predictor == "plan_metric" and "concurrency" not in claim.args:
        row = post_claims.setdefault(claim.args["arch"], {"model": claim.args["arch"],
                                                          "gpus": claim.args["gpus"]})
        row[claim.args["metric"]] = claim.published
post = pd.DataFrame([{"model": r["model"], "gpus": r["gpus"], "tpgs": r["tpgs"],
                      "tco_usd_per_hour": r["tco_usd_per_hour"],
                      "published_advantage": r["cost_advantage"]}
                     for r in post_claims.values()])
post["usd_per_mtok"] = [usd_per_mtok(t, r * g) for t, r, g in
                        zip(post.tco_usd_per_hour, post.tpgs, post.gpus, strict=True)]
post["api_equivalent_usd_per_hour"] = [api_equivalent_usd_per_hour(price, AGENTX_POST_MIX, r * g)
                                       for r, g in zip(post.tpgs, post.gpus, strict=True)]
post["advantage"] = [cost_advantage(a, t) for a, t in
                     zip(post.api_equivalent_usd_per_hour, post.tco_usd_per_hour, strict=True)]
post["rel_error"] = post.advantage / post.published_advantage - 1
post

# %% [markdown]
# ## Sensitivity: advantage vs the cache-hit assumption (same output share)

# %%
sens = []
for h in hit_rates:
    mix = token_mix(POST_MIX_INPUT_TOKENS, POST_MIX_OUTPUT_TOKENS, h)
    for _, row in post.iterrows():
        api = api_equivalent_usd_per_hour(price, mix, row.tpgs * row.gpus)
        sens.append({"hit_rate": h, "model": row.model,
                     "advantage": cost_advantage(api, row.tco_usd_per_hour)})
sens = pd.DataFrame(sens)
lead = sens[sens.model == post.model.iloc[0]].sort_values("hit_rate")
chart = charts.line_chart(
    sens, "hit_rate", "advantage", "model", log_y=True, x_format=".0%",
    x_title="prefix-cache hit rate (share of input tokens)",
    y_title=f"cost advantage over {api_model} (x, log scale)",
    title=f"More cache hits shrink the advantage: {lead.model.iloc[0]} "
          f"{lead.advantage.iloc[0]:.0f}x at {lead.hit_rate.iloc[0]:.0%} hits, "
          f"{lead.advantage.iloc[-1]:.0f}x at {lead.hit_rate.iloc[-1]:.0%}",
    subtitle="the API bills cached input at a discount, the GPUs serve it at the same TPGS; "
             f"{POST_MIX_INPUT_TOKENS / 1e3:.0f}K-token turns, {POST_MIX_OUTPUT_TOKENS} output "
             "tokens, the post's TPGS and TCO")
charts.save(chart, Path(output_dir) / "advantage_vs_hit")
chart

# %%
headline = {f"advantage_{m}": float(a) for m, a in zip(post.model, post.advantage, strict=True)}
headline.update({f"usd_per_mtok_{m}": float(c) for m, c in zip(post.model, post.usd_per_mtok,
                                                               strict=True)})
headline["max_rel_error"] = float(post.rel_error.abs().max())
headline["token_mix"] = AGENTX_POST_MIX.source
nbio.write_headline(output_dir, headline)
headline
