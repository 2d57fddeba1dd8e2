"""The full tier of a disaggregated deployment (x prefill workers of one plan, y decode workers of
another) from the pieces of one replica's full tier (step model, `request_mix_for`, the FCFS wait
laws of model.serve.finite_source / .queueing, model.serve.cache_effect, the system idle cap).

Per request i of the mix (context c_i, uncached u_i, output o_i, gap z_i), with B the budget
(max_num_batched_tokens per rank per step), q the decode tokens per step (speculative decoding):

- Prefill. Sessions stick to one DP rank of one prefill worker (its prefix cache): each of the
  x·dp_P ranks is a FCFS server of N / (x dp_P) sessions at x_P = X / (x dp_P) requests/s. A
  prompt runs in k_i = ceil(u_i / B) prefill-only steps of chunks at their end contexts
  c_i - u_i + min(j B, u_i): its full chunks take whole-budget steps; its last chunk of r tokens
  takes a step of its own, t(r), when no prompt waits behind it, and rides in a full step by its
  tokens, r / B t(B), when the next one is queued (probability rho; vLLM packs queued prompts into
  one budget). On lock-stepped ranks a step waits for the other ranks' chunks, each rank busy
  with probability rho (mean field): t(rho) = t1 + rho (tA - t1), t1 the chunk on one rank, tA
  every rank carrying such a chunk (the step model's prefill_ranks). With pp stages the chunks
  pipeline: the rank is held S_i(rho) = sum of its steps / pp and the prompt finishes (pp - 1)/pp
  of its longest chunk later. The utilization solves rho = x_P E[S(rho)] (quadratic in rho).
  Prefill-only workers run whole-budget chunks (no threshold, no cadence).
- Wait W on the prefill rank: closed loop, the finite-source FCFS law (`fcfs_wait_pmf` with the
  rank's gaps, its sessions decoding elsewhere scaled by the arrival theorem (n - 1) / n, and the
  time from service end to first token); open loop, M/G/1 (Pollaczek-Khinchine) with a Kingman
  stretch (ca² + cs²) / (1 + cs²) for bursty arrivals.
- KV hand-off H_i = `kv_transfer_time_s(u_i)` (model.serve.handoff): the turn's new tokens over
  the prefill GPUs' NICs.
- Decode. Requests spread over y·dp_D decode ranks at x_D = X / (y dp_D) (a pp_D > 1 worker:
  dp_D pp_D lanes of microbatches, model.perf.microbatch); a request decodes
  w_i = max(o_i - 1, 0) / q steps after its first. Per rank the time-average batch b solves
  b = x_D E[w] T_seen(b) (Little), T(b) = f_D step(0, 0, dp_D b, c_d) at the output-weighted decode
  context c_d, f_D the disaggregated decode engine factor (EngineFactors.disagg_decode_scale). A
  decoding request sees itself plus the others (Palm): T_seen(b) = T(b + (1 - b / n_D) / dp_D)
  with n_D the sessions per decode rank (1 + b with open arrivals). The batch stops at
  b_cap = min(max_num_seqs, KV pool / E[c + o]) per rank; there the batch is always full
  (T_seen = T(b_cap)) and the sessions beyond it wait for admission.
- TTFT_i = F_i (front end) + reload_i + W + S_i(rho) + H_i + T_seen (+ the admission wait).
- Closed loop: N = X (Z_eff + E[TTFT] + E[w] T_seen), Z_eff the mean gap under the system idle
  cap at N lanes; solved for X by Brent's method below prefill saturation and the decode cap.
- TPOT: T_seen plus the decode batch's fluctuation over the request's window: the per-rank batch
  is an M/G/inf occupancy of decode runs (Campbell: Var of its mean over a window of w steps =
  lambda E[overlap(L, w)^2] / w², `shot_noise_var`), thinned by the closed loop (1 - b / n_D),
  the ranks independent, so the step's sd is T'(b) sqrt(Var / dp_D); zero at the decode cap.
  Each request's TPOT is Gaussian around T_seen with its window's sd; the law is their mixture.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import numpy as np
from scipy.special import ndtr, ndtri

from model.perf.microbatch import pipeline_lanes
from model.serve.cache_effect import CacheEffect, deployment_cache
from model.serve.engine import ServingResult, request_mix_for
from model.serve.finite_source import fcfs_wait_pmf
from model.serve.handoff import handoff_bytes_per_token, kv_transfer_time_s
from model.serve.policy import EnginePolicy
from model.serve.queueing import quantiles_from_pmf, shot_noise_var, split_bins
from model.serve.request_mix import request_sample
from model.specs.errors import ServecastError
from model.specs.idle_cap import SystemIdleCap
from model.specs.workload import ClosedLoop, Load, OpenLoop, Workload

QUANTILES = (0.5, 0.9, 0.99)  # the percentiles serve() reports
MAX_UTILIZATION = 0.999  # a prefill rank at or above this is saturated
SOLVE_GRID = 2**12  # wait-law cells while solving the closed loop (its mean only)
LAW_GRID = 2**15  # wait-law and TTFT cells of the reported percentiles
WINDOW_BINS = 64  # decode windows the TPOT law distinguishes
RUN_SAMPLE = 4096  # decode runs behind the batch's fluctuation
E2E_REQUESTS, E2E_WAITS, E2E_STEPS = 2048, 16, 8  # strata of the E2E interactivity law


# ---------------------------------------------------------------- the pools, built whole

@dataclass(frozen=True)
class Workers:
    """`count` workers that each run `step_model` (one replica's step model)."""

    step_model: object
    count: int

    def __post_init__(self) -> None:
        if not isinstance(self.count, (int, np.integer)) or self.count < 1:
            raise ServecastError(f"workers: count: must be an integer >= 1, got {self.count!r}")

    @property
    def ranks(self) -> int:
        """DP ranks of one worker."""
        return int(getattr(getattr(self.step_model, "plan", None), "dp", 1) or 1)

    @property
    def gpus(self) -> int:
        return int(getattr(self.step_model, "gpus", 1)) * self.count


@dataclass(frozen=True)
class Pools:
    """Everything about the two pools that does not depend on the request rate, per request of
    the mix (arrays) and per decode batch (the decode step table)."""

    gpus: int
    prefill_ranks: int  # x dp_P
    decode_ranks: int  # y dp_D
    decode_dp: int  # dp_D: the lock-stepped ranks of one decode worker
    output_tokens: np.ndarray
    tokens_per_request: float  # E[c + o]
    gap_s: np.ndarray  # the sessions' gaps, capped per trajectory
    reload_s: np.ndarray  # lower-tier KV reload before the prefill
    frontend_s: np.ndarray  # the front end's render and tokenization before the prefill queue
    prefill: PrefillService
    handoff_s: np.ndarray
    decode_steps: np.ndarray  # w_i: decode steps after the first token
    tokens_per_step: float  # q
    decode_batch: np.ndarray  # per decode rank (grid)
    decode_step_s: np.ndarray  # T(b) on that grid, engine factor included
    decode_batch_cap: float  # per decode rank
    bounded_by: str  # what sets the cap: max_num_seqs | kv_capacity
    hit_rate: float
    cache: CacheEffect | None
    lanes_per_session: float = 1.0  # request chains per closed-loop session (subagents)

    def decode_step(self, b) -> np.ndarray:
        return np.interp(b, self.decode_batch, self.decode_step_s)


def build_pools(workload: Workload, policy: EnginePolicy, load: Load, prefill: Workers,
                decode: Workers, link_bytes_per_s: float, hit_rate: float | None = None,
                cache: CacheEffect | bool | None = None, cache_policy: str = "lru",
                cache_tiers: tuple[str, ...] = ("hbm", "host"), prefetch_reload: bool = False,
                seed: int = 0) -> Pools:
    """The pools of `prefill` and `decode` workers serving `workload` under `policy`: the cache
    (prefixes live on the prefill workers, `sessions / x` each), the request mix at its hit
    rate, each request's prefill service, hand-off and decode steps, and the decode steps."""
    if policy.long_prefill_token_threshold or policy.prefill_schedule_interval != 1:
        raise ServecastError("disaggregated deployment: long_prefill_token_threshold and "
                             "prefill_schedule_interval: prefill-only workers run whole-budget "
                             "chunks FCFS and decode workers no prefill; allowed 0 and 1")
    if cache is None and hit_rate is None:
        cache = deployment_cache(prefill.step_model, workload,
                                 _live_sessions(workload, load, seed) / prefill.count,
                                 cache_policy, cache_tiers, prefetch_reload)
    drawn = request_mix_for(workload, seed=seed, hit_rate=_served_hit_rate(workload, cache,
                                                                             hit_rate, seed))
    # a closed loop's gaps capped, per chain, ending when the front end hands the request over
    mix = request_sample(drawn, load, policy)
    c, u, o, gap = mix.context_tokens, mix.uncached_tokens, mix.output_tokens, mix.gap_s
    service = prefill_service(prefill.step_model, c, u, policy.max_num_batched_tokens)
    sender = prefill.step_model
    handoff = kv_transfer_time_s(u, handoff_bytes_per_token(sender), link_bytes_per_s,
                                 sender.plan.attention_gpus)
    q = float(getattr(decode.step_model, "tokens_per_decode_step", 1.0) or 1.0)
    steps = np.maximum(o - 1.0, 0.0) / q
    # a pipeline-parallel decode worker runs pp microbatches in flight: dp * pp lanes
    lanes_model, lanes = pipeline_lanes(decode.step_model)
    batch, step_s, cap, bounded = decode_steps(lanes_model, lanes, policy, c, o, steps,
                                               lanes // decode.ranks)
    # a prefetch hides the reload behind the client's gap, which ends before the front end's
    reload = (cache.reload_s(c, request_sample(drawn, load).gap_s) if cache
              else np.zeros_like(c))
    return Pools(prefill.gpus + decode.gpus, prefill.count * prefill.ranks,
                 decode.count * lanes, lanes, o, float(np.mean(c + o)), gap, reload,
                 policy.frontend_s(c), service,
                 np.asarray(handoff, float), steps, q, batch, step_s, cap,
                 bounded, mix.hit_rate, cache or None, mix.lanes_per_session)


def _live_sessions(workload: Workload, load: Load, seed: int) -> float:
    """Sessions holding a cache footprint: a closed loop's; an open loop's arrivals times the
    mean gap between a session's turns (Little's law)."""
    if isinstance(load, ClosedLoop):
        return float(load.concurrency)
    gap = float(np.mean(request_mix_for(workload, seed=seed).gap_s))
    return max(float(load.rate_per_s) * gap, 1.0)


def _served_hit_rate(workload, cache: CacheEffect | bool | None, hit_rate: float | None,
                     seed: int) -> float | None:
    """The hit rate to draw the mix at: as given, or the cache model's misses on top of what an
    infinite cache misses, applied to this mix's own hit (serve() does the same)."""
    if not cache:
        return hit_rate
    if hit_rate is not None:
        raise ServecastError("serve: hit_rate: give either hit_rate or cache, not both")
    ceiling = cache.infinite_hit_rate
    if ceiling is None:
        return cache.hit_rate
    if cache.hit_rate >= ceiling - 1e-12:
        return None
    own = request_mix_for(workload, seed=seed).hit_rate
    return own * cache.hit_rate / max(ceiling, 1e-12)


@dataclass(frozen=True)
class PrefillService:
    """A prompt's service on its prefill rank, per request, as a function of the rank
    utilization rho (mean field). Its full chunks take whole-budget steps; its last chunk of
    r tokens runs in a step of its own when no prompt waits behind it (t(r)), and shares a full
    step by its tokens when one does (r / B t(B); vLLM packs queued prompts into one budget),
    the next prompt queued with probability rho. Every step waits for the other lock-stepped
    ranks, each busy with probability rho: t = t1 + rho (tA - t1). With pp stages the chunks
    pipeline: the rank is held sum t / pp, the prompt done (pp - 1)/pp of its longest chunk
    later (`pipeline_s`)."""

    full_one_s: np.ndarray  # sum over full chunks of t1
    full_extra_s: np.ndarray  # ... of tA - t1
    last_one_s: np.ndarray  # the last chunk alone, t1(r)
    last_extra_s: np.ndarray
    shared_one_s: np.ndarray  # the last chunk's share of a full step, r / B t1(B)
    shared_extra_s: np.ndarray
    pipeline_one_s: np.ndarray  # (pp - 1)/pp of the longest chunk's t1
    pipeline_extra_s: np.ndarray

    def service_s(self, rho: float) -> np.ndarray:
        alone = self.last_one_s + rho * self.last_extra_s
        shared = self.shared_one_s + rho * self.shared_extra_s
        return self.full_one_s + rho * self.full_extra_s + (1.0 - rho) * alone + rho * shared

    def pipeline_s(self, rho: float) -> np.ndarray:
        return self.pipeline_one_s + rho * self.pipeline_extra_s

    def utilization(self, rank_rate_rps: float) -> float | None:
        """rho = x E[S(rho)] (E[S] quadratic in rho), or None when the rank saturates."""
        def excess(rho):
            return rank_rate_rps * float(self.service_s(rho).mean()) - rho

        if excess(MAX_UTILIZATION) >= 0.0:
            return None
        return 0.0 if rank_rate_rps <= 0 else _brentq(excess, 0.0, MAX_UTILIZATION,
                                                     xtol=1e-10)


def prefill_service(step_model, context_tokens, uncached_tokens,
                    budget_tokens: int) -> PrefillService:
    """Each prompt's chunks of the budget at their end contexts on one rank of `step_model`'s
    worker, timed with the other DP ranks idle and busy (see PrefillService)."""
    c, u = np.asarray(context_tokens, float), np.asarray(uncached_tokens, float)
    k = np.maximum(np.ceil(u / budget_tokens), 1).astype(int)
    owner = np.repeat(np.arange(len(u)), k)
    j = np.arange(len(owner)) - np.repeat(np.cumsum(k) - k, k)  # chunk index within its prompt
    done = np.minimum((j + 1.0) * budget_tokens, u[owner])
    tokens = np.maximum(done - j * budget_tokens, 1.0)
    ctx = c[owner] - u[owner] + done
    last = j == k[owner] - 1
    plan = step_model.plan
    dp, pp = float(plan.dp), float(plan.pp)

    def timed(p, pctx):  # (one rank carrying p, every rank carrying p)
        alone = np.asarray(step_model.step_time_s(p, pctx, 0.0, 0.0, 1.0, prefill_ranks=1.0),
                           float)
        return alone, np.asarray(step_model.step_time_s(p * dp, pctx, 0.0, 0.0, dp), float)

    one, every = timed(tokens, ctx)
    full_one, full_every = timed(np.full(int(last.sum()), float(budget_tokens)), ctx[last])
    share = tokens[last] / budget_tokens

    def per_request(values, where=None):
        return np.bincount(owner if where is None else owner[where], values, len(u)) / pp

    longest_one, longest_every = np.zeros(len(u)), np.zeros(len(u))
    np.maximum.at(longest_one, owner, one)
    np.maximum.at(longest_every, owner, every)
    tail = (pp - 1.0) / pp
    return PrefillService(
        per_request(np.where(last, 0.0, one)), per_request(np.where(last, 0.0, every - one)),
        per_request(one[last], last), per_request((every - one)[last], last),
        per_request(share * full_one, last), per_request(share * (full_every - full_one), last),
        tail * longest_one, tail * (longest_every - longest_one))


def decode_steps(step_model, ranks: int, policy: EnginePolicy, context_tokens, output_tokens,
                 steps, microbatches: int = 1) -> tuple[np.ndarray, np.ndarray, float, str]:
    """(per-rank batches, decode step on each, the batch cap per rank, what sets it): the step
    of a decode-only worker at the output-weighted decode context, times the disaggregated
    decode engine factor; the cap is max_num_seqs (shared by a DP rank's `microbatches` lanes)
    or the sequences the KV pool holds at the mix's mean context plus output."""
    c, o, w = (np.asarray(a, float) for a in (context_tokens, output_tokens, steps))
    c_d = float(np.sum(w * (c + o / 2.0)) / w.sum()) if w.sum() > 0 else float(c.mean())
    kv_tokens = float(np.asarray(step_model.kv_capacity_tokens(float(c.mean())))) / ranks
    kv_seqs = kv_tokens / float(np.mean(c + o))
    seqs_cap = policy.max_num_seqs / microbatches
    cap, bounded = ((kv_seqs, "kv_capacity") if kv_seqs < seqs_cap
                    else (float(seqs_cap), "max_num_seqs"))
    top = max(cap, 1.0) + 2.0
    batch = np.unique(np.r_[0.0, np.arange(1.0, ranks) / ranks,
                            np.geomspace(1.0, top, 96)])
    factor = float(getattr(getattr(step_model, "factors", None), "disagg_decode_scale", 1.0))
    step = np.asarray(step_model.step_time_s(0.0, 0.0, ranks * np.maximum(batch, 1.0 / ranks),
                                             c_d), float)
    return batch, step * factor, cap, bounded


# ---------------------------------------------------------------- the state at a request rate

@dataclass(frozen=True)
class PoolState:
    """The pools at deployment request rate `rate_rps`."""

    rate_rps: float
    utilization: float  # a prefill rank's
    service_s: np.ndarray  # per request, at that utilization
    pipeline_s: np.ndarray
    decode_batch: float  # per decode rank, time average
    decode_step_s: float  # the step a decoding request sees
    at_cap: bool
    wait_s: float  # mean FCFS wait on the prefill rank
    response_s: float  # mean arrival-to-last-token time (no admission wait)
    first_token_extra_s: float  # mean time from service end to first token


def state_at(pools: Pools, load: Load, rate_rps: float, gap_s: np.ndarray,
             sessions: float | None) -> PoolState | None:
    """The pools' steady state at `rate_rps` with gaps `gap_s` (under the idle cap); None when
    a prefill rank would saturate."""
    x_p = rate_rps / pools.prefill_ranks
    rho = pools.prefill.utilization(x_p)
    if rho is None:
        return None
    service, pipeline = pools.prefill.service_s(rho), pools.prefill.pipeline_s(rho)
    b, step, at_cap = decode_batch(pools, rate_rps / pools.decode_ranks,
                                   None if sessions is None else sessions / pools.decode_ranks)
    extra = float(pools.reload_s.mean() + pools.handoff_s.mean()) + step
    decoding = _decoding(pools, x_p, step, sessions)
    wait = _mean_wait(service, rho, x_p, gap_s if isinstance(load, ClosedLoop) else None,
                      decoding, extra, SOLVE_GRID, _open_stretch(load, service))
    response = wait + float(service.mean() + pipeline.mean()) + extra \
        + float(pools.decode_steps.mean()) * step
    return PoolState(rate_rps, rho, service, pipeline, b, step, at_cap, wait, response,
                     extra)


def decode_batch(pools: Pools, rank_rate_rps: float, rank_sessions: float | None
                 ) -> tuple[float, float, bool]:
    """(time-average batch per decode rank, the step a decoding request sees, at the cap):
    b = x_D E[w] T_seen(b), bisected on [0, cap]."""
    mean_steps = float(pools.decode_steps.mean())

    def seen(b):
        extra = 1.0 - (b / rank_sessions if rank_sessions else 0.0)
        return float(pools.decode_step(b + max(extra, 0.0) / pools.decode_dp))

    cap = pools.decode_batch_cap
    if rank_rate_rps * mean_steps * float(pools.decode_step(cap)) >= cap:
        return cap, float(pools.decode_step(cap)), True
    lo, hi = 0.0, cap
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if rank_rate_rps * mean_steps * seen(mid) > mid else (lo, mid)
        if hi - lo < 1e-9 * max(cap, 1.0):
            break
    return hi, seen(hi), False


def _decoding(pools: Pools, rank_rate_rps: float, step_s: float, sessions: float | None):
    """(sessions of a prefill rank decoding when one of its prompts arrives, their remaining
    decode times): the rank's x_P E[w] T_seen, of which (n - 1) / n are others (arrival theorem:
    an arriving session sees the rest of its rank's n sessions)."""
    if sessions is None:
        return None
    n = sessions / pools.prefill_ranks
    count = rank_rate_rps * float(pools.decode_steps.mean()) * step_s * max(n - 1.0, 0.0) / n
    return count, pools.decode_steps * step_s


def _open_stretch(load: Load, service: np.ndarray) -> float:
    """Kingman's factor on the M/G/1 wait for bursty open arrivals: (ca² + cs²) / (1 + cs²)."""
    if not isinstance(load, OpenLoop):
        return 1.0
    cs2 = float(service.var() / max(service.mean() ** 2, 1e-300))
    return (load.interarrival_cv ** 2 + cs2) / (1.0 + cs2)


def _wait_law(service: np.ndarray, rho: float, rank_rate_rps: float, gaps, decoding,
              extra_s: float, n: int, stretch: float, span_s: float = 0.0):
    """(dt, wait pmf on k·dt, k < n) of a prefill rank's FCFS queue; the grid covers the wait's
    tail and `span_s` more (what the TTFT adds to it)."""
    t_max = 4.0 * float(service.max()) + 20.0 * float(service.mean()) / max(1.0 - rho, 0.02)
    dt = (t_max * stretch + span_s) / n
    pmf, _ = fcfs_wait_pmf(service, rho, dt, n, gaps, rank_rate_rps, decoding, extra_s)
    if stretch != 1.0:
        grid = np.arange(n) * dt
        pmf = np.diff(np.interp(grid / stretch, grid, np.cumsum(pmf)), prepend=0.0)
    return dt, pmf


def _mean_wait(service, rho, rank_rate_rps, gaps, decoding, extra_s, n, stretch) -> float:
    dt, pmf = _wait_law(service, rho, rank_rate_rps, gaps, decoding, extra_s, n, stretch)
    return float(np.sum(pmf * np.arange(n)) * dt)


# ---------------------------------------------------------------- the closed loop

@dataclass(frozen=True)
class PoolSolution:
    """The pools' operating point: the state, the gaps it was solved with (idle cap), and the
    wait beyond the queue laws when a pool's cap binds (admission to decode, or the prefill
    rank at saturation)."""

    state: PoolState
    gap_s: np.ndarray
    admission_wait_s: float
    bounded_by: str  # "" | max_num_seqs | kv_capacity | prefill_rate


def top_rate_rps(pools: Pools) -> tuple[float, str]:
    """(the highest request rate the pools carry, what sets it): the prefill ranks just below
    saturation, or the decode ranks at their batch cap."""
    # E[S(rho)] at saturation: the largest rate a rank carries is rho / E[S(rho)]
    prefill = (pools.prefill_ranks * MAX_UTILIZATION
               / float(pools.prefill.service_s(MAX_UTILIZATION).mean()) * (1.0 - 1e-6))
    steps = float(pools.decode_steps.mean())
    decode = (pools.decode_ranks * pools.decode_batch_cap
              / (steps * float(pools.decode_step(pools.decode_batch_cap)))
              if steps > 0 else np.inf)
    return (prefill, "prefill_rate") if prefill <= decode else (decode, pools.bounded_by)


def solve_closed(pools: Pools, load: ClosedLoop, passes: int = 3) -> PoolSolution:
    """N = X (Z_eff + R(X)), Brent's method on X below `top_rate_rps`; each pass re-reads the
    mean gap the system idle cap leaves at the last response time and scales the sessions'
    gaps to it (the wait law sees them)."""
    n = float(load.concurrency) * pools.lanes_per_session  # request chains
    z = pools.gap_s
    idle = SystemIdleCap(z, load.idle_cap_s) if load.idle_cap_s is not None else None

    def gap_mean(active_s: float) -> float:
        return float(idle.gap_mean(n, active_s)) if idle is not None else float(z.mean())

    top, limit = top_rate_rps(pools)
    gaps = z
    for _ in range(passes):
        def excess(rate, gaps=gaps):
            st = state_at(pools, load, rate, gaps, n)
            return np.inf if st is None else rate * (gap_mean(st.response_s) + st.response_s) - n

        capped = excess(top) <= 0.0
        rate = top if capped else _brentq(excess, top * 1e-9, top, rtol=1e-5)
        st = state_at(pools, load, rate, gaps, n)
        scale = gap_mean(st.response_s) / max(float(z.mean()), 1e-300)
        if abs(float(gaps.mean()) - float(z.mean()) * scale) < 1e-3 * max(float(z.mean()), 1e-9):
            break
        gaps = z * scale
    wait = 0.0
    if capped:
        def short(e):
            return rate * (gap_mean(st.response_s + e) + st.response_s + e) - n
        wait = _brentq(short, 0.0, n / rate) if short(0.0) < 0.0 else 0.0
    return PoolSolution(st, gaps, wait, limit if capped else "")


# ---------------------------------------------------------------- what users see

def ttft_law(pools: Pools, load: Load, sol: PoolSolution, sessions: float | None):
    """(grid, pmf) of TTFT: the prefill rank's FCFS wait convolved with each request's own
    front end + reload + service + pipeline + hand-off + first decode step (+ the admission
    wait)."""
    st = sol.state
    own = (pools.frontend_s + pools.reload_s + st.service_s + st.pipeline_s + pools.handoff_s
           + st.decode_step_s + sol.admission_wait_s)
    x_p = st.rate_rps / pools.prefill_ranks
    dt, wait = _wait_law(st.service_s, st.utilization, x_p,
                         sol.gap_s if isinstance(load, ClosedLoop) else None,
                         _decoding(pools, x_p, st.decode_step_s, sessions),
                         st.first_token_extra_s, LAW_GRID, _open_stretch(load, st.service_s),
                         1.5 * float(own.max()))
    own_pmf = split_bins(own / dt, None, LAW_GRID) / len(own)
    pmf = np.maximum(np.fft.irfft(np.fft.rfft(wait, 2 * LAW_GRID)
                                  * np.fft.rfft(own_pmf, 2 * LAW_GRID), 2 * LAW_GRID)[:LAW_GRID],
                     0.0)
    return np.arange(LAW_GRID) * dt, pmf / max(pmf.sum(), 1e-300), wait, own


def step_sd_s(pools: Pools, st: PoolState, sessions: float | None) -> np.ndarray:
    """Per request: the sd of the decode step averaged over its window of w_i steps, from the
    per-rank batch's fluctuation (M/G/inf occupancy of decode runs, Campbell's second moment,
    thinned by the closed loop; independent ranks); zero at the decode cap."""
    w = pools.decode_steps
    if st.at_cap or not (w > 0).any():
        return np.zeros_like(w)
    window = np.maximum(w, 1.0)
    edges = np.unique(np.quantile(window, np.linspace(0.0, 1.0, WINDOW_BINS + 1)))
    which = np.clip(np.searchsorted(edges, window, side="right") - 1, 0, max(len(edges) - 2, 0))
    centers = np.array([window[which == k].mean() if (which == k).any() else edges[k]
                        for k in range(max(len(edges) - 1, 1))])
    runs = np.sort(w)[np.linspace(0, len(w) - 1, min(len(w), RUN_SAMPLE)).astype(int)]
    per_step = st.rate_rps / pools.decode_ranks * st.decode_step_s  # runs started per step
    var = shot_noise_var(per_step, np.ones_like(runs), runs, centers) / centers**2
    if sessions:
        var = var * max(1.0 - st.decode_batch * pools.decode_ranks / sessions, 0.0)
    b = st.decode_batch
    lo, hi = max(b - 1.0, 0.0), b + 1.0
    slope = float(pools.decode_step(hi) - pools.decode_step(lo)) / (hi - lo)
    return slope * np.sqrt(var[which] / pools.decode_dp)


def mixture_quantiles(mean: float, sd: np.ndarray, qs=QUANTILES) -> np.ndarray:
    """Quantiles of an equal-weight mixture of normals N(mean, sd_i²) (sd_i = 0: a point)."""
    top = float(sd.max()) if len(sd) else 0.0
    if top <= 0.0:
        return np.full(len(qs), mean)
    values, counts = np.unique(sd, return_counts=True)
    weights = counts / counts.sum()
    grid = mean + top * np.linspace(-8.0, 8.0, 4001)
    safe = np.where(values > 0, values, 1.0)[None, :]
    below = np.where(values[None, :] > 0, ndtr((grid[:, None] - mean) / safe),
                     grid[:, None] >= mean)
    return np.interp(qs, below @ weights, grid)


def e2e_interactivity_tok_s(pools: Pools, wait_pmf: np.ndarray, dt: float, own: np.ndarray,
                            step_s: float, sd: np.ndarray) -> dict:
    """{pXX: InferenceX's E2E normalized interactivity, 1 / the quantile of E2EL / OSL over
    requests}: stratified over requests, the wait law and the window's Gaussian step."""
    o = pools.output_tokens
    pick = np.linspace(0, len(o) - 1, min(len(o), E2E_REQUESTS)).astype(int)
    cdf = np.cumsum(wait_pmf) / max(wait_pmf.sum(), 1e-300)
    waits = np.interp((np.arange(E2E_WAITS) + 0.5) / E2E_WAITS, cdf, np.arange(len(cdf)) * dt)
    z = ndtri((np.arange(E2E_STEPS) + 0.5) / E2E_STEPS)
    decode = pools.decode_steps[pick, None] * (step_s + sd[pick, None] * z[None, :])
    total = waits[None, :, None] + (own[pick, None] + decode)[:, None, :]
    per_token = np.quantile(total / np.maximum(o[pick], 1.0)[:, None, None], QUANTILES)
    return {f"p{int(q * 100)}": 1.0 / float(v) for q, v in zip(QUANTILES, per_token, strict=True)}


def serve_pools(workload: Workload, policy: EnginePolicy, load: Load, prefill: Workers,
                decode: Workers, link_bytes_per_s: float, *, hit_rate: float | None = None,
                cache: CacheEffect | bool | None = None, cache_policy: str = "lru",
                cache_tiers: tuple[str, ...] = ("hbm", "host"), prefetch_reload: bool = False,
                seed: int = 0, e2e: bool = True) -> tuple[ServingResult, PoolSolution | None]:
    """Serve `workload` under `load` (ClosedLoop sessions or OpenLoop rate, the whole
    deployment's) on `prefill` + `decode` workers: serve()'s result fields for the deployment
    (all its GPUs; E2E with `e2e`), and the operating point (None when unstable)."""
    pools = build_pools(workload, policy, load, prefill, decode, link_bytes_per_s, hit_rate,
                        cache, cache_policy, cache_tiers, prefetch_reload, seed)
    # request chains: subagents running beside their parent add chains to a session
    sessions = (float(load.concurrency) * pools.lanes_per_session
                if isinstance(load, ClosedLoop) else None)
    if isinstance(load, ClosedLoop):
        sol = solve_closed(pools, load)
    elif isinstance(load, OpenLoop):
        sol = _open_solution(pools, load)
        if isinstance(sol, str):
            return _unstable(sol, pools, policy), None
    else:
        raise ServecastError("disaggregated deployment: load: allowed a closed loop of sessions "
                             "or an open request rate (no trace replay)")
    return _result(pools, load, sol, sessions, policy, e2e), sol


def _open_solution(pools: Pools, load: OpenLoop) -> PoolSolution | str:
    top, limit = top_rate_rps(pools)
    if load.rate_per_s > top:
        return (f"{load.rate_per_s:.3g} requests/s exceed the pools' {top:.3g} "
                f"({limit.replace('_', ' ')})")
    st = state_at(pools, load, float(load.rate_per_s), pools.gap_s, None)
    return PoolSolution(st, pools.gap_s, 0.0, "")


def _result(pools: Pools, load: Load, sol: PoolSolution, sessions: float | None,
            policy: EnginePolicy, e2e: bool = True) -> ServingResult:
    st = sol.state
    grid, pmf, wait, own = ttft_law(pools, load, sol, sessions)
    ttft = quantiles_from_pmf(pmf, grid, QUANTILES)
    sd = step_sd_s(pools, st, sessions)
    tpot = mixture_quantiles(st.decode_step_s, sd[pools.decode_steps > 0]) / pools.tokens_per_step
    names = [f"p{int(q * 100)}" for q in QUANTILES]
    e2e_later = partial(e2e_interactivity_tok_s, pools, wait, grid[1], own, st.decode_step_s, sd)
    rate = st.rate_rps
    return ServingResult(
        stable=True, reason="", ttft_s=dict(zip(names, map(float, ttft), strict=True)),
        tpot_s=dict(zip(names, map(float, tpot), strict=True)),
        interactivity_tok_s={n: 1.0 / float(v) for n, v in zip(names, tpot, strict=True)},
        mean_ttft_s=float(np.sum(pmf * grid)),
        mean_tpot_s=st.decode_step_s / pools.tokens_per_step,
        tpgs=rate * pools.tokens_per_request / pools.gpus,
        output_tokens_per_s_per_gpu=rate * float(pools.output_tokens.mean()) / pools.gpus,
        requests_per_s=rate,
        concurrency=sessions / pools.lanes_per_session if sessions is not None else rate * (
            st.response_s + sol.admission_wait_s),
        decode_batch_per_rank=st.decode_batch, prefill_step_share=0.0,
        hit_rate=pools.hit_rate, bounded_by=sol.bounded_by, policy=policy.as_dict(),
        cache=pools.cache.summary() if pools.cache else None,
        mean_reload_s=float(pools.reload_s.mean()), mean_frontend_s=float(pools.frontend_s.mean()),
        e2e_interactivity_tok_s=e2e_later() if e2e else {},
        e2e_later=None if e2e else e2e_later)


def _unstable(reason: str, pools: Pools, policy: EnginePolicy) -> ServingResult:
    none = {f"p{int(q * 100)}": None for q in QUANTILES}
    return ServingResult(False, reason, dict(none), dict(none), dict(none), None, None, None,
                         None, None, None, None, None, pools.hit_rate, "", None, None,
                         policy.as_dict())


def _brentq(f, lo: float, hi: float, **options) -> float:
    """scipy's Brent root of `f` on [lo, hi]; scipy.optimize is imported here, on first use,
    because it costs a command 0.2 s of start-up that aggregated serving never needs."""
    from scipy.optimize import brentq

    return brentq(f, lo, hi, **options)
