# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% tags=["parameters"]
trace: str = "data/traces/cc_traces_weka_042026_sample"  # AgentX folder/file or Mooncake JSONL
curve_points: int = 25  # capacities on the hit-rate curves (log spaced)
min_capacity_tokens: float = 3e4  # smallest cache on the curves, tokens
max_capacity_tokens: float = 3e7  # largest cache on the curves, tokens
arch: str = "deepseek-r1"  # model whose KV sizes the tiers and the reload-vs-recompute study
hardware: str = "h200-sxm"  # chip of the per-tier study
tp: int = 8  # tensor parallel degree of one replica
replicas: int = 8  # replicas for the routing study
routing_capacity_tokens: float = 5e5  # per-replica HBM cache in the routing study
breakeven_chips: list = ["h200-sxm", "b200", "gb300-nvl72"]  # chips for reload vs recompute
breakeven_archs: list = ["deepseek-r1", "qwen3-30b-a3b", "llama-3.1-70b"]  # MLA, small-active MoE, dense GQA
seed: int = 0  # random routing seed
output_dir: str = "."  # where figures and headline.json go

# %% [markdown]
# # Prefix-cache hit rate: capacity, policy, tiers, routing, reload vs recompute
#
# Agentic turns resend the whole conversation; almost all of it was seen one turn earlier.
# Whether that prefix is still cached, and where, decides prefill work and TTFT. This notebook
# replays the trace's `hash_ids` exactly (`model/serve/cache_replay.py`: one LRU stack-distance pass answers
# every capacity), compares the closed form (`model/serve/cache_model.py`, Che / TTL over the session
# model), splits hits over the HBM / host / NVMe tiers of a real deployment (`model/perf/memory.py`,
# `model/perf/tiers.py`), routes sessions over replicas (`model/serve/routing.py`), and asks when reloading
# a prefix beats recomputing it.

# %%
# ruff: noqa: E402, B018  (notebook: imports after the parameters cell, cells end in a display)
from pathlib import Path

import numpy as np
import pandas as pd

from model import ROOT
from model.frontends import charts, nbio
from model.perf import tiers
from model.perf.parallel import ParallelPlan
from model.serve import cache_model, routing
from model.serve import cache_replay as cache
from model.specs.architecture import load_architecture
from model.specs.errors import Infeasible
from model.specs.hardware import load_hardware

out = Path(output_dir)
stream = cache.stream_for(ROOT / trace if not Path(trace).is_absolute() else trace)
infinite = cache.replay(stream)
live = cache_model.effective_sessions(stream)
pd.Series({"sessions": len(stream.session_ids), "requests": stream.requests,
           "input_tokens": infinite.input_tokens, "infinite_hit_rate": infinite.hit_rate,
           "working_set_tokens": cache.working_set_tokens(stream),
           "live_sessions_token_weighted": live})

# %% [markdown]
# The infinite-cache hit is the workload's ceiling: for the AgentX sample it is exactly the
# `inf_cache_hit_tokens` definition of the derived request CSV (longest leading run of already
# seen 64-token blocks), 95.0%. Next: how much cache it takes to get there, per policy.

# %%
capacities = np.geomspace(min_capacity_tokens, max_capacity_tokens, curve_points)
sample = cache_model.sample_from_stream(stream)
rows = []
for policy in cache.POLICIES:
    for cap, h in zip(capacities, cache.hit_rate_curve(stream, capacities, policy), strict=True):
        rows.append({"capacity_tokens": cap, "hit_rate": h, "policy": policy, "method": "replay"})
for cap in capacities:
    for policy in ("lru", "second-hit"):
        rows.append({"capacity_tokens": cap, "policy": policy, "method": "closed form",
                     "hit_rate": cache_model.closed_form(sample, cap, live, policy).hit_rate})
