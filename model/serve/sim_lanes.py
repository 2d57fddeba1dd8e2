"""Closed-loop lanes of the simulator: which of a session's requests a lane sends next, and when.

A lane plays one synthetic session after another. Its main-agent turns go one at a time, each
after its gap. A subagent run forks: its requests are dealt in turn to `chains` request chains
that run concurrently from the run's spawn, each request after its own gap once the previous
request of its chain has finished; the parent's next turn waits until every chain has finished
(fork/join, as AIPerf's AgentX replay plays a subagent's agent chains as concurrent streams
joined at the parent's next turn: papers/research/workloads.md §1.4 f, §1.5).

`chains` is the parallelism that makes a run's span its share of the session's clock: a run of
m requests on c chains spans about m / c request cycles, so c = 1 / subagent_wall_share, the
workload's measured wall share (model.fit.workload.subagent_wall_share), rounded
(model.serve.siblings.subagent_chains). With a wall share of 1 every run is one chain played in
order.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class Lane:
    """One lane's place in its session. `session` is (context, uncached, output, gap, gap
    share, run) per request, `run` the subagent run number (0 = main agent) or None (every
    request in order). `turn` is the parent turn last sent, or during a fork the turn the
    parent resumes at."""

    session: tuple
    turn: int
    chains: int = 1
    queued: list[list[int]] = field(default_factory=list)  # per chain: requests still to send
    pending: int = 0  # chains of the open fork still running

    def _run(self) -> np.ndarray | None:
        run = self.session[5]
        return None if run is None or self.chains <= 1 else run

    def begin(self, k: int) -> list[tuple[int, int | None, int]]:
        """The requests to send on reaching request `k`: [(request, chain or None, the request
        whose gap comes first)]. A main turn is sent alone after its gap; a subagent request
        opens its run's fork from `k` on (a lane that starts inside a run joins it there),
        every chain's first request after the gap before `k` (the run's spawn)."""
        run = self._run()
        if run is None or run[k] == 0:
            self.turn, self.queued, self.pending = k, [], 0
            return [(k, None, k)]
        start = k
        while start > 0 and run[start - 1] == run[k]:
            start -= 1
        end = k
        while end < len(run) and run[end] == run[k]:
            end += 1
        dealt = [list(range(start + c, end, self.chains)) for c in range(self.chains)]
        self.queued = [[j for j in chain if j >= k] for chain in dealt]
        self.turn = end
        firsts = [(chain.pop(0), c, k) for c, chain in enumerate(self.queued) if chain]
        self.pending = len(firsts)
        return firsts

    def finished(self, chain: int | None) -> list[tuple[int, int | None, int]] | None:
        """The requests to send once a request of `chain` (None: the parent) has finished: its
        chain's next request, else, when it was the fork's last chain or a parent turn, the
        parent's next turn; [] while other chains still run; None when the session is over."""
        if chain is not None:
            if self.queued[chain]:
                j = self.queued[chain].pop(0)
                return [(j, chain, j)]
            self.pending -= 1
            if self.pending:
                return []
            return self.begin_at(self.turn)
        return self.begin_at(self.turn + 1)

    def begin_at(self, k: int) -> list[tuple[int, int | None, int]] | None:
        """`begin(k)`, or None when the session has no request `k`: the lane's session is over."""
        return None if k >= len(self.session[0]) else self.begin(k)

    def delay_s(self, gap_of: int, gap_cap_s: float) -> float:
        """Seconds from a request's trigger until it is sent: the capped gap before request
        `gap_of` times that request's gap share; a session's first request goes at once."""
        if gap_of == 0:
            return 0.0
        gap, share = self.session[3], self.session[4]
        return min(float(gap[gap_of]), gap_cap_s) * float(share[gap_of])
