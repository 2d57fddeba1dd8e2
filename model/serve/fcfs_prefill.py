"""Prefill without a threshold: first come, first served on the whole step budget.

A prompt of k chunks is served k·T_d + E (plus, on lock-stepped ranks, what the other ranks add
to its steps) after a wait in a single-server queue: M/G/1 for open arrivals (the exact
Pollaczek-Khinchine transform, Kingman's stretch when bursty), the finite source of
model.serve.finite_source for a closed loop's sessions. Three corrections ride on that queue:

- the first step: whether another lock-stepped rank is mid-run when the prompt arrives (a
  mixture of offsets, `_run_mixture`; the slot chain's `first_step` on FCFS lock-stepped ranks);
- merging: a prompt queued when its predecessor's last step starts rides in that step when the
  step's room holds its last chunk, saving a decode step (`_merged_queue`);
- the server works on tokens: a prompt's last step hands the budget it leaves to the next queued
  prompt, so with probability q (someone arrived during its wait and earlier steps) its first
  token also waits for that prompt's chunk.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from model.serve.finite_source import fcfs_wait_pmf
from model.serve.lockstep import SlotLaw
from model.serve.mean_waits import kingman_wait_exceeds, kingman_wait_s, pk_wait_transform
from model.serve.queueing import arrivals_kept
from model.serve.rank_engine import RankEngine
from model.serve.step_balance import StepBalance
from model.specs.workload import RequestMix

RUN_HEIGHTS, RUN_PHASES = 16, 8  # first-step mixture resolution: chunk heights x arrival phases
WAIT_GRID_FAST = 2**12  # cells of the wait law inside the merged-queue fixed point


@dataclass(frozen=True)
class FirstStep:
    """What a prompt meets first: offsets past its own first step's decode step and their
    weights; the own slot's extension at each (lock-stepped FCFS ranks, else None) and each
    prompt's first chunk extension (hidden below it); the mean first-step extension the queue's
    service carries; the mean offset; the slot each further own chunk holds."""

    offsets_s: np.ndarray
    weights: np.ndarray
    own_slot_extension_s: np.ndarray | None
    first_chunk_extension_s: np.ndarray | None
    mean_extension_s: float
    mean_offset_s: float
    slot_s: float


@dataclass(frozen=True)
class FcfsPrefill:
    """The FCFS part of a solved state (arrays over the request sample)."""

    ttft_base_s: np.ndarray  # TTFT outside the queue's wait (the first step's mean in extra_s)
    extra_s: float  # the first step's mean offset
    utilization: float  # of the prefill server (rho)
    mean_wait_s: float
    wait_scale: float  # Kingman's stretch of the wait for bursty arrivals
    queue_service_s: np.ndarray  # the wait law's service sample, merging included
    merged_share: float  # P(W > L): queued when the predecessor's last step starts
    merge: np.ndarray  # P(that step's room holds the prompt's last chunk)
    last_step_s: np.ndarray
    next_chunk_share: np.ndarray  # P(the next prompt's chunk shares the own last step)
    next_chunk_extension_s: np.ndarray  # ... and what it adds
    no_arrival: np.ndarray  # exp(-x tau): nobody arrived during the own earlier steps
    merged_next_chunk_extension_s: np.ndarray  # next_chunk_extension_s of a prompt that merged
    first: FirstStep
    decoding: tuple | None  # closed loop: (sessions decoding per rank, their decode times)
    slot_law: SlotLaw | None  # lock-stepped ranks: the slot picture at the solved mean step
    shared_steps_mean_s: float  # mean TTFT the shared last steps add, less what merging saves


@dataclass(frozen=True)
class StalledPrefill:
    """The prefill part of a state past saturation: what the response-time law reads of it."""

    ttft_base_s: np.ndarray
    utilization: float
    extra_s: float = 0.0
    mean_wait_s: float = 0.0
    wait_scale: float = 1.0
    shared_steps_mean_s: float = 0.0


def solve_fcfs(eng: RankEngine, bal: StepBalance, ca2: float, sessions_per_rank: float | None,
               merged_start: float) -> tuple[FcfsPrefill | StalledPrefill, str]:
    """The FCFS queue at the balanced steps: (its part of the state, why it is unstable or "").
    `merged_start`: where the merged share's fixed point starts (the last solve's)."""
    n_sessions = sessions_per_rank
    x, b, td = bal.rate_per_rank_rps, bal.decode_batch, bal.decode_step_s
    runs, rate = bal.runs, bal.chunk_tokens
    k, ext, rem = runs.chunks, runs.extension_s, runs.last_chunk_tokens
    law = None if bal.slots is None else bal.slots.law(x, bal.mean_step_s, bal.slot_grid)
    first = _first_step(eng, bal, law, n_sessions)

    def service_of(k_, ext_):  # first step, the other own steps, the chunks' extensions
        return td + first.mean_extension_s + (np.maximum(k_, 1.0) - 1.0) * first.slot_s + ext_

    service = service_of(k, ext)
    room = np.where(rem > 0, rate - rem, 0.0)
    merge = _merge_probability(room, eng.sample, rate)
    if eng.queue_sample is None:  # the wait law's own sample (RankEngine.queue)
        q_service, q_merge = service, merge
    else:
        q_runs = eng.queue_prefill_runs(b, rate)
        q_service = service_of(q_runs.chunks, q_runs.extension_s)
        q_merge = _merge_probability(room, eng.queue_sample, rate)
    last_step = td + np.where(rem > 0, runs.last_chunk_extension_s, ext / np.maximum(k, 1.0))
    decoding = _decoding(eng, bal, first.slot_s) if n_sessions else None
    # One wait law for the mean and the percentiles: the queue's service without the first
    # slot's height, which the first-step mixture carries (`extra_s`)
    q_service = q_service - first.mean_extension_s
    queue = _merged_queue(q_service, q_merge * td, last_step, x, ca2,
                          eng.queue.gap_s_ascending if n_sessions else None, decoding, merged_start,
                          first.mean_offset_s)
    if queue is None:
        rho_p = x * float(np.mean(q_service - q_merge * td))
        return StalledPrefill(service, rho_p), (
            f"prefill queue utilization {rho_p:.2f} >= 1 with every queued prompt in its "
            "predecessor's last step (FCFS on the budget)")
    queued, q_service, rho_p, wait, cs2, pmf, grid_dt = queue
    # The next prompt is queued when someone arrived during this prompt's wait W and its steps
    # before the last (tau): q = 1 - E[exp(-x W)] exp(-x tau). What the next prompt saves there
    # (its own step, its first-slot offset) is counted with it (merged_share)
    tau = np.maximum(service - td - runs.last_chunk_extension_s, 0.0)
    if n_sessions:
        lt_wait = float(np.sum(pmf * np.exp(-x * grid_dt * np.arange(len(pmf)))))
    else:
        lt_wait = pk_wait_transform(x, rho_p, q_service)
    tail_free = np.exp(-x * tau)
    tail_q = np.clip(1.0 - min(lt_wait, 1.0) * tail_free, 0.0, 1.0)
    tail_ext = eng.next_chunk_extension_s(room, b)
    # a one-chunk prompt that merged leaves its predecessor's room less its own tokens to the
    # next prompt (two 4,000-token prompts fill an 8K step: the third waits)
    tail_ext_late = np.where(k <= 1, eng.merged_tail_extension_s(room, b), tail_ext)
    saved = queued * float(np.mean(merge * (td + first.mean_offset_s)))
    return FcfsPrefill(
        service - first.mean_extension_s, first.mean_offset_s, rho_p, wait,
        (ca2 + cs2) / (1.0 + cs2), q_service, queued, merge, last_step, tail_q, tail_ext,
        tail_free, tail_ext_late, first, decoding, law,
        float(np.mean(tail_q * tail_ext)) - saved), ""


def _first_step(eng: RankEngine, bal: StepBalance, law: SlotLaw | None,
                sessions_per_rank: float | None) -> FirstStep:
    """Whether another rank is mid-run when a prompt arrives decides its first step: a mixture
    of offsets instead of everyone paying the mean (which sets P50 too high and P90 too low
    where runs are rare and long)."""
    x, td, tbar = bal.rate_per_rank_rps, bal.decode_step_s, bal.mean_step_s
    k, ext = bal.runs.chunks, bal.runs.extension_s
    interval = eng.policy.prefill_schedule_interval
    busy = bal.engine_busy(eng.dp)
    gaps = eng.sample.gap_s_ascending if sessions_per_rank else None
    # lock-stepped ranks: each of the prompt's steps also waits for the other ranks' prefill
    # (their share of the mean extension per step)
    t_lock = td + (tbar - td) * (1.0 - 1.0 / eng.dp)
    if law is None:
        offsets, weights, run_h = _run_mixture(
            x, td, bal.own_steps(interval) * t_lock + ext, ext, k, interval, eng.dp, busy, gaps)
        return FirstStep(offsets, weights, None, None, run_h, float(np.sum(offsets * weights)),
                         interval * t_lock)
    # lock-stepped FCFS ranks: the slot the prompt meets follows the chain's J, and its own
    # chunk hides below what the slot holds anyway (a step takes the tallest rank: max(own, h),
    # not own + h); the mixture's run heights come from the slot chain, where most slots hold a
    # run at high load
    offsets, weights, own_h = _lockstep_first_step(
        bal.slots.first_step(law, RUN_HEIGHTS // 2, RUN_PHASES, gaps, points=RUN_HEIGHTS * 2),
        busy)
    first_ext = ext / np.maximum(k, 1.0)
    hidden = float(np.mean(np.minimum(own_h[None, :], first_ext[:, None]) @ weights))
    run_h = float(np.sum(weights * own_h)) - hidden
    extra = float(np.sum(offsets * weights))
    extra -= hidden
    # each further own chunk holds a slot: what the others add above it (their runs and pieces
    # beyond its height), not their mean extension on top
    slot = interval * td + bal.slots.others_above_own(law)
    return FirstStep(offsets, weights, own_h, first_ext, run_h, extra, slot)


def _decoding(eng: RankEngine, bal: StepBalance, slot_s: float) -> tuple:
    """Closed loop: (sessions decoding per rank, their decode times) when a prompt starts. Their
    rank's slots hold its chunks (and what the other ranks add above them) every interval-th
    step, so they finish at that pace, then idle and arrive behind it: at one rank and cadence
    1 a step per 0.5 s chunk lets few do, at eight ranks and cadence 8 most do."""
    runs = bal.runs
    long = runs.chunks > 1
    chunk_h = float(np.sum(runs.extension_s[long] - runs.last_chunk_extension_s[long])) / max(
        float(np.sum(runs.chunks[long] - (runs.last_chunk_tokens[long] > 0))), 1.0)
    interval = eng.policy.prefill_schedule_interval
    # in ascending order: a fixed sample scaled, so the wait law never sorts it again
    return (bal.decode_batch, np.maximum(eng.queue.output_tokens_ascending - 1.0, 0.0)
            / eng.tokens_per_step * (slot_s + chunk_h) / interval)


def _wait_law(service_s: np.ndarray, rho: float, rate_per_rank_rps: float, gaps_s, n: int,
              decoding=None, extra_s: float = 0.0):
    """(dt, busy probability, wait pmf) of the FCFS prefill queue on an n-point grid; `extra_s`:
    the mean time a prompt spends past its wait and service before its first token."""
    s_max = float(service_s.max())
    t_max = 4.0 * s_max + 20.0 * float(service_s.mean()) / max(1.0 - rho, 0.02)
    dt = t_max / n
    pmf, busy = fcfs_wait_pmf(service_s, rho, dt, n, gaps_s, rate_per_rank_rps, decoding,
                              extra_s)
    return dt, busy, pmf


def _merged_queue(service_s, saved_s, last_step_s, rate_per_rank_rps: float, ca2: float,
                  gaps_s, decoding, start: float, extra_s: float = 0.0):
    """FCFS prefill queue where a prompt queued when its predecessor's last step starts saves
    `saved_s` of its service: (queued, service, busy, mean wait, cs2, wait pmf, grid step), or
    None when even all of them merging leaves utilization >= 1. `queued` = P(W > L), the wait
    against the predecessor's last step L, is a fixed point (more merging, less waiting):
    iterated from `start` inside a shrinking bracket of [0, 1]."""
    service, saved, x, gaps, extra = service_s, saved_s, rate_per_rank_rps, gaps_s, extra_s
    ls = np.sort(last_step_s)

    def at(queued):
        s = service - queued * saved
        rho = x * float(s.mean())
        if rho >= 1.0:
            return None
        cs2 = float(s.var() / max(s.mean() ** 2, 1e-30))
        if gaps is not None:  # closed loop: the finite-source wait (model.serve.finite_source)
            dt, busy, pmf = _wait_law(s, rho, x, gaps, WAIT_GRID_FAST, decoding, extra)
            grid = np.arange(len(pmf)) * dt
            p = float(np.sum(pmf * np.searchsorted(ls, grid, side="right"))) / len(ls)
            return p, s, busy, float(np.sum(pmf * grid)), cs2, pmf, dt
        wait = kingman_wait_s(rho, float(s.mean()), cs2, 1.0)
        return kingman_wait_exceeds(rho, wait, ca2, cs2, ls), s, rho, wait, cs2, None, None

    lo, hi = 0.0, 1.0
    q, found = min(max(start, 0.0), 1.0), None
    for _ in range(16):
        r = at(q)
        if r is None:  # unstable unless more prompts merge
            if q >= 1.0:
                return None
            lo, q = q, 1.0 if q > 0.999 else 0.5 * (q + 1.0)
            continue
        found = (q,) + r[1:]
        if abs(r[0] - q) < 2e-3 or hi - lo < 2e-3:
            break
        lo, hi = (q, hi) if r[0] > q else (lo, q)
        q = r[0] if lo < r[0] < hi else 0.5 * (lo + hi)
    return found


def _merge_probability(room: np.ndarray, mix: RequestMix, chunk_tokens: float) -> np.ndarray:
    """Per prompt of `mix`, P(room >= its last chunk) over the sample's rooms (what the
    predecessor's last step leaves): then the chunks shift by the room and the prompt needs one
    step fewer. A prompt's last chunk is a function of its uncached tokens, so it is evaluated
    once per distinct count (a few thousand in a sample of 320,000) and read back per prompt."""
    counts, inverse = mix.uncached_tokens_distinct
    rem = counts - np.floor(counts / chunk_tokens) * chunk_tokens  # as rank_engine's runs
    last = np.where(rem > 0, rem, chunk_tokens)
    rooms = np.sort(room)
    return (1.0 - np.searchsorted(rooms, last, side="left") / len(rooms))[inverse]


def _lockstep_first_step(first, busy: float):
    """(offsets, weights, own slot extensions) of LockstepSlots.first_step, with the quiet
    cycles' share split by whether anything runs anywhere (`busy`): an idle engine starts the
    prompt at once."""
    offs, w, on, own_h = first
    idle = float(np.sum(w[~on])) * (1.0 - busy)
    weights = np.r_[idle, w * np.where(on, 1.0, busy)]
    return np.r_[0.0, offs], weights / weights.sum(), np.r_[0.0, own_h]


def _run_mixture(rate_per_rank_rps: float, decode_step_s: float, span_s: np.ndarray,
                 extension_s: np.ndarray, chunks: np.ndarray, interval: int, dp: int,
                 busy: float, gaps_s=None):
    """FCFS first-step mixture: (offsets, weights, mean first-step extension) at x requests/s
    per rank, decode step td, each request's run span, extension E and chunks k. With probability
    q another of the dp - 1 lock-stepped ranks is mid-run when the prompt arrives (each rank
    spends a fraction x E[span] of its time in runs); the arrival then lands in a run picked
    length-biased, waits out the rest of its cadence cycle (interval decode steps plus that
    run's chunk height H, uniform phase) and its own first step carries H too. Otherwise it
    waits out a cycle of decode steps (none when the engine is idle). With the closed loop's
    `gaps`, arrivals thin during a run of length D to E[min(gap, D)] / D of their rate: the
    run stretches every rank's steps, sessions decoding anywhere stall, and only those already
    idle arrive (DSV4 DEP8, 128 sessions, cadence 1: another rank is mid-run at 57% of arrivals
    with the thinning, 64% without it, 49% simulated)."""
    x, td, span, ext, k, gaps = (rate_per_rank_rps, decode_step_s, span_s, extension_s, chunks,
                                 gaps_s)
    f_run = min(x * float(np.mean(span)), 1.0)
    h = ext / np.maximum(k, 1.0)  # the run's chunk extension per chunk step
    seen = span
    if gaps is not None:
        # closed loop: a run stretches every lock-stepped step to td + h, so the sessions
        # decoding anywhere finish at td / (td + h) of their pace; those already idle arrive
        # as before, but none rejoin them while it lasts (arrivals_kept)
        idle = arrivals_kept(gaps, span)
        seen = span * (idle + (1.0 - idle) * td / (td + h))
        kept = float(seen.sum()) / max(float(span.sum()), 1e-30)
        f_run = f_run * kept / max(f_run * kept + 1.0 - f_run, 1e-30)
    q = 1.0 - (1.0 - f_run) ** (dp - 1)
    order = np.argsort(h)
    cum = np.cumsum(seen[order]) / max(float(seen.sum()), 1e-30)
    edges = np.searchsorted(cum, np.linspace(0.0, 1.0, RUN_HEIGHTS + 1)[1:-1])
    groups = np.split(np.arange(len(h)), edges)
    w_sorted = seen[order]
    heights = np.array([np.average(h[order][g], weights=w_sorted[g]) if len(g) else 0.0
                        for g in groups])
    hw = np.array([w_sorted[g].sum() for g in groups]) / max(float(w_sorted.sum()), 1e-30)
    phase = (np.arange(RUN_PHASES) + 0.5) / RUN_PHASES
    in_run = (phase[None, :] * (interval * td + heights[:, None]) + heights[:, None]).ravel()
    in_w = (q * hw[:, None] / RUN_PHASES * np.ones(RUN_PHASES)[None, :]).ravel()
    quiet = phase * interval * td
    quiet_w = np.full(RUN_PHASES, (1.0 - q) * busy / RUN_PHASES)
    offsets = np.r_[0.0, quiet, in_run]
    weights = np.r_[(1.0 - q) * (1.0 - busy), quiet_w, in_w]
    keep = weights > 0  # one rank (q = 0): the in-run points carry nothing; the TTFT law's
    # histograms run over requests x offsets
    return (offsets[keep], weights[keep] / weights.sum(),
            q * float(np.sum(hw * heights)))
