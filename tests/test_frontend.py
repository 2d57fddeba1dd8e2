"""The API server in front of the engine: every request's whole prompt is rendered and tokenized
before an engine sees it (EnginePolicy.frontend_s; rate model.specs.defaults.
FRONTEND_S_PER_PROMPT_TOKEN, 1.15 us a token: TensorRT-LLM's front end, nsys-timed, 43.7 ms for
a ~38K-token prompt, github.com/NVIDIA/TensorRT-LLM/pull/18389), and a Python front end's
chat-template render on top (model.specs.defaults.FRONTEND_RENDER_S_PER_PROMPT_TOKEN). The engine
alone has none."""

from __future__ import annotations

import numpy as np
import pytest

from model.perf.parallel import ParallelPlan
from model.plan.deployment import Deployment, PhaseConfig
from model.serve.engine import AffineStepModel, serve
from model.serve.policy import EnginePolicy, frontend_rate_s_per_token
from model.serve.request_mix import request_mix_for
from model.serve.simulate import simulate
from model.specs.defaults import FRONTEND_S_PER_PROMPT_TOKEN
from model.specs.errors import ServecastError
from model.specs.workload import ClosedLoop, OpenLoop, TraceArrivals, load_workload

SM = AffineStepModel(a=0.012, b=3e-5, c=1e-4, d=1.5e-9, e=2e-10)
RATE = FRONTEND_S_PER_PROMPT_TOKEN


def test_the_rate_is_the_measured_tokenization_time():
    # 43.7 ms for a ~38K-token prompt (TensorRT-LLM PR 18389): 1.15 us a token
    measured_s_per_token = 43.7e-3 / 38e3
    assert measured_s_per_token == pytest.approx(RATE, rel=0.01)
    assert EnginePolicy().frontend_s(1e5) == 0.0  # the engine alone


def test_simulated_ttft_adds_the_prompts_tokenization():
    # one 1024-token prompt on an idle engine: TTFT = front end 1024 r + one prefill step
    # a + b 1024 + e 1024^2 (test_simulate's hand derivation without a front end)
    ta = TraceArrivals(np.array([0.0]), np.array([1024.0]), np.array([1024.0]), np.array([4.0]))
    policy = EnginePolicy(frontend_s_per_prompt_token=RATE)
    r = simulate(SM, None, policy, ta, duration_s=10.0, warmup_s=0.0)
    prefill = 0.012 + 3e-5 * 1024 + 2e-10 * 1024 * 1024
    assert r.ttft_s[0] == pytest.approx(RATE * 1024 + prefill, rel=1e-9)


def test_closed_form_ttft_adds_the_whole_prompts_tokenization_at_idle():
    # a vanishing open-loop rate: no queue, so the mean TTFT grows by r E[context] exactly
    # (the context, not the uncached part: the whole prompt is resent every turn)
    w = load_workload("agentx-v1")
    alone = serve(SM, w, EnginePolicy(), OpenLoop(1e-4))
    fronted = serve(SM, w, EnginePolicy(frontend_s_per_prompt_token=RATE), OpenLoop(1e-4))
    context = float(np.mean(request_mix_for(w).context_tokens))
    assert fronted.mean_ttft_s - alone.mean_ttft_s == pytest.approx(RATE * context, rel=1e-6)
    assert fronted.mean_frontend_s == pytest.approx(RATE * context, rel=1e-9)


def test_closed_form_and_simulator_agree_with_a_front_end():
    # 16 agentx-v1 lanes, threshold 512, each turn drawn independently (sessions=False: a
    # 3,000 s replay of whole sessions covers too few of them to hold the sample's context
    # tail, which the front end's time follows). Simulated (seed 0): TTFT P50 / P90 0.261 /
    # 0.886 s, TPGS 62.6K; the closed form 0.254 / 0.913 s, 60.7K
    w = load_workload("agentx-v1")
    policy = EnginePolicy(8192, 256, 512, frontend_s_per_prompt_token=RATE)
    cf = serve(SM, w, policy, ClosedLoop(16))
    sim = simulate(SM, w, policy, ClosedLoop(16), duration_s=3000.0, seed=0, sessions=False)
    assert cf.ttft_s["p50"] == pytest.approx(float(np.percentile(sim.ttft_s, 50)), rel=0.10)
    assert cf.ttft_s["p90"] == pytest.approx(float(np.percentile(sim.ttft_s, 90)), rel=0.10)
    assert cf.tpgs == pytest.approx(sim.total_tokens_per_s_per_gpu, rel=0.10)


def test_a_bad_rate_is_one_error_line():
    with pytest.raises(ServecastError, match="frontend_s_per_prompt_token"):
        EnginePolicy(frontend_s_per_prompt_token=-1e-6)


def test_a_python_front_end_adds_its_template_render():
    # TensorRT-LLM PR 16231: a Python front end's Jinja render is "hundreds of ms per request at
    # ~100k-token chats"; the low end, 200 ms per 100K tokens, is 2 us a token on top of the
    # tokenization. The Rust front ends (vLLM's, Dynamo's) render in Rust, not counted
    assert frontend_rate_s_per_token("python") == pytest.approx(RATE + 200e-3 / 100e3)
    assert frontend_rate_s_per_token("rust") == frontend_rate_s_per_token("dynamo") == RATE
    assert frontend_rate_s_per_token(None) == RATE
    # a 100K-token turn waits 0.315 s in a Python front end before the engine sees it
    python = EnginePolicy(frontend_s_per_prompt_token=frontend_rate_s_per_token("python"))
    assert python.frontend_s(1e5) == pytest.approx(0.315)


def test_an_unknown_front_end_is_one_error_naming_the_allowed_ones():
    with pytest.raises(ServecastError, match="allowed python, rust, dynamo, got 'node'"):
        frontend_rate_s_per_token("node")
    replica = PhaseConfig("b300", ParallelPlan(tp=2), 1)
    with pytest.raises(ServecastError, match="frontend 'node': allowed python, rust, dynamo"):
        Deployment(mode="aggregated", arch="minimax-m3", concurrency=1, replica=replica,
                   frontend="node")


@pytest.mark.slow
def test_plan_and_serve_put_the_same_front_end_before_the_engines(cli):
    # MiniMax M3 TP4 on B300, 4 agentx-v1 sessions behind vLLM's Python front end: `plan
    # --deployment` reports what `serve` reports, and each request waits 3.15 us a prompt token
    # in the front end (tokenization and template render) before an engine sees it
    common = ("--arch", "minimax-m3", "--hardware", "b300", "--workload", "agentx-v1",
              "--concurrency", "4", "--frontend", "python", "--json")
    served = cli("serve", "--deployment", "tp4", *common)
    planned = cli("plan", "--deployment", "tp4", *common)
    assert served.code == 0 and planned.code == 0, (served.stderr, planned.stderr)
    s, p = served.json, planned.json
    assert s["deployment"]["engine"]["frontend"] == p["deployment"]["engine"]["frontend"] \
        == "python"
    assert p["p90_ttft_s"] == pytest.approx(s["p90_ttft_s"], rel=1e-9)
    context = float(np.mean(request_mix_for(load_workload("agentx-v1")).context_tokens))
    assert s["mean_frontend_s"] == pytest.approx(3.15e-6 * context, rel=1e-6)
