"""The law of TTFT (time to first token) at a solved state.

FCFS (no threshold): each request's own prefill time outside the queue, against the queue's
wait (model.serve.finite_source: M/G/1 by the Pollaczek-Khinchine transform, or the closed
loop's finite source), with the mixtures over the first step (another rank mid-run at arrival
or not), over merging into the predecessor's last step, and over the next prompt's chunk in the
own last step. With a threshold: the own chunks at the step time plus the other prefills'
extensions landing in the same steps (compound shot noise over the own window, self-excited in
wall time, masked by the own chunk on lock-stepped ranks), after the wait for a prefill slot.

`ttft_law` builds the law once per state and admission wait; `TtftLaw.distribution(sel)` gives
the law of any subset of requests (their own prefill against the queue of the whole sample),
which the E2E law pairs with each window bin.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from model.serve.busiest_rank import others_above
from model.serve.finite_source import fcfs_wait_pmf
from model.serve.queueing import (
    compound_shot_pmf,
    excitation_shape,
    expected_max_poisson,
    quantiles_from_pmf,
    split_bins_each,
)
from model.serve.rank_engine import window_bin_index
from model.serve.rate_solver import SolvedRate
from model.serve.threshold_prefill import run_excitation

QUANTILES = (0.5, 0.9, 0.99)  # the percentiles every law reports
TTFT_GRID = 2**18
SHARED_GRID = 2**13  # threshold mode: cells of each own-window bin's law


@dataclass(frozen=True)
class FcfsWait:
    """The FCFS queue's wait on the TTFT grid k·dt: rffts (zero-padded to 2 TTFT_GRID) of its
    pmf f(w) past the atom, of f(w) exp(-x w), and of both times P(L < w) (L the predecessor's
    last step); the atom: the probability an arrival finds the server idle."""

    dt: float
    hats: tuple
    idle: float


@dataclass(frozen=True)
class TtftLaw:
    """TTFT of a solved state at one admission wait (`admit_wait_s`, added to every request):
    the FCFS wait (None without one) or the threshold mode's per-own-window-bin laws."""

    state: SolvedRate
    admit_wait_s: float
    wait: FcfsWait | None
    shared_bins: tuple | None  # threshold: per bin (its requests, grid, pmf)

    def distribution(self, sel=None) -> tuple[np.ndarray, np.ndarray]:
        """(grid, pmf) of TTFT over the requests `sel` (indices into the sample; all by
        default), their own prefill against the queue of the whole sample."""
        if self.shared_bins is not None:
            return _mixed_bins(self.shared_bins, len(self.state.threshold.shots.own_s), sel)
        base, late, plain, tilted, merge = _own_ttft(self.state, self.admit_wait_s, sel)
        if self.wait is None:  # no wait: the tilted part counts in full
            order = np.argsort(base)
            return base[order], (plain + tilted)[order]
        dt, hats, idle = self.wait.dt, self.wait.hats, self.wait.idle
        # Prompts that found the server idle (the wait's atom `idle`) keep their own steps;
        # those that waited w merge into their predecessor's last step with probability
        # merge P(L < w), then take `late`. Four parts: (plain, tilted) weights against the
        # wait f and its tilt f exp(-x w), each split into kept and merged.
        kept = split_bins_each(base / dt, (plain, tilted, -plain * merge, -tilted * merge),
                               TTFT_GRID)
        moved = split_bins_each(late / dt, (plain * merge, tilted * merge), TTFT_GRID)
        parts = (kept[0], kept[1], kept[2] + moved[0], kept[3] + moved[1])
        own_hat = sum(np.fft.rfft(part, 2 * TTFT_GRID) * hat
                      for part, hat in zip(parts, hats, strict=True))
        pmf = np.fft.irfft(own_hat, 2 * TTFT_GRID)[:TTFT_GRID]
        pmf = np.maximum(pmf + idle * (parts[0] + parts[1]), 0.0)
        return np.arange(TTFT_GRID) * dt, pmf / pmf.sum()


def ttft_law(st: SolvedRate, admit_wait_s: float) -> TtftLaw:
    """The TTFT law of `st` with `admit_wait_s` added to every request."""
    if st.threshold is not None:
        return TtftLaw(st, admit_wait_s, None, _shared_bins(st, admit_wait_s))
    p = st.fcfs
    if p.utilization <= 0 or p.mean_wait_s <= 0:
        return TtftLaw(st, admit_wait_s, None, None)
    return TtftLaw(st, admit_wait_s, _fcfs_wait(st, admit_wait_s), None)


