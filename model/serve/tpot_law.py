"""The law of TPOT (time per output token) at a solved state.

A request's TPOT is the decode step it sees plus Y / window, Y the prefill extension landing in
its window of o - 1 decode steps (binned by window length). Y is a compound shot process: prefill
runs start as Poisson in step time, each of k steps of height h (model.serve.queueing's
compound_shot_pmf, exact by FFT), seen through the window. On top:

- windows open where prefills complete: with a threshold uniformly in time, so a step extended
  by h is (T + h) / T as likely to hold a window start; without one nothing completes inside
  another prefill's run, but each window opens on the prompts queued behind its own (the FCFS
  backlog, `_fcfs_backlog`);
- with a threshold the runs are self-excited in step time (an extended step lets more arrive):
  negative-binomial counts (queueing.excitation_shape). In the simulator 22% of the steps of the
  replayed AgentX sample at 32 lanes carry prefill, against 31% for a Poisson count of the
  same mean;
- lock-stepped ranks: with a threshold a step lasts as long as the busiest rank's chunks
  (`lockstep_masked`); FCFS ranks take their shots from the slot chain's clusters of runs
  (model.serve.lockstep) and the larger of the shot law and the chain's own law at every level;
- the decode batch's fluctuation: Gaussian, its window average from the M/G/inf shot noise of
  decode runs.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from model.serve.busiest_rank import AdmittingStep
from model.serve.lockstep import SlotChain
from model.serve.queueing import (
    arrivals_kept,
    arrivals_kept_cycling,
    compound_shot_pmf,
    excitation_shape,
    expected_max_occupancy,
    quantiles_from_cdf,
    shot_noise_var,
)
from model.serve.rank_engine import RankEngine, window_bin_index
from model.serve.rate_solver import SolvedRate
from model.serve.siblings import (
    Siblings,
    sibling_load,
    subagent_requests,
    with_sibling_decodes,
)
from model.serve.threshold_prefill import run_excitation
from model.serve.ttft_law import QUANTILES

TPOT_GRID = 4096
# FCFS lock-stepped ranks: clusters covering a step this deep leave a quiet slot e^-20 of the
# time (the agreement's DEP rows reach 1.5; saturated agentx-v1 DEP8, 590+ sessions, 3e4)
COVERED_DEPTH = 20.0


@dataclass(frozen=True)
class WindowShots:
    """What every window bin's law shares: the runs as shots (starts per step, per-step
    heights, lengths in steps, each run's window-start bias, its self-excitation eta or None),
    the floor every step carries, the decode step's slope in the batch, the lock-stepped
    threshold masking (mean chunk extension, ranks) and admitting step, the FCFS lock-stepped
    slot chain, whether a window starts inside at most one shot, the prefill cadence."""

    rate_per_step: float
    heights_s: np.ndarray
    steps: np.ndarray
    bias: np.ndarray
    eta: np.ndarray | None
    floor_s: float
    slope_s: float
    masking: tuple | None
    admitting_step: AdmittingStep | None
    chain: SlotChain | None
    single_inside: bool
    interval: int


@dataclass(frozen=True)
class WindowLaw:
    """One window bin: its window (decode steps), weight (requests), the law of Y on y, its
    window-averaged decode batch's variance and, for subagent requests, their siblings."""

    window_steps: float
    weight: float
    y_s: np.ndarray
    pmf: np.ndarray
    batch_var: float = 0.0
    siblings: Siblings | None = None


@dataclass(frozen=True)
class TpotLaw:
    """TPOT of a solved state: per window bin the law of Y, the decode step a decoding request
    sees, and with an FCFS backlog (means, weights, sojourns) what `under` needs to redo a bin's
    law under part of it (the E2E law pairs a request's TTFT with the backlog its sojourn
    leaves)."""

    bins: tuple[WindowLaw, ...]
    decode_step_seen_s: float
    shots: WindowShots | None
    backlog: tuple | None

    def under(self, d: WindowLaw, queued) -> tuple[np.ndarray, np.ndarray]:
        """(y, pmf) of window bin `d`'s Y under the backlog slice `queued`."""
        return window_law(self.shots, d.window_steps, d.batch_var, queued, d.siblings)