curves = pd.DataFrame(rows)
replay_lru = curves[(curves.policy == "lru") & (curves.method == "replay")]
reach = replay_lru[replay_lru.hit_rate >= 0.9 * infinite.hit_rate]
fig = charts.line_chart(
    curves, "capacity_tokens", "hit_rate", "policy", strokedash="method", log_x=True,
    y_format=".0%", x_title="cache capacity (tokens of KV)", y_title="prefix-cache hit rate",
    title=(f"{charts.si(reach.capacity_tokens.min())} tokens of cache reach 90% of the "
           f"{infinite.hit_rate:.1%} ceiling (LRU)" if len(reach) else
           "Prefix-cache hit rate vs capacity"),
    subtitle=f"{Path(trace).name}: exact replay of every block vs the Che closed form "
             "(no closed form for interval)")
charts.save(fig, out / "hit_rate_vs_capacity")
fig

# %%
lru = curves[(curves.policy == "lru")]
gap = (lru[lru.method == "replay"].set_index("capacity_tokens")["hit_rate"]
       - lru[lru.method == "closed form"].set_index("capacity_tokens")["hit_rate"])
big = gap[gap.index >= 2 * np.median(sample.context_tokens)]
closed_form_error = {"mean_abs_above_two_contexts": float(big.abs().mean()) if len(big) else None,
                     "max_abs_above_two_contexts": float(big.abs().max()) if len(big) else None,
                     "mean_abs_all": float(gap.abs().mean())}
closed_form_error

# %% [markdown]
# Reading the curves: below about one session's context nothing survives a turn; the curve
# rises over a few sessions' worth of KV (the live sessions interleave) and flattens at the
# working set. The closed form follows the replay once the cache holds a couple of contexts;
# below that it is pessimistic because it spreads every live session's pressure evenly, while
# real sessions alternate bursts and long pauses. `second-hit` admits a block on its second
# sighting, so every turn also misses the previous turn's growth (about 2x the misses of LRU
# on append-only sessions); `interval` (checkpoints at prompt ends) equals LRU on append-only
# turns and only loses where subagents branch off a parent's prefix or the context is compacted.

# %% [markdown]
# ## Tiers: what the HBM pool keeps, what host memory and NVMe catch
#
# One replica of the model on the chip: the HBM KV pool left after weights, activations and
# runtime reserve (`memory.hbm_budget`), host DRAM and local NVMe per GPU (hardware spec), all
# converted to tokens of context. Tiers are inclusive (every block written through), each an LRU
# over the same stream.

# %%
model_arch = load_architecture(arch)
hw = load_hardware(hardware)
plan = ParallelPlan(tp=tp)
tier_tokens = tiers.tier_capacity_tokens(model_arch, hw, plan)
at_deployment = cache.replay(stream, {k: tier_tokens[k] for k in ("hbm", "host", "nvme")})
per_tier_rows = []
for cap in capacities:
    for label, spec in (("hbm only", {"hbm": cap}),
                        ("hbm + host", {"hbm": cap, "host": max(cap, tier_tokens["host"])}),
                        ("hbm + host + nvme", {"hbm": cap, "host": max(cap, tier_tokens["host"]),
                                               "nvme": max(cap, tier_tokens["nvme"])})):
        res = cache_model.hit_rate(stream, spec)
        per_tier_rows.append({"hbm_capacity_tokens": cap, "tiers": label, "hit_rate": res.hit_rate,
                              "hbm_hit_rate": res.hits_by_tier["hbm"]})
per_tier = pd.DataFrame(per_tier_rows)
smallest = per_tier[per_tier.hbm_capacity_tokens == per_tier.hbm_capacity_tokens.min()] \
    .set_index("tiers")["hit_rate"]
fig = charts.line_chart(
    per_tier, "hbm_capacity_tokens", "hit_rate", "tiers", strokedash="tiers", log_x=True,
    y_format=".0%", x_title="HBM KV pool (tokens)", y_title="prefix-cache hit rate",
    color_title="tiers",
    title=f"Host DRAM lifts the smallest HBM pool from {smallest['hbm only']:.0%} to "
          f"{smallest['hbm + host']:.0%} hits; NVMe adds "
          f"{smallest['hbm + host + nvme'] - smallest['hbm + host']:+.1%}",
    subtitle=f"{arch} TP{tp} on {hardware}: host DRAM holds {charts.si(tier_tokens['host'])} "
             f"tokens, NVMe {charts.si(tier_tokens['nvme'])}; the gap above 'hbm only' is "
             "served by the lower tiers")
