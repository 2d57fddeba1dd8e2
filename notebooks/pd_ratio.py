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
output_dir: str = "."  # where figures and headline.json go

# %% [markdown]
# # Prefill/decode ratio: the AgentX two-stage method
#
# Stage 1 (saturation): the maximum request rate of every prefill-only and decode-only
# configuration (parallel plan x size), decode under the interactivity SLO and its KV capacity.
# Stage 2 (ratio): x prefill + y decode instances serve min(x*lam_P, y*lam_D); the rate-matched
# ratio is x/y = lam_D/lam_P (research/theory.md §7). The joint optimum comes from the full
# search (`model/plan.py`), which also charges the KV hand-off and prefill queueing to TTFT.

# %%
# ruff: noqa: E402, B018  (notebook: imports after the parameters cell, cells end in a display)
from pathlib import Path

from model import charts, nbio
from model.plan import plan

result = plan(arch=arch, hardware=hardware, gpus=gpus, workload=workload,
              slo_p90_interactivity=slo_p90_interactivity, modes=("disaggregated",),
              prefill_hardware=prefill_hardware or None)
sat = result.saturation
best_p = sat[sat.phase == "prefill"].sort_values("max_rps_per_gpu", ascending=False).iloc[0]
best_d = sat[sat.phase == "decode"].sort_values("max_rps_per_gpu", ascending=False).iloc[0]
rate_matched = best_d["max_rps"] / best_p["max_rps"]  # prefill instances per decode instance
sat.sort_values(["phase", "max_rps_per_gpu"], ascending=[True, False]).head(12)

# %% [markdown]
# ## Stage 2: TPGS of every xPyD ratio of the best prefill and decode plans (at the SLO)

# %%
c = result.candidates
pair = c[(c.plan == best_p["plan"]) & (c.decode_plan == best_d["plan"]) & c.feasible
         & (c.p90_interactivity_tok_s >= slo_p90_interactivity)]
by_ratio = (pair.sort_values("tpgs", ascending=False).groupby(["x", "y"], as_index=False).first())
by_ratio["p_per_d"] = by_ratio["x"] / by_ratio["y"]
chart = charts.line_chart(by_ratio.sort_values("p_per_d"), "p_per_d", "tpgs",
                          title=f"{arch}: TPGS vs P/D ratio ({gpus} GPUs)",
                          subtitle=f"prefill {best_p['plan']} x {best_d['plan']} decode; "
                          f"rate-matched {rate_matched:.2f}")
charts.save(chart, Path(output_dir) / "pd_ratio")
chart

# %%
best = result.best
headline = {
    "best_prefill_plan": best_p["plan"], "best_decode_plan": best_d["plan"],
    "prefill_max_rps": float(best_p["max_rps"]), "decode_max_rps": float(best_d["max_rps"]),
    "prefill_max_rps_per_gpu": float(best_p["max_rps_per_gpu"]),
    "decode_max_rps_per_gpu": float(best_d["max_rps_per_gpu"]),
    "rate_matched_p_per_d": float(rate_matched),
    "joint_best": result.deployment.label(),
    "joint_x": int(best["x"]), "joint_y": int(best["y"]),
    "tpgs": float(best["tpgs"]), "p90_interactivity_tok_s": float(best["p90_interactivity_tok_s"]),
    "p90_ttft_s": float(best["p90_ttft_s"]),
}
nbio.write_headline(output_dir, headline)
headline
