"""The distribution laws of the closed-form serving model (papers/research/theory.md §6), each a
pure function: M/G/1 wait laws, shot-noise (Campbell) moments and compound laws of
Poisson-started work seen through a window (derived: §6 + standard Campbell theorem), maxima of
Poisson occupancies. The mean waits (Kingman, Pollaczek-Khinchine) are in model.serve.mean_waits.
"""

from __future__ import annotations

import functools

import numpy as np

from model.perf.expert_balance import expected_max_normal
from model.specs.probability import poisson_cdf, poisson_pmf


def window_overlap_sq(k, w):
    """∫ overlap(x)² dx of a run of k consecutive steps sliding past a window of w steps
    (Campbell's second moment of a rectangular shot): m²M - m³/3 with m = min, M = max."""
    k, w = np.asarray(k, float), np.asarray(w, float)
    m, big = np.minimum(k, w), np.maximum(k, w)
    return m * m * big - m**3 / 3.0


def shot_noise_var(rate_per_step: float, heights, lengths, windows):
    """Variance of the total work seen in windows of `windows` steps, when runs of `lengths`
    steps with per-step `heights` start as a Poisson process of `rate_per_step` (Campbell).
    heights/lengths: samples over runs (averaged); windows: array; returns one value per window.
    """
    h2 = np.asarray(heights, float) ** 2
    g = window_overlap_sq(np.asarray(lengths, float)[None, :], np.asarray(windows, float)[:, None])
    return rate_per_step * (g * h2[None, :]).mean(axis=1)


def mg1_wait_pmf(service_s, rho: float, dt: float, n: int) -> tuple[np.ndarray, float]:
    """Waiting-time pmf on the grid k·dt (k < n) of a FCFS single server fed by Poisson
    arrivals (M/G/1), and the probability an arrival finds it busy (ρ): Pollaczek-Khinchine
    transform, W a geometric(ρ) number of equilibrium residual service times, density
    (1 - F(x)) / E[S], summed by FFT. A closed loop's queue: model.serve.finite_source."""
    s = np.sort(np.asarray(service_s, float))
    out = np.zeros(n)
    if rho <= 0 or s.mean() <= 0:
        out[0] = 1.0
        return out, 0.0
    m = 2 * n  # zero padding keeps the circular sums from wrapping
    # the residual's mass in cell [i dt, (i + 1) dt), half to each end (all at the left point
    # the wait comes out half a cell short)
    resid = residual_mass(s, np.arange(n + 1) * dt)
    resid = 0.5 * (resid + np.r_[0.0, resid[:-1]])
    resid = resid / max(resid.sum(), 1e-300)
    r_hat = np.fft.rfft(resid, m)
    w_hat = (1.0 - rho) / (1.0 - rho * r_hat)
    pmf = np.maximum(np.fft.irfft(w_hat, m)[:n], 0.0)
    return pmf / max(pmf.sum(), 1e-300), rho


