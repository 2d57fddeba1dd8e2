"""The queue for prefill slots of a threshold engine (`long_prefill_token_threshold`).

With a threshold every admitted prompt takes at most `threshold` tokens of an admitting step, so
the budget the decodes leave holds c = budget / mean chunk prompts at once (a last partial chunk
leaves its room to the next prompt); the scheduler admits in arrival order, and the rest wait. The prompts in the slots are a birth-death chain on their
number Q: departures at min(Q, c) / S (S: a prompt's slot time), arrivals at rate x (open loop)
or (N - Q) / T from the N sessions of a rank, T the mean time a session spends outside the
slots (a closed loop: Engset's finite source, M/M/c//N). An arrival that finds Q >= c waits for
floor(Q - c) + 1 departures at rate c / S: an Erlang wait. Exponential slot times give the chain
a closed form and its saturation (Q piles up at c, the sessions wait their share of the cycle:
Little's law) exactly; heavy-tailed ones wait longer below saturation, where long prompts hold
several slots at once (checked against model.serve.simulate in data/calibration/serving_agreement.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from model.specs.probability import gamma_cdf, gamma_ppf

TAIL = 1e-12  # open loop: the chain stops where its stationary tail drops below this
CDF_POINTS = 4097


@dataclass(frozen=True)
class SlotWait:
    """An arrival's wait for a slot: Erlang(j, rate) with probability `weights[j - 1]`
    (j = 1, 2, ...); no wait with probability 1 - sum(weights)."""

    weights: np.ndarray
    rate: float  # departures per second while every slot is held
    # per j, the index of dispersion of the departures over the j-th's mean time (>= 1)
    spread: np.ndarray | None = None

    def _shapes(self) -> tuple[np.ndarray, np.ndarray]:
        """(shape, scale) of each j's Gamma: mean j / rate, variance spread times Erlang's."""
        j = np.arange(1, len(self.weights) + 1, dtype=float)
        spread = np.ones_like(j) if self.spread is None else self.spread
        return j / spread, spread / self.rate

    @property
    def mean(self) -> float:
        j = np.arange(1, len(self.weights) + 1)
        return float(np.sum(self.weights * j)) / self.rate

    def quantile(self, p: float) -> float:
        """Upper bound of the wait's p-quantile (its largest Erlang's), for sizing grids."""
        if not np.any(self.weights > 0):
            return 0.0
        shape, scale = self._shapes()
        return float(np.max(gamma_ppf(p, shape, scale)))

    @cached_property
    def _cdf_table(self) -> tuple[np.ndarray, np.ndarray]:
        """The wait's CDF on CDF_POINTS up to its 1 - 1e-9 quantile (smooth: a Gamma mixture),
        which every grid interpolates (one per TTFT window bin)."""
        top = max(self.quantile(1.0 - 1e-9), 1e-12)
        t = np.linspace(0.0, top, CDF_POINTS)
        cdf = np.full(CDF_POINTS, 1.0 - float(self.weights.sum()))
        shape, scale = self._shapes()
        for j in np.flatnonzero(self.weights > 1e-15):
            cdf += self.weights[j] * gamma_cdf(t, shape[j], scale[j])
        return t, cdf

    def pmf(self, dt: float, n: int) -> np.ndarray:
        """The wait's mass on cells [i dt, (i + 1) dt), i < n (the last holds the rest)."""
        t, cdf = self._cdf_table
        inner = np.interp(np.arange(1, n) * dt, t, cdf, left=cdf[0], right=1.0)
        return np.diff(np.r_[0.0, inner, 1.0])


