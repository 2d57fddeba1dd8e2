"""The FCFS prefill queue fed by a closed loop of sessions (a finite source): the wait's law.

A busy period starts when a session arrives at an idle server. The sessions idle then arrive
within it only as fast as their gaps run out, Λ(t) by elapsed time t: x E[min(Z, t)] from the
idle ones (renewal residuals of their gaps) plus b P(D + Z <= t) from the b decoding, after the
rest of their decode D and a fresh gap. The pool drains over the whole busy period, not job by
job: a job taken from the queue starts where the pool stands, so the prompts queued behind a
long cold prefill see few arrivals (a fresh pool at every job start, with the
Pollaczek-Khinchine ladder on top, would count twice the queue ahead of an arrival that the
runs hold). The pool
at a busy period's start is not its mean: no one is queued or in service then, and the session
that opened it has left it (`_pool_boost`).

A waiting arrival lands in a job at elapsed y and waits out the rest of it, then the prompts
ahead: the Λ(y) that arrived earlier in that job (Poisson) and the q queued when it started.
q follows a Markov chain over job starts (`_queue_seen`)."""

from __future__ import annotations

import numpy as np
from scipy.special import gammaln

from model.serve.queueing import ascending, expected_min, mg1_wait_pmf, residual_mass, split_bins

# earlier arrivals within the job in service: bins of Λ(y) (expected arrivals), each taken at
# its mean in the Poisson count ahead
ARRIVAL_BINS = np.array([0.0, 0.25, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 11.0, 15.0, 20.0,
                         30.0, np.inf])
SERVICE_GROUPS = 64  # groups of the service sample in the chain (`finite_source_wait_pmf`)
# the law is built on at most this many cells and spread onto a finer grid: a cell of 7 ms on
# AgentX (its quantiles moved under 0.5% against 2**18 cells, at a quarter of the time)
LAW_CELLS = 2**16
BOOST_ITERATIONS = 30  # at most; the pool's fixed point usually settles in 3-5
# queue lengths the job-start chain tells apart (`_queue_seen`): its arrays grow as their square
# times SERVICE_GROUPS, 256 of them about 34 MB each; deeper queues share the top state
QUEUE_STATES = 256


