"""Probability laws the engine model evaluates (Poisson, binomial, Gamma, normal), written on
scipy.special's ufuncs: the functions scipy.stats evaluates them with, without importing
scipy.stats, which costs a command about 0.4 s before any work."""

from __future__ import annotations

import numpy as np
from scipy.special import gammainc, gammaincinv, gammaln, ndtr, pdtr, xlog1py, xlogy

normal_cdf = ndtr


def poisson_pmf(k, mean):
    """P(N = k) for N ~ Poisson(mean), k whole and >= 0."""
    k = np.asarray(k, float)
    return np.exp(xlogy(k, mean) - mean - gammaln(k + 1.0))


def poisson_cdf(k, mean):
    """P(N <= k) for N ~ Poisson(mean); 0 below k = 0."""
    k = np.floor(np.asarray(k, float))
    return np.where(k >= 0.0, pdtr(np.maximum(k, 0.0), mean), 0.0)


def binom_pmf(k, n, p):
    """P(B = k) for B ~ Binomial(n, p), 0 <= k <= n whole."""
    k, n = np.asarray(k, float), np.asarray(n, float)
    return np.exp(gammaln(n + 1.0) - gammaln(k + 1.0) - gammaln(n - k + 1.0)
                  + xlogy(k, p) + xlog1py(n - k, -np.asarray(p, float)))


def gamma_cdf(x, shape, scale):
    """P(G <= x) for G ~ Gamma(shape, scale); 0 below x = 0."""
    return gammainc(shape, np.maximum(np.asarray(x, float), 0.0) / scale)


def gamma_ppf(q, shape, scale):
    """The q-quantile of Gamma(shape, scale)."""
    return gammaincinv(shape, q) * scale
