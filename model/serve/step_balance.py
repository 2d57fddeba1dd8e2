"""The decode batch and the step times at one request rate: the engine's fixed point.

Per DP rank at x requests/s: `B` running decodes at the decode context, step time
`T_d = step_time_s(0, 0, B, c_d)`; each request's prefill extends the steps its chunks ride in
by E in all (model.serve.rank_engine.prefill_runs), so the mean step (= mean TPOT) is
`T = T_d + extension per step`, and Little's law on the decoding requests closes the loop:
`B = x E[o - 1] T`. `solve_balance` iterates B (secant, damped iteration as the fallback);
`solve_mean_step` solves T at each B, which is itself a fixed point where lock-stepped ranks
wait for the busiest (any rank's prefill slows every rank):

- FCFS on one rank or unaligned ranks: a rank holds one prefill at a time, its chunks filling
  the budget, so 1 - (1 - p)^dp of the steps carry one;
- FCFS on lock-stepped ranks: the slot picture of model.serve.lockstep;
- with a threshold each rank carries a Poisson number of chunks in an admitting step, and the
  step lasts as long as the busiest rank's (model.serve.busiest_rank.AdmittingStep).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from model.serve.busiest_rank import AdmittingStep, shared_chunk_cost
from model.serve.lockstep import LockstepSlots, SlotGrid
from model.serve.queueing import expected_max_poisson
from model.serve.rank_engine import PrefillRuns, RankEngine


@dataclass(frozen=True)
class WarmStart:
    """Where the last solve landed, the next one's first guess: its rate and decode batch (a
    rate of 0: none yet), and the FCFS queue's merged share."""

    rate_per_rank_rps: float = 0.0
    decode_batch: float = 0.0
    merged_share: float = 0.0


@dataclass(frozen=True)
class StepBalance:
    """The solved decode batch and step times at one per-rank request rate."""

    rate_per_rank_rps: float
    decode_batch: float  # time-average running decodes per rank
    decode_step_s: float
    mean_step_s: float  # inf: no fixed point (prefill fills every step)
    chunk_tokens: float  # per-request chunk: the threshold, or the budget decodes leave
    free_tokens: float  # the budget the decodes leave
    runs: PrefillRuns
    slots: LockstepSlots | None  # FCFS on lock-stepped ranks
    slot_grid: SlotGrid | None  # ... the slot picture's grid where the mean step settled
    admitting_step: AdmittingStep | None  # threshold mode on lock-stepped ranks

    @property
    def prefill_share(self) -> float:
        """Share of step time spent on prefill."""
        t = self.mean_step_s
        return 1.0 - self.decode_step_s / t if np.isfinite(t) and t > 0 else 1.0

    @property
    def stable(self) -> bool:
        return bool(np.isfinite(self.mean_step_s)) and self.mean_step_s > 0

    def engine_busy(self, dp: int) -> float:
        """Probability a step is in flight: the engine idles when nothing decodes or prefills on
        any rank (lock-stepped ranks step together while one of them has work)."""
        x, k = self.rate_per_rank_rps, self.runs.chunks
        return 1.0 - np.exp(-dp * (self.decode_batch + x * float(k.mean()) * self.mean_step_s))

    def own_steps(self, interval: int) -> np.ndarray:
        """Steps a prompt's own chunks span: with prefill_schedule_interval N its k chunks run N
        steps apart, N (k - 1) + 1 steps (the wait for the first prefill slot, (N - 1) / 2
        steps, is outside)."""
        return interval * (np.maximum(self.runs.chunks, 1.0) - 1.0) + 1.0


def solve_balance(eng: RankEngine, rate_per_rank_rps: float, warm: WarmStart) -> StepBalance:
    """Decode batch <-> step time fixed point at `rate_per_rank_rps` (x), from `warm`'s guess."""
    x = rate_per_rank_rps
    b = max(x * eng.mean_decode_steps * eng.decode_step_s(1.0), 0.0)
    if warm.rate_per_rank_rps > 0:  # warm start from the nearest rate solved before
        b = warm.decode_batch * x / warm.rate_per_rank_rps
    prev = None
    for _ in range(80):
        bal = _balance_at(eng, x, b)
        tbar = bal.mean_step_s
        if not np.isfinite(tbar) or tbar <= 0:
            break
        new_b = x * eng.mean_decode_steps * tbar
        if abs(new_b - b) <= 1e-3 * max(b, 1.0):
            break
        # secant on new_b(b) - b once two points exist (damped iteration before and as the
        # fallback): the decode batch grows slowly with itself, so this lands in 2-3 steps
        h = new_b - b
        nxt = 0.3 * b + 0.7 * new_b
        if prev is not None and h != prev[1]:
            cand = b - h * (b - prev[0]) / (h - prev[1])
            if 0.0 <= cand <= 4.0 * max(new_b, b, 1.0):
                nxt = cand
        prev = (b, h)
        b = nxt
    else:  # no convergence in 80 steps: the batch moved on past the last evaluation
        return _with_batch(bal, b)
    return bal


