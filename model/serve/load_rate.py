"""The per-rank request rate a load puts on the engine, and the state the engine settles in.

An open loop sets the rate. A closed loop of N sessions per rank sets it through the
response-time law X = N / (Z + R(X)) (Z the mean gap, R the response time, which grows with X),
solved by regula falsi (`closed_loop_rate`). Around that:

- decode time: a closed loop times its decodes at the step they see, which is longer than the
  mean step (windows open where prefills complete, in long steps); the rate is solved again at
  that step once (`_seen_ratio`);
- the AgentX system idle cap (model.specs.idle_cap) shortens the gaps when every lane idles,
  which raises the rate at light load (`_idle_capped`);
- admission: at most max_num_seqs (or what the KV pool holds) run at once per rank; a closed
  loop's rate is capped where x * run_time(x) meets that limit, the other sessions queue for
  admission (`admission_cap`).

Every solve starts from where the last landed (`WarmStart`), so the calls run in order.
"""

from __future__ import annotations

import numpy as np

from model.serve.rank_engine import RankEngine
from model.serve.rate_solver import SolvedRate, run_time_s, solve_rate
from model.serve.step_balance import WarmStart
from model.serve.tpot_law import seen_step_s, tpot_law
from model.serve.ttft_law import ttft_law
from model.specs.idle_cap import SystemIdleCap
from model.specs.workload import ClosedLoop, Load

SEEN_RATIO_TOLERANCE = 0.005  # the re-solve at the seen step moves the rate < 0.3% more


def open_loop_state(eng: RankEngine, rate_per_rank_rps: float, ca2: float
                    ) -> tuple[SolvedRate, RankEngine]:
    """(state, engine with its seen ratio) at a per-rank request rate from outside (`ca2`: the
    arrivals' squared coefficient of variation)."""
    x = rate_per_rank_rps
    st = solve_rate(eng, x, ca2, None, WarmStart())
    if st.reason:
        return st, eng
    return st, eng.with_seen_ratio(_seen_ratio(eng, st, x, None))


def closed_loop_state(eng: RankEngine, load: ClosedLoop, sessions_per_rank: float
                      ) -> tuple[float, SolvedRate, RankEngine]:
    """(rate per rank, state, engine with its capped gaps and seen ratio) of the sessions on a
    rank: solved at the mean step, then once more at the step decodes see. A rate <= 0 or a
    state with a reason: the load cannot be served."""
    n_rank = sessions_per_rank
    x, st = closed_loop_rate(eng, n_rank, 1.0, WarmStart())
    if x <= 0 or st.reason:
        return x, st, eng
    x, st, eng_capped = _idle_capped(eng, load, n_rank, x, st)
    if x <= 0 or st.reason:
        return x, st, eng_capped
    ratio = _seen_ratio(eng_capped, st, x, n_rank)
    if abs(ratio - eng.seen_ratio) < SEEN_RATIO_TOLERANCE * ratio:
        return x, st, eng_capped
    # start the re-solve where the longer decodes alone would put the rate
    near = n_rank / (n_rank / x + eng.mean_decode_steps * st.mean_step_s
                     * (ratio - eng.seen_ratio))
    seen = eng.with_seen_ratio(ratio)
    x, st = closed_loop_rate(seen, n_rank, 1.0, st.warm_start, near_rps=near)
    if x > 0 and not st.reason:
        return _idle_capped(seen, load, n_rank, x, st)
    return x, st, seen


def _seen_ratio(eng: RankEngine, st: SolvedRate, rate_per_rank_rps: float,
                sessions_per_rank: float | None) -> float:
    """The mean step decoding sequences see (token-weighted mean of the TPOT law) over the
    mean step, at the solved state. DSV4 DEP8 at 128 sessions, cadence 1: 92.9 ms seen over a
    70.6 ms mean step, simulated 87.8-94.0 ms over 69.5-74.6 ms; AgentX at 48 sessions with the
    threshold: 15.1 ms over 12.2 ms, simulated 14.1-14.6 over 11.9-12.0. Never below the mean
    step: every decoding sequence takes every step, and the law's mean falls below it only where
    the law has broken down (FCFS on lock-stepped ranks near saturation)."""
    law = ttft_law(st, st.prefill.extra_s)
    tpot = tpot_law(eng, st, rate_per_rank_rps, sessions_per_rank, law.distribution(),
                    st.decode_step_s)
    return max(seen_step_s(tpot) / st.mean_step_s, 1.0) if tpot.bins else 1.0


def _response_s(eng: RankEngine, st: SolvedRate) -> float:
    """The closed loop's response time R (inf past saturation)."""
    if st.reason:
        return np.inf
    return run_time_s(eng, st, st.prefill.mean_wait_s * st.prefill.wait_scale)


