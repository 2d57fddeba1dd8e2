# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% tags=["parameters"]
results: str = "data/calibration/e2e_measured.csv"  # calibration CSV or vllm bench JSON
max_rows: int = 0  # predict only the first N rows, 0 for all
group_by: str = "backend"  # column to split the errors by: system, backend, model, mode
output_dir: str = "."  # where figures and headline.json go

# %% [markdown]
# # Measured vs predicted: how far the model is from benchmark runs, and why
#
# Each measured run (calibration CSV rows, or a `vllm bench serve --save-result` file) is
# predicted by `servecast check`. The charts show predicted against measured mean TTFT and TPOT,
# the error by group, and which modeled term dominates each prediction, so the gap can be read
# against it (a gap on rows dominated by queueing points at KV capacity or arrival
# synchronization; one on rows dominated by decode kernels points at the kernel model).

# %%
# ruff: noqa: E402, B018  (notebook: imports after the parameters cell, cells end in a display)
from pathlib import Path

import altair as alt
import numpy as np
import pandas as pd

from model.fit.cases import load_cases
from model.frontends import charts, nbio
from model.validate.check import explain_table, summarize

cases = load_cases(results)
if max_rows:
    cases = cases[:max_rows]
table = explain_table(cases)
summary = summarize(table)
{k: summary[k] for k in ("rows", "predicted", "ttft_median_ape", "tpot_median_ape",
                         "ttft_mape", "tpot_mape")}

# %%
ok = table[table["predicted"]].copy()
long = pd.concat([
    pd.DataFrame({"metric": "TTFT (ms)", "measured": ok["ttft_ms"],
                  "predicted": ok["pred_ttft_ms"], group_by: ok[group_by]}),
    pd.DataFrame({"metric": "TPOT (ms)", "measured": ok["tpot_ms"],
                  "predicted": ok["pred_tpot_ms"], group_by: ok[group_by]}),
])
base = alt.Chart(long).encode(
    x=alt.X("measured:Q", title="measured (ms)",
            scale=alt.Scale(type="log", nice=False, padding=6), axis=alt.Axis(format="~s")),
    y=alt.Y("predicted:Q", title="predicted (ms)",
            scale=alt.Scale(type="log", nice=False, padding=6), axis=alt.Axis(format="~s")))
identity = base.mark_line(color="#555555", strokeDash=[4, 3]).encode(
    y=alt.Y("measured:Q", title="predicted (ms)"))
scatter = charts.titled(
    alt.layer(
        base.mark_point(size=18, opacity=0.5, filled=True).encode(
            color=charts.series_color(group_by, long)),
        identity,
    ).properties(width=300, height=300).facet(
        column=alt.Column("metric:N", title=None, header=alt.Header(labelFontSize=13)))
    .resolve_scale(x="independent", y="independent"),
    f"Predicted vs measured over {summary['predicted']:,} runs: median error TTFT "
    f"{summary['ttft_median_ape']:.0%}, TPOT {summary['tpot_median_ape']:.0%}",
    f"{Path(results).name}; dashed: prediction = measurement; log axes")
charts.save(scatter, Path(output_dir) / "measured_vs_predicted")
scatter

# %%
rows = []
for name, sub in summary[f"by_{group_by}"].items() if f"by_{group_by}" in summary else []:
    rows += [{group_by: name, "metric": "TTFT", "median APE": sub["ttft_median_ape"]},
             {group_by: name, "metric": "TPOT", "median APE": sub["tpot_median_ape"]}]
if not rows:  # groups the summary does not pre-compute
    for name, sub in ok.groupby(group_by):
        rows += [{group_by: name, "metric": "TTFT", "median APE": sub["ttft_ape"].median()},
                 {group_by: name, "metric": "TPOT", "median APE": sub["tpot_ape"].median()}]
errors = pd.DataFrame(rows).dropna()
worst = errors.sort_values("median APE", ascending=False).iloc[0]
bars = charts.bar_chart(errors, group_by, "median APE", "metric", value_format=".0%",
                        y_title="median absolute error (share of measured)",
                        title=f"Largest median error: {worst['metric']} on {worst[group_by]} "
                              f"({worst['median APE']:.0%})",
                        subtitle=f"median |predicted - measured| / measured per {group_by}")
charts.save(bars, Path(output_dir) / "error_by_group")
bars

# %% [markdown]
# Signed error (log of predicted / measured) by the term that dominates the prediction:

# %%
ok["tpot_log_error"] = np.log(ok["pred_tpot_ms"] / ok["tpot_ms"])
ok["ttft_log_error"] = np.log(ok["pred_ttft_ms"] / ok["ttft_ms"])
by_term = pd.concat([
    ok.groupby("tpot_term")["tpot_log_error"].agg(["median", "count"]).assign(metric="TPOT"),
    ok.groupby("ttft_term")["ttft_log_error"].agg(["median", "count"]).assign(metric="TTFT"),
]).rename_axis("term").reset_index()
by_term

# %%
worst = by_term.loc[by_term["median"].abs().idxmax()] if len(by_term) else None
headline = {
    "rows": summary["rows"], "predicted": summary["predicted"],
    "coverage": summary["coverage"],
    "ttft_median_ape": summary["ttft_median_ape"], "tpot_median_ape": summary["tpot_median_ape"],
    "ttft_mape": summary["ttft_mape"], "tpot_mape": summary["tpot_mape"],
    "dominant_tpot_term": ok["tpot_term"].mode().iat[0] if len(ok) else None,
    "dominant_ttft_term": ok["ttft_term"].mode().iat[0] if len(ok) else None,
    "most_biased_term": None if worst is None else f"{worst['metric']}:{worst['term']}",
    "most_biased_term_log_error": None if worst is None else float(worst["median"]),
}
nbio.write_headline(output_dir, headline)
headline
