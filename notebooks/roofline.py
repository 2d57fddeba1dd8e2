# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% tags=["parameters"]
arch: str = "deepseek-v3"  # architecture slug, HF id or config.json path
hardware: str = "h200-sxm"  # chip name or alias
tp: int = 1  # tensor parallel degree of attention/dense layers
dp: int = 8  # attention data parallel degree (DEP with ep)
ep: int = 8  # expert parallel degree; experts use tp*dp/ep-way tensor parallel
precision: str = ""  # GEMM weight format override, empty for the checkpoint format
decode_seqs: int = 256  # sequences in the decode step (replica total)
context_tokens: int = 4096  # context per decoding sequence / prompt length
prefill_tokens: int = 8192  # new prompt tokens per rank in the prefill step
cpu_offload_gib: float = 0.0  # weights per GPU kept in host memory (vLLM --cpu-offload-gb)
output_dir: str = "."  # where figures and headline.json go

# %% [markdown]
# # Where a model's ops sit on the chip's roofline
#
# Each point is one kind of op (attention over the KV cache, routed experts, attention
# projections, ...) in one phase on one GPU, summed over the layers: arithmetic intensity (FLOP
# per HBM byte, from the closed-form counts in `model/perf/ops.py`, sharded by the plan) against
# attained FLOP/s (the same FLOPs over the modeled kernel time from `model/perf/roofline.py`), sized
# by its share of the step. Decode GEMMs sit left of the ridge (HBM-bound); prefill GEMMs sit
# right of it (compute-bound).

# %%
# ruff: noqa: E402, B018  (notebook: imports after the parameters cell, cells end in a display)
from pathlib import Path

import pandas as pd

from model.frontends import charts, nbio
from model.perf import ops
from model.perf.parallel import ParallelPlan
from model.perf.roofline import compute_rate
from model.perf.step import build_step_model
from model.specs.architecture import load_architecture
from model.specs.hardware import load_hardware

