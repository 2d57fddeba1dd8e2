"""The screening tier: thousands of candidate deployments in closed form, vectorized, to rank them
and keep the Pareto front of throughput (TPGS) vs P90 interactivity. The numbers `plan` reports
come from the full tier (model.plan.full_tier); this tier only shortlists.

Each candidate is a parallel plan per phase, an instance count (aggregated replicas, or x prefill
+ y decode workers), engine knobs and a client concurrency (closed-loop AgentX lanes). Per plan
the step model is evaluated once on a grid of batch compositions (`StepTable`); every candidate is
then a few numpy operations on that table (`make bench`: the default scenario's ~169K candidates
in about 1.9 s once the tables are built, on 2 cores).

Serving model of an aggregated replica (closed loop, papers/research/theory.md §6, §10, papers/research/workloads.md §1.5):
- `C` lanes per replica cycle through turns: queue + TTFT + O decode steps + think gap Z;
- in steady state a step carries `B = r*O*T` decodes and `r*U*T` prefill tokens on average
  (turn rate r, mean uncached tokens U, mean output O, mean step time T), solved by fixed point;
- prefill arrives in chunks of at most `long_prefill_token_threshold` tokens per request (else the
  whole remaining budget); per DP rank the chunks of a step are Poisson, and a DEP step waits for
  its slowest rank (papers/research/theory.md §4.3): this is how head-of-line blocking costs interactivity, and why
  the threshold and `prefill_schedule_interval` help;
- request rate is capped by the step token budget (prefill-bound) and by KV capacity for the
  decoding batch; sessions not resident in HBM reload their KV from the host tier (offload);
- P90 interactivity = decode tokens per step / (mean step + z90 * sd of the step mean over the
  shortest decodes); P90 TTFT = the P90 request's prefill steps (+ reload) + queueing.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy.optimize.elementwise import find_root

from model.perf.step_table import StepTable
from model.plan.disagg import prefill_saturation_rps
from model.plan.traffic import Traffic
from model.serve.handoff import kv_transfer_time_s
from model.serve.mean_waits import pk_wait_s
from model.specs.defaults import MAX_NUM_BATCHED_TOKENS, MAX_NUM_SEQS
from model.specs.errors import Infeasible, ServecastError

Z90 = 1.2816  # standard normal 90th percentile
ROOT_LOG_TOL = 1e-8  # decode batch's root in log b: 1e-8 relative (30 bisections reached 1.3e-8)
POISSON_MAX = 16  # chunks per rank per step considered (tail mass folded into the last bin)


def _poisson_pmf(lam, nmax: int = POISSON_MAX) -> np.ndarray:
    """pmf of Poisson(lam) on 0..nmax (last bin holds the tail), shape lam.shape + (nmax+1,)."""
    lam = np.maximum(np.asarray(lam, float)[..., None], 0.0)
    # e^-lam lam^n / n! as a running product: no exp or log per bin
    ratios = np.concatenate([np.exp(-lam), lam / np.arange(1, nmax + 1)], -1)
    pmf = np.cumprod(ratios, -1)
    pmf[..., -1] += np.clip(1.0 - pmf.sum(-1), 0, 1)
    return pmf


def _max_of_ranks(pmf: np.ndarray, ranks) -> np.ndarray:
    """pmf of the max over `ranks` iid draws (lockstep DP ranks wait for the slowest)."""
    cdf = np.cumsum(pmf, -1).clip(0, 1)
    with np.errstate(divide="ignore"):  # exp(k log F), about 1.4x faster than F ** k
        cdf_max = np.exp(np.asarray(ranks, float)[..., None] * np.log(cdf))
    return np.diff(cdf_max, prepend=0.0, axis=-1)


# ---------------------------------------------------------------- aggregated replicas

def screen_aggregated(table: StepTable, traffic: Traffic, which, dp, pp, replicas,
                      concurrency, threshold_tokens, interval_steps, kv_capacity_tokens,
                      tokens_per_step=1.0, reload_s_per_token=0.0,
                      max_num_batched_tokens: int = MAX_NUM_BATCHED_TOKENS,
                      max_num_seqs: int = MAX_NUM_SEQS, iterations: int = 13,
                      mixture_iterations: int = 7, miss_tokens=0.0,
                      lower_tier_tokens=None) -> dict:
    """Closed-form steady state of aggregated candidates, all broadcastable arrays: `which`
    plan in the (stacked) table, its `dp` / `pp`, `replicas`, client `concurrency` (whole
    deployment), `threshold_tokens` (0 = off), `interval_steps` (prefill_schedule_interval),
    the replica's `kv_capacity_tokens`, decode `tokens_per_step` and `reload_s_per_token`.
    Finite cache (model.plan.search_cache): `miss_tokens` per request are recomputed,
    `lower_tier_tokens` reloaded (None: sessions whose KV does not fit the pool reload it all).
    Returns arrays: rate_rps (per replica), tokens_per_s (deployment), p90_interactivity_tok_s,
    p90_ttft_s, mean_ttft_s, decode_batch, step_time_s, limit (what binds) and feasible."""
    arrays = np.broadcast_arrays(*(np.asarray(a, float) for a in (
        which, dp, pp, replicas, concurrency, threshold_tokens, interval_steps, kv_capacity_tokens,
        tokens_per_step, reload_s_per_token, miss_tokens)))
    which, dp, pp, replicas, conc, thr, interval, kv_cap, tps, reload_tok, miss = arrays
    which = which.astype(int)
    lanes = conc * traffic.lanes_per_session  # request chains (subagents beside the parent)
    c_r = lanes / replicas
    budget = float(max_num_batched_tokens)  # per DP rank per (micro)step
    cap = np.where(thr > 0, np.minimum(thr, budget), budget)
    # evicted prefixes are recomputed: they lengthen the request's prefill (more chunks)
    chunks_mean = traffic.chunks(cap) + miss / cap
    u_p90 = traffic.p90_uncached_tokens + miss
    u, o, s = (traffic.mean_uncached_tokens + miss, traffic.mean_output_tokens,
               traffic.mean_context_tokens)
    k_eff = u / chunks_mean
    o_step = o / tps  # decode steps per turn
    b_kv = kv_cap / max(s, 1.0)  # decoding sequences whose KV fits
    if lower_tier_tokens is None:
        resident = np.minimum(1.0, kv_cap / np.maximum(conc / replicas * s, 1.0))
        reload = (1.0 - resident) * s * reload_tok  # offloaded sessions fetch their KV back
    else:
        reload = np.asarray(lower_tier_tokens, float) * reload_tok

    t = table.decode(np.maximum(c_r / 4, 1.0), which)
    t_chunk = t_quiet = t
    t_prev = g_prev = None
    idle_gap = traffic.idle_gap(lanes)
    for it in range(iterations):
        ttft0 = _ttft(chunks_mean, t_chunk, t_quiet, pp, interval) + reload
        z = idle_gap(ttft0 + o_step * t)
        cycle = ttft0 + o_step * t + z
        r_lanes = c_r / cycle
        # budget: per (micro)step each rank takes <= budget tokens of decodes + prefill
        r_budget = budget * dp * pp / (t * (u * interval + o_step))
        r_kv = b_kv / (o_step * t)
        r = np.minimum(np.minimum(r_lanes, r_budget), r_kv)
        b_mb = r * o_step * t / pp  # decodes per microbatch (per step when pp == 1)
        # prefill tokens per step over all ranks (mean), and a step carrying one of this
        # request's chunks: its rank is the busiest, the other ranks bring their mean share
        p_step = r * u * t / pp
        t_chunk = np.maximum(table.busiest(k_eff, k_eff + p_step * (1 - 1 / dp), b_mb, dp,
                                           which), t)
        if it < iterations - mixture_iterations:  # mean field first: cheap, gets close
            t = 0.5 * t + 0.5 * table(p_step, b_mb, which)
            t_quiet = table.decode(b_mb, which)
            continue
        t_quiet = table.decode(b_mb, which)
        lam = r * u * t * interval / (pp * dp * k_eff)  # chunks per rank per admitting step
        t_new, second = _cadence_steps(table, which, lam, k_eff, b_mb, dp, pp, budget,
                                       interval, t_quiet)
        t, t_prev, g_prev = _secant_step(t, t_new, t_prev, g_prev), t, t_new
    var = np.maximum(second - t_new**2, 0.0)
    tpot_p90 = t + Z90 * np.sqrt(var / np.maximum(traffic.p10_output_tokens / tps, 1.0)) \
        + _tagged_shift(table, b_mb, c_r / pp, which, t_quiet)
    limit = np.where(r >= r_lanes * (1 - 1e-6), "lanes",
                     np.where(r_kv <= r_budget, "kv_capacity", "prefill_budget"))
    queue = np.maximum(c_r / r - (ttft0 + o_step * t + z), 0.0)
    wait, own_p90 = _p90_prefill(table, traffic, which, cap, miss, thr, u_p90, r, dp, pp, b_mb,
                                 p_step, t, t_chunk, t_quiet, interval)
    ttft_p90 = own_p90 + reload + queue
    b_total = r * o_step * t
    feasible = (b_total / dp <= max_num_seqs * (1 + 1e-9)) & (b_kv >= 1.0)
    return {"rate_rps": r, "tokens_per_s": r * replicas * (s + o),
            "p90_interactivity_tok_s": tps / tpot_p90, "p90_ttft_s": ttft_p90,
            "mean_ttft_s": ttft0 + queue + wait, "decode_batch": b_total, "step_time_s": t,
            "limit": limit, "feasible": feasible}


def _p90_prefill(table: StepTable, traffic: Traffic, which, cap, miss, thr, u_p90, r, dp, pp,
                 b_mb, p_step, t, t_chunk, t_quiet, interval):
    """(mean FCFS wait, P90 TTFT before reload and queue): with the threshold off the FCFS
    mixture of `_fcfs_prefill`, with one the P90 prompt's own chunks, each in a step of its
    rank's busiest share."""
    c90 = np.minimum(cap, u_p90)
    t_chunk_p90 = np.maximum(table.busiest(c90, c90 + p_step * (1 - 1 / dp), b_mb, dp, which),
                             t)
    wait, fcfs_p90 = _fcfs_prefill(traffic, cap, miss, thr, r / dp, t_chunk, t_chunk_p90,
                                   t_quiet, pp, interval)
    return wait, np.where(np.asarray(thr) <= 0, fcfs_p90,
                          _ttft(np.ceil(u_p90 / cap), t_chunk_p90, t_quiet, pp, interval))