def tpot_law(eng: RankEngine, st: SolvedRate, rate_per_rank_rps: float,
             sessions_per_rank: float | None, ttft_dist, decode_step_seen_s: float) -> TpotLaw:
    """The TPOT law at `st` (`sessions_per_rank`: a closed loop's, None for open arrivals), the
    FCFS backlog read off the TTFT law `ttft_dist` (grid, pmf), TPOT measured from the decode
    step a decoding request sees."""
    x, n_rank = rate_per_rank_rps, sessions_per_rank
    decoding = eng.decode_steps >= 1
    w = eng.decode_steps[decoding]
    if len(w) == 0:
        return TpotLaw((), decode_step_seen_s, None, None)
    shots = _window_shots(eng, st, x, n_rank)
    backlog = None
    if st.fcfs is not None:
        backlog = _fcfs_backlog(st, x, ttft_dist, n_rank)
    # decode-batch fluctuation: M/G/inf shot noise of decode runs, thinned by the finite
    # session population of a closed loop (binomial instead of Poisson occupancy)
    runs = w[np.linspace(0, len(w) - 1, min(len(w), 2000)).astype(int)]
    thin = max(1.0 - st.balance.decode_batch / n_rank, 0.0) if n_rank else 1.0
    # subagent requests see their sibling chains beside them (model.serve.siblings)
    sib = sibling_load(eng, st, ttft_dist, decode_step_seen_s, n_rank)
    sub = subagent_requests(eng)
    classes = [(w, None)] if sib is None else [(w[~sub[decoding]], None),
                                               (w[sub[decoding]], sib)]
    bins = []
    for cw, cs in classes:
        if len(cw) == 0:
            continue
        reps, weights = _window_bins(cw)
        var_b = thin * shot_noise_var(x * st.mean_step_s, np.ones(len(runs)), runs,
                                      reps) / reps**2
        bins += [WindowLaw(win, weight, *window_law(shots, win, vb, backlog, cs), vb, cs)
                 for win, weight, vb in zip(reps, weights, var_b, strict=True)]
    return TpotLaw(tuple(bins), decode_step_seen_s, shots, backlog)


