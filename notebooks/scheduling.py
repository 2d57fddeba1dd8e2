# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% tags=["parameters"]
arch: str = "deepseek-v4-pro"  # architecture slug (ignored with reference_step_model)
hardware: str = "b300"  # hardware name
dp: int = 8  # attention data-parallel ranks (DEP)
ep: int = 8  # expert parallel degree
tp: int = 1  # tensor parallel degree
workload: str = "agentx"  # workload profile
long_prefill_token_threshold: int = 512  # the threshold compared against 0 (off)
max_num_batched_tokens: int = 0  # token budget per engine step; 0: the engine default
prefill_schedule_interval: int = 8  # prefill every Nth step, aligned across DP ranks (InferenceX DSv4 DEP lane: 8)
slo_p90_interactivity: float = 50.0  # tok/s per user that 90% of requests must reach
concurrencies: list = [8, 16, 32, 64, 128, 256]  # closed-loop sessions swept per replica
at_concurrency: int = 128  # load at which both policies are compared side by side
simulate_s: float = 300.0  # simulated seconds of the mechanism timeline; 0 skips it
reference_step_model: bool = False  # use the affine reference step model (fast, for tests)
output_dir: str = "."  # where figures and headline.json go

# %% [markdown]
# # Why `--long-prefill-token-threshold` helps agentic serving
#
# AgentX turns are mostly warm: a few hundred new tokens on a cached 100K+ context. A few are
# cold: a new session or a compaction re-prefills its whole context. vLLM's scheduler gives a
# prefill everything the decodes leave of the step budget, so a cold 100K prompt holds
# `max_num_batched_tokens` for a run of long steps: warm turns queue behind it (head-of-line
# blocking of TTFT), and every decode in flight, on every lock-stepped DP rank, pays for those
# steps. A threshold of 512 cuts each request's prefill to 512 tokens per step: warm turns ride
# alongside the cold one, and the lock-stepped ranks pay the slowest rank's small chunk instead
# of each rank's whole-budget chunk in turn.
#
# Both policies run at the same `--prefill-schedule-interval` (8 by default, InferenceX's DEP
# cadence): prefill lands on every 8th step on all ranks at once, so with the threshold the
# ranks carry small chunks side by side; without it each admitting step still carries a rank's
# whole-budget chunk of a cold prompt. The closed form (`model.serve.engine`) sweeps sessions for both
# policies; the simulator (`model.serve.simulate`) shows the step timeline the mechanism comes from.

# %%
# ruff: noqa: E402, B018  (notebook: imports after the parameters cell, cells end in a display)
from pathlib import Path

import altair as alt
import numpy as np
import pandas as pd

from model.frontends import charts, nbio
from model.serve.engine import AffineStepModel, threshold_effect
from model.serve.policy import EnginePolicy
from model.serve.simulate import simulate
from model.specs.defaults import MAX_NUM_BATCHED_TOKENS, MAX_NUM_SEQS
from model.specs.workload import ClosedLoop, load_workload

budget = max_num_batched_tokens or MAX_NUM_BATCHED_TOKENS

if reference_step_model:
    step = AffineStepModel(a=0.008, b=3e-5, c=5e-5, d=1e-9, e=2e-10)
    dp = 1
else:
    from model.perf.parallel import ParallelPlan
    from model.plan.plan_models import step_model

    step = step_model(arch, hardware, ParallelPlan(tp=tp, dp=dp, ep=ep))  # served per recipe
w = load_workload(workload)
policy = EnginePolicy(budget, MAX_NUM_SEQS, 0, prefill_schedule_interval if dp > 1 else 1)
effect = threshold_effect(step, w, policy, threshold=long_prefill_token_threshold,
                          slo_p90_interactivity=slo_p90_interactivity,
                          concurrencies=[int(c) for c in concurrencies],
                          at_concurrency=int(at_concurrency))
{k: v for k, v in effect.items() if not k.startswith("sweep")}