def _cadence_steps(table: StepTable, which, lam, k_eff, b_mb, dp, pp, budget: float, interval,
                   t_quiet):
    """(mean step, mean squared step) over a cadence of `interval` steps of which one admits
    prefill: `lam` chunks of `k_eff` tokens per rank arrive Poisson per admitting step, and the
    step waits for the busiest of the dp lock-stepped ranks, and with pp stages for the slowest
    of the pp microbatches in flight: a sequence's next token needs its own microbatch's full
    pass, so the pipeline's period is the longest pass (a flow shop with proportional stage
    times), and a prefill chunk in one microbatch stalls them all; the other steps decode
    (`t_quiet`)."""
    n = np.arange(POISSON_MAX + 1)
    pmf = _max_of_ranks(_poisson_pmf(lam), dp * pp)
    x = np.minimum(n * k_eff[..., None], np.maximum(budget - b_mb[..., None] / dp[..., None],
                                                    0.0))
    # the busiest rank holds x; the others their mean (the total the experts see)
    total = x + (lam * k_eff * (dp - 1.0))[..., None]
    t_steps = table.busiest(x, np.maximum(total, x), b_mb[..., None], dp[..., None],
                            which[..., None])
    mean_adm = (pmf * t_steps).sum(-1)
    second = (pmf * t_steps**2).sum(-1)
    return (mean_adm / interval + t_quiet * (1 - 1 / interval),
            second / interval + t_quiet**2 * (1 - 1 / interval))


