"""AgentX's system idle cap in closed form: the replay skips idle time when nothing is in flight.

AIPerf's `agentic_replay` (scenario `inferencex-agentx-mvp`, https://github.com/SemiAnalysisAI/
aiperf docs/tutorials/agentx-mvp.md) keeps
each trajectory's recorded delays but with `--system-idle-gap-cap-seconds=10` shifts all timers
forward whenever no request is in flight, so an interval with every lane in its gap lasts at
most `cap_s`. At one session that caps every gap; at dozens some lane is almost always busy and
nothing changes.

Closed form, lanes independent: a lane is idle a fraction p = Z / (Z + A) of the time (Z mean
gap, A its active time per turn). An all-idle interval starts when a lane goes idle while the
other n - 1 are idle (rate n p^(n-1) / (Z + A)) and lasts D = min(fresh gap, n - 1 residual
gaps), so P(D > t) = S(t) S_r(t)^(n-1) with S the gap survival and S_r(t) = int_t^inf S / Z.
Each such interval loses E[(D - cap)+] = int_cap^inf S S_r^(n-1) dt of every lane's idle time,
so the effective mean gap is Z - n p^(n-1) int_cap^inf S S_r^(n-1) dt; at n = 1 that is
E[min(gap, cap)]. model.serve.simulate applies the rule exactly and is the check.
"""

from __future__ import annotations

import numpy as np

from model.specs.defaults import SYSTEM_IDLE_CAP_S


class SystemIdleCap:
    """Effective mean gap of `gaps` (already capped per trajectory) under the system idle cap."""

    GRID = 2048

    def __init__(self, gaps, cap_s: float | None = SYSTEM_IDLE_CAP_S) -> None:
        g = np.sort(np.asarray(gaps, float).ravel())
        self.mean = float(g.mean()) if g.size else 0.0
        self.cap_s = cap_s
        self._integrals: dict[int, float] = {}
        if cap_s is None or g.size == 0 or g[-1] <= cap_s or self.mean <= 0:
            self._t = None
            return
        # survival S and residual survival S_r on a grid from the cap to the longest gap
        self._t = np.linspace(cap_s, g[-1], self.GRID)
        self._s = 1.0 - np.searchsorted(g, self._t, side="right") / g.size
        # int_t^max S(u) du from the sorted sample: mean of (g - t)+
        above = np.cumsum(g[::-1])[::-1]  # sum of g[k:]
        k = np.searchsorted(g, self._t, side="right")
        tail_sum = np.where(k < g.size, above[np.minimum(k, g.size - 1)], 0.0)
        self._sr = (tail_sum - (g.size - k) * self._t) / g.size / self.mean

    def _integral(self, lanes: int) -> float:
        if lanes not in self._integrals:
            f = self._s * self._sr ** (lanes - 1)
            self._integrals[lanes] = float(np.sum(0.5 * (f[1:] + f[:-1]) * np.diff(self._t)))
        return self._integrals[lanes]

    def at(self, lanes):
        """`active_s -> mean gap per turn` with `lanes` sessions in the whole system, each active
        (TTFT plus decode, queueing included) `active_s` per turn; the lane-dependent integral
        is taken once, so a search calls the result inside its iterations."""
        n = np.maximum(np.round(np.asarray(lanes, float)), 1.0).astype(int)
        if self._t is None:
            def plain(active_s, idx=...):
                return np.broadcast_arrays(np.full(n[idx].shape, self.mean),
                                           np.asarray(active_s, float))[0]
            return plain
        values, inverse = np.unique(n, return_inverse=True)
        weight = n * np.array([self._integral(int(v)) for v in values])[inverse].reshape(n.shape)

        def gap_mean(active_s, idx=...):
            """`idx` selects lanes' entries (a root finder's still-active elements)."""
            w, k = weight[idx], n[idx]
            p = self.mean / (self.mean + np.maximum(np.asarray(active_s, float), 0.0))
            # p ** (k - 1) as exp((k - 1) log p): ~1.4x faster; p >= 1e-300 keeps k = 1 at 1
            return np.maximum(self.mean - w * np.exp((k - 1) * np.log(np.maximum(p, 1e-300))),
                              0.0)
        return gap_mean

    def gap_mean(self, lanes, active_s) -> np.ndarray:
        """Mean gap per turn at `lanes` sessions each active `active_s` per turn (see `at`)."""
        return self.at(lanes)(active_s)
