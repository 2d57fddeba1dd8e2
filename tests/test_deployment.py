"""Deployments: the description (model.plan.deployment), the labels users write, and the full tier
of a whole aggregated deployment (model.serve.deployment: sessions spread over replicas)."""

import pytest

from model.perf.parallel import ParallelPlan
from model.plan.deployment import Deployment, PhaseConfig, parse_deployment_label
from model.serve.deployment import serve_deployment
from model.serve.engine import AffineStepModel, serve
from model.serve.policy import EnginePolicy
from model.serve.pools import Workers
from model.specs.errors import ServecastError
from model.specs.workload import ClosedLoop, OpenLoop, load_workload


def test_deployment_gpus_and_dict():
    p = PhaseConfig("gb300-nvl72", ParallelPlan(tp=1, dp=4, ep=4), instances=1)
    d = PhaseConfig("gb300-nvl72", ParallelPlan(tp=1, dp=8, ep=8), instances=1)
    dep = Deployment(mode="disaggregated", arch="deepseek-v4-pro", concurrency=256, prefill=p,
                     decode=d)
    assert dep.gpus == 12
    out = dep.as_dict()
    assert out["workers"] == {"prefill": 1, "decode": 1}
    assert out["decode"]["plan"] == "dp8-ep8"
    assert dep.shape_label() == "1P[dp4-ep4]1D[dp8-ep8]"
    with pytest.raises(ServecastError):
        Deployment(mode="aggregated", arch="x", concurrency=1)


def test_labels_read_back_what_plan_labels_write():
    # the labels ParallelPlan.label and Deployment.shape_label write parse back to the plans
    for plan in (ParallelPlan(dp=8, ep=8), ParallelPlan(tp=8, moe_tp=8, dcp=8),
                 ParallelPlan(tp=2, pp=2, sp=True), ParallelPlan(pcp=4, ep=4), ParallelPlan()):
        assert parse_deployment_label(plan.label()).replica == plan
    shape = parse_deployment_label("1P[dp4-ep4]1D[dp8-ep8]")
    assert (shape.prefill, shape.prefill_workers) == (ParallelPlan(dp=4, ep=4), 1)
    assert (shape.decode, shape.decode_workers) == (ParallelPlan(dp=8, ep=8), 1)
    assert shape.resolve(12)[1] == 12
    # a bare plan takes its replicas from the GPU budget; `Rx[plan]` states them
    assert parse_deployment_label("tp4").resolve(16)[0].replicas == 4
    assert parse_deployment_label("tp4").resolve(None)[0].replicas == 1
    assert parse_deployment_label("agg 2x[tp4]").resolve(8)[0].replicas == 2


@pytest.mark.parametrize("label, gpus, what", [
    ("dp8-xp8", None, "'xp8' is not a degree"),
    ("tp4-tp2", None, "repeats a degree"),
    ("1P[dp4-ep4]", None, "not a deployment label"),
    ("tp4", 6, "--gpus 6 is not a multiple of the replica's 4 GPUs"),
    ("2x[tp4]", 16, "the deployment uses 8 GPUs, --gpus says 16"),
])
def test_bad_labels_are_one_line_naming_the_flag(label, gpus, what):
    with pytest.raises(ServecastError) as err:
        parse_deployment_label(label).resolve(gpus)
    text = str(err.value)
    assert "\n" not in text and text.startswith("--deployment") and what in text
    if "allowed" in text:
        assert "1P[dp4-ep4]1D[dp8-ep8]" in text


def test_aggregated_replicas_split_the_sessions_and_add_up():
    # 5 sessions over 2 replicas: one serves 2, the other 3 (sticky sessions). Rates add, TPGS
    # is the two replicas' mean per GPU, the concurrency the deployment's 5; each part is
    # serve() on one replica at its share.
    w = load_workload("fixed-8k1k")
    step, policy = AffineStepModel(), EnginePolicy()
    two, three = (serve(step, w, policy, ClosedLoop(n)) for n in (2, 3))
    r = serve_deployment(w, policy, ClosedLoop(5), replicas=Workers(step, 2))
    assert r.result.requests_per_s == pytest.approx(two.requests_per_s + three.requests_per_s)
    assert r.result.tpgs == pytest.approx((two.tpgs + three.tpgs) / 2)
    assert r.result.concurrency == 5 and r.gpus == 2
    weights = (two.requests_per_s, three.requests_per_s)
    mean_tpot = sum(wi * res.tpot_s["p90"] for wi, res in zip(weights, (two, three), strict=True)) / sum(weights)
    assert r.result.tpot_s["p90"] == pytest.approx(mean_tpot)
    assert any("request-weighted" in a for a in r.assumptions)
    # the E2E law left out of both parts and run later combines as the eager one does
    lean = serve_deployment(w, policy, ClosedLoop(5), replicas=Workers(step, 2), e2e=False)
    assert lean.result.e2e_interactivity_tok_s == {}
    assert lean.with_e2e().as_dict() == r.as_dict()
    # an even split is serve() itself, scaled to the replicas; an open rate splits evenly
    even = serve_deployment(w, policy, ClosedLoop(6), replicas=Workers(step, 2)).result
    assert even.tpgs == three.tpgs and even.requests_per_s == 2 * three.requests_per_s
    one = serve(step, w, policy, OpenLoop(0.5))
    both = serve_deployment(w, policy, OpenLoop(1.0), replicas=Workers(step, 2)).result
    assert both.ttft_s == one.ttft_s and both.requests_per_s == pytest.approx(1.0)


def test_a_session_with_subagents_states_its_request_chains():
    # agentx-v1: a quarter of its requests are subagents', 33.4% of whose time lengthens the
    # session (model.fit.workload.subagent_wall_share): 1 / (1 - 0.251 x 0.666) = 1.20 chains,
    # which the deployment's assumptions state; a profile without subagents states none
    step, policy = AffineStepModel(), EnginePolicy()
    r = serve_deployment(load_workload("agentx-v1"), policy, ClosedLoop(4),
                         replicas=Workers(step, 1))
    assert any("each session is 1.20 request chains" in a for a in r.assumptions)
    plain = serve_deployment(load_workload("fixed-8k1k"), policy, ClosedLoop(4),
                             replicas=Workers(step, 1))
    assert not any("request chains" in a for a in plain.assumptions)