def _fcfs_prefill(traffic: Traffic, cap, miss, thr, rate_per_rank, t_chunk, t_chunk_p90,
                  t_quiet, pp, interval):
    """(mean wait, P90 TTFT before reload and queue) of a prompt on its DP rank with the
    threshold off (FCFS: one prompt holds the budget until its last chunk; papers/research/theory.md §1.1
    head-of-line blocking). M/G/1 on the rank's prefill server, service = the prompt's chunks
    at t_chunk / pp each plus interval - 1 decode steps between them: Pollaczek-Khinchine mean
    wait; the P90 from `Traffic.fcfs_p90_chunks` at full-chunk times (the prompts that set it
    are the cold ones). With a threshold prompts share the budget instead: no wait."""
    per_chunk = t_chunk / pp + (interval - 1.0) * t_quiet
    extra = miss / cap  # recomputed misses lengthen every prompt's prefill by this many chunks
    base = traffic.chunks(cap)
    c1 = base + extra
    c2 = traffic.chunks_squared(cap) + 2.0 * base * extra + extra**2
    rho = np.minimum(rate_per_rank * c1 * per_chunk, 0.99)
    wait = pk_wait_s(rate_per_rank, c1 * per_chunk, c2 * per_chunk**2, 0.99)
    fcfs = np.broadcast_to(np.asarray(thr) <= 0, np.shape(wait))
    steps = np.zeros(np.shape(wait))
    if fcfs.any():
        cap_, rho_, extra_ = (np.broadcast_to(a, fcfs.shape)[fcfs] for a in (cap, rho, extra))
        steps[fcfs] = traffic.fcfs_p90_chunks(cap_, rho_, extra_)
    p90 = steps * (t_chunk_p90 / pp + (interval - 1.0) * t_quiet) + (pp - 1.0) * t_chunk_p90 / pp
    return np.where(fcfs, wait, 0.0), p90


