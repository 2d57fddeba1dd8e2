"""Prefill with a threshold (`long_prefill_token_threshold`): prompts run side by side.

Each admitted prompt takes at most `threshold` tokens of an admitting step, so prefills run in
parallel instead of queueing for the whole budget: a prompt's TTFT is its own k chunks at the
step time, plus the other prefills' extensions landing in its steps (compound shot noise over
its window, model.serve.ttft_law), after a wait for one of the prefill slots the budget holds
(budget / mean chunk of them; model.serve.slot_queue). With prefill_schedule_interval N its
chunks run only in admitting steps, N apart, each holding the prefill of the interval's steps.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from model.serve.queueing import arrivals_kept
from model.serve.rank_engine import RankEngine
from model.serve.slot_queue import SlotWait, slot_wait
from model.serve.step_balance import StepBalance


@dataclass(frozen=True)
class Shots:
    """The other prefills as shots in step time: runs started per step (all ranks), each run's
    height per step and length in steps (a subsample of the sample's runs, scaled so their mean
    is the mean step's extension), and per request its own steps and own time."""

    rate_per_step: float
    heights_s: np.ndarray
    steps: np.ndarray
    own_steps: np.ndarray
    own_s: np.ndarray
    interval: int


@dataclass(frozen=True)
class BusiestPile:
    """Lock-stepped ranks: the mean chunk extension and the chunks each rank packs per admitting
    step (Poisson), over `ranks` ranks: a step lasts as long as the busiest rank's pile."""

    chunk_extension_s: float
    chunks_per_rank: float
    ranks: int


@dataclass(frozen=True)
class ThresholdPrefill:
    """The threshold part of a solved state (arrays over the request sample)."""

    ttft_base_s: np.ndarray  # own steps at the mean step, own extension, the interval's wait
    extra_s: float  # the wait for the first admitting step and the step in flight
    mean_wait_s: float  # for a prefill slot
    wait_scale: float
    shots: Shots
    # whether other runs' arrivals answer to longer steps: on one rank; on lock-stepped ranks a
    # prompt's own chunk masks the other ranks' (the step waits for the slowest, not the sum)
    excite: bool
    pile: BusiestPile | None  # lock-stepped ranks
    slot_wait: SlotWait
    utilization: float = 0.0  # no single prefill server
    shared_steps_mean_s: float = 0.0


def solve_threshold(eng: RankEngine, bal: StepBalance, ca2: float,
                    sessions_per_rank: float | None) -> tuple[ThresholdPrefill | None, float]:
    """The threshold part at the balanced steps: (its part of the state, or None past the
    slots' saturation; the token load of the admitting steps)."""
    x, td, tbar = bal.rate_per_rank_rps, bal.decode_step_s, bal.mean_step_s
    k, ext = bal.runs.chunks, bal.runs.extension_s
    interval, dp = eng.policy.prefill_schedule_interval, eng.dp
    own_steps = bal.own_steps(interval)
    # a prompt's chunks run in admitting steps only, each holding the prefill of the interval's
    # steps: its own steps see interval - 1 steps' extension more than the mean step gives its
    # span (the runs that reached the rank while it waited for the slot)
    base = own_steps * tbar + ext + (interval - 1) * (tbar - td)
    extra = (interval - 1) / 2.0 * tbar + _in_flight_s(bal, dp)
    # prefill runs only on every interval-th step, whose budget takes the interval's arrivals
    rho_tok = x * float(eng.sample.uncached_tokens.mean()) * tbar * interval / max(
        bal.free_tokens, 1.0)
    if rho_tok >= 1.0:
        return None, rho_tok
    # below that the slot chain is stable (its load is rho_tok)
    wait = _slot_wait(eng, bal, base, extra, sessions_per_rank)
    pick = np.linspace(0, len(k) - 1, min(len(k), 1500)).astype(int)
    kk = np.maximum(k[pick], 1.0) * interval  # others' runs span k * interval steps
    # lock-stepped ranks wait for the slowest, so the others' runs add up to the mean step's
    # extension (tbar - td), not to the sum of their heights
    lam = dp * x * tbar
    shot_scale = (tbar - td) / max(lam * float(ext[pick].mean()), 1e-30)
    shots = Shots(lam, shot_scale * ext[pick] / kk, kk, own_steps, own_steps * td + ext,
                  interval)
    pile = BusiestPile(float(ext.mean()) / max(float(k.mean()), 1e-12),
                       x * float(k.mean()) * tbar * interval, dp) if dp > 1 else None
    return ThresholdPrefill(base, extra, wait.mean,
                            (ca2 + 1.0) / 2.0 if sessions_per_rank is None else 1.0, shots,
                            dp == 1,
                            pile, wait), rho_tok


def _in_flight_s(bal: StepBalance, dp: int) -> float:
    """Mean wait for the step in flight at arrival: its mean residual E[T^2] / (2 E[T]), with
    the per-step extension's second moment from the runs (k steps of height E / k each), only
    while a step is in flight."""
    x, td, tbar = bal.rate_per_rank_rps, bal.decode_step_s, bal.mean_step_s
    k, ext = bal.runs.chunks, bal.runs.extension_s
    h = ext / np.maximum(k, 1.0)
    ext2 = x * tbar * float(np.mean(k * h * h))
    busy = bal.engine_busy(dp)
    return busy * (td * td + 2.0 * td * (tbar - td) + ext2) / (2.0 * tbar)


def _slot_wait(eng: RankEngine, bal: StepBalance, base_s: np.ndarray, extra_s: float,
               sessions_per_rank: float | None) -> SlotWait:
    """The wait for a prefill slot (model.serve.slot_queue). A prompt holds one for its k
    admitting steps; the budget holds free / E[u] * E[k] of them, which saturates where the
    prompts' tokens fill it (a last partial chunk leaves its room to the next prompt). In a
    closed loop a session spends the rest of its cycle outside: gap, decode, reload and the
    prefill time not in a slot."""
    x, tbar, k = bal.rate_per_rank_rps, bal.mean_step_s, bal.runs.chunks
    held = k * eng.policy.prefill_schedule_interval * tbar
    slots = bal.free_tokens * float(k.mean()) / max(float(eng.sample.uncached_tokens.mean()),
                                                    1e-12)
    if sessions_per_rank is None:
        return slot_wait(slots, held, x)
    outside = float(eng.sample.gap_s.mean()) + eng.admitted_time_s(
        float(base_s.mean()), extra_s, tbar) - float(held.mean())
    return slot_wait(slots, held, x, sessions_per_rank, max(outside, 1e-9))


def run_excitation(mean_step_s: float, decode_step_s: float, gaps_s: np.ndarray | None,
                   steps) -> np.ndarray:
    """Per run of `steps` steps, the share eta of a step that draws more arrivals (runs arrive
    in wall time, so a step extended by the others' prefill lets more in). A closed loop
    (`gaps_s`) thins it by E[min(gap, D)] / D over the run's span D."""
    return (1.0 - decode_step_s / mean_step_s) * (
        1.0 if gaps_s is None else arrivals_kept(gaps_s, np.asarray(steps, float) * mean_step_s))
