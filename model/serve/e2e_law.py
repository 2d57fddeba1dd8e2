"""InferenceX AgentX's E2E normalized interactivity: 1 / pXX of E2EL / OSL, TTFT included.

E2EL = TTFT + window x decode step (+ the window's prefill extension) and OSL = window x tokens
per step + 1, per window bin of the TPOT law. Each window bin pairs with the TTFT law of its own
requests, grouped with neighbouring bins into E2E_TTFT_GROUPS groups of about equal requests
(long prompts come with long outputs in agentic sessions, and a long output dilutes its TTFT;
the queue they meet is the whole sample's). With FCFS a request's window sees the backlog its
own sojourn left (`_sojourn_slices`); otherwise within a bin TTFT and the window's steps are
independent.
"""

from __future__ import annotations

import numpy as np

from model.serve.queueing import quantiles_from_cdf
from model.serve.rank_engine import RankEngine, window_bin_index
from model.serve.tpot_law import TpotLaw
from model.serve.ttft_law import QUANTILES, TtftLaw

E2E_TTFT_GROUPS = 5  # TTFT laws by output length the E2E law pairs
# FCFS: TTFT quantiles where the E2E law splits the backlog a request's decode window sees
E2E_SOJOURN_SLICES = (0.5, 0.8, 0.9, 0.95)


def e2e_interactivity(eng: RankEngine, ttft: TtftLaw, tpot: TpotLaw) -> np.ndarray:
    """QUANTILES of the E2E normalized interactivity in tok/s (P90 = the rate 90% of requests
    get); NaN without decode windows."""
    if not tpot.bins:
        return np.full(len(QUANTILES), np.nan)
    q, td_seen = eng.tokens_per_step, tpot.decode_step_seen_s
    idx = np.flatnonzero(eng.decode_steps >= 1)
    top = eng.decode_steps[idx].max() + 1
    which = window_bin_index(eng.decode_steps[idx], top)
    bins, counts = np.unique(which, return_counts=True)
    # adjacent window bins share a TTFT law, E2E_TTFT_GROUPS groups of about equal requests
    # (a TPOT bin, of either request class, takes its window's group)
    share = np.cumsum(counts) / counts.sum()
    group = np.minimum((share - 1e-9) * E2E_TTFT_GROUPS, E2E_TTFT_GROUPS - 1).astype(int)
    group_of = dict(zip(bins.tolist(), group.tolist(), strict=True))
    laws = {}
    parts = []
    slices = _sojourn_slices(tpot)
    for d in tpot.bins:
        b = int(window_bin_index(np.array([d.window_steps]), top)[0])
        g = group_of.get(b, group_of[int(bins[np.argmin(np.abs(bins - b))])])
        if g not in laws:
            laws[g] = _trimmed(ttft.distribution(idx[np.isin(which, bins[group == g])]))
        t_val, t_p, t_hi = laws[g]
        win = d.window_steps
        if slices is None:
            parts.append((*_e2e_ratio(t_val, t_p, t_hi, d.y_s, d.pmf, win, td_seen, q),
                          d.weight))
            continue
        for lo, hi, queued in slices:
            inside = (t_val >= lo) & (t_val < hi)
            mass = float(t_p[inside].sum())
            if mass > 0:
                parts.append((*_e2e_ratio(t_val[inside], t_p[inside] / mass, t_hi,
                                          *tpot.under(d, queued), win, td_seen, q),
                              d.weight * mass))
    total = sum(w for _, _, w in parts)
    lo = max(min(float(g[0]) for g, _, _ in parts), 1e-9)
    hi = max(float(g[-1]) for g, _, _ in parts)
    grid = np.geomspace(lo, hi, 8001)
    cdf = sum(w / total * np.interp(grid, g, c, left=0.0, right=1.0) for g, c, w in parts)
    return 1.0 / quantiles_from_cdf(cdf, grid, QUANTILES)


def _trimmed(law) -> tuple[np.ndarray, np.ndarray, float]:
    """(values, probabilities, top) of a TTFT law without its empty cells; the grid runs far
    past its mass (headroom for the wait), so values are clipped at its 1 - 1e-7 quantile."""
    t_val, t_p = (np.asarray(a, float) for a in law)
    keep = t_p > 0
    t_val, t_p = t_val[keep], t_p[keep] / t_p[keep].sum()
    t_hi = float(t_val[min(np.searchsorted(np.cumsum(t_p), 1.0 - 1e-7), len(t_val) - 1)])
    return np.minimum(t_val, t_hi), t_p, t_hi


def _sojourn_slices(tpot: TpotLaw):
    """FCFS: [(TTFT from, to, backlog)] splitting the backlog (tpot_law._fcfs_backlog) at the
    TTFT quantiles E2E_SOJOURN_SLICES, so that a request's decode window sees the prompts its
    own sojourn left queued; None without a backlog."""
    if tpot.backlog is None:
        return None
    means, weights, sojourn = tpot.backlog
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