def _window_shots(eng: RankEngine, st: SolvedRate, rate_per_rank_rps: float,
                  sessions_per_rank: float | None) -> WindowShots:
    """The shots every window bin's law shares (see WindowShots)."""
    x, n_rank = rate_per_rank_rps, sessions_per_rank
    bal, iv, thr = st.balance, eng.policy.prefill_schedule_interval, st.threshold
    td, tbar, ext = bal.decode_step_s, bal.mean_step_s, bal.runs.extension_s
    lam = eng.dp * x * tbar  # prefill runs started per step, all ranks (lock-step)
    mean_ext = tbar - td
    scale = mean_ext / max(lam * float(ext.mean()), 1e-30) if mean_ext > 0 else 0.0
    # every run of the sample (a subsample leaves the threshold-mode tails to which rare long
    # runs it catches); a prefill of k chunks runs on every interval-th step: its extension is
    # spread over k * interval steps
    k = np.maximum(bal.runs.chunks, 1.0) * iv
    heights = scale * ext / k
    floor = 0.0
    slot_law = None if st.fcfs is None else st.fcfs.slot_law
    if slot_law is not None:
        # FCFS on lock-stepped ranks (model.serve.lockstep): the short prompts packed on every
        # rank are a floor under every admitting step, and the shots are clusters of
        # overlapping runs (LockstepSlots.run_shots), which never overlap one another: a window
        # starts inside at most one (single_inside). Windows open preferentially inside
        # clusters, so the mean TPOT sits above the mean step
        floor_slot, full, h_eff, share_runs = bal.slots.run_shots(slot_law)
        floor = min(floor_slot / iv, max(mean_ext, 0.0))
        lam = lam * share_runs
        k = full * iv
        heights = h_eff / iv
        if k.size == 0:  # every prompt packs into the floor: no run extends a window
            lam, k, heights = 0.0, np.ones(1), np.zeros(1)
    slope = 0.0
    b = bal.decode_batch
    if b > 1:
        slope = (eng.decode_step_s(b + 1.0) - eng.decode_step_s(b - 1.0)) / 2.0
    # with a threshold a window's run count is overdispersed (the TTFT law's negative
    # binomial), also on lock-stepped ranks where the step waits for the busiest rank (a
    # decoding window has no own chunk to mask the others')
    eta = run_excitation(tbar, td, st.session_gaps_s, k) if thr is not None and (
        thr.excite or thr.pile is not None) else None
    bias = _start_bias(eng, st, x, n_rank, heights, k, floor)
    masking = None
    if thr is not None and thr.pile is not None:
        # threshold mode on lock-stepped ranks: a step lasts as long as the busiest rank's
        # chunks, not their sum. The runs add up unscaled across ranks (Y), and each window's
        # Y maps to what the busiest rank adds (`lockstep_masked`): a lone run adds its full
        # height, many at once about the tallest rank's pile
        heights = ext / k
        # the chunk extension a unit of extension belongs to (size-biased: tall chunks dominate)
        chunk = ext / np.maximum(bal.runs.chunks, 1.0)
        masking = (float(np.sum(ext * chunk) / max(float(ext.sum()), 1e-300)), eng.dp)
    chain = None
    if slot_law is not None:
        # FCFS on lock-stepped ranks the shot law's clusters stack where the ranks on a run
        # (J) cannot, so where runs cover most slots its windows vary too much and skew right;
        # J's Markov chain has the mean reversion, not a long cold run's persistence. Each
        # misses what only raises a quantile where it is the lower, so a window takes the
        # larger of the two at every level
        chain = bal.slots.window_chain(slot_law, st.session_gaps_s if n_rank else None)
    return WindowShots(lam, heights, k, bias, eta, floor, slope, masking, bal.admitting_step,
                       chain, slot_law is not None, iv)


def _start_bias(eng: RankEngine, st: SolvedRate, rate_per_rank_rps: float,
                sessions_per_rank: float | None, heights_s: np.ndarray, steps: np.ndarray,
                floor_s: float) -> np.ndarray:
    """Per run (of `steps` steps extended by `heights_s`), how much likelier a window starts in one of its steps than in a mean step.
    Windows start when a prefill completes. With a threshold, prefills complete uniformly in
    time, so a step extended by h is (T + h) / T as likely to hold a window start; without one
    (FCFS on the budget) nothing completes while a prefill holds the budget, so only the other
    lock-stepped ranks' prefills, a 1 - 1/dp share, complete (and start windows) inside a run."""
    x, n_rank, heights, k, floor = (rate_per_rank_rps, sessions_per_rank, heights_s, steps,
                                    floor_s)
    td, tbar = st.decode_step_s, st.mean_step_s
    bias = 1.0 + heights / tbar
    if st.fcfs is not None and st.fcfs.slot_law is not None:
        # FCFS on lock-stepped ranks a step inside a run lasts td + the run's slot (the other
        # ranks' pieces are masked in it), not the mean step plus the run
        bias = (td + floor + heights) / tbar
    if n_rank and eng.dp > 1:
        # closed loop, lock-stepped ranks: another rank's long run stretches every step here,
        # so a session arriving during it decodes slowly for H = its decode steps x (td + h)
        # before it idles again. Arrivals thin over min(D, H): a session idle at the run's start
        # arrives within that time with probability E[min(gap, t)] / E[gap], not t / E[gap],
        # so fewer windows start inside long runs
        span_s = k * td + heights * k
        hold_s = eng.mean_decode_steps * (td + heights)
        bias = 1.0 + (bias - 1.0) * arrivals_kept(eng.sample.gap_s, np.minimum(span_s, hold_s))
    elif n_rank and st.session_gaps_s is not None:
        # closed loop, one rank: a run stretches every step, so the sessions decoding cycle
        # slower and fewer arrive during it (simulated, agentx-n16-t512-indep: 0.26 arrivals/s
        # during runs of 50+ chunks against 0.32/s overall)
        bias = 1.0 + (bias - 1.0) * arrivals_kept_cycling(st.session_gaps_s, n_rank / x, tbar,
                                                          heights, k)
    if not np.isfinite(eng.policy.chunk_cap):
        bias = bias * (1.0 - 1.0 / eng.dp)
    return bias


