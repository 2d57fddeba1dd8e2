"""The request-level moments the screening tier needs, from a workload's request mix
(`Traffic`), and the FCFS prefill P90 over that mix (`Traffic.fcfs_p90_chunks`).

Everything here is built whole from the mix: the AgentX system idle cap over its gaps
(model.specs.idle_cap) is a field; the sorted chunk counts per per-step cap are a pure function of
(traffic, cap), memoized (`_chunk_mix`), since a search asks for the same few caps again.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import numpy as np

from model.specs.defaults import SYSTEM_IDLE_CAP_S, TURN_GAP_CAP_S
from model.specs.idle_cap import SystemIdleCap

QUANTILE_SAMPLE = 4096  # order statistics of the request mix kept for the FCFS P90
REQUEST_SAMPLE = 200_000  # requests drawn for the moments (`traffic_from_workload`)


@dataclass(frozen=True)
class Traffic:
    """Moments of a request mix (means are request-weighted, the hit rate token-weighted) and
    the samples the P90 terms need."""

    name: str
    mean_context_tokens: float  # input tokens per request, cached + new
    mean_uncached_tokens: float
    p90_uncached_tokens: float
    mean_output_tokens: float
    p10_output_tokens: float
    mean_gap_s: float  # think/tool gap before a turn, capped as the replay caps it
    hit_rate: float
    uncached_tokens_sample: np.ndarray = field(repr=False, compare=False)
    gap_s_sample: np.ndarray = field(repr=False, compare=False)  # capped gaps, per chain
    idle_cap: SystemIdleCap = field(repr=False, compare=False)  # over gap_s_sample
    # request chains per closed-loop session, and gaps weighted by the session clock
    # (model.serve.request_mix.request_sample: subagents beside their parent)
    lanes_per_session: float = 1.0

    def idle_gap(self, lanes):
        """`active_s -> mean gap per turn` with `lanes` sessions in the system under the AgentX
        system idle cap (model.specs.idle_cap)."""
        return self.idle_cap.at(lanes)

    def chunks(self, cap_tokens) -> np.ndarray:
        """Mean prefill steps per request, E[ceil(U / cap)], when a request takes at most
        `cap_tokens` per step (exact over the sample; few distinct caps occur in a search)."""
        return self._chunk_moment(cap_tokens, 1)

    def chunks_squared(self, cap_tokens) -> np.ndarray:
        """E[ceil(U / cap)^2]: the second moment of a request's prefill steps."""
        return self._chunk_moment(cap_tokens, 2)

    def _chunk_moment(self, cap_tokens, power: int) -> np.ndarray:
        cap = np.asarray(cap_tokens, float)
        values, inverse = np.unique(cap, return_inverse=True)
        means = np.array([(np.ceil(self.uncached_tokens_sample / v) ** power).mean()
                          for v in values])
        return means[inverse].reshape(cap.shape)

    def chunk_tokens(self, cap_tokens) -> np.ndarray:
        """Mean tokens in one prefill chunk under a per-step cap."""
        return self.mean_uncached_tokens / self.chunks(cap_tokens)

    def fcfs_p90_chunks(self, cap_tokens, utilization, extra_chunks=0.0,
                        iterations: int = 20) -> np.ndarray:
        """P90 of a prompt's prefill steps including its FCFS wait, in steps: with probability
        1 - rho the server is free and it takes its own C = ceil(U / cap) + extra steps; with
        probability rho it first waits out the residual R of the prompt in service (length-
        biased: P(R > r) = E[(C - r)+] / E[C]) and then takes its mean E[C]. Cold prefills are
        rare but long, so this P90 sits far below the Pollaczek-Khinchine mean wait added to the
        P90 own time. Solves (1 - rho) P(C > t) + rho P(R > t - E[C]) = 0.1 by bisection
        between quantile bounds of the two terms (`_fcfs_p90`)."""
        cap, rho, extra = np.broadcast_arrays(*(np.asarray(a, float)
                                                for a in (cap_tokens, utilization, extra_chunks)))
        out = np.zeros(cap.shape)
        for v in np.unique(cap):
            sel = cap == v
            out[sel] = _fcfs_p90(_chunk_mix(self, float(v)), rho[sel], extra[sel], iterations)
        return out


class _ChunkMix:
    """A sorted sample of prompt chunk counts C: its quantiles and its residual excess
    g(a) = E[(C - a)+], piecewise linear between the sample's values (exact by interp)."""

    def __init__(self, c: np.ndarray):
        self.c, self.mean = c, float(c.mean())
        self.grid = np.concatenate([[0.0], np.unique(c)])
        idx = np.searchsorted(c, self.grid, side="right")
        suffix = np.concatenate([np.cumsum(c[::-1])[::-1], [0.0]])
        self.excess = (suffix[idx] - self.grid * (len(c) - idx)) / len(c)

    def above(self, a):
        """P(C > a)."""
        return 1.0 - np.searchsorted(self.c, a, side="right") / len(self.c)

    def quantile_above(self, p):
        """Smallest a with P(C > a) <= p."""
        k = np.ceil((1.0 - np.clip(p, 0.0, 1.0)) * len(self.c)).astype(int) - 1
        return np.where(k >= 0, self.c[np.maximum(k, 0)], 0.0)

    def excess_at(self, b):
        """g(b); E[C] - b below 0."""
        return np.where(b < 0.0, self.mean - b, np.interp(b, self.grid, self.excess, right=0.0))

    def excess_inverse(self, target):
        """Smallest b with g(b) <= target (g decreasing)."""
        return np.where(target >= self.mean, self.mean - target,
                        np.interp(target, self.excess[::-1], self.grid[::-1]))


