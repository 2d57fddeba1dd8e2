"""Mean engine step of lock-stepped DP ranks with the prefill threshold off (FCFS on the budget).

Every rank waits for the slowest in each step. Per admitting step (every
`prefill_schedule_interval`-th), a rank either holds one full-budget chunk of a long prompt
(a run) or packs the short last pieces of the prompts that reached it since it was last free.
Two things set the mean step, and the simpler picture (each rank's mean chunk height,
independent ranks) misses both:

- a step lasts as long as its busiest rank, so with unequal heights (a cold 8K chunk at long
  context against a warm 2K turn) the slowest of several busy ranks is what counts;
- steps holding a run are long, so they collect more of the other ranks' arrivals, and those
  pieces land in the next run step, where the run masks them. The running ranks' own arrivals
  wait for a quiet step.

Measured on DeepSeek V4 Pro DEP8 on B300 under the 64-session AgentX population at 128 sessions
(model.serving_agreement, 2026-12-02): the serving fixed point's mean step is 88.5 / 66.8 ms
for prefill_schedule_interval 1 / 8, against 86.1 / 67.2 ms simulated; the mean-height picture
gave 99.1 / 53.0 ms.
"""

from __future__ import annotations

import numpy as np

GRID = 4096


def _binned(values: np.ndarray, weights: np.ndarray | None, dy: float) -> np.ndarray:
    """Mass of `values` (weighted) on the grid k·dy, the top bin holding everything beyond."""
    return np.bincount(np.minimum(np.round(values / dy).astype(int), GRID - 1), weights,
                       minlength=GRID)[:GRID]


def _cdf(values: np.ndarray, weights: np.ndarray | None, dy: float) -> np.ndarray:
    pmf = _binned(values, weights, dy)
    return np.cumsum(pmf) / max(float(pmf.sum()), 1e-300)


def _mean(cdf: np.ndarray, dy: float) -> float:
    return float(np.sum(1.0 - cdf) * dy)


class LockstepSlots:
    """Per-rank admitting-slot picture of one request mix: `full` chunks per request (each of
    extension `full_ext`) and a last piece of extension `last_ext` (0 when the prompt ends on a
    full chunk)."""

    def __init__(self, full: np.ndarray, full_ext: np.ndarray, last_ext: np.ndarray,
                 td: float, interval: int, dp: int):
        # the whole mix: an evenly strided subsample of a session-ordered mix is biased (4,000
        # of 5,242 AgentX turns put 5% more run chunks in and the step 8% higher)
        self.full = np.asarray(full, float)
        self.full_ext = np.asarray(full_ext, float)
        self.last = np.asarray(last_ext, float)
        self.td, self.interval, self.dp = td, interval, dp
        self.mean_full = float(self.full.mean())
        self.run_w = self.full / max(float(self.full.sum()), 1e-300)
        self.last_mean = float(self.last.mean())
        self.last_m2 = float(np.mean(self.last**2))
        self.top = max(float(self.full_ext.max()), float(self.last.max()), 1e-12)
        self._cached = None

    def _grid(self, y_max: float):
        """(dy, run-height cdf, piece transform) on a grid kept while it reaches y_max: a
        grid that moved with every step time would make the fixed-point map jitter."""
        if self._cached is None or self._cached[0] * GRID < y_max:
            dy = 1.5 * y_max / GRID
            self._cached = (dy, _cdf(self.full_ext, self.run_w, dy), self._piece_transform(dy))
        return self._cached

    def _piece_transform(self, dy: float) -> np.ndarray:
        return np.fft.rfft(_binned(self.last, None, dy) / len(self.last), 2 * GRID) - 1.0

    @staticmethod
    def _packed_cdf(mu: float, piece: np.ndarray) -> np.ndarray:
        """cdf of the extension of a Poisson(mu) number of last pieces packed into one step
        (`piece`: their transform less one, on the slot's grid)."""
        pmf = np.fft.irfft(np.exp(mu * piece), 2 * GRID)[:GRID]
        pmf = np.maximum(pmf, 0.0)
        return np.minimum(np.cumsum(pmf) / max(float(pmf.sum()), 1e-300), 1.0)

    def mean_step(self, x: float, t: float) -> float:
        """The mean step implied by a mean step `t` at x requests/s per rank (one map of the
        fixed point in the step time)."""
        return self._slots(x, t)[0]

    def run_shots(self, x: float, t: float):
        """For the TPOT law at mean step `t`: (quiet floor per admitting slot, chunks per run,
        each run's extension per chunk above the others, share of requests that run). A run
        chunk of height h adds E[(h - M)+] = integral_0^h P(M <= y) dy to a slot whose other
        ranks alone would take M (their packed pieces, or their own run chunk): what it masks
        adds nothing, and two overlapping runs add about the taller one, not both."""
        _, f_quiet, dy, f_others = self._slots(x, t)
        floor = _mean(f_quiet, dy)
        above = np.r_[0.0, np.cumsum(f_others) * dy]
        runs = self.full >= 1
        h_eff = np.interp(self.full_ext[runs] / dy, np.arange(GRID + 1), above)
        return floor, self.full[runs], h_eff, float(runs.mean())

    def _slots(self, x: float, t: float):
        dp, iv, td = self.dp, self.interval, self.td
        p = min(x * self.mean_full * t * iv, 0.999)  # a rank holds a run chunk in a slot
        p_run = 1.0 - (1.0 - p) ** dp  # some rank does: a run slot
        runners = dp * p / max(p_run, 1e-12)
        others = max(dp - runners, 0.0)
        per_slot = x * t * iv  # last pieces reaching a rank per slot, on average
        width = per_slot / max(1.0 - p_run, 1e-3)
        y_max = 1.05 * max(self.top, width * self.last_mean
                           + 10.0 * np.sqrt(width * self.last_m2) + self.top)
        dy, f_run, piece = self._grid(y_max)
        f_a = ((1.0 - p + p * f_run) ** dp - (1.0 - p) ** dp) / max(p_run, 1e-12)
        x_run = _mean(f_a, dy)
        for _ in range(3):  # a run slot draws arrivals over its own length
            mu_run = x * (iv * td + x_run)
            x_run = _mean(f_a * self._packed_cdf(mu_run, piece) ** others, dy)
        mu_quiet = max(per_slot - p_run * mu_run * others / dp, 0.0) / max(1.0 - p_run, 1e-12)
        f_quiet = self._packed_cdf(mu_quiet, piece) ** dp
        x_quiet = _mean(f_quiet, dy)
        f_others = f_quiet * (1.0 - p + p * f_run) ** (dp - 1)  # the other ranks' max
        return td + (p_run * x_run + (1.0 - p_run) * x_quiet) / iv, f_quiet, dy, f_others