def _secant_step(t, t_new, t_prev, g_prev):
    """Next iterate of the step-time fixed point t = G(t): a secant step t + (G(t) - t) / (1 - G')
    with the slope G' from the last two iterates, clipped to [-0.5, 0.9] so it never jumps past
    a contraction; plain G(t) on the first step. Damped iteration converged too slowly here
    (8 mixture steps left P90 interactivity up to 23% off its fixed point); 7 secant steps
    reach it within 0.02% (rates 0.06%, P90 TTFT 1%) on the default scenario's candidates."""
    if t_prev is None:
        return t_new
    dt = t - t_prev
    moved = np.abs(dt) > 1e-15
    slope = np.clip(np.where(moved, (t_new - g_prev) / np.where(moved, dt, 1.0), 0.0), -0.5, 0.9)
    return (t_new - slope * t) / (1.0 - slope)


def _ttft(chunks, t_chunk, t_quiet, pp, interval):
    """Prefill latency of a request needing `chunks` steps: with pp stages its chunks pipeline,
    (chunks + pp - 1) stage times (papers/research/theory.md §4.4); with prefill_schedule_interval N each chunk
    waits N - 1 decode-only steps."""
    return (chunks + pp - 1) * t_chunk / pp + chunks * (interval - 1) * t_quiet


# ---------------------------------------------------------------- disaggregated

