"""Subagent runs as concurrent chains: the simulator's fork/join lanes (model.serve.sim_lanes),
a run's requests dealt to chains, the parent's next turn after the last of them, and what the
closed form adds for a subagent request's siblings (model.serve.siblings) (AIPerf's AgentX replay plays a
subagent's agent chains as concurrent streams joined at the parent's next turn;
papers/research/workloads.md §1.4 f, §1.5)."""

import numpy as np
import pytest
from scipy.stats import binom

from model.serve.policy import EnginePolicy
from model.serve.siblings import Siblings, subagent_chains, with_sibling_decodes
from model.serve.sim_lanes import Lane
from model.serve.simulate import simulate
from model.specs.workload import ClosedLoop, load_workload
from model.validate.agreement import SM_FIXED

# eight requests: main, main, a subagent run of five, main; gaps 1..8 s, gap shares all 1
RUN = np.array([0, 0, 1, 1, 1, 1, 1, 0])
SESSION = (np.ones(8), np.ones(8), np.ones(8), np.arange(1.0, 9.0), np.ones(8), RUN)


def test_chains_are_the_inverse_wall_share_rounded():
    # agentx-v1's subagent wall share 0.3336 (042026) -> 3 chains; a share of 1 plays in order
    assert [subagent_chains(w) for w in (0.3336, 0.45, 0.8, 1.0)] == [3, 2, 1, 1]


def test_a_run_forks_into_dealt_chains_and_joins_at_the_parent():
    lane = Lane(SESSION, 1, chains=3)
    # requests 2..6 dealt in turn: chain 0 gets 2 and 5, chain 1 gets 3 and 6, chain 2 gets 4;
    # each chain's first request goes after the run's spawn gap (the gap before request 2)
    assert lane.finished(None) == [(2, 0, 2), (3, 1, 2), (4, 2, 2)]
    assert lane.finished(0) == [(5, 0, 5)]  # the chain's next request, after its own gap
    assert lane.finished(2) == []  # chain 2 is done, two still run
    assert lane.finished(0) == []  # chain 0 is done, chain 1 still runs
    assert lane.finished(1) == [(6, 1, 6)]
    assert lane.finished(1) == [(7, None, 7)]  # the last chain ends: the parent's next turn
    assert lane.finished(None) is None  # the session is over


def test_a_lane_that_starts_inside_a_run_joins_its_fork_there():
    # warm start at request 4: the chains keep their dealt requests from 4 on (5, 6 and 4)
    lane = Lane(SESSION, 4, chains=3)
    assert lane.begin(4) == [(5, 0, 4), (6, 1, 4), (4, 2, 4)]
    assert lane.pending == 3 and lane.turn == 7


def test_one_chain_plays_the_run_in_order():
    lane = Lane(SESSION, 1, chains=1)
    assert [lane.finished(None) for _ in range(6)] == [[(k, None, k)] for k in range(2, 8)]


def test_delays_are_capped_gaps_times_their_share():
    share = np.full(8, 0.5)
    lane = Lane(SESSION[:4] + (share, RUN), 0)
    assert lane.delay_s(3, 300.0) == pytest.approx(2.0)  # gap 4 s x 0.5
    assert lane.delay_s(7, 6.0) == pytest.approx(3.0)  # gap 8 s capped at 6 s, x 0.5
    assert lane.delay_s(0, 300.0) == 0.0  # a session's first request goes at once


def test_forked_runs_put_siblings_in_flight_together():
    # one AgentX session: unforked, its 1.22 lanes round to one lane, so at most one request
    # decodes at a time; forked, a subagent run's three chains decode side by side
    w = load_workload("agentx-v1")
    pol = EnginePolicy(max_num_batched_tokens=16384)
    kw = dict(duration_s=3000, seed=1, hit_rate=0.96)  # seed 1 reaches a subagent run
    one = simulate(SM_FIXED, w, pol, ClosedLoop(1, forked_runs=False), **kw)
    fork = simulate(SM_FIXED, w, pol, ClosedLoop(1), **kw)
    assert one.step_decodes.max() == 1
    assert fork.step_decodes.max() == 3


def test_sibling_decodes_shift_the_window_law_binomially():
    # a window of 2 steps that sees no prefill (Y = 0 surely), two siblings each decoding half
    # the time (S ~ Binomial(2, 1/2): 1/4, 1/2, 1/4), each adding 0.5 s to every step: Y is
    # 0, 1 or 2 s with those probabilities (values by hand)
    sib = Siblings(0.0, binom.pmf(np.arange(3), 2, 0.5), 0.5)
    y, pmf = with_sibling_decodes(np.arange(4.0), np.array([1.0, 0.0, 0.0, 0.0]), 2.0, sib)
    law = dict(zip(np.round(y, 9), pmf, strict=True))
    assert [law[0.0], law[1.0], law[2.0]] == pytest.approx([0.25, 0.5, 0.25])
    assert pmf.sum() == pytest.approx(1.0)