@functools.lru_cache(maxsize=64)
def _chunk_mix(traffic: Traffic, cap_tokens: float) -> _ChunkMix:
    """The sample's chunk counts at `cap_tokens` per step, sorted (at most QUANTILE_SAMPLE
    equally spaced order statistics: ample for a P90)."""
    c = np.sort(np.ceil(traffic.uncached_tokens_sample / cap_tokens))
    if len(c) > QUANTILE_SAMPLE:
        c = c[np.linspace(0, len(c) - 1, QUANTILE_SAMPLE).astype(int)]
    return _ChunkMix(c)


def _fcfs_p90(mix: _ChunkMix, r, e, iterations: int) -> np.ndarray:
    """Solves (1 - r) P(C + e > t) + r P(R > t - E[C]) = 0.1 for t (see
    Traffic.fcfs_p90_chunks); R's tail is the residual excess over E[C] + e."""
    mean = mix.mean

    def tail(t):
        res = np.minimum(mix.excess_at(t - (mean + e) - e) / (mean + e), 1.0)
        return (1.0 - r) * mix.above(t - e) + r * res

    def own_at(p):  # smallest t with P(C + e > t) <= p
        return mix.quantile_above(p) + e

    def res_at(p):  # smallest t with P(R > t - E[C]) <= p
        return mix.excess_inverse(np.clip(p, 0.0, 1.0) * (mean + e)) + mean + 2.0 * e

    # the P90 lies above each term's quantile at the level that term alone would need
    # (0.1 / its weight), and below both terms' P90s and the quantile of the heavier term
    # that leaves the lighter one all of its weight
    with np.errstate(divide="ignore", invalid="ignore"):
        lo = np.maximum(own_at(0.1 / (1.0 - r)), res_at(0.1 / r))
        hi = np.minimum.reduce([np.maximum(own_at(0.1), res_at(0.1)),
                                np.where(r < 0.1, own_at((0.1 - r) / (1.0 - r)), np.inf),
                                np.where(r > 0.9, res_at((r - 0.9) / r), np.inf)])
    lo = np.maximum(np.minimum(lo, hi) * (1.0 - 1e-9) - 1e-9, 0.0)
    hi = hi * (1.0 + 1e-9) + 1e-9
    for _ in range(iterations):
        mid = 0.5 * (lo + hi)
        over = tail(mid) > 0.1
        lo, hi = np.where(over, mid, lo), np.where(over, hi, mid)
    return hi


def traffic_from_mix(name: str, context_tokens, uncached_tokens, output_tokens, gap_s,
                     gap_cap_s: float = TURN_GAP_CAP_S, wall_weight=None) -> Traffic:
    """Moments of a request mix given as arrays (one entry per request); `wall_weight`: each
    request's share of the session clock (model.specs.workload.RequestMix)."""
    context, uncached, output, gap = (np.asarray(a, float) for a in (
        context_tokens, uncached_tokens, output_tokens, gap_s))
    capped = np.minimum(gap, gap_cap_s)
    lanes = 1.0
    if wall_weight is not None:
        w = np.asarray(wall_weight, float)
        lanes, capped = 1.0 / float(w.mean()), capped * w / float(w.mean())
    return Traffic(name=name, mean_context_tokens=float(context.mean()),
                   mean_uncached_tokens=float(uncached.mean()),
                   p90_uncached_tokens=float(np.percentile(uncached, 90)),
                   mean_output_tokens=float(output.mean()),
                   p10_output_tokens=float(np.percentile(output, 10)),
                   mean_gap_s=float(capped.mean()),
                   hit_rate=float(1.0 - uncached.sum() / context.sum()),
                   uncached_tokens_sample=uncached, gap_s_sample=capped,
                   idle_cap=SystemIdleCap(capped, SYSTEM_IDLE_CAP_S), lanes_per_session=lanes)


def traffic_from_workload(workload, n: int = REQUEST_SAMPLE, seed: int = 0,
                          hit_rate: float | None = None,
                          gap_cap_s: float = TURN_GAP_CAP_S) -> Traffic:
    """Moments of `workload.request_mix(n, seed, hit_rate)` (model.specs.workload). 200K requests:
    sessions are heavy-tailed (a few long ones carry many long requests), and 20K (~300
    sessions) left the mean context of a synthetic profile up to 12% off its population mean."""
    mix = workload.request_mix(n, seed, hit_rate)
    return traffic_from_mix(workload.name, mix.context_tokens, mix.uncached_tokens,
                            mix.output_tokens, mix.gap_s, gap_cap_s, mix.wall_weight)


@dataclass(frozen=True)
class Keyed:
    """A spec that is unhashable (a pydantic workload) or slow to hash (an architecture), keyed
    by a cheap content key, so memoized pure functions can take it as an argument."""

    value: object = field(compare=False, repr=False)
    key: tuple = ()

    @staticmethod
    def workload(workload) -> Keyed:
        dump = getattr(workload, "model_dump_json", None)
        return Keyed(workload, (dump() if dump is not None else repr(workload),))

    @staticmethod
    def arch(arch) -> Keyed:
        """An architecture as served: its name, weight format and source file."""
        return Keyed(arch, (arch.name, arch.weight_dtype, arch.source))


def traffic_for(workload, hit_rate: float | None = None) -> Traffic:
    """Traffic moments of a workload profile (memoized on the profile's content)."""
    return _traffic_for(Keyed.workload(workload), hit_rate)


@functools.lru_cache(maxsize=16)
def _traffic_for(workload: Keyed, hit_rate: float | None) -> Traffic:
    return traffic_from_workload(workload.value, hit_rate=hit_rate)
