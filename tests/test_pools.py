"""The full tier of a disaggregated deployment (model.serve.pools), on a reference step model
whose times are checked by hand: the M/D/1 limit of the prefill queue, one
session with no queueing, the saturated decode pool, the lock-stepped prefill ranks."""

from dataclasses import dataclass, field

import numpy as np
import pytest

from model.perf.parallel import ParallelPlan
from model.perf.step import EngineFactors
from model.serve.policy import EnginePolicy
from model.serve.pools import Workers, build_pools, serve_pools, state_at
from model.specs.errors import ServecastError
from model.specs.workload import ClosedLoop, OpenLoop, load_workload

LINK = 50e9  # bytes/s per GPU
KV = 1000.0  # bytes per token handed off


@dataclass
class Affine:
    """t = a + b P (+ lock-step: `rank_extra` per other DP rank carrying prefill) for prefill
    steps, d + c B for decode steps; one 1-GPU rank per worker unless `plan` says more."""

    a: float = 0.05
    b: float = 2e-5
    d: float = 0.02
    c: float = 0.0
    rank_extra: float = 0.0
    plan: ParallelPlan = ParallelPlan()
    factors: EngineFactors = field(default_factory=EngineFactors)
    tokens_per_decode_step: float = 1.0
    kv_bytes_per_token: float = KV
    kv_tokens: float = 1e12

    @property
    def gpus(self) -> int:
        return self.plan.gpus

    def step_time_s(self, prefill_tokens, prefill_context=0.0, decode_seqs=0.0,
                    decode_context=0.0, prefill_seqs=1.0, prefill_ranks=None):
        p, b = np.asarray(prefill_tokens, float), np.asarray(decode_seqs, float)
        ranks = self.plan.dp if prefill_ranks is None else prefill_ranks
        per_rank = p / ranks
        prefill = self.a + self.b * per_rank + self.rank_extra * (ranks - 1)
        return np.where(p > 0, prefill, self.d + self.c * b)

    def kv_capacity_tokens(self, context):
        return np.full(np.shape(context), self.kv_tokens)


FIXED = load_workload("fixed-8k1k")  # 8,192 new tokens, 1,024 out, no gap, no cache
POLICY = EnginePolicy(max_num_batched_tokens=8192)
SERVICE = 0.05 + 2e-5 * 8192  # one whole-budget chunk: 0.21384 s
HANDOFF = 8192 * KV / LINK + 128 * 2e-6  # 8,192 tokens' KV over one GPU's link, 128 blocks


def _serve(load, prefill=None, decode=None, policy=POLICY):
    return serve_pools(FIXED, policy, load, Workers(prefill or Affine(), 1),
                       Workers(decode or Affine(), 1), LINK)


def test_open_loop_prefill_queue_is_m_d_1():
    # Every prompt is one 8,192-token chunk: a deterministic service S = 0.21384 s on one rank,
    # Poisson arrivals at 2/s: rho = 0.4277, M/D/1 mean wait rho S / (2 (1 - rho)) (papers/research/theory.md
    # §6). Mean TTFT = wait + S + hand-off + the first decode step (20 ms); 1 - rho > 1/2 of the
    # prompts find the server idle, so the median TTFT carries no wait.
    r, sol = _serve(OpenLoop(2.0))
    rho = 2.0 * SERVICE
    assert sol.state.utilization == pytest.approx(rho, rel=1e-9)
    wait = rho * SERVICE / (2 * (1 - rho))
    assert r.mean_ttft_s == pytest.approx(wait + SERVICE + HANDOFF + 0.02, rel=0.01)
    assert r.ttft_s["p50"] == pytest.approx(SERVICE + HANDOFF + 0.02, rel=0.01)
    # decode: constant 20 ms steps, one token each: TPOT 20 ms at every percentile
    assert r.tpot_s["p90"] == pytest.approx(0.02) and r.interactivity_tok_s["p99"] == 50.0
    # TPGS: 2 requests/s x (8,192 + 1,024) tokens over 2 GPUs
    assert r.tpgs == pytest.approx(2.0 * 9216 / 2)
    # past the prefill rank's capacity (1 / S = 4.68/s) the pools are unstable, with the reason
    over, _ = _serve(OpenLoop(5.0))
    assert not over.stable and "prefill rate" in over.reason