def saturation_backlog_s(eng: RankEngine, st: SolvedRate, rate_per_rank_rps: float,
                         sessions_per_rank: float) -> float:
    """The wait a closed loop's sessions spend queued beyond what the solved state explains,
    by Little's law: N / X - Z - R(X). Zero where the response-time law has its root; positive
    where the prefill queue saturates before the root (the law jumps from a finite response to
    no steady state), so the rate stays at the last served one and the rest of the sessions
    wait in the queue."""
    cycle_s = sessions_per_rank / rate_per_rank_rps
    return max(cycle_s - float(eng.sample.gap_s.mean()) - _response_s(eng, st), 0.0)


def closed_loop_rate(eng: RankEngine, sessions_per_rank: float, ca2: float, warm: WarmStart,
                     near_rps: float | None = None) -> tuple[float, SolvedRate]:
    """(rate, state) of the response-time law X = N / (Z + R(X)) by regula falsi (R grows with
    X); `near_rps`, a rate close to the answer, brackets it from there."""
    n, near = sessions_per_rank, near_rps
    z = float(eng.sample.gap_s.mean())
    feasible_from: dict[float, WarmStart] = {}  # each served rate's start

    def excess(x: float, warm: WarmStart) -> tuple[float, WarmStart]:
        """> 0 when x is too high (more requests than sessions allow); and the landing."""
        st = solve_rate(eng, x, ca2, n, warm)
        r = _response_s(eng, st)
        if np.isfinite(r):
            feasible_from[x] = warm
        return (1.0 if not np.isfinite(r) else x * (z + r) / n - 1.0), st.warm_start

    if near is None:
        st0 = solve_rate(eng, 1e-9, ca2, n, warm)
        hi = n / max(z + _response_s(eng, st0), 1e-12)  # no queueing: the upper bound
        f_hi, warm = excess(hi, st0.warm_start)
        lo, f_lo = 0.0, -1.0
        if f_hi <= 0:
            lo = hi
    else:
        lo, f_lo, hi, f_hi, warm = _bracket(excess, near, warm)
    lo, warm = _regula_falsi(excess, lo, f_lo, hi, f_hi, warm)
    st = solve_rate(eng, lo, ca2, n, warm)
    if st.reason and lo in feasible_from:
        # near saturation the merged prefill queue has two fixed points, and the last landing
        # (an infeasible rate's) can pick the stalled one: lo was served from its own start
        st = solve_rate(eng, lo, ca2, n, feasible_from[lo])
    return lo, st


def _regula_falsi(excess, lo: float, f_lo: float, hi: float, f_hi: float, warm: WarmStart
                  ) -> tuple[float, WarmStart]:
    """The root of the monotone `excess` in [lo, hi] by Illinois regula falsi: converges in a
    handful of evaluations where bisection needs ~15; infeasible rates (f = 1) fall back to
    halving."""
    side = 0
    for _ in range(60):
        if hi - lo < 2e-4 * hi:
            break
        if f_hi >= 1.0:  # unstable at hi: bisect until the function is finite
            mid = 0.5 * (lo + hi)
        else:
            mid = (lo * f_hi - hi * f_lo) / (f_hi - f_lo)
            mid = min(max(mid, lo + 1e-4 * (hi - lo)), hi - 1e-4 * (hi - lo))
        f, warm = excess(mid, warm)
        if f > 0:
            hi, f_hi = mid, f
            if side == -1:
                f_lo *= 0.5
            side = -1
        else:
            lo, f_lo = mid, f
            if side == 1:
                f_hi *= 0.5
            side = 1
        if abs(f) < 2e-4:
            lo = mid
            break
    return lo, warm


def _bracket(excess, near: float, warm: WarmStart, width: float = 0.003):
    """(lo, f(lo), hi, f(hi), landing) with f(lo) <= 0 < f(hi) around `near`, widening the
    step 2x at a time (from `width` x near)."""
    f, warm = excess(near, warm)
    step = width * near
    if f > 0:
        hi, f_hi = near, f
        while True:
            lo = max(hi - step, 0.0)
            f_lo = -1.0
            if lo > 0:
                f_lo, warm = excess(lo, warm)
            if f_lo <= 0:
                return lo, f_lo, hi, f_hi, warm
            hi, f_hi, step = lo, f_lo, 2.0 * step
    lo, f_lo = near, f
    while True:
        hi = lo + step
        f_hi, warm = excess(hi, warm)
        if f_hi > 0:
            return lo, f_lo, hi, f_hi, warm
        lo, f_lo, step = hi, f_hi, 2.0 * step