def window_law(shots: WindowShots, window_steps: float, batch_var: float, queued,
               siblings: Siblings | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(y, pmf) of the extension a window of `window_steps` steps sees, `batch_var` the variance
    of its window-averaged decode batch, `queued` the FCFS backlog when it opens
    (`_fcfs_backlog`, or a slice of it), `siblings` a subagent request's sibling chains (their
    prefill runs join the shots; their decodes shift the law, `with_sibling_decodes`)."""
    if siblings is not None:
        y, pmf = window_law(replace(shots, rate_per_step=shots.rate_per_step
                                    + siblings.runs_per_step), window_steps, batch_var, queued)
        return with_sibling_decodes(y, pmf, window_steps, siblings)
    win, vb = window_steps, batch_var
    lam, heights, k, chain = shots.rate_per_step, shots.heights_s, shots.steps, shots.chain
    mean_y = lam * win * float((heights * k).mean())
    var_y = float(shot_noise_var(lam, heights, k, np.array([win]))[0])
    top = float((heights * np.minimum(k, win)).max())
    y_max = mean_y + 12.0 * np.sqrt(var_y) + top
    if queued is not None:
        mean_q = float(np.sum(queued[0] * queued[1]))
        y_max += top * (mean_q + 6.0 * np.sqrt(mean_q) + 1.0)
    sd = abs(shots.slope_s) * np.sqrt(vb)
    slots = win / shots.interval
    if y_max <= 0 and chain is None:
        return np.full(1, shots.floor_s * win), np.ones(1)
    # FCFS lock-stepped ranks where runs cover every slot: the shot law shrinks to its floor
    # (shots of no height), or its clusters, which never overlap, cover each step COVERED_DEPTH
    # deep (never ending: at saturation a vanishing share of requests would open one, far
    # longer than any window); the chain alone holds
    if chain is not None and (y_max <= 0 or lam * float(k.mean()) > COVERED_DEPTH):
        return _chain_window(chain, slots, 0.0, sd * win)
    if shots.masking is None:
        y_max += 8.0 * sd * win
    dy = y_max / TPOT_GRID
    pmf = compound_shot_pmf(lam, heights, k, win, dy, TPOT_GRID, shots.bias,
                            None if shots.eta is None else
                            excitation_shape(shots.eta, lam, heights, k, win),
                            backlog=None if queued is None else queued[:2],
                            single_inside=shots.single_inside)
    y = np.arange(TPOT_GRID) * dy
    if shots.masking is not None:
        pmf, dy = lockstep_masked(pmf, y, win, shots.interval, *shots.masking,
                                  8.0 * sd * win, shots.admitting_step)
        y = np.arange(len(pmf)) * dy
    y, pmf = _with_batch_noise(y, pmf, dy, sd * win)
    y = y + shots.floor_s * win
    if chain is not None:
        y, pmf = _upper_envelope(y, pmf, *_chain_window(chain, slots, float(y[-1]), sd * win))
    return y, pmf


def lockstep_masked(pmf: np.ndarray, y_s: np.ndarray, window_steps: float, interval: int,
                    chunk_extension_s: float, dp: int, headroom_s: float,
                    slot: AdmittingStep | None = None) -> tuple[np.ndarray, float]:
    """(pmf, dy) of the extension a window of `window_steps` (win) steps sees on lock-stepped
    ranks, from the pmf of the runs' unscaled sum Y on grid `y_s`. Y holds
    S = Y interval / (win c) chunks of extension c = `chunk_extension_s` per admitting step, all ranks together, spread over the dp ranks as sticky
    sessions spread them (uniformly); the step waits for the busiest rank, so the window sees
    (win / interval) c E[most of S chunks on one rank]: Y for a lone run, far less for many.
    Rebinned on a uniform grid with `headroom` left for the batch noise. Over a Poisson S this
    is the max the mean step takes (model.serve.step_balance.solve_mean_step). `slot`
    (model.serve.busiest_rank.AdmittingStep, or None: c per chunk on the busiest rank) prices
    the step."""
    y, win, c = y_s, window_steps, chunk_extension_s
    chunks = y * interval / (win * max(c, 1e-300))
    if slot is None:
        seen = expected_max_occupancy(chunks, dp) * win * c / interval
    else:
        seen = slot.spread(chunks) * win / interval
    dy = max((float(seen[-1]) + headroom_s) / TPOT_GRID, 1e-300)
    out = np.bincount(np.minimum((seen / dy + 0.5).astype(int), TPOT_GRID - 1), pmf,
                      minlength=TPOT_GRID)
    return out, dy


def _chain_window(chain: SlotChain, slots: float, span: float, noise_sd: float):
    """(y, pmf) of the extension a window of `slots` admitting slots sees under `chain`, on a
    grid reaching at least `span`, with the decode-batch noise folded in."""
    dz = max(span, chain.span(slots)) / TPOT_GRID
    return _with_batch_noise(np.arange(TPOT_GRID) * dz, chain.sum_pmf(slots, dz, TPOT_GRID),
                             dz, noise_sd)


def _with_batch_noise(y: np.ndarray, pmf: np.ndarray, dy: float, sd: float):
    """(y, pmf) with the Gaussian decode-batch noise of sd `sd` (in Y units) folded in."""
    if sd <= dy:
        return y, pmf
    half = int(np.ceil(5.0 * sd / dy))
    kern = np.exp(-0.5 * (np.arange(-half, half + 1) * dy / sd) ** 2)
    pmf = np.convolve(pmf, kern / kern.sum())
    return float(y[0]) + (np.arange(len(pmf)) - half) * dy, pmf


def _upper_envelope(y1: np.ndarray, pmf1: np.ndarray, y2: np.ndarray, pmf2: np.ndarray):
    """(grid, pmf) of the larger of two laws' quantiles at every level: the lower cdf."""
    grid = np.union1d(y1, y2)
    cdf = np.minimum(np.interp(grid, y1, np.cumsum(pmf1) / pmf1.sum(), left=0.0, right=1.0),
                     np.interp(grid, y2, np.cumsum(pmf2) / pmf2.sum(), left=0.0, right=1.0))
    return grid, np.diff(np.r_[0.0, cdf])