def slot_wait(slots: float, slot_times: np.ndarray, x: float, sessions: float | None = None,
              outside_s: float | None = None) -> SlotWait | None:
    """The slot wait with `slots` (c, fractional where the budget's last slot is partial) held
    for `slot_times` (a sample, seconds); open loop at `x` prompts/s, or closed with `sessions`
    cycling `outside_s` seconds outside the slots. None: an open loop at or above saturation.

    Exponential slot times make the chain; heavy-tailed ones make departures come in bursts
    (a slot a long prompt holds gives none for a while): the index of dispersion I(t) of the
    slots' departures over t (stationary renewal processes) widens the number an arrival finds
    ahead, as a diffusion of noise (1 + I) / 2 over the chain's relaxation time (its law raised
    to 2 / (1 + I), Kingman's (ca2 + cs2) / 2 in heavy traffic), and the time those take to
    leave (Gamma of variance I(t) times Erlang's)."""
    times = np.asarray(slot_times, float)
    c, s = float(slots), float(times.mean()) if times.size else 0.0
    if s <= 0:  # nothing to prefill: no slot is ever held
        return SlotWait(np.zeros(0), 1.0)
    if sessions is None:
        rho = x * s / c
        if rho >= 1.0:
            return None
        top = int(np.ceil(c)) + int(np.ceil(np.log(TAIL) / np.log(max(rho, 1e-300)))) + 1
        q = np.arange(top + 1, dtype=float)
        birth = np.full(top, x)
    else:
        q = np.arange(int(np.ceil(sessions)) + 1, dtype=float)
        birth = np.maximum(sessions - q[:-1], 0.0) / max(float(outside_s), 1e-12)
    death = np.minimum(q[1:], c) / s
    # stationary law of the birth-death chain, in logs (128 sessions overflow a product)
    log_pi = np.r_[0.0, np.cumsum(np.log(np.maximum(birth, 1e-300)) - np.log(death))]
    pi = np.exp(log_pi - log_pi.max())
    pi /= pi.sum()
    flow = float(np.sum(pi[1:] * death))
    relax = float(np.sum(pi * q * q) - np.sum(pi * q) ** 2) / max(flow, 1e-300)
    rate = c / s
    need = np.where(q >= c, np.floor(q - c) + 1.0, 0.0).astype(int)
    # the widened chain relaxes as much slower as it is wider: noise and relaxation time
    # settle together, below the renewal limit I(inf) = cs2
    widest = max((1.0 + float(times.var()) / (s * s)) / 2.0, 1.0)
    dispersion = _departure_dispersion(times, max(widest * relax, float(need.max()) / rate, s))
    noise = 1.0
    for _ in range(8):
        noise = min((1.0 + float(dispersion(noise * relax))) / 2.0, widest)
    seen = np.exp((log_pi - log_pi.max()) / noise)
    if sessions is not None:  # an arrival sees the chain without itself: pi(Q) (N - Q)
        seen = seen * np.maximum(sessions - q, 0.0)
    seen = seen / seen.sum()
    weights = np.bincount(need, weights=seen)[1:]
    j = np.arange(1, len(weights) + 1)
    return SlotWait(weights, rate, np.maximum(dispersion(j / rate), 1.0))


def _departure_dispersion(times: np.ndarray, horizon: float):
    """t -> Var N(t) / E N(t) of a stationary renewal process with lifetimes `times`, for
    t <= horizon: 1 + 2 / t int_0^t M - t / mu, M the renewal function of the process started
    at a renewal (M = F + f * M, solved by FFT under an exponential tilt that keeps it
    invertible; Cox, Renewal Theory, 1962, 4.5)."""
    mu = float(times.mean())
    # 64 cells a mean lifetime (a lifetime shorter than half a cell renews at once: 7% too
    # much dispersion at 13 cells for exponential ones)
    n = int(2 ** np.clip(np.ceil(np.log2(64.0 * horizon / mu)), 12, 17))
    dt = 1.01 * horizon / n
    f = np.bincount(np.minimum(np.rint(times / dt).astype(int), n), minlength=n + 1)[:n] / times.size
    tilt = np.exp(-10.0 * np.arange(n) / n)
    f_hat = np.fft.rfft(f * tilt, 2 * n)
    big_f = np.fft.rfft(np.cumsum(f) * tilt, 2 * n)
    renewals = np.fft.irfft(big_f / (1.0 - f_hat), 2 * n)[:n] / tilt
    area = np.cumsum(renewals) * dt

    def at(t):
        t = np.asarray(t, float)
        i = np.clip((t / dt).astype(int), 0, n - 1)
        return 1.0 + 2.0 * area[i] / np.maximum(t, 1e-300) - t / mu

    return at
