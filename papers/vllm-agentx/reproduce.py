# %% [markdown]
# # Reproducing the vLLM AgentX post
#
# Every quantitative claim of the seed documents (the post, a news piece, a talk summary) is in
# `claims.yaml` with its tolerance and the model function that predicts it. This notebook runs
# them all (`model.validate.reproduce`), tabulates published against predicted, and draws three figures:
# the ratio predicted / published per claim, the results table (TPGS at P90 > 50 tok/s) and the
# cost comparison against Opus 5 API prices.

# %% tags=["parameters"]
only: str = ""  # comma-separated claim ids or globs such as workload.* (empty means all)
workers: int = 2  # processes for the independent plan searches
write_report: bool = False  # also rewrite papers/vllm-agentx/report.md
output_dir: str = "."  # where headline.json and the figures go

# %%
# ruff: noqa: E402, B018  (notebook: imports after the parameters cell, cells end in a display)
from pathlib import Path

import pandas as pd

from model.frontends import charts
from model.frontends.nbio import write_headline
from model.validate.reproduce import load_paper, reproduce
from model.validate.reproduce import write_report as write_report_md

patterns = [p.strip() for p in only.split(",") if p.strip()] or None
result = reproduce("vllm-agentx", only=patterns, workers=workers)
claims = pd.DataFrame(result["claims"])
claims[["id", "published", "predicted", "rel_error", "within_tolerance", "unit"]]

# %% [markdown]
# **Summary.** Claims without a prediction carry the reason (a module not there, a quantity the
# analytical model does not represent, or an infeasible configuration).

# %%
print(result["summary"])
claims.loc[claims["predicted"].isna(), ["id", "reason"]]

# %% [markdown]
# ## Predicted / published, per claim
# 1.0 is a perfect reproduction; the shaded verdict is against each claim's own tolerance.

# %%
ratio = claims.dropna(subset=["predicted"]).assign(
    ratio=lambda d: d["predicted"] / d["published"],
    verdict=lambda d: d["within_tolerance"].map({True: "within tolerance",
                                                 False: "outside tolerance"}))
figures = []
if not ratio.empty:
    chart = charts.bar_chart(ratio, "id", "ratio", "verdict", horizontal=True, rule=1.0,
                             title="Predicted / published, per claim",
                             subtitle="vLLM AgentX post; 1.0 = exact reproduction")
    figures += charts.save(chart, Path(output_dir) / "claims_ratio")

# %% [markdown]
# ## Results table: TPGS at P90 interactivity > 50 tok/s

# %%
def table(prefix: str, suffix: str) -> pd.DataFrame:
    rows = claims[claims["id"].str.startswith(prefix) & claims["id"].str.endswith(suffix)]
    model = rows["id"].str.split(".").str[1]
    return pd.concat([
        pd.DataFrame({"model": model, "value": rows["published"], "source": "published"}),
        pd.DataFrame({"model": model, "value": rows["predicted"], "source": "Servecast"}),
    ]).dropna()


tpgs = table("results.", ".tpgs").rename(columns={"value": "tpgs"})
traffic = load_paper("vllm-agentx").defaults["workload"]
if not tpgs.empty:
    figures += charts.save(charts.bar_chart(tpgs, "model", "tpgs", "source",
                                            title="TPGS at P90 interactivity > 50 tok/s",
                                            subtitle=f"traffic: {traffic}; total tokens per "
                                                     "GPU-second"),
                           Path(output_dir) / "results_tpgs")

# %% [markdown]
# ## Cost: GPU TCO per hour vs the Opus 5 API price of the same tokens

# %%
cost = pd.concat([
    table("cost.", ".tco_usd_per_hour").assign(kind="GPU TCO"),
    table("cost.", ".api_equivalent_usd_per_hour").assign(kind="Opus 5 API equivalent"),
])
if not cost.empty:
    cost = cost.assign(series=cost["kind"] + " (" + cost["source"] + ")").rename(
        columns={"value": "usd_per_hour"})
    figures += charts.save(charts.bar_chart(cost, "model", "usd_per_hour", "series", log_y=True,
                                            title="Cost per hour of the served tokens",
                                            subtitle="log scale; published vs Servecast"),
                           Path(output_dir) / "cost_comparison")

# %%
if write_report:
    write_report_md(result)
summary = result["summary"]
write_headline(output_dir, {
    "claims": summary["claims"], "predicted": summary["predicted"],
    "within_tolerance": summary["within_tolerance"], "seconds": summary["seconds"],
    "predictions": {r["id"]: r["predicted"] for r in result["claims"]},
    "figures": [str(p) for p in figures],
})