def screen_disaggregated(prefill_step_s, prefill_gpus, prefill_senders, decode_table: StepTable,
                           which, decode_gpus, decode_seqs_cap, x, y, concurrency,
                           traffic: Traffic, chunk_tokens, kv_bytes_per_token: float,
                           link_bytes_per_s: float, tokens_per_step=1.0, miss_tokens=0.0,
                           lower_tier_s=0.0, decode_pp=1.0) -> dict:
    """Closed loop of `concurrency` lanes over x prefill and y decode instances, all arguments
    broadcastable arrays (one entry per candidate); returns flattened arrays.

    A lane's cycle: M/D/1 wait in the prefill pool (at its load), the prefill of U uncached tokens
    at the prefill instance's rate chunk / T_P (`prefill_step_s` is its `chunk_tokens` step), the
    KV hand-off, O / q decode steps of T_D(b), the think gap. With b the mean decoding sequences
    per decode instance (`decode_table.decode(b, which)` gives T_D, no prefill interference) the
    system serves r(b) = y b q / (O T_D(b)) requests/s and holds N(b) = r(b) * cycle(b) lanes
    (Little's law); N rises with b, so a bracketed root finder on log b (`_decode_batch_root`)
    finds the b that carries the given lanes. b stops at `decode_seqs_cap` (KV pool,
    max_num_seqs): lanes beyond it wait for a decode slot, and a prefill pool near saturation
    absorbs them in its M/D/1 wait.
    Finite cache: `miss_tokens` per request are recomputed (prefill work), `lower_tier_s` per
    request reloads lower-tier hits before the prefill. A decode plan with `decode_pp` stages
    keeps that many microbatches in flight: its step is the pass of b / pp sequences
    (model.perf.microbatch)."""
    args = np.broadcast_arrays(*(np.asarray(a, float) for a in (
        prefill_step_s, prefill_gpus, prefill_senders, which, decode_gpus, decode_seqs_cap, x, y,
        concurrency, chunk_tokens, tokens_per_step, miss_tokens, lower_tier_s, decode_pp)))
    t_p, g_p, senders, which, g_d, b_cap, x, y, conc, chunk, tps, miss, lower, pp = (
        np.atleast_1d(a) for a in args)  # candidates are indexed (the root finder's subsets)
    which = which.astype(int)
    sessions, conc = conc, conc * traffic.lanes_per_session  # conc: request chains
    # b: decoding sequences per microbatch lane, y * pp lanes of at most b_cap / pp each
    y_mb, cap_mb = y * pp, b_cap / pp
    u, o, s = (traffic.mean_uncached_tokens + miss, traffic.mean_output_tokens,
               traffic.mean_context_tokens)
    thr_p = chunk / t_p  # prefill tokens/s per instance
    lam_p = prefill_saturation_rps(t_p, chunk, u)
    service = u / thr_p
    # service U / thr_p varies with the prompt: second moment over the request mix (cap 1 token)
    u_sq = traffic.chunks_squared(1.0) + 2.0 * traffic.mean_uncached_tokens * miss + miss**2
    hand_mean = kv_transfer_time_s(u, kv_bytes_per_token, link_bytes_per_s, senders)
    fixed = service + hand_mean + lower  # active time outside the queue and the decode
    idle_gap = traffic.idle_gap(conc)
    service_sq = np.broadcast_to(u_sq / thr_p**2, conc.shape)

    def state(b, idx=slice(None)):
        """(decode step, request rate, prefill wait, lanes held) at b decoding sequences per
        decode instance; `idx` selects candidates (the root finder's still-active ones)."""
        step = decode_table.decode(b, which[idx])
        r = y_mb[idx] * b * tps[idx] / (o * step)
        wait = pk_wait_s(r / x[idx], service[idx], service_sq[idx])
        active = fixed[idx] + wait + o / tps[idx] * step
        return step, r, wait, r * (active + idle_gap(active, idx))

    top = np.maximum(cap_mb, 1e-3)  # the decode cap, evaluated once
    cap_step, _, _, cap_held = state(top)
    at_cap = cap_held <= conc
    b = np.where(at_cap, top, _decode_batch_root(state, decode_table.decode(0.0, which), top,
                                                  cap_step, fixed, o / tps, idle_gap, y_mb, conc))
    step, rate, wait, held = state(b)
    active = fixed + wait + o / tps * step
    queue = np.where(at_cap, np.maximum(conc / np.maximum(rate, 1e-300) - active
                                        - idle_gap(active), 0.0), 0.0)
    hand_p90 = kv_transfer_time_s(traffic.p90_uncached_tokens + miss, kv_bytes_per_token,
                                  link_bytes_per_s, senders)
    rho = rate / (x * lam_p)
    step_p90 = step + Z90 * _batch_step_sd(decode_table, which, b, conc / y_mb, at_cap, traffic, tps) \
        + np.where(at_cap, 0.0, _tagged_shift(decode_table, b, conc / y_mb, which, step))
    # own prefill + FCFS wait at the P90 (token-sized steps: cap 1)
    ttft_p90 = traffic.fcfs_p90_chunks(1.0, np.minimum(rho, 0.999), miss) / thr_p + hand_p90 \
        + lower + queue
    gpus = x * g_p + y * g_d
    limit = np.where(at_cap, "decode_rate", np.where(rho > 0.95, "prefill_rate", "lanes"))
    out = {"x": x.astype(int), "y": y.astype(int), "decode_batch": b * pp, "decode_batch_cap": b_cap,
           "tpgs": rate * (s + o) / gpus, "p90_interactivity_tok_s": tps / step_p90,
           "p90_ttft_s": ttft_p90, "mean_ttft_s": service + wait + hand_mean + lower + queue,
           "rate_rps": rate, "gpus": gpus.astype(int), "concurrency": sessions,
           "prefill_rps": x * lam_p, "decode_rps": y_mb * top * tps / (o * cap_step),
           "step_time_s": step, "limit": limit,
           "feasible": (b_cap >= 1.0) & np.isfinite(ttft_p90)}
    return {k: np.ravel(v) for k, v in out.items()}