def fcfs_wait_pmf(service_s, rho: float, dt: float, n: int, gaps_s=None,
                  arrival_rate: float | None = None, decoding=None,
                  extra_s: float = 0.0) -> tuple[np.ndarray, float]:
    """The FCFS prefill queue's wait pmf on the grid k·dt and the probability an arrival finds
    the server busy: M/G/1 for arrivals from outside (`gaps_s` None), the finite source for a
    closed loop's sessions (`extra_s`: the mean time a prompt spends past its wait and service
    before its first token)."""
    if gaps_s is None or rho <= 0:
        return mg1_wait_pmf(service_s, rho, dt, n)
    f = max(n // LAW_CELLS, 1)
    pmf, busy = finite_source_wait_pmf(service_s, dt * f, n // f, gaps_s, float(arrival_rate),
                                       decoding, extra_s)
    return (pmf if f == 1 else _spread(pmf, f)), busy


def _spread(pmf: np.ndarray, f: int) -> np.ndarray:
    """A pmf on a grid f times coarser, spread onto the fine grid: the atom at zero stays, the
    rest of each coarse point fills the fine cells within half a coarse cell of it."""
    n = len(pmf) * f
    rest = np.r_[0.0, pmf[1:]]
    cdf = np.interp(np.arange(n), (np.arange(-1, len(pmf)) + 0.5) * f, np.r_[0.0, np.cumsum(rest)])
    out = np.diff(cdf, prepend=0.0)
    out[0] += pmf[0]
    return out


def finite_source_wait_pmf(service_s, dt: float, n: int, gaps_s, arrival_rate: float,
                           decoding: tuple[float, np.ndarray] | None = None,
                           extra_s: float = 0.0) -> tuple[np.ndarray, float]:
    """Wait pmf on the grid k·dt (k < n) and the probability an arrival finds the server busy.
    `gaps_s`: the sessions' idle times; `arrival_rate`: requests/s into this server;
    `decoding`: (sessions decoding, their decode times); `extra_s`: the mean time a prompt
    spends past its wait and service before its first token."""
    s = np.asarray(service_s, float)
    z = ascending(gaps_s)
    x = float(arrival_rate)
    edges = np.arange(n + 1) * dt
    idle = x * expected_min(z, edges)  # Λ(t) of the idle sessions
    dec = np.zeros(n + 1)
    if decoding is not None and decoding[0] > 0:
        dec = decoding[0] * _decoders_arrived(np.asarray(decoding[1], float), z, edges)
    # groups finer toward the long services, whose arrivals drain the pool (rank edges
    # N (1 - (1 - i / G)^2): the top group holds N / G^2 jobs). With 64 of them the TTFT P90 of
    # 64 AgentX sessions sits 0.3% from the ungrouped chain's (equal-count groups: 14%)
    cuts = np.unique(np.round(len(s) * (1.0 - (1.0 - np.arange(1, SERVICE_GROUPS)
                                                / SERVICE_GROUPS) ** 2)).astype(int))
    cuts = cuts[(cuts > 0) & (cuts < len(s))]
    # each group is a range of ranks: partitioning at the cuts places them (no full sort)
    groups = [g for g in np.split(np.partition(s, cuts) if len(cuts) else s, cuts) if len(g)]
    s_g = np.array([c.mean() for c in groups])
    w_g = np.array([len(c) for c in groups], float) / len(s)
    jobs = split_bins(s / dt, None, n) / len(s)
    tail = np.cumsum(jobs[::-1])[::-1]  # P(S >= cell i)
    tail_s = np.cumsum((jobs * np.arange(n))[::-1])[::-1] * dt  # E[S; S >= cell i]
    pool, mean_s = x * float(z.mean()), float(s.mean())
    held = mean_s + float(extra_s)  # a prompt's start to its first token
    # At a busy period's start no one is queued or in service: the sessions that are on average
    # (x (E[W] + held), arrival to first token) are idle then, less the one that opened it.
    # Simulated (model.serve.simulate), idle besides the opener against on average and
    # x E[TTFT]: AgentX at 48 sessions 42.6 / 41.6 / 1.65, at 16 sessions 13.8 / 14.5 / 0.35;
    # DSV4 DEP8, per rank, at 256 sessions 21.8 / 21.1 / 2.0, at 128 11.9 / 12.0 / 0.6
    boost, wait = 0.0, 0.0
    for _ in range(BOOST_ITERATIONS):
        lam = (1.0 + boost) * idle + dec
        q_w, busy = _queue_seen(s_g, w_g, lam, edges)
        d = np.r_[0.0, np.diff(lam)[:-1]]  # arrivals in elapsed cell [(i - 1) dt, i dt)
        a_mid = np.r_[0.0, 0.5 * (lam[:-2] + lam[1:-1])]
        mass = float(np.sum(d * tail))
        resid = float(np.sum(d * (tail_s - np.arange(n) * dt * tail))) / max(mass, 1e-300)
        ahead = float(np.sum(d * a_mid * tail)) / max(mass, 1e-300)
        wait = busy * (resid + mean_s * (ahead + float(np.sum(q_w * np.arange(len(q_w))))))
        boost, last = _pool_boost(x, wait, held, pool), boost
        if abs(boost - last) < 1e-4:
            break
    if busy <= 0.0:
        return np.r_[1.0, np.zeros(n - 1)], 0.0
    return _wait_law(jobs, d, a_mid, q_w, busy, n), busy


def _pool_boost(x: float, wait: float, held: float, pool: float) -> float:
    """The idle pool at a busy period's start over its mean, less one."""
    return max((x * (wait + held) - 1.0) / pool, -1.0) if pool > 0 else 0.0


def _decoders_arrived(decode_s: np.ndarray, gaps: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """P(D + Z < t) at `edges`: D the rest of a decode in progress (its equilibrium residual,
    density P(W > y) / E[W]), Z a fresh idle gap."""
    n = len(edges) - 1
    resid = residual_mass(ascending(decode_s), edges)
    gap = np.diff(np.searchsorted(ascending(gaps), edges, side="right")) / len(gaps)
    both = np.fft.irfft(np.fft.rfft(resid, 2 * n) * np.fft.rfft(gap, 2 * n), 2 * n)[:n]
    return np.r_[0.0, np.cumsum(np.maximum(both, 0.0))]


def _queue_seen(s_g, w_g, lam, edges) -> tuple[np.ndarray, float]:
    """Markov chain over job starts: (P(q prompts were queued when the job in service started),
    as arrivals see it; the share of arrivals that find the server busy). State 0 opens a
    busy period (fresh pool); state 1 + q takes a job from the queue with q left waiting, at
    the elapsed time by which q + 1 arrivals were due. A job of service S brings K ~
    Poisson(Λ(a + S) - Λ(a)) arrivals; the next job starts with q + K - 1 waiting, or opens
    the next busy period when none is."""
    top = min(int(np.ceil(lam[-1])) + 2, QUEUE_STATES)
    ages = np.r_[0.0, np.interp(np.arange(1, top + 2), lam, edges)]
    q_of = np.r_[0, np.arange(top + 1)]
    mu = np.interp(ages[:, None] + s_g[None, :], edges, lam) - np.interp(ages, edges, lam)[:, None]
    k = np.arange(top + 3)
    pk = _poisson_mixture(mu, w_g, len(k))  # (states, k)
    nxt = q_of[:, None] + k[None, :] - 1
    dest = np.where(nxt < 0, 0, 1 + np.minimum(nxt, top))
    n_states = len(ages)
    # each cell's terms summed by bincount: np.add.at's sums to rounding (1e-14), far faster
    trans = np.bincount((np.arange(n_states)[:, None] * n_states + dest).ravel(), pk.ravel(),
                        n_states * n_states).reshape(n_states, n_states)
    trans[:, -1] += np.maximum(1.0 - pk.sum(axis=1), 0.0)  # beyond the top: stay there
    a = trans.T - np.eye(len(ages))
    a[-1, :] = 1.0
    pi = np.maximum(np.linalg.solve(a, np.r_[np.zeros(len(ages) - 1), 1.0]), 0.0)
    seen = pi * (mu @ w_g)  # arrivals landing in each state's jobs
    busy = float(seen.sum() / max(seen.sum() + pi[0], 1e-300))
    return np.bincount(q_of, seen, minlength=top + 1) / max(seen.sum(), 1e-300), busy


def _poisson_mixture(mu: np.ndarray, w_g: np.ndarray, n_k: int) -> np.ndarray:
    """sum_g w_g Poisson(k; mu[s, g]) for k < n_k, per state s. The pmf is taken in logs (a
    recurrence p(k) = p(k - 1) mu / k overflows where mu runs into the hundreds, a saturated
    rank, and e^-mu times it is then NaN; at mu = 0 only k = 0 has mass, as xlogy). Each group
    is summed up to its own reach, mu + 12 sqrt(mu) + 20 at its largest mu: past it the pmf is
    below e^-60 of its peak (Chernoff), so the sum is the full one to rounding, and the short
    services, most of the groups, cost a few dozen terms instead of n_k."""
    out = np.zeros((mu.shape[0], n_k))
    log_k_fact = gammaln(np.arange(n_k) + 1.0)
    peak = mu.max(axis=0)
    reach = np.minimum(np.ceil(peak + 12.0 * np.sqrt(peak) + 20.0) + 1.0, n_k)
    reach = np.where(np.isfinite(reach), reach, n_k).astype(int)  # an unbounded rate: every k
    for g in np.flatnonzero(w_g > 0):
        m = mu[:, g, None]
        terms = np.arange(reach[g]) * np.log(np.maximum(m, np.finfo(float).tiny))
        terms -= m
        terms -= log_k_fact[: reach[g]]
        np.exp(terms, out=terms)
        out[:, : reach[g]] += w_g[g] * terms
    return out


def _wait_law(jobs, d, a_mid, q_w, busy: float, n: int) -> np.ndarray:
    """The wait pmf: an atom 1 - busy at zero; otherwise the rest of the job in service (an
    arrival in elapsed cell i of a job of x + i cells leaves between x and x + 1 cells, half to
    each) plus the services of the Λ(y) prompts that arrived earlier in it and of the q queued
    when it started."""
    m = 2 * n
    s_hat = np.fft.rfft(jobs, m)
    law = np.zeros(n + 1, complex)
    which = np.searchsorted(ARRIVAL_BINS, a_mid, side="right") - 1
    for b in np.unique(which[d > 0]):
        part = np.where(which == b, d, 0.0)
        r = np.maximum(np.fft.irfft(s_hat * np.conj(np.fft.rfft(part, m)), m)[:n], 0.0)
        r = 0.5 * (r + np.r_[0.0, r[:-1]])
        ahead = float(np.sum(part * a_mid) / part.sum())
        law += np.fft.rfft(r, m) * np.exp(ahead * (s_hat - 1.0))
    queued = np.zeros_like(law)
    for w in q_w[: int(np.flatnonzero(q_w > 1e-9).max()) + 1][::-1]:  # Horner in S's transform
        queued = queued * s_hat + w
    pmf = np.maximum(np.fft.irfft(law * queued, m)[:n], 0.0)
    pmf = busy * pmf / max(pmf.sum(), 1e-300)
    pmf[0] += 1.0 - busy
    return pmf
