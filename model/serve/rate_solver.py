"""The engine's steady state at one per-rank request rate, built whole in three parts.

`solve_rate` first balances the decode batch against the step times (model.serve.step_balance),
then solves the prefill side at those steps: the FCFS queue on the whole budget
(model.serve.fcfs_prefill) or, with a threshold, prompts running side by side behind a wait for
a slot (model.serve.threshold_prefill). The result, `SolvedRate`, is what the TTFT, TPOT and E2E
laws read; past saturation it carries the reason instead (and `StalledPrefill`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from model.serve.fcfs_prefill import FcfsPrefill, StalledPrefill, solve_fcfs
from model.serve.rank_engine import RankEngine
from model.serve.step_balance import StepBalance, WarmStart, solve_balance
from model.serve.threshold_prefill import ThresholdPrefill, solve_threshold


@dataclass(frozen=True)
class SolvedRate:
    """The steady state at one rate: the balanced steps, the prefill part, why it cannot be
    served ("" when it can), the closed loop's session gaps (None: open arrivals), each
    request's time before its prefill (front end and reload), and where the next solve starts."""

    balance: StepBalance
    prefill: FcfsPrefill | ThresholdPrefill | StalledPrefill
    reason: str
    session_gaps_s: np.ndarray | None
    before_prefill_s: np.ndarray
    warm_start: WarmStart

    @property
    def rate_per_rank_rps(self) -> float:
        return self.balance.rate_per_rank_rps

    @property
    def decode_step_s(self) -> float:
        return self.balance.decode_step_s

    @property
    def mean_step_s(self) -> float:
        return self.balance.mean_step_s

    @property
    def fcfs(self) -> FcfsPrefill | None:
        return self.prefill if isinstance(self.prefill, FcfsPrefill) else None

    @property
    def threshold(self) -> ThresholdPrefill | None:
        return self.prefill if isinstance(self.prefill, ThresholdPrefill) else None


def solve_rate(eng: RankEngine, rate_per_rank_rps: float, ca2: float,
               sessions_per_rank: float | None, warm: WarmStart) -> SolvedRate:
    """Fixed point at a per-rank request rate (decode batch, step times, prefill queue); `ca2`:
    squared coefficient of variation of the arrivals; `sessions_per_rank`: a closed loop's
    (None: open arrivals); `warm`: the last solve's landing."""
    x, n_sessions = rate_per_rank_rps, sessions_per_rank
    bal = solve_balance(eng, x, warm)
    if bal.stable:
        warm = WarmStart(x, bal.decode_batch, warm.merged_share)
    gaps = eng.queue.gap_s if n_sessions else None

    def solved(prefill, reason: str = "", warm_start: WarmStart = warm) -> SolvedRate:
        return SolvedRate(bal, prefill, reason, gaps, eng.reload_s + eng.frontend_s, warm_start)

    k = bal.runs.chunks
    if bal.prefill_share >= 1.0 or not np.isfinite(bal.mean_step_s):
        return solved(StalledPrefill(k * 0, 1.0), "prefill work fills every step: "
                      "utilization >= 1")
    if np.isinf(eng.policy.chunk_cap):
        part, reason = solve_fcfs(eng, bal, ca2, n_sessions, warm.merged_share)
        if reason:
            return solved(part, reason)
        return solved(part, "", WarmStart(warm.rate_per_rank_rps, warm.decode_batch,
                                          part.merged_share))
    part, rho_tok = solve_threshold(eng, bal, ca2, n_sessions)
    if part is None:
        return solved(StalledPrefill(k * 0, rho_tok), f"prefill tokens need {rho_tok:.2f}x the "
                      "step budget left by decodes: utilization >= 1")
    return solved(part)


def run_time_s(eng: RankEngine, st: SolvedRate, queue_wait_s: float = 0.0) -> float:
    """Mean time a request spends admitted; with `queue_wait_s`, its response time (the closed
    loop's R)."""
    p = st.prefill
    return eng.admitted_time_s(float(p.ttft_base_s.mean()), p.extra_s, st.mean_step_s,
                               p.shared_steps_mean_s) + queue_wait_s
