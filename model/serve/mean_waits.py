"""Mean-value queue laws: the mean waits of G/G/1 (Kingman) and M/G/1 (Pollaczek-Khinchine,
M/D/1) queues, the tail Kingman's mean implies, and the P-K transform at the arrival rate
(papers/research/theory.md section 6 [S26][S28]). Numpy only: the benchmark-client model and the
screening tier use them without the distribution laws of model.serve.queueing."""

from __future__ import annotations

import numpy as np


def kingman_wait_s(rho: float, mean_service_s: float, cs2: float, ca2: float = 1.0) -> float:
    """Mean wait in a G/G/1 queue: (ca²+cs²)/2 · ρ/(1-ρ) · E[S]; equals P-K for ca² = 1."""
    if not 0 <= rho < 1:
        raise ValueError(f"utilization {rho} is not in [0, 1)")
    return (ca2 + cs2) / 2.0 * rho / (1.0 - rho) * mean_service_s


def pk_wait_s(rate, service_mean, service_sq_mean, max_utilization: float = 1.0):
    """Pollaczek-Khinchine mean wait of M/G/1 queues (vectorized), lam E[S^2] / (2 (1 - rho));
    infinite at rho >= 1, unless `max_utilization` < 1 clips rho there."""
    rate = np.asarray(rate, float)
    rho = rate * service_mean
    if max_utilization < 1.0:
        rho = np.minimum(rho, max_utilization)
    with np.errstate(divide="ignore", invalid="ignore"):
        wait = rate * service_sq_mean / (2.0 * (1.0 - rho))
    return np.where(rho < 1.0, wait, np.inf)


def md1_wait_s(utilization, service_s, max_utilization: float = 1.0):
    """Mean M/D/1 wait, rho S / (2 (1 - rho)): Pollaczek-Khinchine with a deterministic service
    S (E[S^2] = S^2), rho clipped at `max_utilization` (a closed loop's throughput bound takes
    over beyond it); infinite at rho >= 1 when not clipped."""
    rho = np.asarray(utilization, float)
    if max_utilization < 1.0:
        rho = np.minimum(rho, max_utilization)
    with np.errstate(divide="ignore", invalid="ignore"):
        wait = rho * service_s / (2.0 * (1.0 - rho))
    return np.where(rho < 1.0, wait, np.inf)


def kingman_wait_exceeds(rho: float, wait_s: float, ca2: float, cs2: float,
                         thresholds_s: np.ndarray) -> float:
    """P(W > L) averaged over the sample `thresholds_s` of L, for the G/G/1 wait of mean `wait_s`
    (Kingman's, `kingman_wait_s`): busy with probability rho, then exponential of mean
    wait / rho, stretched by (ca2 + cs2) / (1 + cs2) for bursty arrivals."""
    tail = wait_s * (ca2 + cs2) / (1.0 + cs2) / rho
    return rho * float(np.mean(np.exp(-thresholds_s / max(tail, 1e-30))))


def pk_wait_transform(rate: float, rho: float, service_s: np.ndarray) -> float:
    """E[exp(-rate W)] of the M/G/1 wait at the arrival rate itself: the Pollaczek-Khinchine
    transform W*(s) = (1 - rho) s / (s - rate (1 - S*(s))) at s = rate, (1 - rho) / S*(rate):
    the probability that nobody arrives during a wait."""
    return (1.0 - rho) / max(float(np.mean(np.exp(-rate * service_s))), 1e-300)