# %% [markdown]
# ## Throughput against interactivity
#
# Each point is one closed-loop concurrency. The threshold moves the front where the decodes
# were paying for whole-budget prefill steps; where the load is light it can cost a little P90
# interactivity (spreading a cold prefill touches more decode windows, each a little).
#
# The threshold has its own ceiling: a rank's budget holds budget / chunk prompts at once (~16 at
# 8K and 512), and a cold prompt keeps its slot for its whole prefill. Near the budget's
# saturation prompts queue for a slot (`model.serve.slot_queue`), and the threshold engine's TTFT
# climbs there instead of FCFS's head-of-line blocking.

# %%
frames = []
for label, key in (("off", "sweep_off"), (f"threshold {long_prefill_token_threshold}",
                                          "sweep_on")):
    f = effect[key].copy()
    f["policy"] = label
    frames.append(f)
sweep = pd.concat(frames, ignore_index=True)
ok = sweep[sweep.stable]
gain, inter_ratio = effect["tpgs_gain"], effect["p90_interactivity_ratio"]
if gain is not None and inter_ratio is not None:
    verdict = (f"threshold {long_prefill_token_threshold}: {gain:+.0%} TPGS at the SLO "
               f"(at equal load up to {effect.get('tpgs_gain_max', float('nan')):+.0%}), "
               f"{inter_ratio:.2f}x P90 interactivity")
elif effect["off"] or effect["on"]:
    verdict = (f"only {'threshold off' if effect['off'] else 'the threshold'} reaches P90 "
               f"{slo_p90_interactivity:g} tok/s")
else:
    verdict = f"neither policy reaches P90 {slo_p90_interactivity:g} tok/s here"
sessions = ok["concurrency"]
front = alt.Chart(ok).mark_line(point=True).encode(
    x=alt.X("p90_interactivity_tok_s:Q", title="P90 interactivity (tok/s per user)"),
    y=alt.Y("tpgs:Q", title="TPGS (total tokens per GPU-second)"),
    color=charts.series_color("policy", ok),
    tooltip=["policy", "concurrency", "tpgs", "p90_interactivity_tok_s", "p90_ttft_s"],
).properties(title="Throughput against interactivity", width=420, height=300)
rule = alt.Chart(pd.DataFrame({"x": [slo_p90_interactivity],
                               "text": [f"SLO {slo_p90_interactivity:g}"]}))
rule = rule.mark_rule(strokeDash=[4, 4], color="#666666").encode(x="x:Q") + rule.mark_text(
    align="left", dx=4, baseline="top", color="#444444").encode(x="x:Q", y=alt.value(2),
                                                               text="text:N")
ttft = alt.Chart(ok).mark_line(point=True).encode(
    x=alt.X("concurrency:Q", title="closed-loop sessions",
            scale=alt.Scale(type="log", domain=[sessions.min() / 1.2, sessions.max() * 1.2],
                            nice=False),
            axis=alt.Axis(values=charts.log_ticks(sessions.min() / 1.2, sessions.max() * 1.2),
                          format="~g")),
    y=alt.Y("p90_ttft_s:Q", scale=alt.Scale(type="log"), title="P90 TTFT (s, log scale)"),
    color=charts.series_color("policy", ok)).properties(
    title="Head-of-line blocking in TTFT", width=300, height=300)
figure = charts.titled(
    alt.hconcat(front + rule, ttft), f"{arch if not reference_step_model else 'reference'} on "
    f"{hardware}: {verdict}",
    f"{workload} traffic, {budget}-token steps, dp{dp}; each point one "
    "closed-loop concurrency (model.serve.engine)")
charts.save(figure, Path(output_dir) / "threshold_front")
figure

# %% [markdown]
# ## The step timeline behind it
#
# One simulated stretch at `at_concurrency` sessions: each engine step's duration and its prefill
# tokens. Without the threshold, the steps that carry a whole-budget chunk of a cold prompt stand
# out as tall spikes, and every decode pays them; with it, prefill is spread thin.

