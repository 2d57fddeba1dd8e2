"""TTFT and TPOT distributions of the serving closed form (model.serve.engine), from its steady state.

TTFT: own prefill time, the FCFS wait (Pollaczek-Khinchine, model.serve.finite_source in a closed loop) or,
with a threshold, the other prefills landing in the own steps (compound shot noise, masked by
the own chunk on lock-stepped ranks). TPOT: decode windows of each output length see a
compound shot process of prefill runs (plus the FCFS backlog and, on lock-stepped FCFS ranks,
the packed-prompt floor of model.serve.lockstep) and the decode batch's fluctuation.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from model.serve.finite_source import fcfs_wait_pmf
from model.serve.queueing import (
    compound_shot_pmf,
    expected_max_occupancy,
    expected_max_poisson,
    expected_min,
    quantiles_from_cdf,
    quantiles_from_pmf,
    shot_noise_var,
    split_bins,
)

if TYPE_CHECKING:
    from model.serve.engine import _Engine, _State

QUANTILES = (0.5, 0.9, 0.99)

TTFT_GRID = 2**18
E2E_TTFT_GROUPS = 5  # TTFT laws by output length the E2E law pairs (`_e2e_interactivity`)
# FCFS: TTFT quantiles where the E2E law splits the backlog a request's decode window sees
E2E_SOJOURN_SLICES = (0.5, 0.8, 0.9, 0.95)
TPOT_GRID = 4096
WINDOW_BINS = 20
# FCFS lock-stepped ranks: clusters covering a step this deep leave a quiet slot e^-20 of the
# time (the agreement's DEP rows reach 1.5; saturated agentx-v1 DEP8, 590+ sessions, 3e4)
COVERED_DEPTH = 20.0


def _ttft_distribution(st: _State, admit_wait: float, sel=None) -> tuple[np.ndarray, np.ndarray]:
    """(grid, pmf) of TTFT: own prefill time (+ FCFS M/G/1 wait, exact P-K transform); with a
    threshold, own chunks at the decode step time + the other prefills' extensions landing in
    the same steps (compound Poisson over a window of the request's own chunk count).
    `sel` (indices into the request mix): the TTFT law of those requests only, their own
    prefill against the queue of the whole mix (same grid and wait law)."""
    if st.shots is not None:
        return _ttft_shared(st, admit_wait, sel)
    base, late, plain, tilted, merge = _own_ttft(st, admit_wait, sel)
    if tilted is None:
        tilted = 0.0 * plain
    if st.rho_p <= 0 or st.wait_mean <= 0:  # no wait: the tilted part counts in full
        order = np.argsort(base)
        return base[order], (plain + tilted)[order]
    dt, hats, idle = _wait_law(st, admit_wait)
    # Prompts that found the server idle (the wait's atom `idle`) keep their own steps; those
    # that waited w merge into their predecessor's last step with probability merge P(L < w)
    # (L: that step's length), then take `late`. Four parts: (plain, tilted) weights against
    # the wait f and its tilt f exp(-x w), each split into kept and merged.
    both, moved = np.r_[base, late], np.r_[-merge, merge]
    parts = (split_bins(base / dt, plain, TTFT_GRID), split_bins(base / dt, tilted, TTFT_GRID),
             split_bins(both / dt, np.r_[plain, plain] * moved, TTFT_GRID),
             split_bins(both / dt, np.r_[tilted, tilted] * moved, TTFT_GRID))
    own_hat = sum(np.fft.rfft(part, 2 * TTFT_GRID) * hat for part, hat in zip(parts, hats,
                                                                                 strict=True))
    pmf = np.fft.irfft(own_hat, 2 * TTFT_GRID)[:TTFT_GRID]
    pmf = np.maximum(pmf + idle * (parts[0] + parts[1]), 0.0)
    return np.arange(TTFT_GRID) * dt, pmf / pmf.sum()


def _own_ttft(st: _State, admit_wait: float, sel=None):
    """FCFS: (values, values after a wait, weights, tilted weights) of the TTFT outside the
    queue's wait W, per request of `sel` (all by default), with the mixtures over a shared last
    step and another rank mid-run. The last step is shared when someone arrived during W or the
    own steps before it (tau): with probability 1 - exp(-x (W + tau)), so the TTFT law is the
    wait's pmf f(w) against `weights` plus f(w) exp(-x w) against `tilted` (None without the
    mixture); taking the mean probability for every W put 11% of the prompts that never waited
    a next prompt's chunk (~90 ms) long (AgentX at 48 sessions: P50 +24%). A prompt that waited
    starts in its predecessor's last step: a step shorter when that step has room for its last
    chunk (st.merge), and a one-chunk prompt leaves the next one less room
    (st.tail_ext_late)."""
    n_all = st.ttft_base.shape

    def pick(a):
        a = np.broadcast_to(a, n_all)
        return a if sel is None else a[sel]

    base = pick(st.ttft_base) + admit_wait
    if st.delay is not None:
        base = base + pick(st.delay)
    late = base - (st.td if st.merge is not None else 0.0)
    merge = pick(st.merge if st.merge is not None else 0.0)
    weights = np.full(len(base), 1.0 / len(base))
    tilted = None
    if st.tail_free is not None:
        free = pick(st.tail_free)
        tilted = np.r_[weights * free, -weights * free]
        weights = np.r_[0.0 * weights, weights]
        base = np.r_[base, base + pick(st.tail_ext)]
        late = np.r_[late, late + pick(st.tail_ext_late)]
        merge = np.r_[merge, merge]
    if st.run_offsets is not None:  # mixture: another rank mid-run at arrival or not
        off = np.broadcast_to(st.run_offsets[None, :], (len(base), len(st.run_offsets)))
        if st.run_own_h is not None:  # the own first chunk hides below the slot's height
            first = pick(st.first_ext)
            first = np.r_[first, first] if len(base) == 2 * len(first) else first
            off = off - np.minimum(st.run_own_h[None, :], first[:, None])
        base = ((base - st.extra)[:, None] + off).ravel()
        # a prompt that merged rides in its predecessor's last step: no slot of its own
        late = np.repeat(late - st.extra, len(st.run_offsets))
        weights = (weights[:, None] * st.run_weights[None, :]).ravel()
        merge = np.repeat(merge, len(st.run_offsets))
        if tilted is not None:
            tilted = (tilted[:, None] * st.run_weights[None, :]).ravel()
    return base, late, weights, tilted, merge


def _wait_law(st: _State, admit_wait: float):
    """(dt, rffts zero-padded to 2 TTFT_GRID of the wait's pmf f(w) past its atom, of
    f(w) exp(-x w), and of both times P(L < w), the atom at zero: the probability an arrival
    finds the server idle) of the FCFS wait on the TTFT grid, sized on every request's own TTFT
    so that subsets share it; computed once per state."""
    cached = st._wait_law_cache
    if cached is not None and cached[0] == admit_wait:
        return cached[1:]
    base = _own_ttft(st, admit_wait)[0]
    service = st.ttft_base if st.queue_base is None else st.queue_base
    t_max = max(4.0 * float(service.max()), 1.5 * float(base.max())) \
        + 40.0 * st.wait_mean / max(st.rho_p, 0.05)
    dt = t_max / TTFT_GRID
    wait, busy = fcfs_wait_pmf(service, st.rho_p, dt, TTFT_GRID, st.gaps, st.x, st.decoding,
                               st.extra)
    grid = np.arange(TTFT_GRID) * dt
    if st.wait_scale != 1.0:  # Kingman: bursty arrivals stretch the wait
        cdf = np.interp(grid / st.wait_scale, grid, np.cumsum(wait))
        wait = np.diff(cdf, prepend=0.0)
    idle = min(1.0 - busy, float(wait[0]))
    waited = wait - idle * (grid == 0.0)
    tilted = waited * np.exp(-st.x * grid)
    if st.last_step is not None:  # P(the predecessor's last step is shorter than the wait)
        merged = np.searchsorted(np.sort(st.last_step), grid, side="right") / len(st.last_step)
    else:
        merged = 0.0 * grid
    hats = tuple(np.fft.rfft(f, 2 * TTFT_GRID) for f in (waited, tilted, waited * merged,
                                                          tilted * merged))
    st._wait_law_cache = (admit_wait, dt, hats, idle)
    return dt, hats, idle


def _ttft_shared(st: _State, shift: float, sel=None) -> tuple[np.ndarray, np.ndarray]:
    """Threshold mode: own chunks + the other prefills' extensions landing in the own steps.

    Runs arrive in wall time, so the step clock sees them self-excited: a longer step lets more
    arrive. Processor sharing with a state-dependent step td + N h has a negative-binomial N
    (index of dispersion 1 / (1 - eta), eta = 1 - td / tbar) and mean sojourn E[N] / x; three
    terms carry that here. (1) The runs present at arrival are time-weighted by their height
    over td, not over the mean step. (2) Their number is negative binomial: a Gamma-mixed rate
    with that overdispersion, averaged over the window. (3) Open loop: a prompt in flight
    lengthens every step it shares, so new runs start at lam (td + h_own) / td during it (mean
    field). On fixed 8K prompts at threshold 512 these took P90 / P99 from -19% / -26% of the
    simulation to -3% / +1%. A closed loop thins (1) and (2) by E[min(gap, D)] / D over each
    run's span D and keeps of (3) only the wall clock: new runs start at lam (tbar + h_own) /
    tbar per own step, without the excitation (the full term put AgentX's replayed sample at
    P99 +26% / +34%, where the idle pool that could arrive is small; none put fixed 8K with
    10 s think at P50 -13%, P99 -18%; 2026-12-03: -4.0% / +1.2%)."""
    keep = None
    if sel is not None:  # the TTFT law of these requests: their own-window bins' laws, mixed
        keep = np.zeros(len(st.shots[4]), bool)
        keep[sel] = True
    grids, masses = [], []
    for members, grid, conv in _shared_bins(st, shift):
        count = len(members) if keep is None else int(keep[members].sum())
        if count:
            grids.append(grid)
            masses.append(conv * count)
    grid, mass = np.concatenate(grids), np.concatenate(masses)
    order = np.argsort(grid, kind="stable")
    return grid[order], mass[order] / mass.sum()


def _shared_bins(st: _State, shift: float) -> list:
    """Threshold mode: per bin of own window (steps), its requests, its grid and the TTFT pmf of
    its requests (own time + the other runs' extensions landing in it, `_ttft_shared`);
    computed once per state."""
    cached = st._shared_cache
    if cached is not None and cached[0] == shift:
        return cached[1]
    lam, heights, k, steps_own, own, interval = st.shots
    h_own = np.maximum(own - steps_own * st.td, 0.0) / np.maximum(steps_own, 1.0)
    if st.delay is not None:
        own = own + st.delay
    which = _window_bin_index(np.maximum(steps_own, 1.0), steps_own.max() + 2)
    # the runs present at arrival drew arrivals over their own spans
    eta = _run_excitation(st, k) if st.excite else 0.0
    bias = 1.0 + heights / (st.tbar * (1.0 - eta))
    n = 2**13
    slot = st.slot_law  # the wait for a prefill slot (model.serve.slot_queue), before the own steps
    wait_top = slot.quantile(1.0 - 1e-6) if slot is not None else 0.0
    out = []
    for b in np.unique(which):  # each window bin on its own grid (their spans differ by 1e3x)
        sel = which == b
        # the runs landing in the own admitting steps: those of its span and of the interval - 1
        # steps before each (model.serve.engine: the own steps' exposure)
        win = float(np.median(steps_own[sel])) + interval - 1.0
        # open loop: new runs start at lam (td + h_own) / td while this prompt is in flight; a
        # closed loop's idle pool is finite and not left excited, but arrives in wall time over
        # the own steps, h_own longer than the mean step (see the docstring)
        mult = 1.0 + (st.excite * float(h_own[sel].mean()) / st.td if st.gaps is None
                      else float(h_own[sel].mean()) / st.tbar)
        y_max = lam * mult * win * float((heights * k).mean()) * 6.0 + \
            float((heights * np.minimum(k, win)).max()) * 2.0
        dt = (float(own[sel].max()) + shift + y_max + wait_top) / n
        seen = heights
        if st.lock is not None:  # the own chunk masks the other ranks' below its height
            c, m, dp = st.lock
            chunk = (own[sel] - st.td * steps_own[sel]) / np.maximum(st.k[sel], 1.0)
            pick = np.linspace(0, len(chunk) - 1, min(len(chunk), 400)).astype(int)
            seen = heights * float(np.mean(_others_above(chunk[pick], c, m, dp))) / (
                c * expected_max_poisson(m, dp))
        pmf = compound_shot_pmf(lam * mult, seen, k, win, dt, n, bias / mult,
                                _excitation_shape(eta, lam, seen, k, win))
        hist = np.bincount(np.minimum(((own[sel] + shift) / dt).astype(int), n - 1),
                           minlength=n).astype(float)
        if wait_top > 0:
            hist = np.fft.irfft(np.fft.rfft(hist, 2 * n) * np.fft.rfft(slot.pmf(dt, n), 2 * n),
                                2 * n)[:n]
        conv = np.fft.irfft(np.fft.rfft(pmf, 2 * n) * np.fft.rfft(hist, 2 * n), 2 * n)[:n]
        conv = np.maximum(conv, 0.0)
        out.append((np.flatnonzero(sel), np.arange(n) * dt, conv / max(conv.sum(), 1e-300)))
    st._shared_cache = (shift, out)
    return out


def _others_above(h: np.ndarray, c: float, m: float, dp: int) -> np.ndarray:
    """E[max(h + c N0, c M)] - h: what a lock-stepped step adds to a rank's own chunk of
    extension h when each rank packs a Poisson(m) number of chunks of extension c (N0 on its
    own rank, M the most on any of the other dp - 1): the step waits for the busiest."""
    from scipy.stats import poisson

    n = np.arange(int(m + 12.0 * np.sqrt(m) + 12.0))
    p = poisson.pmf(n, m)
    q = np.diff(np.r_[0.0, poisson.cdf(n, m) ** (dp - 1)])  # pmf of the others' most
    cum_q, cum_jq = np.cumsum(q), np.cumsum(n * q)
    own = np.asarray(h, float)[:, None] + c * n[None, :]  # (h, N0)
    idx = np.clip(np.floor(own / max(c, 1e-300)).astype(int), -1, len(n) - 1)
    below = np.where(idx >= 0, cum_q[np.maximum(idx, 0)], 0.0)
    above_j = cum_jq[-1] - np.where(idx >= 0, cum_jq[np.maximum(idx, 0)], 0.0)
    step = own * below + c * above_j  # E over M of max(own, c M)
    return (step * p[None, :]).sum(axis=1) - np.asarray(h, float)


def _run_excitation(st: _State, k) -> np.ndarray:
    """Per run of k steps, the share eta of a step that draws more arrivals (threshold mode:
    runs arrive in wall time, so a step extended by the others' prefill lets more in). A closed
    loop thins it by E[min(gap, D)] / D over the run's span D."""
    return (1.0 - st.td / st.tbar) * (
        1.0 if st.gaps is None else _arrivals_kept(st.gaps, np.asarray(k, float) * st.tbar))


def _excitation_shape(eta, lam: float, heights, k, win: float) -> float | None:
    """Gamma shape of the run rate seen over a window of `win` steps. The per-step extension of
    self-excited runs has variance lam E[k h^2] / (1 - eta) (eta: the share of the step that
    draws more arrivals, per run; negative binomial where Poisson has 1 / (1 - eta) less), i.e. a
    rate factor of variance lam E[eta / (1 - eta) k h^2] / (lam E[k h])^2; averaged over the window,
    a run of k steps keeps 1 - u / 3 of it (u = win / k <= 1), else 1 / u - 1 / (3 u^2)."""
    mean = lam * float(np.mean(heights * k))
    eta = np.broadcast_to(np.asarray(eta, float), np.shape(heights))
    if not np.any(eta > 0) or mean <= 0:
        return None
    u = win / np.maximum(k, 1.0)
    keep = np.where(u <= 1.0, 1.0 - u / 3.0, 1.0 / u - 1.0 / (3.0 * u * u))
    var = lam * float(np.mean(eta / (1.0 - eta) * k * heights**2 * keep)) / mean**2
    return 1.0 / var if var > 0 else None


def _ttft_quantiles(st: _State, admit_wait: float, law):
    grid, pmf = law
    mean = float(np.mean(st.ttft_base)) + admit_wait + st.wait_mean * st.wait_scale
    if st.delay is not None:
        mean += float(np.mean(st.delay))
    mean += st.shared_steps_mean
    return quantiles_from_pmf(pmf, grid, QUANTILES), mean


def _window_bin_index(w: np.ndarray, top: float) -> np.ndarray:
    """Log-spaced bin (WINDOW_BINS edges from 1 to `top` steps) of each window length."""
    edges = np.unique(np.round(np.geomspace(1, top, WINDOW_BINS + 1)))
    return np.clip(np.searchsorted(edges, w, side="right") - 1, 0, len(edges) - 1)


def _window_bins(w: np.ndarray):
    """Group decode windows (steps) into log-spaced bins: representative window and weight."""
    which = _window_bin_index(w, w.max() + 1)
    reps, weights = [], []
    for b in np.unique(which):
        sel = w[which == b]
        reps.append(float(np.median(sel)))
        weights.append(len(sel))
    return np.array(reps), np.array(weights, float)


def _fcfs_backlog(st: _State, x: float, ttft_law, n_rank: float | None, points: int = 48):
    """FCFS: the prompts queued behind one when its prefill ends, which its decode window then
    sees prefilled: those who arrived on its rank during its sojourn (arrival to first token),
    Poisson of mean x T over the TTFT law (M/G/1: a departure leaves behind the arrivals during
    its sojourn; a closed loop thins it). Returns (means, weights, sojourns T) on `points` TTFT
    quantiles."""
    grid, pmf = ttft_law
    cdf = np.cumsum(pmf) / max(float(pmf.sum()), 1e-300)
    qs = (np.arange(points) + 0.5) / points
    t = quantiles_from_cdf(cdf, grid, qs)
    means = x * t
    if st.gaps is not None:  # closed loop: who arrives stays queued, so long sojourns thin
        means = means * _arrivals_kept(st.gaps, t)
    if n_rank:  # ... and the arrivals are the other sessions' (this one is in the system)
        means = means * max(1.0 - 1.0 / n_rank, 0.0)
    return means, np.full(points, 1.0 / points), t


def _tpot_distributions(eng: _Engine, st: _State, x: float, n_rank: float | None, ttft_law):
    """Per window bin: (window, weight, y grid, pmf of the prefill extension Y seen in the
    window, sd of the window-averaged decode-step time). TPOT = T_d + Y / window + noise."""
    w = eng.o1[eng.o1 >= 1]
    if len(w) == 0:
        return []
    reps, weights = _window_bins(w)
    lam = eng.dp * x * st.tbar  # prefill runs started per step, all ranks (lock-step)
    mean_ext = st.tbar - st.td
    scale = mean_ext / max(lam * float(st.ext.mean()), 1e-30) if mean_ext > 0 else 0.0
    # every run of the mix: a 2,000-run subsample left the threshold-mode TPOT tails to which
    # rare long runs it caught (agentx-pop64-n16-t512 P99 +33% with it, +2% with all).
    # A prefill of k chunks runs on every interval-th step: its extension is spread over
    # k * interval steps, not k (with prefill_schedule_interval 8 that is 8x thinner pulses)
    k = np.maximum(st.k, 1.0) * eng.pol.prefill_schedule_interval
    heights = scale * st.ext / k
    floor = 0.0
    if st.slots is not None:
        # FCFS on lock-stepped ranks (model.serve.lockstep): the short prompts packed on every rank
        # are a floor under every admitting step, and the shots are clusters of overlapping
        # runs (LockstepSlots.run_shots), which never overlap one another: a window starts
        # inside at most one (single_inside; Poisson stacking put the TPOT P99 at cadence 8
        # +50% over the simulator, 2026-12-04). Windows open preferentially inside clusters,
        # so the mean TPOT sits above the mean step (DSV4 DEP8, 128 sessions, cadence 1: the
        # tokens' mean step 85 ms over a 67 ms mean step; simulated 88-94 over 70-75 ms).
        iv = eng.pol.prefill_schedule_interval
        floor_slot, full, h_eff, share_runs = st.slots.run_shots(x, st.tbar)
        floor = min(floor_slot / iv, max(mean_ext, 0.0))
        lam = lam * share_runs
        k = full * iv
        heights = h_eff / iv
    # decode-batch fluctuation: M/G/inf shot noise of decode runs, thinned by the finite
    # session population of a closed loop (binomial instead of Poisson occupancy)
    runs = w[np.linspace(0, len(w) - 1, min(len(w), 2000)).astype(int)]
    var_b = shot_noise_var(x * st.tbar, np.ones(len(runs)), runs, reps) / reps**2
    if n_rank:
        var_b = var_b * max(1.0 - st.b / n_rank, 0.0)
    slope = 0.0
    if st.b > 1:
        slope = (eng.decode_step(st.b + 1.0) - eng.decode_step(st.b - 1.0)) / 2.0
    # Decode windows start when a prefill completes. With a threshold, prefills complete all the
    # time, uniformly in time, so a step extended by h is (T + h) / T times as likely to hold a
    # window start; without one (FCFS on the budget) nothing completes while a prefill holds the
    # budget, so no window starts inside a run, but each opens on the prompts queued behind its
    # own (`_fcfs_backlog`).
    # With lock-stepped DP ranks only a 1/dp share of the runs hold the budget of the window's
    # own rank: the other ranks' prefills complete (and start windows) inside them.
    bias = 1.0 + heights / st.tbar
    # With a threshold the runs are self-excited in step time (a step they extend lets more
    # arrive), so a window's run count is overdispersed: the TTFT law's negative binomial
    # (`_excitation_shape`). Poisson counts had the replayed sample's TPOT tail short (one rank,
    # 32 lanes: P90 / P99 -14.6 / -21.3%, now -8.4 / -2.1%; 2026-12-05): in the simulator 22%
    # of the steps carry prefill, against 31% for a Poisson count of the same mean. On
    # lock-stepped ranks too, where the step waits for the busiest rank (DSV4 DEP8, 128
    # sessions, cadence 1: TPOT P99 -16.5% -> -7.1%); there a prompt's own chunk masks the
    # others' in its TTFT, but a decoding window has none. The start bias stays (T + h) / T:
    # with the TTFT law's h / (T (1 - eta)) 48-lane one-rank P90s read +23-27%.
    eta = _run_excitation(st, k) if st.excite or st.lock is not None else None
    if st.slots is not None:
        # FCFS on lock-stepped ranks a step inside a run lasts td + the run's slot (the other
        # ranks' pieces are masked in it), not the mean step plus the run: at cadence 8 the
        # mean step holds 4x td's worth of the slots' prefill
        bias = (st.td + floor + heights) / st.tbar
    if n_rank and eng.dp > 1:
        # Closed loop, lock-stepped ranks: another rank's long run stretches every step here,
        # so a session arriving during it decodes slowly for H = its decode steps x (td + h)
        # before it idles again. Arrivals thin over min(D, H): a session idle at the run's
        # start arrives within that time with probability E[min(gap, t)] / E[gap], not
        # t / E[gap], so fewer windows start inside long runs. (Measured against the simulator
        # on DSV4 DEP8: the TPOT tails at 32 sessions went from +67% to +1% at P90. On one rank
        # with a threshold it overcorrects, since sessions keep cycling: the branch below.)
        span_s = k * st.td + heights * k
        hold_s = eng.mean_o1 * (st.td + heights)
        bias = 1.0 + (bias - 1.0) * _arrivals_kept(eng.mix.z, np.minimum(span_s, hold_s))
    elif n_rank and st.gaps is not None:
        # Closed loop, one rank: a run stretches every step, so the sessions decoding cycle
        # slower and fewer arrive during it (windows start inside runs at (1 + h / T) of the
        # mean only where the arrivals keep pace). Simulated (agentx-n16-t512-indep, 2 runs
        # of 30,000 s, 2026-12-05): 0.26 arrivals/s during runs of 50+ chunks against 0.32/s
        # overall; the 48-lane TPOT P90s had read +10-12%, now 0-7%.
        bias = 1.0 + (bias - 1.0) * _arrivals_kept_cycling(st.gaps, n_rank / x, st.tbar,
                                                         heights, k)
    backlog = None
    if not np.isfinite(eng.pol.chunk_cap):
        bias = bias * (1.0 - 1.0 / eng.dp)
        backlog = _fcfs_backlog(st, x, ttft_law, n_rank)
    masking = None
    if st.lock is not None:
        # threshold mode on lock-stepped ranks: a step lasts as long as the busiest rank's
        # chunks, not their sum. The runs add up unscaled across ranks (Y), and each window's
        # Y maps to what the busiest rank adds (`_lockstep_masked`): a lone run adds its full
        # height, many at once add about the tallest rank's pile. The scaled sum (the mean
        # right, every run shrunk alike) put the tails long (DSV4 DEP8 at cadence 8, 32
        # sessions: TPOT P99 +38% against the simulator).
        heights = st.ext / k
        # the chunk extension a unit of extension belongs to (size-biased: tall chunks dominate)
        chunk = st.ext / np.maximum(st.k, 1.0)
        masking = (float(np.sum(st.ext * chunk) / max(float(st.ext.sum()), 1e-300)), eng.dp)
    chain = None
    if st.slots is not None:
        # FCFS on lock-stepped ranks the clusters of the shot law stack where the ranks on a
        # run (J) cannot: where runs cover most slots its windows vary too much and skew right
        # (256 DEP8 sessions, cadence 8: TPOT P50 -13.2% of the simulator). J's Markov chain
        # has the mean reversion, not a long cold run's persistence (its P99 -18% there, -39 /
        # -58% at 128 / 32 sessions, cadence 1). Each misses what only raises a quantile where
        # it is the lower, so a window takes the larger of the two at every level: P50 -0.7%
        # at 256 sessions, the tails as before (2026-12-05).
        chain = st.slots.window_chain(x, st.tbar, st.gaps if n_rank else None)
    def window_law(win: float, vb: float, queued) -> tuple[np.ndarray, np.ndarray]:
        """(y, pmf) of the extension a window of `win` steps sees, `queued` the FCFS backlog
        when it opens (`_fcfs_backlog`, or a slice of it)."""
        mean_y = lam * win * float((heights * k).mean())
        var_y = float(shot_noise_var(lam, heights, k, np.array([win]))[0])
        top = float((heights * np.minimum(k, win)).max())
        y_max = mean_y + 12.0 * np.sqrt(var_y) + top
        if queued is not None:
            mean_q = float(np.sum(queued[0] * queued[1]))
            y_max += top * (mean_q + 6.0 * np.sqrt(mean_q) + 1.0)
        sd = abs(slope) * np.sqrt(vb)
        slots = win / eng.pol.prefill_schedule_interval
        if y_max <= 0 and chain is None:
            return np.full(1, floor * win), np.ones(1)
        # FCFS lock-stepped ranks where runs cover every slot: the shot law shrinks to its
        # floor (shots of no height), or its clusters, which never overlap, cover each step
        # COVERED_DEPTH deep (never ending: a share of 1e-21 of the requests opening one, 1e25
        # slots long, at 590 agentx-v1 DEP8 sessions, which put the TPOT P99 at 93.2 ms against
        # 71.9 ms at 575); the chain varies
        if chain is not None and (y_max <= 0 or lam * float(k.mean()) > COVERED_DEPTH):
            return _chain_window(chain, slots, 0.0, sd * win)
        if masking is None:
            y_max += 8.0 * sd * win
        dy = y_max / TPOT_GRID
        pmf = compound_shot_pmf(lam, heights, k, win, dy, TPOT_GRID, bias,
                                None if eta is None else
                                _excitation_shape(eta, lam, heights, k, win),
                                backlog=None if queued is None else queued[:2],
                                single_inside=st.slots is not None)
        y = np.arange(TPOT_GRID) * dy
        if masking is not None:
            pmf, dy = _lockstep_masked(pmf, y, win, eng.pol.prefill_schedule_interval,
                                       *masking, 8.0 * sd * win, st.shared_slot)
            y = np.arange(len(pmf)) * dy
        y, pmf = _with_batch_noise(y, pmf, dy, sd * win)
        y = y + floor * win
        if chain is not None:
            y, pmf = _upper_envelope(y, pmf, *_chain_window(chain, slots, float(y[-1]),
                                                            sd * win))
        return y, pmf

    out = _WindowLaws((win, weight, *window_law(win, vb, backlog), 0.0)
                      for win, weight, vb in zip(reps, weights, var_b, strict=True))
    if backlog is not None:
        out.backlog = backlog
        noise = dict(zip(reps, var_b, strict=True))
        out.law = lambda win, queued: window_law(win, noise[win], queued)
    return out


class _WindowLaws(list):
    """Per window bin (window, weight, y, pmf, sd); with an FCFS backlog also `backlog` (means,
    weights, sojourns) and `law(window, backlog)`, the bin's law under part of it (the E2E law
    pairs a request's TTFT with the backlog its sojourn leaves)."""

    backlog = None
    law = None


def _chain_window(chain, slots: float, span: float, noise_sd: float):
    """(y, pmf) of the extension a window of `slots` admitting slots sees under `chain`, on a
    grid reaching at least `span`, with the decode-batch noise folded in."""
    dz = max(span, chain.span(slots)) / TPOT_GRID
    return _with_batch_noise(np.arange(TPOT_GRID) * dz,
                             _chain_sum_pmf(chain, slots, dz, TPOT_GRID), dz, noise_sd)


def _chain_sum_pmf(chain, slots: float, dz: float, n: int) -> np.ndarray:
    """pmf on the grid k·dz (n points) of the extension summed over `slots` admitting slots
    (whole counts either side, mixed) of `chain` (model.serve.lockstep.SlotChain), from the state
    where the window opens: opens' (P D(theta))^m 1, D the states' transforms."""
    pos = np.arange(chain.pmfs.shape[-1]) * chain.dy / dz
    lo = np.minimum(np.floor(pos).astype(int), n - 1)
    up = np.minimum(lo + 1, n - 1)
    frac = pos - np.floor(pos)
    binned = np.stack([np.bincount(lo, p * (1.0 - frac), 2 * n) + np.bincount(up, p * frac, 2 * n)
                       for p in chain.pmfs])
    phi = np.fft.rfft(binned, axis=1)  # (states, frequencies)
    step = chain.trans[None, :, :] * phi.T[:, None, :]  # P D(theta): column b scaled by phi_b
    whole = int(np.floor(slots))
    rest = slots - whole
    power = np.linalg.matrix_power(step, whole)
    cf = (1.0 - rest) * np.einsum("a,kab->k", chain.opens, power)
    if rest > 0:
        cf = cf + rest * np.einsum("a,kab,kbc->k", chain.opens, power, step)
    out = np.maximum(np.fft.irfft(cf, 2 * n)[:n], 0.0)
    return out / max(out.sum(), 1e-300)


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


def _lockstep_masked(pmf: np.ndarray, y: np.ndarray, win: float, interval: int, c: float,
                     dp: int, headroom: float, slot=None) -> tuple[np.ndarray, float]:
    """(pmf, dy) of the extension a window of `win` steps sees on lock-stepped ranks, from the
    pmf of the runs' unscaled sum Y on grid `y`. Y holds S = Y interval / (win c) chunks of
    extension c per admitting step, all ranks together, spread over the dp ranks as sticky
    sessions spread them (uniformly); the step waits for the busiest rank, so the window sees
    (win / interval) c E[most of S chunks on one rank]: Y for a lone run, far less for many.
    Rebinned on a uniform grid with `headroom` left for the batch noise. Over a Poisson S this
    is the max the mean step takes (model.serve.engine._mean_step, expected_max_poisson). `slot`
    (model.serve.engine._SharedSlot, or None: c per chunk on the busiest rank) prices the step."""
    chunks = y * interval / (win * max(c, 1e-300))
    if slot is None:
        seen = expected_max_occupancy(chunks, dp) * win * c / interval
    else:
        seen = slot.spread(chunks) * win / interval
    dy = max((float(seen[-1]) + headroom) / TPOT_GRID, 1e-300)
    out = np.bincount(np.minimum((seen / dy + 0.5).astype(int), TPOT_GRID - 1), pmf,
                      minlength=TPOT_GRID)
    return out, dy


def _arrivals_kept(gaps: np.ndarray, span_s) -> np.ndarray:
    """E[min(gap, D)] / D: the share of a stationary arrival stream that still arrives during a
    span D when nobody who arrives returns before it ends (closed loop, heavy-tailed gaps)."""
    d = np.maximum(np.asarray(span_s, float), 1e-12)
    return np.minimum(expected_min(np.sort(np.asarray(gaps, float)), d) / d, 1.0)


def _arrivals_kept_cycling(gaps: np.ndarray, cycle_s: float, step: float, heights, k
                           ) -> np.ndarray:
    """Share of a closed loop's arrivals that still come during a run of k steps extended by
    `heights` on one rank, where sessions keep cycling: a session's cycle (`cycle_s`: mean gap Z
    plus active time A) has its active part stretched by s = (step + h) / step, so over a long
    run they arrive at (Z + A) / (Z + A s) of the rate; over a short one those already idle
    arrive as before (`_arrivals_kept`, E[min(gap, D)] / D over the run's D seconds)."""
    z = float(np.mean(gaps))
    active = max(cycle_s - z, 0.0)
    heights = np.asarray(heights, float)
    slowed = (z + active) / np.maximum(z + active * (step + heights) / step, 1e-300)
    return slowed + (1.0 - slowed) * _arrivals_kept(gaps, np.asarray(k, float) * (step + heights))


def _tpot_cdf(st: _State, dists, grid: np.ndarray) -> np.ndarray:
    cdf = np.zeros_like(grid)
    total = sum(d[1] for d in dists)
    for win, weight, y, pmf, _ in dists:
        vals = st.td_seen + y / win
        cdf_b = np.interp(grid, vals, np.cumsum(pmf) / pmf.sum(), left=0.0, right=1.0)
        cdf += weight / total * cdf_b
    return np.maximum.accumulate(np.clip(cdf, 0.0, 1.0))


def _tpot_quantiles(eng, st, x, n_rank, ttft_law):
    dists = _tpot_distributions(eng, st, x, n_rank, ttft_law)
    if not dists:
        return np.full(len(QUANTILES), st.tbar), dists
    hi = max(st.td_seen + float(y[-1]) / win for win, _, y, _, _ in dists)
    lo = max(min(st.td_seen + float(y[0]) / win for win, _, y, _, _ in dists), 0.0)
    # log-spaced too: short windows behind a queued long run reach far beyond the median
    grid = np.unique(np.r_[np.linspace(lo, hi, 2001),
                           np.geomspace(max(lo, 0.05 * st.td_seen, 1e-9), hi, 6001)])
    cdf = _tpot_cdf(st, dists, grid)
    return quantiles_from_cdf(cdf, grid, QUANTILES), dists


def _slo_attainment(st, ttft_law, dists, slo_inter, slo_ttft) -> float:
    ok = 1.0
    if slo_inter and dists:
        ok *= float(_tpot_cdf(st, dists, np.array([1.0 / slo_inter]))[0])
    if slo_ttft:
        grid, pmf = ttft_law
        ok *= float(np.sum(pmf[grid <= slo_ttft]))
    return ok


def _trimmed(law) -> tuple[np.ndarray, np.ndarray, float]:
    """(values, probabilities, top) of a TTFT law without its empty cells; the grid runs far
    past its mass (headroom for the wait), so values are clipped at its 1 - 1e-7 quantile."""
    t_val, t_p = (np.asarray(a, float) for a in law)
    keep = t_p > 0
    t_val, t_p = t_val[keep], t_p[keep] / t_p[keep].sum()
    t_hi = float(t_val[min(np.searchsorted(np.cumsum(t_p), 1.0 - 1e-7), len(t_val) - 1)])
    return np.minimum(t_val, t_hi), t_p, t_hi


def _sojourn_slices(dists):
    """FCFS: [(TTFT from, to, backlog)] splitting the backlog (`_fcfs_backlog`) at the TTFT
    quantiles E2E_SOJOURN_SLICES, so that a request's decode window sees the prompts its own
    sojourn left queued; None without a backlog."""
    if getattr(dists, "law", None) is None:
        return None
    means, weights, sojourn = dists.backlog
    levels = (np.arange(len(means)) + 0.5) / len(means)
    cuts = np.searchsorted(levels, E2E_SOJOURN_SLICES)
    edges = np.r_[-np.inf, 0.5 * (sojourn[cuts - 1] + sojourn[cuts]), np.inf]
    return [(edges[j], edges[j + 1], (means[part], weights[part] / weights[part].sum(),
                                      sojourn[part]))
            for j, part in enumerate(np.split(np.arange(len(means)), cuts))]


def _e2e_ratio(t_val, t_p, t_hi: float, y, pmf, win: float, td: float, q: float):
    """(grid, cdf) of E2EL / OSL for one window bin: TTFT (values, probabilities, top) plus
    win decode steps td plus the window's extension Y (y, pmf), over OSL = win q + 1."""
    h = max(float(y[1] - y[0]) if len(y) > 1 else 0.0, t_hi / 2**14, 1e-9)
    lo_y = float(y[0])
    n_t = int(t_val.max() / h) + 2
    n_y = int((float(y[-1]) - lo_y) / h) + 2
    a = np.bincount((t_val / h).astype(int), t_p, minlength=n_t)
    c = np.bincount(((np.asarray(y) - lo_y) / h).astype(int), pmf / pmf.sum(), minlength=n_y)
    n = n_t + n_y
    z = np.maximum(np.fft.irfft(np.fft.rfft(a, n) * np.fft.rfft(c, n), n), 0.0)
    grid = (np.arange(n) + 0.5) * h + lo_y + win * td
    return grid / (win * q + 1.0), np.cumsum(z) / z.sum()


def _e2e_interactivity(eng: _Engine, st: _State, admit_wait: float, dists) -> np.ndarray:
    """Quantiles of InferenceX AgentX's "E2E normalized interactivity", 1 / pXX of E2EL / OSL
    (its North Star metric: TTFT counts, spread over the request's output), where E2EL = TTFT +
    window x decode step and OSL = window x q + 1 per window bin. Each window bin pairs with the
    TTFT law of its own requests, grouped with neighbouring bins into E2E_TTFT_GROUPS groups of
    about equal requests (long prompts come with long outputs in agentic sessions, and a long
    output dilutes its TTFT; the queue they meet is the whole mix's). With FCFS a request's
    window sees the backlog its own sojourn left (`_sojourn_slices`); otherwise within a bin
    TTFT and the window's steps are independent. Returned in tok/s, in QUANTILES order (P90 =
    the rate 90% of requests get)."""
    if not dists:
        return np.full(len(QUANTILES), np.nan)
    q = eng.q
    idx = np.flatnonzero(eng.o1 >= 1)
    which = _window_bin_index(eng.o1[idx], eng.o1[idx].max() + 1)
    bins = np.unique(which)
    # adjacent window bins share a TTFT law, E2E_TTFT_GROUPS groups of about equal requests
    share = np.cumsum([d[1] for d in dists]) / sum(d[1] for d in dists)
    group = np.minimum((share - 1e-9) * E2E_TTFT_GROUPS, E2E_TTFT_GROUPS - 1).astype(int)
    laws = {}
    parts = []
    slices = _sojourn_slices(dists)
    for g, (win, weight, y, pmf, _) in zip(group, dists, strict=True):
        if g not in laws:
            laws[g] = _trimmed(_ttft_distribution(st, admit_wait,
                                                  idx[np.isin(which, bins[group == g])]))
        t_val, t_p, t_hi = laws[g]
        if slices is None:
            parts.append((*_e2e_ratio(t_val, t_p, t_hi, y, pmf, win, st.td_seen, q), weight))
            continue
        for lo, hi, queued in slices:
            inside = (t_val >= lo) & (t_val < hi)
            mass = float(t_p[inside].sum())
            if mass > 0:
                parts.append((*_e2e_ratio(t_val[inside], t_p[inside] / mass, t_hi,
                                          *dists.law(win, queued), win, st.td_seen, q),
                              weight * mass))
    total = sum(w for _, _, w in parts)
    lo = max(min(float(g[0]) for g, _, _ in parts), 1e-9)
    hi = max(float(g[-1]) for g, _, _ in parts)
    grid = np.geomspace(lo, hi, 8001)
    cdf = sum(w / total * np.interp(grid, g, c, left=0.0, right=1.0) for g, c, w in parts)
    return 1.0 / quantiles_from_cdf(cdf, grid, QUANTILES)