charts.save(fig, out / "hit_rate_by_tier")
{"tier_tokens": tier_tokens, **at_deployment.hit_rate_by_tier}

# %% [markdown]
# ## Tool-call gaps: what moves down a tier, and prefetch
#
# Between turns a session waits on a tool or on its user. If other sessions evict its tail
# from HBM meanwhile, the next turn finds it in host memory (or on NVMe). Because the router
# knows the session will come back, the connector can start loading as soon as the turn ends:
# a load is hidden when it finishes within the gap before the next request.

# %%
per_token = tiers.kv_bytes_per_token_per_gpu(model_arch, plan)
link = tiers.tiers_for(hw)
pre = tiers.prefetch(at_deployment, stream, link, per_token)
no_pre = tiers.prefetch(at_deployment, stream, link, per_token, prefetch=False)
# closed-form view of the same: a prefix outlives a gap in a tier while the gap is shorter than
# that tier's characteristic time T (Che); longer gaps find it one tier down, or recompute
cf = cache_model.closed_form(sample, {k: tier_tokens[k] for k in ("hbm", "host", "nvme")}, live)
warm_gaps = sample.gap_s[~sample.first]
gap_split = {f"gaps_under_T_{k}": float(np.mean(warm_gaps < t))
             for k, t in cf.characteristic_time_s.items()}
gaps = {"characteristic_time_s": cf.characteristic_time_s, **gap_split,
        "lower_tier_tokens": pre.lower_tier_tokens, "requests_with_lower_hits":
        pre.requests_with_lower_hits, "prefetch_hidden_fraction": pre.hidden_fraction,
        "exposed_load_s_with_prefetch": pre.exposed_load_s,
        "exposed_load_s_without": no_pre.exposed_load_s,
        "kv_bytes_per_token_per_gpu": per_token}
gaps

# %% [markdown]
# ## Routing over replicas
#
# Sticky routing sends every turn of a session (and its subagents) to one replica. Random and
# least-loaded routing spread a session's turns: the replica a turn lands on holds that session's
# prefix only as of its last visit there, on average R turns earlier, so the turn misses the
# growth of the turns since; with a finite cache each replica also keeps copies of every
# session, which shrinks the effective capacity R-fold. A shared remote pool (Mooncake store)
# turns those misses into remote loads. The price of stickiness is load imbalance: a session
# cannot be split, so the busiest replica carries at least the largest session's tokens.

# %%
route_rows = []
for name in routing.ROUTINGS:
    for pool in (0.0, np.inf):
        r = routing.route_replay(stream, replicas, name, routing_capacity_tokens, pool,
                                 seed=seed)
        closed = cache_model.closed_form(sample, routing_capacity_tokens, live / replicas, "lru",
                                         replicas, name, pool)
        route_rows.append({"routing": name, "shared_pool": bool(pool), "hit_rate": r.hit_rate,
                           "closed_form_hit_rate": closed.hit_rate,
                           "local_hit_rate": r.hit_tokens_by_tier["local"] / r.input_tokens,
                           "imbalance": r.imbalance, "uncached_imbalance": r.uncached_imbalance})
routes = pd.DataFrame(route_rows)
sticky = routes[(routes.routing == "sticky") & ~routes.shared_pool].iloc[0]
rand = routes[(routes.routing == "random") & ~routes.shared_pool].iloc[0]
parts = routes.assign(config=routes.routing + np.where(routes.shared_pool, " + pool", ""),
                      local=routes.local_hit_rate, remote=routes.hit_rate - routes.local_hit_rate)