def _window_bins(w: np.ndarray):
    """Group decode windows (steps) into log-spaced bins: representative window and weight."""
    which = window_bin_index(w, w.max() + 1)
    reps, weights = [], []
    for b in np.unique(which):
        sel = w[which == b]
        reps.append(float(np.median(sel)))
        weights.append(len(sel))
    return np.array(reps), np.array(weights, float)


def _fcfs_backlog(st: SolvedRate, rate_per_rank_rps: float, ttft_dist,
                  sessions_per_rank: float | None, points: int = 48):
    """FCFS: the prompts queued behind one when its prefill ends, which its decode window then
    sees prefilled: those who arrived on its rank during its sojourn (arrival to first token),
    Poisson of mean x T over the TTFT law (M/G/1: a departure leaves behind the arrivals during
    its sojourn; a closed loop thins it). Returns (means, weights, sojourns T) on `points` TTFT
    quantiles."""
    grid, pmf = ttft_dist
    cdf = np.cumsum(pmf) / max(float(pmf.sum()), 1e-300)
    qs = (np.arange(points) + 0.5) / points
    t = quantiles_from_cdf(cdf, grid, qs)
    means = rate_per_rank_rps * t
    if st.session_gaps_s is not None:  # closed loop: who arrives stays queued, so long
        means = means * arrivals_kept(st.session_gaps_s, t)  # sojourns thin
    if sessions_per_rank:  # ... and the arrivals are the other sessions' (this one is in)
        means = means * max(1.0 - 1.0 / sessions_per_rank, 0.0)
    return means, np.full(points, 1.0 / points), t


