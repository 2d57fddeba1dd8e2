"""The screening search: every candidate deployment as rows of a frame, evaluated in one array
pass per mode by the screening tier (model.plan.screening).

Aggregated: every (plan, threshold, interval, concurrency) of replicas filling the GPU budget;
disaggregated: stage 1 saturation of every prefill-only and decode-only plan, then every xPyD
ratio of every plan pair that fills the budget, at each concurrency. Each (plan, knobs) gets a few
more concurrencies at its SLO edge (`slo_edge_concurrencies`). The prefix cache answers to each
plan's tier capacities and the policy (model.plan.search_cache). The frame's `_model` /
`_decode_model` columns hold the `PlanModel` behind each row.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from model.perf.step_table import StepTable
from model.plan.deployment import DeploymentShape
from model.plan.disagg import DECODE_BATCHES, xpyd_grid
from model.plan.inputs import PlanInputs
from model.plan.plan_models import (
    PlanModel,
    host_reload_s_per_token,
    plan_models,
    prefill_step_s,
    step_table,
)
from model.plan.screening import meets_slo, screen_aggregated, screen_disaggregated
from model.plan.search_cache import (
    CacheSetup,
    reload_s_per_token,
    replica_capacities,
    tier_hits_interp,
)
from model.plan.traffic import Traffic
from model.specs.defaults import MAX_NUM_BATCHED_TOKENS, MAX_NUM_SEQS
from model.specs.errors import ServecastError
from model.specs.recipes import SPEC_OFF

# rows one screening frame may hold (about 1 KB each with its columns and models): past this the
# search refuses, naming how to narrow it, rather than grow until the machine kills it
MAX_SCREENED_ROWS = 2_000_000


def _cache_terms(pm: PlanModel, arch, hw, kv_dtype, workload, sessions, cache: CacheSetup):
    """(recomputed miss tokens, lower-tier tokens) per request and the lower tier's reload time
    per token, for `sessions` live sessions per replica of plan `pm` (model.plan.search_cache)."""
    caps = replica_capacities(arch, hw, pm.plan, kv_dtype, cache.tiers, pm.context_tokens,
                              pm.step.cpu_offload_gib)
    hbm, low, inf = tier_hits_interp(workload, caps, sessions, cache.policy)
    ctx = pm.context_tokens
    lower = cache.tiers[1] if len(cache.tiers) > 1 else "host"
    return (np.maximum(inf - hbm - low, 0.0) * ctx, low * ctx, hbm + low,
            reload_s_per_token(arch, hw, pm.plan, kv_dtype, lower))


def search_aggregated(models: list[PlanModel], hw, traffic: Traffic, gpus: int, concurrency,
                      thresholds, intervals, kv_bytes_per_token: float,
                      max_num_batched_tokens: int = MAX_NUM_BATCHED_TOKENS, cache_inputs=None,
                      slo_p90_interactivity: float | None = None, refine: int = 8,
                      slo_p90_ttft_s: float | None = None) -> pd.DataFrame:
    """Every (plan, threshold, interval, concurrency) of aggregated replicas, in one array pass.
    `cache_inputs` = (arch, kv_dtype, workload, CacheSetup): hit rates answer to each plan's tier
    capacities and the policy (model.plan.search_cache); None keeps the infinite-cache hit rate.
    With an SLO, each (plan, knobs) gets `refine` more concurrencies at its SLO edge
    (`slo_edge_concurrencies`)."""
    usable = [pm for pm in models if gpus % pm.plan.gpus == 0]
    if not usable:
        return pd.DataFrame()
    table = StepTable.stack([step_table(pm) for pm in usable])
    rows = []  # (model index, threshold, interval)
    for k, pm in enumerate(usable):
        for thr in thresholds:
            for interval in intervals:
                if interval > 1 and pm.plan.dp == 1 and 1 in intervals:
                    continue  # searched, the interval only aligns prefill across DP ranks
                rows.append((k, thr, interval))
    combo = np.array(rows, float)
    conc = np.sort(np.asarray(concurrency, float))
    which = np.repeat(np.arange(len(combo)), len(conc))
    args = (usable, table, hw, traffic, gpus, kv_bytes_per_token, max_num_batched_tokens,
            cache_inputs)
    frame = _aggregated_frame(*args, combo[which], np.tile(conc, len(combo)))
    if slo_p90_interactivity is None:
        return frame
    idx, fine = slo_edge_concurrencies(conc, meets_slo(frame, slo_p90_interactivity,
                                                       slo_p90_ttft_s).to_numpy(),
                                       refine)
    if not len(idx):
        return frame
    return pd.concat([frame, _aggregated_frame(*args, combo[idx], fine)], ignore_index=True)


def slo_edge_concurrencies(conc: np.ndarray, ok: np.ndarray, refine: int
                           ) -> tuple[np.ndarray, np.ndarray]:
    """`ok` is flat over (combo, sorted concurrency `conc`): for each combo whose last grid point
    meeting the SLO is not the grid's last, `refine` integer concurrencies between it and the next
    one. TPGS at the SLO is set by that edge, and a coarse grid would rank combos by where the
    grid happens to fall. Returns (combo index, concurrency) arrays."""
    empty = np.array([], int), np.array([], float)
    if refine <= 0 or len(conc) < 2:
        return empty
    ok = ok.reshape(-1, len(conc))
    edge = np.where(ok.any(axis=1), len(conc) - 1 - np.argmax(ok[:, ::-1], axis=1), -1)
    sel = (edge >= 0) & (edge < len(conc) - 1)
    if not sel.any():
        return empty
    lo, hi = conc[edge[sel]], conc[edge[sel] + 1]
    steps = np.arange(1, refine + 1) / (refine + 1)
    fine = np.round(lo[:, None] + (hi - lo)[:, None] * steps[None, :])
    keep = (fine > lo[:, None]) & (fine < hi[:, None])
    return np.repeat(np.flatnonzero(sel), refine)[keep.ravel()], fine.ravel()[keep.ravel()]


def _aggregated_frame(usable, table, hw, traffic: Traffic, gpus: int, kv_bytes_per_token: float,
                      max_num_batched_tokens: int, cache_inputs, combos: np.ndarray,
                      c: np.ndarray) -> pd.DataFrame:
    """Candidates for explicit rows: combos (model index, threshold, interval) x concurrency."""
    k = combos[:, 0].astype(int)
    thr, interval = combos[:, 1], combos[:, 2]
    attr = lambda f: np.array([f(pm) for pm in usable], float)[k]  # noqa: E731
    replicas = attr(lambda pm: gpus // pm.plan.gpus)
    miss, lower, hit = 0.0, None, np.full(len(c), traffic.hit_rate)
    if cache_inputs is None:
        reload = attr(lambda pm: host_reload_s_per_token(hw, kv_bytes_per_token, pm.plan))
    else:
        arch, kv_dtype, workload, setup = cache_inputs
        miss, lower, reload = np.zeros(len(c)), np.zeros(len(c)), np.zeros(len(c))
        for i, pm in enumerate(usable):
            sel = k == i
            if not sel.any():
                continue
            m, lo, h, rl = _cache_terms(pm, arch, hw, kv_dtype, workload,
                                        c[sel] / replicas[sel], setup)
            miss[sel], lower[sel], hit[sel], reload[sel] = m, lo, h, rl
    r = screen_aggregated(table, traffic, k, attr(lambda pm: pm.plan.dp),
                            attr(lambda pm: pm.plan.pp), replicas, c, thr, interval,
                            attr(lambda pm: pm.kv_tokens), attr(lambda pm: pm.tokens_per_step),
                            np.where(np.isfinite(reload), reload, 0.0), max_num_batched_tokens,
                            miss_tokens=miss, lower_tier_tokens=lower)
    labels = _text(np.array([pm.plan.label() for pm in usable], object)[k])
    models = np.array(usable, object)[k]
    return pd.DataFrame({
        "mode": _text(np.full(len(c), "aggregated", object)), "plan": labels,
        "decode_plan": labels,
        "replicas": replicas.astype(int), "x": 0, "y": replicas.astype(int),
        "concurrency": c.astype(int), "threshold": thr.astype(int),
        "interval": interval.astype(int), "gpus": gpus,
        "tpgs": r["tokens_per_s"] / gpus, "hit_rate": hit,
        **{key: r[key] for key in ("p90_interactivity_tok_s", "p90_ttft_s", "mean_ttft_s",
                                   "decode_batch", "step_time_s", "rate_rps", "feasible")},
        "limit": _text(r["limit"]), "_model": models})


def _text(values) -> pd.Series:
    """A label column kept as Python strings (object dtype): pandas' default Arrow strings cost
    more to build, filter and concatenate than the search's numbers over 100K+ candidates."""
    return pd.Series(np.asarray(values, object), dtype=object, copy=False)


