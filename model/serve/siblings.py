"""What a subagent request's sibling chains add to its decode window.

AgentX replays a subagent run as concurrent agent chains joined at the parent's next turn
(papers/research/workloads.md §1.4 f); model.serve.sim_lanes plays a run on c = 1 / w chains, w
the workload's subagent wall share. The closed form counts those chains as independent lanes
(model.serve.request_mix.request_sample), which gets the mean load right but not what a
subagent request sees: its c - 1 siblings run beside it on its rank for its whole window.

- **Their decodes.** Each sibling is decoding a share delta of its cycle (gap + TTFT + decode, its
  gap the unweighted one): S ~ Binomial(c - 1, delta) siblings decode with it, each lengthening
  every step of its window by the step's slope in one more sequence. S is held over the window
  (siblings start together and cycle alike).
- **Their prefills.** Each sibling starts a prefill once a cycle: c - 1 more prefill runs per
  cycle on the rank, of the sample's run shapes, on top of the background's.

Main-agent requests see the background alone (their parent is idle while a run's chains play).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from model.serve.rank_engine import RankEngine
from model.serve.rate_solver import SolvedRate
from model.specs.probability import binom_pmf


def subagent_chains(wall_share: float) -> int:
    """Concurrent chains a subagent run plays on (AgentX replays a run's agent chains side by
    side, joined at the parent's next turn): the parallelism that makes the run's span its wall
    share, 1 / wall share rounded, at least 1."""
    return max(1, int(round(1.0 / wall_share))) if wall_share > 0 else 1


@dataclass(frozen=True)
class Siblings:
    """A subagent request's siblings: extra prefill runs per step, the law of how many decode
    beside it (P(S = s), s = 0..c-1) and what each adds to a step."""

    runs_per_step: float
    decoding_pmf: np.ndarray
    step_per_sibling_s: float


def subagent_requests(eng: RankEngine) -> np.ndarray | None:
    """Per sample request: whether it is a subagent's (wall weight below 1); None without any."""
    w = eng.sample.wall_weight
    if w is None or not (w < 1.0).any():
        return None
    return w < 1.0


def sibling_load(eng: RankEngine, st: SolvedRate, ttft_dist, decode_step_seen_s: float,
                 sessions_per_rank: float | None) -> Siblings | None:
    """The siblings of a subagent request at the solved state `st` (closed loops only; None
    where runs play on one chain (`eng.subagent_chains`) or the sample has no subagent
    requests)."""
    sub = subagent_requests(eng)
    c = eng.subagent_chains
    if sub is None or not sessions_per_rank or c <= 1:
        return None
    w = eng.sample.wall_weight
    grid, pmf = ttft_dist
    ttft_s = float(np.sum(np.asarray(grid) * pmf) / max(float(np.sum(pmf)), 1e-300))
    gap_s = eng.sample.gap_s[sub] * float(w.mean()) / w[sub]  # the sample weights them by w/E[w]
    decode_s = eng.decode_steps[sub] * decode_step_seen_s
    cycle_s = float(gap_s.mean()) + ttft_s + float(decode_s.mean())
    delta = min(float(decode_s.mean()) / cycle_s, 1.0)
    b = st.balance.decode_batch
    seen = b + max(1.0 - b / sessions_per_rank, 0.0) / eng.dp
    step = float(eng.decode_step_s(seen + 1.0 / eng.dp) - eng.decode_step_s(seen))
    return Siblings((c - 1) / cycle_s * st.mean_step_s,
                    binom_pmf(np.arange(c), c - 1, delta), max(step, 0.0))


def with_sibling_decodes(y: np.ndarray, pmf: np.ndarray, window_steps: float,
                         sib: Siblings) -> tuple[np.ndarray, np.ndarray]:
    """(y, pmf) of a window's extension with S siblings decoding beside it: the law shifted by
    s x step_per_sibling x window with probability P(S = s)."""
    shift = sib.step_per_sibling_s * window_steps
    if shift <= 0:
        return y, pmf
    dy = float(y[1] - y[0]) if len(y) > 1 else shift
    n = len(sib.decoding_pmf)
    grid = float(y[0]) + np.arange(len(y) + int(np.ceil((n - 1) * shift / dy)) + 1) * dy
    cdf0 = np.cumsum(pmf) / max(float(pmf.sum()), 1e-300)
    cdf = sum(p * np.interp(grid - s * shift, y, cdf0, left=0.0, right=1.0)
              for s, p in enumerate(sib.decoding_pmf))
    return grid, np.diff(np.r_[0.0, cdf])
