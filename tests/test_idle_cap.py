"""AgentX's system idle cap (AIPerf --system-idle-gap-cap-seconds 10: timers shift forward while
nothing is in flight; AIPerf docs/tutorials/agentx-mvp.md) in closed form (model.specs.idle_cap) and in the
discrete-event oracle (model.serve.simulate applies the rule exactly)."""

import numpy as np
import pytest

from model.serve.engine import serve
from model.serve.policy import EnginePolicy
from model.serve.simulate import simulate
from model.specs.errors import ServecastError
from model.specs.idle_cap import SystemIdleCap
from model.specs.workload import ClosedLoop
from model.validate.agreement import SM_FIXED, fixed_with_think

# AgentX v1.0 inter-turn gaps: log-normal, median 3.84 s, 10% over 1 min -> sigma 2.145
# (SemiAnalysis AgentX v1.0 statistics), capped at 300 s per trajectory
GAPS = np.minimum(np.exp(np.log(3.84) + 2.145 * np.random.default_rng(0).standard_normal(200_000)),
                  300.0)


def test_one_session_caps_every_gap():
    # with one lane every gap is an all-idle interval: the mean becomes E[min(gap, 10 s)]
    cap = SystemIdleCap(GAPS, 10.0)
    assert float(cap.gap_mean(1, 3.0)) == pytest.approx(float(np.minimum(GAPS, 10.0).mean()),
                                                        rel=2e-3)
    assert GAPS.mean() > 4 * np.minimum(GAPS, 10.0).mean()  # the cap matters: ~24 s -> ~5 s


def test_many_sessions_leave_the_gaps_alone():
    # 64 lanes active 3 s per turn: all idle only p^63 of the time (p = 24 / 27): < 0.1% change
    cap = SystemIdleCap(GAPS, 10.0)
    assert float(cap.gap_mean(64, 3.0)) == pytest.approx(GAPS.mean(), rel=1e-3)
    assert float(cap.gap_mean(1, 3.0)) < float(cap.gap_mean(4, 3.0)) < float(cap.gap_mean(16, 3.0))


def test_closed_form_matches_the_simulated_replay_rule():
    # two sessions of 2K/200 turns with log-normal (sigma 1) think time of mean 30 s: the cap
    # raises the request rate ~1.7x, and the closed form follows the exact simulation
    w = fixed_with_think(2048, 200, 30.0)
    pol = EnginePolicy(max_num_batched_tokens=8192)
    rates = {}
    for cap in (None, 10.0):
        load = ClosedLoop(2, idle_cap_s=cap)
        cf = serve(SM_FIXED, w, pol, load)
        sim = simulate(SM_FIXED, w, pol, load, duration_s=60_000, seed=1)
        rates[cap] = (cf.requests_per_s, sim.completed / sim.duration_s)
        assert cf.requests_per_s == pytest.approx(rates[cap][1], rel=0.06)
    assert rates[10.0][0] > 1.5 * rates[None][0]


def test_negative_idle_cap_is_refused():
    with pytest.raises(ServecastError, match="idle_cap_s"):
        ClosedLoop(4, idle_cap_s=-1.0)