def search_disaggregated(prefill_models, decode_models, traffic: Traffic, gpus: int,
                         kv_bytes_per_token: float, link_bytes_per_s: float, chunk: int,
                         slo_p90_interactivity: float, concurrency, cache_inputs=None,
                         prefill_hw=None,
                         max_num_seqs: int = MAX_NUM_SEQS, refine: int = 8,
                         slo_p90_ttft_s: float | None = None
                         ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Stage 1: saturation of every prefill-only and decode-only plan. Stage 2: every xPyD ratio
    of every plan pair that fills the budget, at each client concurrency (closed loop,
    `screen_disaggregated`), refined at each combo's SLO edge as in the aggregated search.
    `cache_inputs` = (arch, kv_dtype, workload, CacheSetup): the prefix cache lives on the
    prefill workers (sticky sessions), each holding concurrency / x sessions; evicted prefixes
    are recomputed and lower-tier hits reloaded before the prefill."""
    sat_rows = []
    if not prefill_models or not decode_models:
        return pd.DataFrame(), pd.DataFrame(columns=["phase", "plan", "hardware", "gpus",
                                                     "max_rps", "max_rps_per_gpu",
                                                     "at_interactivity_tok_s"])
    t_p = np.array([prefill_step_s(pm, chunk * pm.plan.dp) for pm in prefill_models])
    chunk_p = np.array([chunk * pm.plan.dp for pm in prefill_models], float)
    lam_p = chunk_p / t_p / traffic.mean_uncached_tokens
    for pm, lam in zip(prefill_models, lam_p, strict=True):
        sat_rows.append({"phase": "prefill", "plan": pm.plan.label(), "hardware": pm.hardware,
                         "gpus": pm.plan.gpus, "max_rps": lam, "max_rps_per_gpu": lam / pm.plan.gpus,
                         "at_interactivity_tok_s": np.nan})
    batches = np.array([DECODE_BATCHES * pm.plan.dp for pm in decode_models])
    # decode-only workers run slower than the same batch in an aggregated engine
    # (EngineFactors.disagg_decode_scale, fitted on the recorded disaggregated runs)
    d_scale = np.array([pm.step.factors.disagg_decode_scale for pm in decode_models])
    # a pp-stage decode worker passes its batch as pp microbatches (model.perf.microbatch)
    steps = np.array([step_table(pm)(0.0, b / pm.plan.pp)
                      for pm, b in zip(decode_models, batches, strict=True)])
    steps = steps * d_scale[:, None]
    tps = np.array([pm.tokens_per_step for pm in decode_models])
    kv_batch = np.array([pm.kv_tokens / traffic.mean_context_tokens for pm in decode_models])
    b_cap = np.minimum(kv_batch, np.array([max_num_seqs * pm.plan.dp for pm in decode_models]))
    rate = batches * tps[:, None] / (traffic.mean_output_tokens * steps)
    inter = tps[:, None] / steps
    ok = (inter >= slo_p90_interactivity) & (batches <= b_cap[:, None])
    best = np.argmax(np.where(ok, rate, -1.0), axis=1)
    for k, pm in enumerate(decode_models):
        i, good = best[k], ok[k, best[k]]
        sat_rows.append({"phase": "decode", "plan": pm.plan.label(), "hardware": pm.hardware,
                         "gpus": pm.plan.gpus, "max_rps": rate[k, i] if good else 0.0,
                         "max_rps_per_gpu": (rate[k, i] if good else 0.0) / pm.plan.gpus,
                         "at_interactivity_tok_s": inter[k, i] if good else np.nan})
    # combos: (prefill plan, decode plan, x, y) filling the whole budget (idle GPUs serve nothing)
    p_size = np.array([pm.plan.gpus for pm in prefill_models])
    d_size = np.array([pm.plan.gpus for pm in decode_models])
    parts = []
    for gp in np.unique(p_size):
        for gd in np.unique(d_size):
            xs, ys = xpyd_grid(int(gp), int(gd), gpus, exact=True)
            if len(xs):
                pi, di, ri = np.meshgrid(np.flatnonzero(p_size == gp), np.flatnonzero(d_size == gd),
                                         np.arange(len(xs)), indexing="ij")
                parts.append(np.stack([pi.ravel(), di.ravel(), xs[ri.ravel()], ys[ri.ravel()]], 1))
    if not parts:
        return pd.DataFrame(), pd.DataFrame(sat_rows)
    combo = np.concatenate(parts)
    conc = np.sort(np.asarray(concurrency, float))
    if len(combo) * len(conc) > MAX_SCREENED_ROWS:
        raise ServecastError(
            f"plan: {gpus} GPUs give {len(combo) * len(conc):,} disaggregated candidates to "
            f"screen, over the search's cap of {MAX_SCREENED_ROWS:,}; narrow it (--mode "
            f"aggregated, --deployment LABEL, --concurrency N) or plan fewer GPUs and replicate")
    args = (combo, prefill_models, decode_models,
            StepTable.stack([step_table(pm) for pm in decode_models], d_scale),
            t_p, chunk_p, b_cap, tps, traffic, kv_bytes_per_token, link_bytes_per_s,
            cache_inputs, prefill_hw)
    frame = _disaggregated_frame(*args, np.repeat(np.arange(len(combo)), len(conc)),
                                 np.tile(conc, len(combo)))
    idx, fine = slo_edge_concurrencies(conc, meets_slo(frame, slo_p90_interactivity,
                                                       slo_p90_ttft_s).to_numpy(), refine)
    if len(idx):
        frame = pd.concat([frame, _disaggregated_frame(*args, idx, fine)], ignore_index=True)
    return frame, pd.DataFrame(sat_rows)


def _disaggregated_frame(combo, prefill_models, decode_models, table: StepTable, t_p, chunk_p,
                         b_cap, tps, traffic: Traffic, kv_bytes_per_token: float,
                         link_bytes_per_s: float, cache_inputs, prefill_hw, rows: np.ndarray,
                         c: np.ndarray) -> pd.DataFrame:
    """Candidates for explicit rows: combos (prefill plan, decode plan, x, y) x concurrency;
    `table` stacks the decode plans' step tables."""
    pi, di, x, y = (combo[rows, j] for j in range(4))
    miss, lower_s, hit = np.zeros(len(c)), np.zeros(len(c)), np.full(len(c), traffic.hit_rate)
    if cache_inputs is not None:
        arch, kv_dtype, workload, setup = cache_inputs
        for j in np.unique(pi):
            sel = pi == j
            m, lo, h, rl = _cache_terms(prefill_models[j], arch, prefill_hw, kv_dtype, workload,
                                        c[sel] / x[sel], setup)
            miss[sel], lower_s[sel], hit[sel] = m, lo * rl, h
    p_gpus = np.array([pm.plan.gpus for pm in prefill_models], float)
    senders = np.array([pm.plan.attention_gpus for pm in prefill_models], float)
    d_gpus = np.array([pm.plan.gpus for pm in decode_models], float)
    d_pp = np.array([pm.plan.pp for pm in decode_models], float)
    r = screen_disaggregated(t_p[pi], p_gpus[pi], senders[pi], table, di, d_gpus[di],
                             b_cap[di], x, y, c, traffic, chunk_p[pi], kv_bytes_per_token,
                             link_bytes_per_s, tps[di], miss, lower_s, d_pp[di])
    p_labels = np.array([pm.plan.label() for pm in prefill_models], object)
    d_labels = np.array([pm.plan.label() for pm in decode_models], object)
    p_ids = np.array(prefill_models, object)
    d_ids = np.array(decode_models, object)
    r["limit"] = _text(r["limit"])
    out = pd.DataFrame({"mode": _text(np.full(len(c), "disaggregated", object)),
                        "plan": _text(p_labels[pi]), "decode_plan": _text(d_labels[di]),
                        "replicas": 0, "threshold": 0, "interval": 1, **r, "hit_rate": hit,
                        "_model": p_ids[pi], "_decode_model": d_ids[di]})
    out["concurrency"] = np.round(out["concurrency"]).astype(int)
    return out


# ---------------------------------------------------------------- one plan's screening

def screen_candidates(inputs: PlanInputs, gpus: int, modes, concurrency, thresholds, intervals,
                      slo_p90_interactivity: float, slo_p90_ttft_s: float | None = None,
                      shape: DeploymentShape | None = None
                      ) -> tuple[pd.DataFrame, pd.DataFrame, str]:
    """(every candidate of `modes` on `gpus` GPUs, the stage-1 saturation table, the last reason
    a plan was left out), screened; `shape` restricts them to one deployment's plans and
    worker counts."""
    frames, sat, rejected = [], pd.DataFrame(), ""
    ctx, chunk = inputs.traffic.mean_context_tokens, inputs.max_num_batched_tokens
    common = (inputs.precision, inputs.kv_dtype, chunk, gpus)
    offload = {"cpu_offload_gib": inputs.cpu_offload_gib,
               "attention_backend": inputs.attention_backend,
               "draft_attention_backend": inputs.draft_attention_backend}
    if "aggregated" in modes:
        # PCP replicates decode-side state, so it belongs to dedicated prefill workers (post)
        models, rejected = plan_models(inputs.arch, inputs.hardware, replica_sizes(gpus, True),
                                       ("decode",), ctx, *common, inputs.spec,
                                       None if shape is None else (shape.replica,), **offload)
        frames.append(search_aggregated(models, inputs.hardware, inputs.traffic, gpus,
                                        concurrency, thresholds, intervals,
                                        inputs.kv_bytes_per_token, chunk, inputs.cache_inputs,
                                        slo_p90_interactivity=slo_p90_interactivity,
                                        slo_p90_ttft_s=slo_p90_ttft_s))
    if "disaggregated" in modes and gpus >= 2:
        sizes = replica_sizes(gpus - 1, False)
        p_models, why_p = plan_models(inputs.arch, inputs.prefill_hardware, sizes, ("prefill",),
                                      ctx, *common, SPEC_OFF,
                                      None if shape is None else (shape.prefill,), **offload)
        d_models, why_d = plan_models(inputs.arch, inputs.hardware, sizes, ("decode",), ctx,
                                      *common, inputs.spec,
                                      None if shape is None else (shape.decode,), **offload)
        rejected = why_d or why_p or rejected
        link = min(float(inputs.prefill_hardware.scale_out_bandwidth_bytes_per_s),
                   float(inputs.hardware.scale_out_bandwidth_bytes_per_s))
        frame, sat = search_disaggregated(p_models, d_models, inputs.traffic, gpus,
                                          inputs.kv_bytes_per_token, link, chunk,
                                          slo_p90_interactivity,
                                          concurrency, inputs.cache_inputs,
                                          inputs.prefill_hardware,
                                          slo_p90_ttft_s=slo_p90_ttft_s)
        if shape is not None and not frame.empty:
            frame = frame[(frame["x"] == shape.prefill_workers)
                          & (frame["y"] == shape.decode_workers)].reset_index(drop=True)
        frames.append(frame)
    frames = [f for f in frames if not f.empty]
    if not frames:
        return pd.DataFrame(), sat, rejected
    cands = pd.concat(frames, ignore_index=True)
    cands["hit_rate"] = (cands["hit_rate"] if "hit_rate" in cands else pd.Series(
        np.nan, index=cands.index)).fillna(inputs.traffic.hit_rate)
    served = np.isfinite(cands["tpgs"]) & (cands["tpgs"] > 0)
    if not served.all():  # a full-frame copy costs 0.1 s at 170K candidates: only when needed
        cands = cands[served].reset_index(drop=True)
    return cands, sat, rejected


def replica_sizes(budget: int, divisors_only: bool) -> list[int]:
    """GPUs per replica (or worker) the search tries: the budget's divisors, and for
    disaggregated workers powers of two too."""
    if divisors_only:
        return [g for g in range(1, budget + 1) if budget % g == 0]
    pow2 = [2**i for i in range(0, 12) if 2**i <= budget]
    return sorted(set(pow2 + [g for g in range(1, budget + 1) if budget % g == 0]))

