"""The full tier's solved state is built whole and frozen, and a serve() call leaves nothing behind
that changes the next one (model.serve.rate_solver, model.serve.load_rate)."""

from __future__ import annotations

import dataclasses

import pytest

from model.serve.engine import AffineStepModel, serve
from model.serve.load_rate import closed_loop_rate
from model.serve.policy import EnginePolicy
from model.serve.rank_engine import rank_engine
from model.serve.rate_solver import solve_rate
from model.serve.request_mix import request_mix_for, request_sample
from model.serve.step_balance import WarmStart
from model.specs.workload import ClosedLoop, OpenLoop, load_workload

SM = AffineStepModel(a=0.008, b=3e-5, c=5e-5, d=1e-9, e=2e-10)


def _engine(threshold: int, load):
    w = load_workload("agentx")
    sample = request_sample(request_mix_for(w, 2000, 0), load)
    queue = request_sample(request_mix_for(w, 2000, 0, queue=True), load)
    return rank_engine(SM, sample, EnginePolicy(8192, 256, threshold), 1, queue)


@pytest.mark.parametrize("threshold", [0, 512])
def test_solved_state_and_its_parts_are_frozen(threshold):
    load = ClosedLoop(16)
    st = solve_rate(_engine(threshold, load), 0.5, 1.0, 16.0, WarmStart())
    assert not st.reason
    for record in (st, st.balance, st.prefill, st.warm_start):
        field = dataclasses.fields(record)[0].name
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(record, field, None)


def test_a_solve_depends_on_its_warm_start_only_through_its_arguments():
    # the same rate from the same warm start gives the same state; the warm start is returned,
    # not kept: a second solve from a fresh start repeats the first exactly
    eng = _engine(0, ClosedLoop(16))
    first = solve_rate(eng, 0.5, 1.0, 16.0, WarmStart())
    again = solve_rate(eng, 0.5, 1.0, 16.0, WarmStart())
    assert first.balance.mean_step_s == again.balance.mean_step_s
    assert first.prefill.mean_wait_s == again.prefill.mean_wait_s
    assert first.warm_start == again.warm_start
    assert first.warm_start.rate_per_rank_rps == 0.5
    x, st = closed_loop_rate(eng, 16.0, 1.0, first.warm_start)
    assert st.rate_per_rank_rps == x > 0


@pytest.mark.parametrize("threshold, load", [(0, ClosedLoop(24)), (512, ClosedLoop(24)),
                                             (0, OpenLoop(0.2))])
def test_serve_gives_the_same_answer_twice(threshold, load):
    # no module state or object filled in by one call reaches the next: a repeated call, after
    # a different one in between, is bit-identical
    w = load_workload("agentx")
    pol = EnginePolicy(8192, 256, threshold)
    first = serve(SM, w, pol, load, mix_size=4000).as_dict()
    serve(SM, w, pol.with_threshold(512 - threshold), ClosedLoop(8), mix_size=4000)
    assert serve(SM, w, pol, load, mix_size=4000).as_dict() == first


def test_leaving_out_the_e2e_law_changes_no_other_number():
    # serve(e2e=False) skips only the E2E normalized interactivity (model.serve.e2e_law): every
    # other field is the one the full call reports, bit for bit, and the E2E field is empty
    w = load_workload("agentx")
    pol = EnginePolicy(8192, 256, 512)
    full = serve(SM, w, pol, ClosedLoop(24), mix_size=4000).as_dict()
    lean_result = serve(SM, w, pol, ClosedLoop(24), mix_size=4000, e2e=False)
    lean = lean_result.as_dict()
    # the law left out runs later on the same solved state: the full call's answer, bit for bit
    assert lean_result.with_e2e().as_dict() == full
    assert full.pop("e2e_interactivity_tok_s")["p90"] > 0
    assert lean.pop("e2e_interactivity_tok_s") == {}
    assert lean == full