def _decode_batch_root(state, step0, top, top_step, fixed, steps_per_token, idle_gap, y, conc):
    """The decode batch b <= `top` at which `state(b)` holds `conc` lanes, bracketed tightly
    before Chandrupatla's method (scipy) refines it in log b. Above: each lane decodes its
    O / q steps (`steps_per_token` = O / q) and waits at least `fixed` plus its shortest gap
    per turn, so N(b) >= y b (1 + (fixed + gap) / (O / q T_D(top))). Below: for b under that
    bound b_hi the wait, step and gap are at most b_hi's and the step at least T_D(0), so
    N(b) <= b N(b_hi) T_D(b_hi) / (b_hi T_D(0))."""
    gap_min = idle_gap(fixed + steps_per_token * step0)
    b_hi = np.minimum(top, conc / (y * (1.0 + (fixed + gap_min) / (steps_per_token * top_step))))
    step_hi, _, _, held_hi = state(b_hi)
    with np.errstate(divide="ignore", invalid="ignore"):
        b_lo = np.maximum(b_hi * conc / held_hi * step0 / step_hi, 1e-3)
    lo, hi = np.log(np.minimum(b_lo, b_hi)), np.log(b_hi)
    def excess_lanes(log_b, idx):  # scipy passes the active candidates' indices as floats
        idx = idx.astype(int)
        return state(np.exp(log_b), idx)[3] - conc[idx]

    root = find_root(excess_lanes, (lo, np.maximum(hi, lo + 1e-12)),
                     args=(np.arange(conc.size).reshape(conc.shape),),
                     tolerances={"xatol": ROOT_LOG_TOL, "xrtol": 0.0, "fatol": 0.0, "frtol": 0.0})
    return np.exp(np.where(root.success, root.x, hi))


def _tagged_shift(table: StepTable, b, lanes, which, base):
    """What the decode step a decoding request sees adds to the mean batch's: itself plus the
    others decoding, b + 1 - b / lanes in all (Palm expectation over a closed loop of `lanes`
    sessions; model.serve.tpot_law.decode_step_seen_s is the same correction in the full tier).
    It matters at light load, where the time-average batch b counts idle time. `base`: the
    caller's decode step at b (table.decode(b)), already looked up."""
    b = np.asarray(b, float)
    extra = np.maximum(1.0 - b / np.maximum(lanes, 1e-9), 0.0)
    return np.maximum(table.decode(b + extra, which) - base, 0.0)


