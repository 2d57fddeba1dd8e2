"""Expert load balance across expert-parallel ranks: how much more routed work the busiest EP
rank does than the mean, without and with redundant experts (EPLB).

Every rank of an EP group waits for the busiest one before the combine, so a MoE layer takes the
hottest rank's time. Two things make that rank hotter than the mean:

- **static skew**: some experts are routed to far more often than others. TensorRT-LLM measured
  it on DeepSeek-R1 at EP32 with 8 experts per rank (examples/wide_ep/ep_load_balancer/README.md,
  `report_load_statistics.py` over iterations 100-200): the hottest rank receives 1.56 times
  more routed tokens than the mean ((max - mean) / mean, averaged over layers and iterations).
  A rank's load is the sum of its `n` experts' loads; taken as a lognormal whose coefficient of
  variation is the per-expert one over sqrt(n) (independent experts), the hottest of `ep` ranks
  sits exp(sigma z - sigma^2 / 2) above the mean (z = E[max of ep N(0, 1)]). SKEW_CV_PER_EXPERT
  is the per-expert variation that puts that figure at 1.56 for EP32 x 8 experts. It is one
  model's measurement, applied to every MoE model (an assumption: no other was found).
- **routing noise**: a step's token-expert pairs land on a rank like Poisson draws around its
  mean (the floor even perfect placement leaves; SGLang's "simulated perfect EPLB" is random
  routing, lmsys.org/blog/2025-05-05-large-scale-ep): z / sqrt(mean pairs) above the mean.

Redundant experts (vLLM `--enable-eplb` with `num_redundant_experts`, SGLang
`--ep-num-redundant-experts`, TensorRT-LLM `num_slots`) let the balancer replicate hot experts and
pack the rest (DeepSeek-V3 report section 3.4; github.com/deepseek-ai/EPLB). The same TensorRT-LLM
README measured what is left with 32 redundant experts (288 slots, EP36): 0.115, of which the
routing noise of its 1024 pairs per rank is 0.066; the rest is the placement's residual static
skew, SKEW_CV_RANK_EPLB per rank. Any redundancy is taken to reach that residual (the README's
one measured point; fewer redundant slots may balance less).

Independent deviations add in quadrature: excess = hypot(static, noise).
"""

from __future__ import annotations

import functools
import math

import numpy as np

MEASURED_EXCESS = 1.56  # hottest rank (max - mean) / mean, DeepSeek-R1, EP32, no redundancy
MEASURED_EP = 32
MEASURED_EXPERTS_PER_RANK = 8


@functools.lru_cache(maxsize=256)
def expected_max_normal(n: int) -> float:
    """E[max of n iid N(0, 1)] (0 for n <= 1)."""
    if n <= 1:
        return 0.0
    z = np.linspace(-8.0, 8.0, 4001)
    # the standard normal cdf from math.erf: the step model stays free of scipy (0.15 s import)
    cdf = 0.5 * (1.0 + np.array([math.erf(v / math.sqrt(2.0)) for v in z]))
    return float(np.sum(1.0 - cdf ** n) * (z[1] - z[0])) - 8.0


def _lognormal_max_excess(cv: float, ranks: int) -> float:
    """(E-ish max - mean) / mean of `ranks` lognormal loads of coefficient of variation `cv`:
    exp(sigma z - sigma^2 / 2) - 1."""
    if cv <= 0 or ranks <= 1:
        return 0.0
    sigma = math.sqrt(math.log1p(cv * cv))
    return math.exp(sigma * expected_max_normal(ranks) - sigma * sigma / 2.0) - 1.0


def _cv_for_excess(excess: float, ranks: int) -> float:
    """The lognormal coefficient of variation whose hottest of `ranks` sits `excess` above the
    mean (inverse of _lognormal_max_excess: the smaller root of sigma z - sigma^2/2 = ln(1+e))."""
    z = expected_max_normal(ranks)
    sigma = z - math.sqrt(z * z - 2.0 * math.log1p(excess))
    return math.sqrt(math.expm1(sigma * sigma))


@functools.cache
def _skew_cv_per_expert() -> float:
    """Per-expert load variation that reproduces MEASURED_EXCESS at EP32 x 8 experts."""
    return _cv_for_excess(MEASURED_EXCESS, MEASURED_EP) * math.sqrt(MEASURED_EXPERTS_PER_RANK)


# residual with EPLB: TensorRT-LLM README, 288 slots on EP36, 1024 pairs per rank
EPLB_MEASURED_EXCESS = 0.115
EPLB_MEASURED_EP = 36
EPLB_MEASURED_PAIRS = 1024.0


@functools.cache
def _eplb_cv_per_rank() -> float:
    """Per-rank static variation left after EPLB placement (the measured residual less the
    routing noise of its pairs, in quadrature)."""
    z = expected_max_normal(EPLB_MEASURED_EP)
    noise = z / math.sqrt(EPLB_MEASURED_PAIRS)
    static = math.sqrt(max(EPLB_MEASURED_EXCESS ** 2 - noise ** 2, 0.0))
    return _cv_for_excess(static, EPLB_MEASURED_EP)


def hot_rank_load_factor(ep: int, logical_experts: int, redundant_experts: int, pairs_per_rank):
    """Busiest EP rank's routed token-expert pairs over the mean rank's (>= 1; 1 for ep <= 1).

    `pairs_per_rank`: the mean rank's pairs this step (tokens x top_k / ep); broadcasts."""
    pairs = np.maximum(np.asarray(pairs_per_rank, float), 1.0)
    if ep <= 1:
        return np.ones_like(pairs)
    z = expected_max_normal(ep)
    if redundant_experts > 0:
        static = _lognormal_max_excess(_eplb_cv_per_rank(), ep)
    else:
        per_rank = logical_experts / ep
        static = _lognormal_max_excess(_skew_cv_per_expert() / math.sqrt(per_rank), ep)
    noise = z / np.sqrt(pairs)
    return 1.0 + np.hypot(static, noise)