def _idle_capped(eng: RankEngine, load: ClosedLoop, sessions_per_rank: float,
                 rate_per_rank_rps: float, st: SolvedRate, passes: int = 2
                 ) -> tuple[float, SolvedRate, RankEngine]:
    """Re-solve the closed loop with the gaps the AgentX system idle cap leaves
    (model.specs.idle_cap): each pass reads the lanes' active time per turn at the last solution
    and scales the sample's gaps to the capped mean. Returns the engine with those gaps."""
    n_rank, x = sessions_per_rank, rate_per_rank_rps
    if load.idle_cap_s is None:
        return x, st, eng
    gaps = eng.sample.gap_s.copy()
    q_gaps = None if eng.queue_sample is None else eng.queue_sample.gap_s.copy()
    idle = SystemIdleCap(gaps, load.idle_cap_s)
    if idle.mean <= 0:
        return x, st, eng
    for _ in range(passes):
        active = n_rank / x - float(eng.sample.gap_s.mean())
        z_eff = float(idle.gap_mean(load.concurrency * eng.sample.lanes_per_session, active))
        if abs(z_eff - float(eng.sample.gap_s.mean())) < 1e-3 * idle.mean:
            break
        eng = eng.with_gaps(gaps * (z_eff / idle.mean),
                            None if q_gaps is None else q_gaps * (z_eff / idle.mean))
        x, st = closed_loop_rate(eng, n_rank, 1.0, st.warm_start)
        if x <= 0 or st.reason:
            break
    return x, st, eng


def admission_cap(eng: RankEngine, load: Load, rate_per_rank_rps: float, st: SolvedRate,
                  sessions_per_rank: float | None) -> tuple[float, SolvedRate, float, str, str]:
    """(rate, state, admission wait, what bounds it, why unstable) under the admission limit:
    running requests per rank (max_num_seqs, the KV pool). An open loop past it is unstable; a
    closed loop's throughput is capped where x * run_time(x) = limit (Little's law on the
    running set; run time grows with x), the remaining sessions queueing for admission."""
    x, n_rank = rate_per_rank_rps, sessions_per_rank
    running = x * run_time_s(eng, st)
    c, o = eng.sample.context_tokens, eng.sample.output_tokens
    kv_tokens = float(np.asarray(getattr(eng.step_model, "kv_capacity_tokens",
                                         lambda _context: np.inf)(float(c.mean())))) / eng.dp
    kv_seqs = kv_tokens / float(np.mean(c + o))
    limit = float(eng.policy.max_num_seqs)
    if kv_seqs < limit:
        limit = kv_seqs
        bounded_name = "kv_capacity"
    else:
        bounded_name = "max_num_seqs"
    if running <= limit:
        return x, st, 0.0, "", ""
    if not isinstance(load, ClosedLoop):
        return x, st, 0.0, "", (f"{running:.0f} requests per rank would run at once; "
                                f"{bounded_name} allows {limit:.0f}")
    x, st, r_run = _admission_capped_rate(eng, x, limit, n_rank, st.warm_start, running)
    admit_wait = max(n_rank / x - float(eng.sample.gap_s.mean()) - r_run
                     - st.prefill.mean_wait_s, 0.0)
    return x, st, admit_wait, bounded_name, ""


def _admission_capped_rate(eng: RankEngine, max_rate_rps: float, limit_requests: float,
                           sessions_per_rank: float, warm: WarmStart, running_at_max: float
                           ) -> tuple[float, SolvedRate, float]:
    """(x, state, run time) with x * run_time(x) = limit, by regula falsi below the uncapped
    rate x_hi, where `running_at_max` requests run at once (`_regula_falsi`, as for the closed
    loop's rate; a single re-solve at limit / run_time overshoots when the queue at x_hi made
    the run time long)."""
    x_hi, limit, n_rank = max_rate_rps, limit_requests, sessions_per_rank

    def excess(x: float, warm: WarmStart) -> tuple[float, WarmStart]:
        """(running - limit) / (running + limit): > 0 when x runs more requests at once than
        the limit, -1 at no load, 1 only where x is not served."""
        st = solve_rate(eng, x, 1.0, n_rank, warm)
        running = x * run_time_s(eng, st) if not st.reason else np.inf
        return ((running - limit) / (running + limit) if np.isfinite(running) else 1.0,
                st.warm_start)

    f_hi = (running_at_max - limit) / (running_at_max + limit)
    x, warm = _regula_falsi(excess, 0.0, -1.0, x_hi, f_hi, warm)
    x = max(x, 1e-12)
    st = solve_rate(eng, x, 1.0, n_rank, warm)
    return x, st, run_time_s(eng, st)