def tpot_cdf(law: TpotLaw, grid: np.ndarray) -> np.ndarray:
    """cdf of TPOT (per decode step) over requests at `grid`. A bin's mass at grid point y_k,
    k >= 1, stands for the cell around it (split or rounded to the nearest point), so the cdf
    reaches its cumulative sum at the cell's upper edge, half a spacing above y_k: read at y_k
    it would put every quantile half a cell low (at TPOT_GRID cells, TPOT 0.7% short on TP2
    MiniMax M3 at 24 sessions and 4% where the grid is coarse against the spread). The first
    point holds the windows no prefill extends, an atom, read where it is."""
    cdf = np.zeros_like(grid)
    total = sum(d.weight for d in law.bins)
    for d in law.bins:
        vals = law.decode_step_seen_s + d.y_s / d.window_steps
        half = 0.5 * np.diff(vals)
        upper = vals + np.r_[0.0, half[1:], half[-1:]] if len(vals) > 1 else vals
        cdf_b = np.interp(grid, upper, np.cumsum(d.pmf) / d.pmf.sum(), left=0.0, right=1.0)
        cdf += d.weight / total * cdf_b
    return np.maximum.accumulate(np.clip(cdf, 0.0, 1.0))


def tpot_quantiles(law: TpotLaw, mean_step_s: float) -> np.ndarray:
    """QUANTILES of TPOT per decode step (the mean step for every request without a window)."""
    if not law.bins:
        return np.full(len(QUANTILES), mean_step_s)
    seen = law.decode_step_seen_s
    hi = max(seen + float(d.y_s[-1]) / d.window_steps for d in law.bins)
    lo = max(min(seen + float(d.y_s[0]) / d.window_steps for d in law.bins), 0.0)
    # log-spaced too: short windows behind a queued long run reach far beyond the median
    grid = np.unique(np.r_[np.linspace(lo, hi, 2001),
                           np.geomspace(max(lo, 0.05 * seen, 1e-9), hi, 6001)])
    return quantiles_from_cdf(tpot_cdf(law, grid), grid, QUANTILES)


def _window_means(law: TpotLaw):
    """(window, weight, mean TPOT per decode step) of each window bin."""
    return [(d.window_steps, d.weight,
             law.decode_step_seen_s + float(np.sum(d.pmf * d.y_s) / d.pmf.sum()) / d.window_steps)
            for d in law.bins]


def seen_step_s(law: TpotLaw) -> float:
    """Token-weighted mean step over the TPOT law's window bins."""
    bins = _window_means(law)
    return sum(wt * win * m for win, wt, m in bins) / max(sum(wt * win for win, wt, _ in bins),
                                                          1e-300)


def mean_tpot_s(law: TpotLaw, st: SolvedRate) -> float:
    """Mean TPOT over requests (per decode step)."""
    if not law.bins:
        return float(st.mean_step_s + law.decode_step_seen_s - st.decode_step_s)
    bins = _window_means(law)
    return sum(wt * m for _, wt, m in bins) / sum(wt for _, wt, _ in bins)


def decode_step_seen_s(eng: RankEngine, st: SolvedRate, sessions_per_rank: float | None
                       ) -> float:
    """The decode step a decoding request sees. The time-average batch b counts idle time; a
    request that decodes sees itself plus the others decoding (Palm expectation): 1 + b on its
    rank with Poisson arrivals, 1 + b (n - 1) / n with n closed-loop sessions on the rank (each
    decoding with probability b / n). At light load this is 1-2 sequences where b is below one.
    On lock-stepped DP ranks only the own rank carries the extra sequence: the step sees
    dp * b + 1 - b / n decodes in all (the table's per-rank batch b + (1 - b / n) / dp)."""
    b, n_rank = st.balance.decode_batch, sessions_per_rank
    extra = 1.0 - (b / n_rank if n_rank else 0.0)
    return max(eng.decode_step_s(b + max(extra, 0.0) / eng.dp), st.decode_step_s)