a = load_architecture(arch)
hw = load_hardware(hardware)
moe_tp = max(tp * dp // ep, 1)
sm = build_step_model(a, hw, ParallelPlan(tp=tp, dp=dp, ep=ep, moe_tp=moe_tp),
                      precision=precision or None, cpu_offload_gib=cpu_offload_gib)
rate, peak = compute_rate(sm.arch.weight_dtype, hw)  # weight-only formats run at bf16
bandwidth = hw.hbm_bandwidth_bytes_per_s
ridge = peak / bandwidth

decode = sm.op_table(0, 0, decode_seqs, context_tokens).assign(phase="decode")
prefill = sm.op_table(prefill_tokens * dp, context_tokens, 0, 0, dp).assign(phase="prefill")
table = pd.concat([decode, prefill], ignore_index=True)
table["group"] = [charts.op_group(o, k) for o, k in zip(table["op"], table["kind"], strict=True)]
table.sort_values(["phase", "time_s"], ascending=[True, False]).head(20)

# %% [markdown]
# The formulas behind the counts (sympy, rendered):

# %%
pd.DataFrame(ops.render())

# %% [markdown]
# ## Where the efficiencies come from
#
# A count becomes a time through an efficiency curve per op class and number format
# (`model/perf/kernels.py`): the fraction of peak FLOP/s a kernel reaches as its rows grow, the
# fraction of HBM bandwidth it streams at, and a fixed cost per call. The curves are fitted on
# measured kernel tables (`data/calibration/ops/`, fits in `data/calibration/kernels.yaml`):
# - `fitted:<chip>`: the chip's own measured tables (H100, H200, B200);
# - `fitted:<die table>`: a table of the chip's die for some op classes (`kernel_tables` in its
#   hardware spec; MI300X and MI325X have AITER's tuned MoE times);
# - `transfer:<reference>`: another chip's curve, its compute ceiling scaled by the two chips'
#   measured best-GEMM fractions of peak (MAMF); the `calibration_reference` of the spec says
#   which chip and why.

# %%
from model.perf.kernels import params_for

experts = next((ly.mlp.experts.dtype for ly in sm.arch.layers
                if getattr(ly.mlp.experts, "dtype", None)), None)
formats = {"gemm": sm.arch.weight_dtype, "memory": "bf16"} | ({"moe": experts} if experts else {})
curves = pd.DataFrame([
    {"op class": op_class, "format": fmt, "source": p.source,
     "peak fraction (max)": round(p.compute_efficiency_max, 3), "rows at half": p.half_tokens,
     "HBM fraction": round(p.memory_efficiency, 3), "fixed cost (us)": round(p.overhead_s * 1e6, 1)}
    for op_class, fmt in formats.items() for p in [params_for(hw, op_class, fmt)]])
curves

# %%
# One point per (phase, op group) over all layers: summed FLOPs over summed bytes and time, sized
# and labelled by its share of that phase's step; groups under 1% of a phase are left out.
summed = table.assign(flops=table.flops * table.layers, bytes=table.bytes * table.layers,
                      time_s=table.time_s * table.layers)
points = summed.groupby(["phase", "group"], as_index=False)[["flops", "bytes", "time_s"]].sum()
points["intensity_flop_per_byte"] = points.flops / points.bytes
points["attained_flop_per_s"] = points.flops / points.time_s
points["time_share"] = points.time_s / points.groupby("phase").time_s.transform("sum")
points = points[points.time_share >= 0.01].sort_values(["phase", "time_share"],
                                                       ascending=[True, False])
points["share_label"] = (100 * points.time_share).round().astype(int).astype(str) + "%"
points["share_label"] = charts.declutter(points, "intensity_flop_per_byte",
                                         "attained_flop_per_s", "share_label", "time_share")


def share_below_ridge(df: pd.DataFrame) -> float:
    t = df["time_s"] * df["layers"]
    return float(t[df["intensity_flop_per_byte"] < ridge].sum() / t.sum())


decode_hbm, prefill_hbm = share_below_ridge(decode), share_below_ridge(prefill)
chart = charts.roofline_chart(
    points, "intensity_flop_per_byte", "attained_flop_per_s", peak, bandwidth, label="group",
    shape="phase", size="time_share", text="share_label", color_title="op",
    title=f"{a.name} on {hw.name}: {decode_hbm:.0%} of decode time is HBM-bound, "
          f"{1 - prefill_hbm:.0%} of prefill time compute-bound",
    subtitle=f"plan {sm.plan.label()}; decode {decode_seqs} seqs at {context_tokens:,} tokens, "
             f"prefill {prefill_tokens:,} tokens per rank; labels: share of that phase's step "
             "time")
charts.save(chart, Path(output_dir) / "roofline")
chart

# %% [markdown]
# Weights kept in host memory (`cpu_offload_gib`, vLLM's `--cpu-offload-gb`) add a third roof.
# vLLM's UVA offloader moves the first decoder layers' parameters to pinned host memory, and every
# step reads them back across the host link, at tens of GB/s instead of the HBM's TB/s
# (`model/perf/host_weights.py`). That wait is not a kernel, so it is not a point on the chart.
# The step's breakdown counts it as `host_link`, and it names the bottleneck when it is the
# largest part.

# %% [markdown]
# Some kernels sit below every roof: they are bound by latency, not by FLOPs or bytes. vLLM's Triton
# attention (`--attention-backend TRITON_ATTN`, the MiniMax M3 launchers' choice off Blackwell)
# splits a long context over programs only when every sequence brings one query. A speculative
# verify step brings 1 + drafts, and the kernel then walks each sequence's whole context in one
# program, 32 keys a tile, one tile after another (`roofline.serial_walk_s`). Each tile costs about
# 1.6 us whatever the bandwidth (measured on an A100, `model.specs.defaults.TRITON_2D_TILE_S`), so a
# dense attention layer at 100K tokens takes about 5 ms where its bytes need tens of microseconds.
# A step model built with `attention_backend="triton"` takes the slower of the two. The programs
# run side by side, so the step waits for the batch's longest context: the serving model takes
# the expected longest of its workload's decoding contexts (`model.perf.context_spread`), about
# 2.7 times the mean for 8 sequences when contexts spread as an exponential law.

# %%
from model.perf import roofline as rl

# one sequence verifying 3 drafts (4 queries) at each context, on this plan's TP shard
dense = [ly.attention for ly in sm.arch.main_layers if ly.attention.kind in ("gqa", "swa")][:1]
walk = pd.DataFrame([{"context_tokens": c, "serial_walk_ms_per_layer": 1e3 * float(
    rl.serial_walk_s(att.kind, 1.0, 4.0, c, att, sm.plan.tp))}
    for att in dense for c in (8_192, 32_768, 131_072)])
walk

# %%
dec_b = sm.breakdown(0, 0, decode_seqs, context_tokens)
pre_b = sm.breakdown(prefill_tokens * dp, context_tokens, 0, 0, dp)
headline = {
    "arch": a.name, "hardware": hw.name, "plan": sm.plan.label(),
    "ridge_flop_per_byte": ridge,
    "decode_step_ms": dec_b["step_time_s"] * 1e3, "decode_bottleneck": dec_b["bottleneck"],
    "prefill_step_ms": pre_b["step_time_s"] * 1e3, "prefill_bottleneck": pre_b["bottleneck"],
    "decode_time_share_memory_bound": decode_hbm,
    "prefill_time_share_memory_bound": prefill_hbm,
    "decode_top_op": points[points.phase == "decode"].iloc[0]["group"],
    "prefill_top_op": points[points.phase == "prefill"].iloc[0]["group"],
    "prefill_mfu": pre_b["flops_per_gpu"] / pre_b["step_time_s"] / peak,
    "decode_host_link_ms": dec_b["time_by_bound_s"].get("host_link", 0.0) * 1e3,
}
nbio.write_headline(output_dir, headline)
headline