# %%
timeline = []
if simulate_s > 0:
    for label, thr in (("off", 0), (f"threshold {long_prefill_token_threshold}",
                                    long_prefill_token_threshold)):
        sim = simulate(step, w, policy.with_threshold(thr), ClosedLoop(int(at_concurrency)),
                       duration_s=simulate_s, seed=1, dp_ranks=dp)
        timeline.append(pd.DataFrame({
            "time_s": np.cumsum(sim.step_s), "step_ms": sim.step_s * 1e3,
            "prefill_tokens": sim.step_prefill_tokens, "policy": label}))
if timeline:
    tl = pd.concat(timeline, ignore_index=True)
    worst = tl.groupby("policy").step_ms.max()
    steps = alt.Chart(tl).mark_line(strokeWidth=0.8).encode(
        x=alt.X("time_s:Q", title="simulated time (s)"),
        y=alt.Y("step_ms:Q", title="step time (ms)"),
        color=alt.Color("policy:N", legend=None, scale=alt.Scale(
            domain=list(dict.fromkeys(tl.policy)), range=charts.PALETTE[:2])),
        row=alt.Row("policy:N", title=None, header=alt.Header(labelFontSize=13, labelAngle=0,
                                                             labelAlign="left")),
    ).properties(width=640, height=140)
    steps = charts.titled(
        steps, "Longest engine step: " + ", ".join(f"{k} {v:,.0f} ms" for k, v in worst.items()),
        f"{at_concurrency} sessions, {tl.time_s.max():.0f} s of recorded engine steps "
        "(model.serve.simulate); every decode in flight waits for each step")
    charts.save(steps, Path(output_dir) / "step_timeline")
    steps

# %% [markdown]
# ## What TTFT counts before the engine
#
# The chat API is stateless: each turn resends the whole conversation, and the API server renders
# and tokenizes all of it before an engine sees the request. HF tokenizers take 43.7 ms for a
# ~38K-token prompt (nsys-timed in TensorRT-LLM's front end), 1.15 us a token. A Python front end
# (vLLM's OpenAI server) also renders the chat template in Jinja2 over the whole conversation:
# "hundreds of ms per request at ~100k-token chats" (TensorRT-LLM PR 16231), taken at its low end,
# 2 us a token more (an assumption; `servecast serve --frontend python`). At AgentX contexts the
# front end alone is a visible part of a warm turn's TTFT, whatever the threshold. A deployment's
# evaluation (`servecast serve`, `plan`, `validate`) adds it to every request's TTFT and to the
# session's gap as the engine sees it; the sweeps above are the engine alone.

# %%
from model.serve.policy import frontend_rate_s_per_token
from model.serve.request_mix import request_mix_for

context = np.percentile(request_mix_for(w).context_tokens, [50, 90, 99])
pd.DataFrame({"percentile": ["P50", "P90", "P99"], "context_tokens": context.round(),
              "tokenization_s": (frontend_rate_s_per_token(None) * context).round(3),
              "python_front_end_s": (frontend_rate_s_per_token("python") * context).round(3)})

# %%
best_off, best_on = effect["off"] or {}, effect["on"] or {}
nbio.write_headline(output_dir, {
    "arch": "affine-reference" if reference_step_model else arch,
    "hardware": hardware, "workload": workload, "threshold": long_prefill_token_threshold,
    "slo_p90_interactivity_tok_s": slo_p90_interactivity,
    "tpgs_off": best_off.get("tpgs"), "tpgs_on": best_on.get("tpgs"),
    "tpgs_gain": effect["tpgs_gain"],
    "tpgs_gain_max": effect.get("tpgs_gain_max"),
    "tpgs_gain_max_concurrency": effect.get("tpgs_gain_max_concurrency"),
    "p90_interactivity_ratio": effect["p90_interactivity_ratio"],
    "at_concurrency": int(at_concurrency),
    "tpgs_ratio_at_concurrency": effect.get("tpgs_ratio_at_concurrency"),
    "p90_interactivity_ratio_at_concurrency": effect.get("p90_interactivity_ratio_at_concurrency"),
    "p90_ttft_ratio_at_concurrency": effect.get("p90_ttft_ratio_at_concurrency"),
})