def residual_mass(sorted_s: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Mass of the equilibrium residual of a lifetime S (density P(S > y) / E[S]) in each cell
    between `edges`, from its sorted sample."""
    return np.diff(expected_min(sorted_s, edges)) / max(float(sorted_s.mean()), 1e-300)


def split_bins(pos: np.ndarray, weights, n: int) -> np.ndarray:
    """Mass (weights, default 1) of points at fractional grid positions `pos`, each split
    between its two neighbouring grid points in proportion (the mean position is kept, where
    flooring loses half a cell on average); positions past the grid go to its last point."""
    return split_bins_each(pos, (weights,), n)[0]


SPLIT_SLICE = 1 << 20  # points binned at a time: temporaries stay small and are reused


def split_bins_each(pos: np.ndarray, weights: tuple, n: int) -> list[np.ndarray]:
    """`split_bins` of the same positions under each of several weight vectors (None: 1),
    locating the points once, a slice of them at a time."""
    pos = np.asarray(pos, float).ravel()
    weights = tuple(None if w is None else np.broadcast_to(np.asarray(w, float), pos.shape)
                    for w in weights)
    whole = [np.zeros(n + 1) for _ in weights]
    shifted = [np.zeros(n + 1) for _ in weights]
    for start in range(0, max(pos.size, 1), SPLIT_SLICE):
        part = np.clip(pos[start:start + SPLIT_SLICE], 0.0, n - 1.0)
        low = part.astype(int)  # part >= 0: truncation is the floor
        frac = part - low
        for i, weights_i in enumerate(weights):
            w = None if weights_i is None else weights_i[start:start + SPLIT_SLICE]
            whole[i] += np.bincount(low, w, minlength=n + 1)
            # the part at the upper neighbour is the lower one's shifted by a cell
            shifted[i] += np.bincount(low, frac if w is None else w * frac, minlength=n + 1)
    return [(w - s)[:n] + np.r_[0.0, s[: n - 1]] for w, s in zip(whole, shifted, strict=True)]


def expected_min(sorted_s: np.ndarray, x, weights: np.ndarray | None = None,
                 side: str = "right") -> np.ndarray:
    """E[w min(S, x)] over the empirical sample (sorted ascending; `weights` in the same order,
    default 1: then ∫_0^x P(S > y) dy), at each x, by prefix sums."""
    x = np.asarray(x, float)
    w = np.ones_like(sorted_s) if weights is None else weights
    idx = np.searchsorted(sorted_s, x, side=side)
    cws = np.concatenate([[0.0], np.cumsum(w * sorted_s)])
    cw = np.concatenate([[0.0], np.cumsum(w)])
    return (cws[idx] + x * (cw[-1] - cw[idx])) / len(sorted_s)


def compound_shot_pmf(rate_per_step: float, heights, lengths, window: float, dt: float,
                      n: int, start_bias=None, rate_shape: float | None = None,
                      backlog=None, single_inside: bool = False) -> np.ndarray:
    """pmf on the grid k·dt of the work Y seen by a window of `window` steps when runs of
    `lengths` steps (per-step `heights`, one sample per run type, equally likely) start as a
    Poisson process of `rate_per_step` (exact compound Poisson through its Lévy measure + FFT).

    Relative to a run of k steps, a window starting before it overlaps it by a length uniform on
    [0, m] (m = min(k, w)) over m start positions and by m over max(w - k, 0) more; a window
    starting inside it overlaps by a length uniform on [0, m] over m positions and by m over
    max(k - w, 0) more. `start_bias` (per run, default 1) weights windows starting inside a run:
    windows start at request times, uniform in time, so long (extended) steps catch more starts.
    `rate_shape` alpha: the rate is scaled by a Gamma(alpha, 1/alpha) factor (mean 1) held over
    the window, so run counts are negative binomial, not Poisson (None: Poisson);
    E[exp(R z)] = (1 - z / alpha)^-alpha replaces exp(z) in the transform.
    `backlog` (means, weights): runs already queued when the window opens, on top of the Poisson
    ones: a Poisson number of mean `means[i]` with probability `weights[i]`, each of a type drawn
    uniformly and overlapping the window fully (each run on its own, capped at the window).
    `single_inside`: runs never overlap one another (busy periods of one server), so a window
    starts inside at most one: with probability p = min(Λ, 1), Λ the mass of starting inside
    (Poisson would stack a second on top with probability ~Λ² / 2), and then without a backlog
    of its own, the run in progress holding the slots.
    """
    h = np.asarray(heights, float)
    k = np.asarray(lengths, float)
    bias = np.ones_like(h) if start_bias is None else np.asarray(start_bias, float)
    share = rate_per_step / len(h)
    m = np.minimum(k, window)
    top = h * m  # largest contribution of each run
    before = (m * share, np.maximum(window - k, 0.0) * share)
    inside = (m * share * bias, bias * np.maximum(k - window, 0.0) * share)
    size = 2 * n
    if single_inside:
        mass, lo, up, frac = _levy_mass(top, *before, dt, n)
        mass_in = _levy_mass(top, *inside, dt, n)[0]
        lam_in = float(mass_in.sum())
        p_in = min(lam_in, 1.0)
        z = np.fft.rfft(mass, size) - mass.sum()
        f_in = np.fft.rfft(mass_in, size) / max(lam_in, 1e-300)
    else:
        mass, lo, up, frac = _levy_mass(top, before[0] + inside[0], before[1] + inside[1], dt, n)
        z = np.fft.rfft(mass, size) - mass.sum()
        p_in, f_in = 0.0, 0.0
    cf = np.exp(z) if rate_shape is None else (1.0 - z / rate_shape) ** -rate_shape
    queued = 1.0
    if backlog is not None:
        first = np.zeros(n)
        np.add.at(first, lo, (1 - frac) / len(h))
        np.add.at(first, up, frac / len(h))
        means, weights = (np.asarray(a, float) for a in backlog)
        zq = np.fft.rfft(first, size) - 1.0
        queued = (weights[:, None] * np.exp(means[:, None] * zq[None, :])).sum(axis=0)
    cf = cf * ((1.0 - p_in) * queued + p_in * f_in)
    pmf = np.maximum(np.fft.irfft(cf, size)[:n], 0.0)
    return pmf / max(pmf.sum(), 1e-300)


def _levy_mass(top: np.ndarray, uni_mass: np.ndarray, atom: np.ndarray, dt: float, n: int):
    """Lévy measure on the grid k·dt of runs contributing uniformly on [0, top] (mass
    `uni_mass`) or exactly `top` (mass `atom`); returns it and each run's bins at `top` (lower,
    upper, fraction in the upper)."""
    levy = np.zeros(n + 1)
    # runs narrower than a bin put their uniform part at its mean top / 2 (split between bins
    # 0 and 1): as a density over [0, top] it would cancel huge terms
    narrow = np.where(top < dt, uni_mass, 0.0)
    point = np.zeros(n)
    point[1] = float(np.sum(narrow * top / (2 * dt)))
    point[0] = float(narrow.sum()) - point[1]
    uni_mass = uni_mass - narrow
    # uniform parts: mass spread over [0, top]
    dens = np.where(top > 0, uni_mass / np.maximum(top, 1e-300), 0.0)
    hi = top / dt
    full = np.floor(hi).astype(int)
    np.add.at(levy, np.zeros_like(full), dens * dt)
    np.add.at(levy, np.minimum(full, n), -dens * dt)
    ramp = np.cumsum(levy)[:n]
    frac = hi - full
    tail = np.zeros(n)
    np.add.at(tail, np.minimum(full, n - 1), dens * dt * frac)
    mass = ramp + tail + point
    # atoms at `top`, split between neighbours to keep the mean
    lo = np.minimum(full, n - 1)
    up = np.minimum(lo + 1, n - 1)
    np.add.at(mass, lo, atom * (1 - frac))
    np.add.at(mass, up, atom * frac)
    return mass, lo, up, frac


def quantiles_from_cdf(cdf: np.ndarray, grid: np.ndarray, qs) -> np.ndarray:
    """The first grid values whose (non-decreasing) cdf reaches each of `qs`."""
    return grid[np.minimum(np.searchsorted(cdf, np.asarray(qs, float)), len(grid) - 1)]


def quantiles_from_pmf(pmf: np.ndarray, grid: np.ndarray, qs) -> np.ndarray:
    cdf = np.cumsum(pmf)
    return quantiles_from_cdf(cdf / cdf[-1], grid, qs)


def expected_max_poisson(mean, n: int):
    """E[max of n iid Poisson(mean)] = sum_k (1 - F(k)^n), F the Poisson cdf (= mean for n 1);
    beyond a mean of 400 the normal limit mean + sqrt(mean) E[max of n N(0, 1)]. `mean` a
    number (returns a float) or an array (returns an array of its shape)."""
    m = np.maximum(np.asarray(mean, float), 0.0)
    if n <= 1:
        out = m
    else:
        out = np.empty_like(m)
        big = m > 400.0
        if np.any(big):
            out[big] = m[big] + np.sqrt(m[big]) * expected_max_normal(n)
        small = m[~big]
        if small.size:
            top = float(small.max())
            k = np.arange(int(top + 12.0 * np.sqrt(top) + 12.0))
            out[~big] = np.sum(1.0 - poisson_cdf(k, small[..., None]) ** n, axis=-1)
    return float(out) if np.ndim(mean) == 0 else out


# balls at which expected_max_occupancy is evaluated: every count to 64, then geometric (the
# curve is smooth there), interpolated between; exact up to EXACT_OCCUPANCY balls per bin
_OCCUPANCY_KNOTS = np.unique(np.r_[np.arange(65), np.round(np.geomspace(64, 2**40, 400))])
EXACT_OCCUPANCY = 32.0  # the normal limit is within 1% beyond


def expected_max_occupancy(balls, bins: int) -> np.ndarray:
    """E[most balls in one bin] when `balls` balls fall uniformly into `bins` bins (multinomial
    occupancy), linear between whole counts: `balls` for up to one ball, about balls / bins +
    sqrt(balls / bins) E[max of bins N(0, 1)] for many. Poissonized it is
    expected_max_poisson: E over balls ~ Poisson(bins m) gives E[max of bins Poisson(m)]."""
    s = np.maximum(np.asarray(balls, float), 0.0)
    if bins <= 1:
        return s
    top = float(s.max()) if s.size else 0.0
    knots = _OCCUPANCY_KNOTS[: int(np.searchsorted(_OCCUPANCY_KNOTS, top)) + 1]
    values = np.array([_max_occupancy(int(k), bins) for k in knots])
    return np.interp(s, knots, values)


@functools.lru_cache(maxsize=4096)
def _max_occupancy(balls: int, bins: int) -> float:
    """Exact E[max occupancy] for whole counts: P(max <= r) = P(every one of `bins` iid
    Poisson(t) is <= r | their sum is `balls`), t = balls / bins (any t gives the same; this one
    keeps the numbers in range), read off the r-truncated pmf's convolution power; the normal
    limit beyond EXACT_OCCUPANCY balls per bin."""
    if balls <= 1:
        return float(balls)
    t = balls / bins
    if t > EXACT_OCCUPANCY:  # the normal limit, as in expected_max_poisson
        return t + np.sqrt(t) * expected_max_normal(bins)
    r_lo = int(np.ceil(t))
    r_hi = min(balls, int(t + 12.0 * np.sqrt(t) + 12.0))
    pmf = poisson_pmf(np.arange(r_hi + 1), t)
    r = np.arange(r_lo, r_hi + 1)
    rows = np.where(np.arange(r_hi + 1)[None, :] <= r[:, None], pmf[None, :], 0.0)
    size = 1 << int(np.ceil(np.log2(bins * r_hi + 1)))
    power = np.fft.irfft(np.fft.rfft(rows, size, axis=1) ** bins, size, axis=1)[:, balls]
    at_most = np.clip(power / poisson_pmf(balls, balls), 0.0, 1.0)
    # E[max] = sum over r >= 0 of P(max > r): 1 for every r below balls / bins
    return float(r_lo + np.sum(1.0 - at_most))


def ascending(values) -> np.ndarray:
    """`values` as a float array in ascending order, sorted only when it is not already (the
    solvers pass the same sorted sample many times)."""
    a = np.asarray(values, float)
    return a if a.size < 2 or bool(np.all(a[1:] >= a[:-1])) else np.sort(a)


def arrivals_kept(gaps_s: np.ndarray, span_s) -> np.ndarray:
    """E[min(gap, D)] / D: the share of a stationary arrival stream that still arrives during a
    span D when nobody who arrives returns before it ends (closed loop, heavy-tailed gaps)."""
    d = np.maximum(np.asarray(span_s, float), 1e-12)
    return np.minimum(expected_min(ascending(gaps_s), d) / d, 1.0)


def arrivals_kept_cycling(gaps_s: np.ndarray, cycle_s: float, step_s: float, heights_s,
                          steps) -> np.ndarray:
    """Share of a closed loop's arrivals that still come during a run of `steps` steps extended
    by `heights_s` on one rank, where sessions keep cycling: a session's cycle (`cycle_s`: mean
    gap Z plus active time A) has its active part stretched by s = (step + h) / step, so over a
    long run they arrive at (Z + A) / (Z + A s) of the rate; over a short one those already idle
    arrive as before (`arrivals_kept`, E[min(gap, D)] / D over the run's D seconds)."""
    z = float(np.mean(gaps_s))
    active = max(cycle_s - z, 0.0)
    heights_s = np.asarray(heights_s, float)
    slowed = (z + active) / np.maximum(z + active * (step_s + heights_s) / step_s, 1e-300)
    return slowed + (1.0 - slowed) * arrivals_kept(gaps_s,
                                                   np.asarray(steps, float) * (step_s + heights_s))


def excitation_shape(eta, rate_per_step: float, heights, lengths, window: float
                     ) -> float | None:
    """Gamma shape of the run rate seen over a window of `window` steps (the `rate_shape` of
    `compound_shot_pmf`). The per-step work of self-excited runs has variance
    lam E[k h^2] / (1 - eta) (eta: the share of the step that draws more arrivals, per run;
    negative binomial where Poisson has 1 / (1 - eta) less), i.e. a rate factor of variance
    lam E[eta / (1 - eta) k h^2] / (lam E[k h])^2; averaged over the window, a run of k steps
    keeps 1 - u / 3 of it (u = window / k <= 1), else 1 / u - 1 / (3 u^2). None: no
    excitation (Poisson counts)."""
    lam, k = rate_per_step, lengths
    mean = lam * float(np.mean(heights * k))
    eta = np.broadcast_to(np.asarray(eta, float), np.shape(heights))
    if not np.any(eta > 0) or mean <= 0:
        return None
    u = window / np.maximum(k, 1.0)
    keep = np.where(u <= 1.0, 1.0 - u / 3.0, 1.0 / u - 1.0 / (3.0 * u * u))
    var = lam * float(np.mean(eta / (1.0 - eta) * k * heights**2 * keep)) / mean**2
    return 1.0 / var if var > 0 else None