def _batch_step_sd(decode_table: StepTable, which, b, lanes, at_cap, traffic: Traffic, tps):
    """Sd of the decode step a short request sees over its own decode window, from the batch's
    fluctuation: decodes are an M/G/inf occupancy of mean b (Poisson variance b), thinned by the
    closed loop's finite lanes (binomial: x (1 - b / lanes)) and averaged over the window w of
    a P10-length output against the mean decode length L: b (1 - w / 3L) (rectangular shots,
    w <= L). None at the decode cap, where queued lanes keep the slots full."""
    length = traffic.mean_output_tokens / tps
    w = np.minimum(traffic.p10_output_tokens / tps, length)
    var = b * (1.0 - w / (3.0 * length)) * np.maximum(1.0 - b / np.maximum(lanes, 1e-9), 0.0)
    slope = np.maximum(decode_table.decode(b + 1.0, which) - decode_table.decode(
        np.maximum(b - 1.0, 0.0), which), 0.0) / (b + 1.0 - np.maximum(b - 1.0, 0.0))
    return np.where(at_cap, 0.0, slope * np.sqrt(var))


# ---------------------------------------------------------------- Pareto and best

def pareto_front(df: pd.DataFrame, x: str = "p90_interactivity_tok_s", y: str = "tpgs"
                 ) -> pd.DataFrame:
    """Rows not dominated in (higher x, higher y), sorted by x."""
    if df.empty:
        return df
    xv, yv = df[x].to_numpy(float), df[y].to_numpy(float)
    order = np.lexsort((-xv, -yv))  # y descending, then x descending (NaN last)
    xs = xv[order]
    keep = np.concatenate([[True], xs[1:] > np.maximum.accumulate(xs)[:-1]])
    rows = order[keep]  # only the front's rows are taken from the frame
    return df.iloc[rows[np.argsort(xv[rows], kind="stable")]].reset_index(drop=True)


def meets_slo(df: pd.DataFrame, slo_p90_interactivity: float,
              slo_p90_ttft_s: float | None = None) -> pd.Series:
    """Feasible candidates meeting the P90 interactivity floor (and the P90 TTFT ceiling)."""
    ok = df["feasible"] & (df["p90_interactivity_tok_s"] >= slo_p90_interactivity)
    return ok & (df["p90_ttft_s"] <= slo_p90_ttft_s) if slo_p90_ttft_s is not None else ok


def best_under_slo(df: pd.DataFrame, slo_p90_interactivity: float,
                   slo_p90_ttft_s: float | None = None) -> pd.Series:
    ok = np.flatnonzero(meets_slo(df, slo_p90_interactivity, slo_p90_ttft_s).to_numpy())
    if not len(ok):
        best = df["p90_interactivity_tok_s"].max() if len(df) else float("nan")
        if slo_p90_ttft_s is not None and len(df) and (
                df["feasible"] & (df["p90_interactivity_tok_s"] >= slo_p90_interactivity)).any():
            fastest = df.loc[df["feasible"] & (df["p90_interactivity_tok_s"]
                                               >= slo_p90_interactivity), "p90_ttft_s"].min()
            raise Infeasible(f"no candidate meeting P90 interactivity {slo_p90_interactivity:g} "
                             f"tok/s has P90 TTFT <= {slo_p90_ttft_s:g} s (best {fastest:.2f} s); "
                             "raise --slo-p90-ttft or add GPUs")
        raise Infeasible(f"no candidate reaches P90 interactivity {slo_p90_interactivity:g} tok/s "
                         f"(best {best:.1f} tok/s); lower --slo-p90-interactivity or add GPUs")
    return df.iloc[_top(df, ok)]


def _top(df: pd.DataFrame, rows: np.ndarray) -> int:
    """Position of the highest-TPGS row among `rows`, ties to the higher P90 interactivity."""
    tpgs = df["tpgs"].to_numpy(float)[rows]
    tied = rows[tpgs == tpgs.max()]
    return int(tied[np.argmax(df["p90_interactivity_tok_s"].to_numpy(float)[tied])])


def require_candidates(df: pd.DataFrame, what: str) -> pd.DataFrame:
    if df.empty:
        raise ServecastError(f"no valid {what} deployment: no parallel plan fits the GPU budget")
    return df