def _with_batch(bal: StepBalance, b: float) -> StepBalance:
    return StepBalance(bal.rate_per_rank_rps, b, bal.decode_step_s, bal.mean_step_s,
                       bal.chunk_tokens, bal.free_tokens, bal.runs, bal.slots, bal.slot_grid,
                       bal.admitting_step)


def _balance_at(eng: RankEngine, x: float, b: float) -> StepBalance:
    """The step times at x requests/s per rank and decode batch b: each request's chunks and
    extension, the mean step."""
    pol = eng.policy
    cap, interval = pol.chunk_cap, pol.prefill_schedule_interval
    c_free = max(float(pol.max_num_batched_tokens) - b, 1.0)
    # per-request chunk: the threshold (the prompts the budget cannot hold wait for a slot,
    # model.serve.slot_queue), or without one the budget the decodes leave
    rate = min(cap, c_free)
    runs = eng.prefill_runs(b, rate)
    td = eng.decode_step_s(b)
    k, ext = runs.chunks, runs.extension_s
    slots = shared = None
    if np.isinf(cap) and eng.dp > 1:
        full = runs.full_chunks
        slots = LockstepSlots(full, np.where(full > 0, (ext - runs.last_chunk_extension_s)
                                             / np.maximum(full, 1.0), 0.0),
                              runs.last_chunk_extension_s, td, interval, eng.dp,
                              shared_chunk_cost(eng, rate, b), runs.last_chunk_tokens, rate)
    if not np.isinf(cap) and eng.dp > 1:
        shared = AdmittingStep(eng, runs, rate, b, c_free)
    tbar, grid = solve_mean_step(x, float(k.mean()), float(ext.mean()), td, interval, eng.dp,
                                 np.isinf(cap), slots, shared)
    return StepBalance(x, b, td, tbar, rate, c_free, runs, slots, grid, shared)


def solve_mean_step(rate_per_rank_rps: float, mean_chunks: float, mean_extension_s: float,
                    decode_step_s: float, interval: int, dp: int, fcfs: bool,
                    slots: LockstepSlots | None = None, shared: AdmittingStep | None = None):
    """(mean step, slot grid): the mean engine step T = T_d + the prefill extension per step,
    where any lock-stepped rank's prefill slows every rank (unaligned: 1 - (1 - p)^dp of steps;
    aligned by the cadence: prefill only on every interval-th step; FCFS on dp > 1 ranks:
    `slots`, whose grid where the fixed point settles comes back with it; with a threshold on
    dp > 1 ranks: `shared`). Fixed point in the step time itself, by secant (exact in one step
    where the map is linear, as with one rank), plain iteration as the fallback."""
    tol = 1e-9 if slots is None else 1e-5  # the slot picture lives on a grid
    x, td, mean_k, mean_e = rate_per_rank_rps, decode_step_s, mean_chunks, mean_extension_s

    def g(tbar: float, kept):
        """One map of the fixed point, with what it kept (the slot grid, the counts table)."""
        if slots is not None:
            law = slots.law(x, tbar, kept)
            return law.mean_step_s, law.grid
        if fcfs:  # one prefill at a time per rank, its chunks fill the budget: equal heights
            p_rank = min(x * mean_k * tbar * interval, 1.0)
            per_slot = x * mean_e * tbar * interval / max(p_rank, 1e-12)  # extension | busy
            return td + (1.0 - (1.0 - p_rank) ** dp) * per_slot / interval, None
        m = x * mean_k * tbar * interval
        if shared is not None:
            ext, kept = shared.extension_s(m, kept)
            return td + ext / interval, kept
        return td + mean_e / max(mean_k, 1e-12) * expected_max_poisson(m, dp) / interval, None

    t0 = td
    g0, kept = g(td, None)
    t1 = g0
    for _ in range(100):
        if not np.isfinite(t1) or t1 > 1e6 * td:
            return float("inf"), _grid(kept, slots)
        g1, kept = g(t1, kept)
        if not np.isfinite(g1) or g1 > 1e6 * td:
            return float("inf"), _grid(kept, slots)
        h0, h1 = g0 - t0, g1 - t1
        if abs(h1) < tol * max(t1, 1e-9):
            return g1, _grid(kept, slots)
        t2 = t1 - h1 * (t1 - t0) / (h1 - h0) if h1 != h0 else g1
        if not td <= t2 <= 1e6 * td:
            t2 = g1  # no fixed point in reach (or secant overshoot): plain iteration
        t0, g0, t1 = t1, g1, t2
    return t1, _grid(kept, slots)


def _grid(kept, slots) -> SlotGrid | None:
    return kept if slots is not None else None