def test_one_session_never_waits():
    # One session, no gaps (fixed-8k1k): each turn is S + hand-off + the first step, then 1,023
    # decode steps of 20 ms. Nothing queues; the response-time law gives the rate 1 / cycle.
    r, sol = _serve(ClosedLoop(1))
    ttft = SERVICE + HANDOFF + 0.02
    cycle = ttft + 1023 * 0.02
    assert sol.state.wait_s == pytest.approx(0.0, abs=1e-9)
    assert r.ttft_s["p90"] == pytest.approx(ttft, rel=2e-3)
    assert r.requests_per_s == pytest.approx(1 / cycle, rel=1e-4)
    assert r.decode_batch_per_rank == pytest.approx(1023 * 0.02 / cycle, rel=1e-4)


def test_saturated_decode_pool():
    # Decode steps of 20 ms + 1 ms per sequence, at most 4 sequences per rank, 64 sessions:
    # the batch stays full, so the rate is 4 / (1,023 x 24 ms) and every request sees a 24 ms
    # step (no fluctuation); the sessions beyond wait for admission in their TTFT.
    decode = Affine(c=0.001)
    r, sol = _serve(ClosedLoop(64), decode=decode, policy=EnginePolicy(8192, 4))
    rate = 4 / (1023 * 0.024)
    assert r.requests_per_s == pytest.approx(rate, rel=1e-6)
    assert r.bounded_by == "max_num_seqs" and sol.state.at_cap
    assert r.tpot_s["p50"] == r.tpot_s["p99"] == pytest.approx(0.024)
    assert sol.admission_wait_s == pytest.approx(64 / rate - sol.state.response_s, rel=1e-6)


def test_lock_stepped_prefill_ranks_wait_for_each_other():
    # Two DP ranks; a step with the other rank also prefilling takes 30 ms more. The rank's
    # utilization solves rho = x (S1 + rho 0.03) for one chunk per prompt: rho = x S1 / (1 -
    # 0.03 x), x the rank's arrivals (the deployment's 3/s over two ranks).
    prefill = Affine(rank_extra=0.03, plan=ParallelPlan(dp=2))
    pools = build_pools(FIXED, POLICY, OpenLoop(3.0), Workers(prefill, 1), Workers(Affine(), 1),
                        LINK)
    st = state_at(pools, OpenLoop(3.0), 3.0, pools.gap_s, None)
    x = 1.5
    assert st.utilization == pytest.approx(x * SERVICE / (1 - 0.03 * x), rel=1e-9)
    assert st.service_s.mean() == pytest.approx(SERVICE + st.utilization * 0.03, rel=1e-9)


def test_partial_chunks_share_a_step_when_a_prompt_waits():
    # 8,192-token prompts in a 16,384-token budget: alone, a prompt takes its own step
    # (S = 0.05 + 2e-5 x 8,192); with the next prompt queued (probability rho) it shares a
    # full step by its tokens, half of t(16,384) = 0.5 x 0.37768. E[S] = S + rho (0.18884 - S).
    pools = build_pools(FIXED, EnginePolicy(16384), OpenLoop(2.0), Workers(Affine(), 1),
                        Workers(Affine(), 1), LINK)
    st = state_at(pools, OpenLoop(2.0), 2.0, pools.gap_s, None)
    shared = 0.5 * (0.05 + 2e-5 * 16384)
    rho = st.utilization
    assert rho == pytest.approx(2.0 * (SERVICE + rho * (shared - SERVICE)), rel=1e-9)


def test_disaggregated_settings_are_checked():
    with pytest.raises(ServecastError, match="long_prefill_token_threshold"):
        _serve(ClosedLoop(4), policy=EnginePolicy(8192, 256, 512))


def test_leaving_out_the_e2e_law_changes_no_other_number():
    # as model.serve.engine.serve: e2e=False drops only the E2E normalized interactivity
    full, _ = _serve(ClosedLoop(4))
    lean, _ = serve_pools(FIXED, POLICY, ClosedLoop(4), Workers(Affine(), 1),
                          Workers(Affine(), 1), LINK, e2e=False)
    assert lean.with_e2e().as_dict() == full.as_dict()  # the law left out, run later
    full, lean = full.as_dict(), lean.as_dict()
    # E2E per token of a fixed 8,192/1,024 request: at least its 1,023 decode steps of 20 ms
    assert 1.0 / full.pop("e2e_interactivity_tok_s")["p50"] > 1023 * 0.02 / 1024
    assert lean.pop("e2e_interactivity_tok_s") == {}
    assert lean == full
