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
gpus: int = 12  # GPU budget for the whole deployment
workload: str = "agentx"  # workload profile name or YAML path
slo_p90_interactivity: float = 50.0  # minimum P90 tokens/s per user
long_prefill_token_threshold: int = -1  # vLLM per-request prefill cap (-1 searches, 0 turns it off)
mode: str = ""  # aggregated, disaggregated, or empty for both
prefill_hardware: str = ""  # a different chip for disaggregated prefill workers (empty: same)
precision: str = ""  # serve weights in this format, e.g. mxfp8 (empty: the checkpoint)
api_model: str = "claude-opus-5"  # API whose prices give the API-equivalent cost
pareto_points: int = 8  # full-tier points added along the screening's Pareto front
allow_beyond_window: bool = False  # serve workload requests past the model's context window (stated)
cpu_offload_gib: float = 0.0  # weights per GPU every engine keeps in host memory (vLLM --cpu-offload-gb)
output_dir: str = "."  # where figures and headline.json go

# %% [markdown]
# # Best deployment under an interactivity SLO
#
# Every valid parallel plan (TP, PP, DP/DEP, EP, DCP, PCP) per replica size, aggregated replicas
# and disaggregated xPyD workers, engine knobs and client concurrency are ranked by the screening
# tier (`model/plan/screening.py`, vectorized); the full tier (`model/plan/full_tier.py`: serve()
# per replica, `model/serve/pools.py` for disaggregated workers) serves the shortlisted ones and
# points along the screening's front. Every number shown is the full tier's: the Pareto front of
# TPGS (cached input included) against P90 interactivity, and the best point above the SLO with
# its cost and the launch commands that realize it.

# %%
# ruff: noqa: E402, B018  (notebook: imports after the parameters cell, cells end in a display)
from pathlib import Path

import pandas as pd

from model.frontends import charts, nbio
from model.plan.planner import plan
from model.specs.defaults import MODES

result = plan(arch=arch, hardware=hardware, gpus=gpus, workload=workload,
              slo_p90_interactivity=slo_p90_interactivity,
              long_prefill_token_threshold=None if long_prefill_token_threshold < 0
              else long_prefill_token_threshold,
              modes=(mode,) if mode else MODES, prefill_hardware=prefill_hardware or None,
              precision=precision or None, api_model=api_model, pareto_points=pareto_points,
              allow_beyond_window=allow_beyond_window, cpu_offload_gib=cpu_offload_gib)
headline = result.contract()
{k: headline[k] for k in ("tpgs", "p90_interactivity_tok_s", "p90_ttft_s", "tco_usd_per_hour",
                          "usd_per_mtok", "cost_advantage", "why")}

# %% [markdown]
# ## Pareto front: throughput per GPU vs P90 interactivity (full tier)

# %%
front = result.pareto
shown = charts.pareto_front(front, "p90_interactivity_tok_s", "tpgs", "mode")
best = result.best
at_slo = front[front.p90_interactivity_tok_s >= slo_p90_interactivity]
other = at_slo[at_slo["mode"] != best["mode"]]
versus = (f", {best['tpgs'] / other['tpgs'].max():.1f}x the best {other['mode'].iloc[0]}"
          if len(other) else "")
chart = charts.pareto_chart(
    shown[["mode", "plan", "decode_plan", "concurrency", "tpgs", "p90_interactivity_tok_s",
           "p90_ttft_s"]], "p90_interactivity_tok_s", "tpgs", "mode",
    title=f"{arch} on {gpus} x {hardware}: {best['tpgs'] / 1e3:,.1f}K TPGS at the SLO "
          f"({best['mode']}{versus})",
    subtitle=[f"{workload} traffic; the full tier's Pareto front per mode ("
              f"{headline['full_tier_evaluations']} evaluations); ringed: the chosen "
              f"{result.deployment.label()}",
              f"${headline['usd_per_mtok']:.2g} per million tokens at "
              f"${headline['tco_usd_per_hour']:,.2f}/h TCO; P90 TTFT "
              f"{headline['p90_ttft_s']:.2f} s"],
    x_rule=slo_p90_interactivity, x_rule_label=f"SLO {slo_p90_interactivity:g} tok/s",
    highlight=pd.DataFrame([{"p90_interactivity_tok_s": float(best["p90_interactivity_tok_s"]),
                             "tpgs": float(best["tpgs"]),
                             "text": result.deployment.label().rsplit(" c", 1)[0]}]),
    highlight_label="text", x_title="P90 interactivity (tok/s per user)",
    y_title="TPGS (tokens/s per GPU, cached input included)")
charts.save(chart, Path(output_dir) / "pareto")
chart

# %% [markdown]
# ## The chosen deployment and how to launch it

# %%
print("\n".join(result.launch_commands["vllm"]))
result.pareto.tail(10)

# %%
nbio.write_headline(output_dir, headline)
