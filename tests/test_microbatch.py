"""Pipeline-parallel replicas keep pp microbatches in flight, in both tiers of the serving model.

vLLM runs a pipeline-parallel engine with a batch queue of pp scheduled batches
(vllm/v1/engine/core.py, EngineCore.step_with_batch_queue; max_concurrent_batches is the
pipeline-parallel size), so every stage works on one microbatch while the others are on the
other stages. model.perf.microbatch gives the full tier those lanes; the screening tier prices
the same pipeline period (model.plan.screening._cadence_steps)."""

import pytest

from model.perf.microbatch import MicrobatchSteps, pipeline_lanes
from model.plan.deployment import parse_deployment_label
from model.plan.evaluate import evaluate_deployment, labelled_deployment, worker_step_model
from model.plan.inputs import ServingChoices, resolve_inputs, setup_for
from model.plan.planner import screening_at
from model.serve.policy import EnginePolicy


def _deployment(setup, label: str, gpus: int, sessions: int, policy: EnginePolicy):
    shape, _ = parse_deployment_label(label).resolve(gpus)
    return labelled_deployment(shape, setup, sessions, policy)


def _tpgs(setup, label: str, gpus: int, sessions: int, policy: EnginePolicy) -> float:
    result = evaluate_deployment(setup, _deployment(setup, label, gpus, sessions, policy)).result
    assert result.stable, result.reason
    return result.tpgs


def test_a_pass_carries_one_microbatch():
    """The view's pass over the lanes' decodes is the step model's pipeline latency of a
    pp-th of them, and a pp2-dp2 replica is four lanes."""
    setup = setup_for("qwen3-32b", "h100", "fixed-1k1k", ServingChoices())
    dep = _deployment(setup, "pp2-tp4", 8, 8, EnginePolicy())
    step = worker_step_model(setup, setup.hardware, dep.replica, True)
    view, lanes = pipeline_lanes(step)
    assert isinstance(view, MicrobatchSteps) and lanes == 2
    assert float(view.step_time_s(0.0, 0.0, 64.0, 2048.0)) == pytest.approx(
        float(step.step_time_s(0.0, 0.0, 32.0, 2048.0)), rel=1e-12)


@pytest.mark.slow
def test_pipeline_stages_stay_busy():
    """Qwen3-32B on 8 H100, 1K/1K requests, 128 sessions: one pp2-tp4 replica serves within
    20% of two tp4 replicas (it pays the stage hand-offs and lock-steps its microbatches). One
    batch at a time through both stages would serve 28% less than the two replicas."""
    setup = setup_for("qwen3-32b", "h100", "fixed-1k1k", ServingChoices())
    policy = EnginePolicy(8192, 256, 0, 1)
    pipelined = _tpgs(setup, "pp2-tp4", 8, 128, policy)
    replicas = _tpgs(setup, "2x[tp4]", 8, 128, policy)
    assert 0.8 * replicas <= pipelined <= replicas


@pytest.mark.slow
def test_a_pipeline_plan_serves_like_the_dp_plan_of_its_gpus():
    """DeepSeek V4 Pro on 12 GB300, agentx-v1, 1,152 sessions, threshold 512, cadence 8 (the
    screening's best peak-TPGS deployment is 2x[pp2-dp3-moetp3]): in both tiers it serves within
    5% of 2x[dp6-ep6], whose six ranks of a replica decode side by side as its 2 x 3 lanes do.
    One batch at a time through both stages serves about half (74.6K against 134K)."""
    inputs = resolve_inputs("deepseek-v4-pro", "gb300-nvl72", "agentx-v1")
    policy = EnginePolicy(inputs.max_num_batched_tokens, 256, 512, 8)
    tiers = {}
    for label in ("2x[pp2-dp3-moetp3]", "2x[dp6-ep6]"):
        dep = _deployment(inputs.setup, label, 12, 1152, policy)
        tiers[label] = (_tpgs(inputs.setup, label, 12, 1152, policy),
                        float(screening_at(inputs, dep)["tpgs"]))
    for pipelined, dp in zip(tiers["2x[pp2-dp3-moetp3]"], tiers["2x[dp6-ep6]"], strict=True):
        assert pipelined == pytest.approx(dp, rel=0.05)