def ttft_quantiles(law: TtftLaw, distribution) -> tuple[np.ndarray, float]:
    """(QUANTILES of TTFT, mean TTFT) from the law's (grid, pmf) over all requests."""
    grid, pmf = distribution
    st, p = law.state, law.state.prefill
    mean = float(np.mean(p.ttft_base_s)) + law.admit_wait_s + p.mean_wait_s * p.wait_scale
    mean += float(np.mean(st.before_prefill_s))
    mean += p.shared_steps_mean_s
    return quantiles_from_pmf(pmf, grid, QUANTILES), mean


def _own_ttft(st: SolvedRate, admit_wait: float, sel=None):
    """FCFS: (values, values after a wait, weights, tilted weights, merge probabilities) of the
    TTFT outside the queue's wait W, per request of `sel` (all by default), with the mixtures
    over a shared last step and another rank mid-run. The last step is shared when someone
    arrived during W or the own steps before it (tau): with probability 1 - exp(-x (W + tau)),
    so the TTFT law is the wait's pmf f(w) against `weights` plus f(w) exp(-x w) against
    `tilted`; taking the mean probability for every W would put the prompts that never waited a
    next prompt's chunk long. A prompt that waited starts in its predecessor's last step: a
    step shorter when that step has room for its last chunk (merge), and a one-chunk prompt
    leaves the next one less room (merged_next_chunk_extension_s)."""
    p, td = st.fcfs, st.decode_step_s
    first = p.first

    def pick(a):
        a = np.broadcast_to(a, p.ttft_base_s.shape)
        return a if sel is None else a[sel]

    base = pick(p.ttft_base_s) + admit_wait
    base = base + pick(st.before_prefill_s)
    late = base - td
    merge = pick(p.merge)
    weights = np.full(len(base), 1.0 / len(base))
    free = pick(p.no_arrival)
    tilted = np.r_[weights * free, -weights * free]
    weights = np.r_[0.0 * weights, weights]
    base = np.r_[base, base + pick(p.next_chunk_extension_s)]
    late = np.r_[late, late + pick(p.merged_next_chunk_extension_s)]
    merge = np.r_[merge, merge]
    # the mixture over the first step: another rank mid-run at arrival or not
    off = np.broadcast_to(first.offsets_s[None, :], (len(base), len(first.offsets_s)))
    if first.own_slot_extension_s is not None:  # the own first chunk hides below the slot
        own = pick(first.first_chunk_extension_s)
        own = np.r_[own, own] if len(base) == 2 * len(own) else own
        off = off - np.minimum(first.own_slot_extension_s[None, :], own[:, None])
    base = ((base - p.extra_s)[:, None] + off).ravel()
    # a prompt that merged rides in its predecessor's last step: no slot of its own
    late = np.repeat(late - p.extra_s, len(first.offsets_s))
    weights = (weights[:, None] * first.weights[None, :]).ravel()
    merge = np.repeat(merge, len(first.offsets_s))
    tilted = (tilted[:, None] * first.weights[None, :]).ravel()
    return base, late, weights, tilted, merge


def _fcfs_wait(st: SolvedRate, admit_wait: float) -> FcfsWait:
    """The FCFS wait on the TTFT grid, sized on every request's own TTFT so that subsets share
    it."""
    p, x = st.fcfs, st.rate_per_rank_rps
    base = _own_ttft(st, admit_wait)[0]
    service = p.queue_service_s
    t_max = max(4.0 * float(service.max()), 1.5 * float(base.max())) \
        + 40.0 * p.mean_wait_s / max(p.utilization, 0.05)
    dt = t_max / TTFT_GRID
    wait, busy = fcfs_wait_pmf(service, p.utilization, dt, TTFT_GRID, st.session_gaps_s, x,
                               p.decoding, p.extra_s)
    grid = np.arange(TTFT_GRID) * dt
    if p.wait_scale != 1.0:  # Kingman: bursty arrivals stretch the wait
        cdf = np.interp(grid / p.wait_scale, grid, np.cumsum(wait))
        wait = np.diff(cdf, prepend=0.0)
    idle = min(1.0 - busy, float(wait[0]))
    waited = wait - idle * (grid == 0.0)
    tilted = waited * np.exp(-x * grid)
    # P(the predecessor's last step is shorter than the wait)
    merged = np.searchsorted(np.sort(p.last_step_s), grid, side="right") / len(p.last_step_s)
    hats = tuple(np.fft.rfft(f, 2 * TTFT_GRID) for f in (waited, tilted, waited * merged,
                                                          tilted * merged))
    return FcfsWait(dt, hats, idle)


def _mixed_bins(bins: tuple, n: int, sel=None) -> tuple[np.ndarray, np.ndarray]:
    """Threshold mode: the TTFT law of the requests `sel` (of n), their own-window bins' laws
    mixed by how many of them each bin holds."""
    keep = None
    if sel is not None:
        keep = np.zeros(n, bool)
        keep[sel] = True
    grids, masses = [], []
    for members, grid, conv in bins:
        count = len(members) if keep is None else int(keep[members].sum())
        if count:
            grids.append(grid)
            masses.append(conv * count)
    grid, mass = np.concatenate(grids), np.concatenate(masses)
    order = np.argsort(grid, kind="stable")
    return grid[order], mass[order] / mass.sum()