fig = charts.stacked_bar(parts[["config", "local", "remote"]].melt(
                             id_vars=["config"], value_vars=["local", "remote"],
                                    var_name="served_from", value_name="hit_rate"),
                         "config", "hit_rate", "served_from", x_title="routing", y_format=".0%",
                         y_title="prefix-cache hit rate", color_title="served from",
                         title=f"Sticky routing keeps {sticky.hit_rate:.0%} hits over "
                               f"{replicas} replicas; random gets {rand.hit_rate:.0%}",
                         subtitle=f"{routing_capacity_tokens:,.0f} tokens of HBM cache per "
                                  "replica; + pool: an unbounded shared remote store (Mooncake)")
charts.save(fig, out / "routing")
routes.round(4)

# %%
growth = (sample.uncached_tokens * ~sample.first).sum() / max((~sample.first).sum(), 1)
routing_margin = {"sticky_minus_random": float(sticky.hit_rate - rand.hit_rate),
                  "mean_growth_tokens_per_warm_turn": float(growth),
                  "sticky_imbalance": float(sticky.imbalance),
                  "random_imbalance": float(rand.imbalance)}
routing_margin

# %% [markdown]
# The margin: with R replicas a randomly routed turn finds its own prefix k turns stale with
# probability (1/R)(1-1/R)^(k-1), and misses those turns' growth; at finite capacity the copies
# crowd each other out. The closed form (`cache_model.closed_form` with `routing="random"`,
# column `closed_form_hit_rate`) carries the same argument; it over-predicts random routing by
# about 0.1 on this sample because growth is heavy-tailed and bursts of turns cluster on the
# same few sessions.

# %% [markdown]
# ## Reload vs recompute
#
# Reloading c tokens of KV from a tier costs `latency + c x bytes/token / link`; recomputing them
# is a chunked prefill (the step model), here its marginal cost on a busy engine. The
# break-even is the context from which reloading wins for good. The grid starts at one KV block
# (16 tokens): where reloading already wins there (`reload_wins_everywhere`), the per-transfer
# latency never pays for itself and there is no crossover to report, which is the common case
# for MoE models (a few recomputed tokens already touch many experts' weights). Real crossovers
# show where the link is slow relative to the prefill rate (NVMe, large-KV dense models).

# %%
be_rows = []
for name in breakeven_archs:
    a = load_architecture(name)
    for chip in breakeven_chips:
        h = load_hardware(chip)
        # the smallest TP whose weights leave a KV pool on this chip
        for size in (1, 2, 4, 8):
            try:
                b0 = tiers.break_even(a, h, ParallelPlan(tp=size), "host")
                p = ParallelPlan(tp=size)
                break
            except Infeasible:
                continue
        else:
            continue
        for tier in ("host", "nvme", "remote"):
            b = b0 if tier == "host" else tiers.break_even(a, h, p, tier)
            i = int(np.argmin(np.abs(b.contexts_tokens - 131072)))
            be_rows.append({"arch": name, "hardware": chip, "tier": tier, "plan": p.label(),
                            "reload_wins_above_tokens": b.reload_wins_above_tokens,
                            "reload_wins_everywhere": b.reload_wins_everywhere,
                            "crossovers_tokens": list(b.crossovers_tokens),
                            "speedup_at_128k": float(b.speedup[i])})
breakeven = pd.DataFrame(be_rows)
breakeven

# %%
nbio.write_headline(out, {
    "trace": trace,
    "infinite_hit_rate": infinite.hit_rate,
    "hit_tokens": infinite.hit_tokens,
    "input_tokens": infinite.input_tokens,
    "working_set_tokens": cache.working_set_tokens(stream),
    "curves": {p: dict(zip([float(c) for c in capacities],
                           curves[(curves.policy == p) & (curves.method == "replay")]["hit_rate"],
                           strict=True)) for p in cache.POLICIES},
    "closed_form_error": closed_form_error,
    "deployment": {"arch": arch, "hardware": hardware, "tp": tp, "tier_tokens": tier_tokens,
                   "hit_rate_by_tier": at_deployment.hit_rate_by_tier},
    "prefetch": gaps,
    "routing": {"replicas": replicas, "capacity_tokens": routing_capacity_tokens,
                "rows": routes.to_dict(orient="records"), **routing_margin},
    "reload_vs_recompute": breakeven.to_dict(orient="records"),
})