def _shared_bins(st: SolvedRate, shift: float) -> tuple:
    """Threshold mode: per bin of own window (steps), its requests, its grid and the TTFT pmf of
    its requests: own chunks + the other prefills' extensions landing in the own steps.

    Runs arrive in wall time, so the step clock sees them self-excited: a longer step lets more
    arrive. Processor sharing with a state-dependent step td + N h has a negative-binomial N
    (index of dispersion 1 / (1 - eta), eta = 1 - td / tbar) and mean sojourn E[N] / x; three
    terms carry that here. (1) The runs present at arrival are time-weighted by their height
    over td, not over the mean step. (2) Their number is negative binomial: a Gamma-mixed rate
    with that overdispersion, averaged over the window. (3) Open loop: a prompt in flight
    lengthens every step it shares, so new runs start at lam (td + h_own) / td during it (mean
    field). A closed loop thins (1) and (2) by E[min(gap, D)] / D over each run's span D and
    keeps of (3) only the wall clock: new runs start at lam (tbar + h_own) / tbar per own step,
    without the excitation (the idle pool that could arrive is small)."""
    thr, td, tbar = st.threshold, st.decode_step_s, st.mean_step_s
    sh, gaps = thr.shots, st.session_gaps_s
    lam, heights, k, steps_own, own = sh.rate_per_step, sh.heights_s, sh.steps, sh.own_steps, \
        sh.own_s
    h_own = np.maximum(own - steps_own * td, 0.0) / np.maximum(steps_own, 1.0)
    own = own + st.before_prefill_s
    which = window_bin_index(np.maximum(steps_own, 1.0), steps_own.max() + 2)
    # the runs present at arrival drew arrivals over their own spans
    eta = run_excitation(tbar, td, gaps, k) if thr.excite else 0.0
    bias = 1.0 + heights / (tbar * (1.0 - eta))
    n = SHARED_GRID
    slot = thr.slot_wait  # the wait for a prefill slot, before the own steps
    wait_top = slot.quantile(1.0 - 1e-6) if slot is not None else 0.0
    out = []
    for b in np.unique(which):  # each window bin on its own grid (their spans differ by 1e3x)
        sel = which == b
        # the runs landing in the own admitting steps: those of its span and of the interval - 1
        # steps before each (the own steps' exposure, model.serve.threshold_prefill)
        win = float(np.median(steps_own[sel])) + sh.interval - 1.0
        # open loop: new runs start at lam (td + h_own) / td while this prompt is in flight; a
        # closed loop's idle pool is finite and not left excited, but arrives in wall time over
        # the own steps, h_own longer than the mean step (see the docstring)
        mult = 1.0 + (thr.excite * float(h_own[sel].mean()) / td if gaps is None
                      else float(h_own[sel].mean()) / tbar)
        y_max = lam * mult * win * float((heights * k).mean()) * 6.0 + \
            float((heights * np.minimum(k, win)).max()) * 2.0
        dt = (float(own[sel].max()) + shift + y_max + wait_top) / n
        seen = heights
        if thr.pile is not None:  # the own chunk masks the other ranks' below its height
            c, m, dp = thr.pile.chunk_extension_s, thr.pile.chunks_per_rank, thr.pile.ranks
            chunk = (own[sel] - td * steps_own[sel]) / np.maximum(
                st.balance.runs.chunks[sel], 1.0)
            pick = np.linspace(0, len(chunk) - 1, min(len(chunk), 400)).astype(int)
            seen = heights * float(np.mean(others_above(chunk[pick], c, m, dp))) / (
                c * expected_max_poisson(m, dp))
        pmf = compound_shot_pmf(lam * mult, seen, k, win, dt, n, bias / mult,
                                excitation_shape(eta, lam, seen, k, win))
        hist = np.bincount(np.minimum(((own[sel] + shift) / dt).astype(int), n - 1),
                           minlength=n).astype(float)
        if wait_top > 0:
            hist = np.fft.irfft(np.fft.rfft(hist, 2 * n) * np.fft.rfft(slot.pmf(dt, n), 2 * n),
                                2 * n)[:n]
        conv = np.fft.irfft(np.fft.rfft(pmf, 2 * n) * np.fft.rfft(hist, 2 * n), 2 * n)[:n]
        conv = np.maximum(conv, 0.0)
        out.append((np.flatnonzero(sel), np.arange(n) * dt, conv / max(conv.sum(), 1e-300)))
    return tuple(out)
