"""The screening tier: traffic moments, step tables, the aggregated closed form, the DP lockstep
term, Pareto front and best-under-SLO. Step models here are small test doubles with
hand-checkable times; the wiring to the real step model is tested in test_plan.py."""

from dataclasses import dataclass

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from model.perf.parallel import ParallelPlan
from model.perf.step_table import StepTable
from model.plan.screening import (
    _max_of_ranks,
    _poisson_pmf,
    best_under_slo,
    pareto_front,
    screen_aggregated,
    screen_disaggregated,
)
from model.plan.traffic import traffic_from_mix
from model.specs.errors import Infeasible


@dataclass
class ConstantStep:
    """Every step takes `t` seconds whatever it carries."""

    t: float
    plan: ParallelPlan = ParallelPlan()

    def step_time_s(self, p, pctx, b, dctx, seqs=1.0):
        return np.full(np.broadcast(p, b).shape, self.t)


@dataclass
class RooflineStep:
    """max(compute, HBM) + overhead: 2*N_active FLOPs per token; weights + KV read per step."""

    active_params: float = 20e9
    weight_bytes: float = 40e9
    kv_bytes_per_token: float = 50_000
    flops: float = 1e15
    hbm: float = 4e12
    overhead_s: float = 0.002
    plan: ParallelPlan = ParallelPlan()

    def step_time_s(self, p, pctx, b, dctx, seqs=1.0):
        p, b = np.asarray(p, float), np.asarray(b, float)
        compute = 2 * self.active_params * (p + b) / self.flops
        memory = (self.weight_bytes + b * dctx * self.kv_bytes_per_token) / self.hbm
        return self.overhead_s + np.maximum(compute, memory)


def _traffic(context=100_000, uncached=(1000, 3000), output=400, gap=10.0):
    n = len(uncached)
    return traffic_from_mix("t", np.full(n, context), np.array(uncached), np.full(n, output),
                            np.full(n, gap))


def test_traffic_moments_and_chunks():
    tr = _traffic()
    assert tr.mean_uncached_tokens == 2000 and tr.mean_output_tokens == 400 and tr.mean_gap_s == 10
    assert tr.hit_rate == pytest.approx(1 - 4000 / 200_000)
    # cap 1000 tokens/step: 1 + 3 chunks -> mean 2 steps, mean chunk 1000 tokens.
    assert tr.chunks(1000) == pytest.approx(2.0, rel=0.02)
    assert tr.chunk_tokens(1000) == pytest.approx(1000, rel=0.02)
    # cap above every request: one chunk each.
    assert tr.chunks(8192) == pytest.approx(1.0, rel=0.02)
    # gaps are capped as the AgentX replay caps them (300 s per-trajectory idle cap)
    assert traffic_from_mix("t", [1], [1], [1], [1000.0]).mean_gap_s == 300.0


def test_step_table_matches_model_on_grid_and_between():
    model = RooflineStep()
    table = StepTable(model, 100_000, 8192, 8192, 512, points=40)
    for p, b in ((0.0, 64.0), (4096.0, 0.0), (2000.0, 100.0)):
        exact = float(model.step_time_s(p, 100_000, b, 100_000))
        assert float(table(p, b)) == pytest.approx(exact, rel=0.03)
    stacked = StepTable.stack([table, StepTable(ConstantStep(0.5), 1, 1, 0, 0,
                                                grid=(table.p_grid, table.b_grid))])
    assert float(stacked(100.0, 10.0, which=1)) == pytest.approx(0.5)
    # per-plan scales (disaggregated decode workers' factor) multiply that plan's steps only
    scaled = StepTable.stack([table, StepTable(ConstantStep(0.5), 1, 1, 0, 0,
                                               grid=(table.p_grid, table.b_grid))], [1.0, 1.2])
    assert float(scaled(100.0, 10.0, which=1)) == pytest.approx(0.6)
    assert float(scaled(2000.0, 100.0, which=0)) == float(table(2000.0, 100.0))
    # the decode-only lookup is the table's first row, per plan
    assert float(scaled.decode(64.0, which=0)) == pytest.approx(
        float(model.step_time_s(0.0, 100_000, 64.0, 100_000)), rel=0.03)
    assert float(scaled.decode(10.0, which=1)) == pytest.approx(0.6)
    # a grid not evenly spaced in log1p (a caller's) is looked up by search, same values
    uneven = StepTable(model, 100_000, 8192, 0, 0, grid=(np.r_[0.0, np.geomspace(1, 8192, 40)],
                                                         np.r_[0.0, np.geomspace(1, 512, 40)]))
    assert float(uneven(2000.0, 100.0)) == pytest.approx(
        float(model.step_time_s(2000.0, 100_000, 100.0, 100_000)), rel=0.03)


def test_aggregated_constant_step_closed_form():
    # Constant 20 ms steps, 1 replica of 1 GPU, 10 lanes, threshold off (cap 8192 -> 1 chunk):
    # cycle = TTFT (1 step) + 400 decode steps + 10 s gap = 0.02 + 8 + 10 = 18.02 s;
    # rate = 10/18.02 = 0.5549 turns/s; TPGS = rate * (100,000 + 400) = 55,716 tok/s/GPU;
    # interactivity = 1/0.02 = 50 tok/s exactly (no step variance).
    tr = _traffic()
    table = StepTable(ConstantStep(0.02), tr.mean_context_tokens, 8192, 8192, 512)
    r = screen_aggregated(table, tr, 0, 1, 1, 1, np.array([10.0]), 0, 1, 1e9)
    assert r["rate_rps"][0] == pytest.approx(10 / 18.02, rel=1e-6)
    assert r["tokens_per_s"][0] == pytest.approx(10 / 18.02 * 100_400, rel=1e-6)
    assert r["p90_interactivity_tok_s"][0] == pytest.approx(50.0)
    assert r["limit"][0] == "lanes"
    # decode batch = rate * 400 steps * 0.02 s = 4.44 sequences
    assert r["decode_batch"][0] == pytest.approx(10 / 18.02 * 8, rel=1e-6)


def test_aggregated_kv_capacity_bound():
    # KV holds 2 contexts of 100K: decoding batch <= 2 -> rate <= 2/(400*0.02) = 0.25 turns/s.
    tr = _traffic()
    table = StepTable(ConstantStep(0.02), tr.mean_context_tokens, 8192, 8192, 512)
    r = screen_aggregated(table, tr, 0, 1, 1, 1, np.array([100.0]), 0, 1, 200_000)
    assert r["rate_rps"][0] == pytest.approx(0.25, rel=1e-6)
    assert r["limit"][0] == "kv_capacity"


def test_dp_lockstep_slowed_fraction_t36():
    # papers/research/theory.md §13 T36: DP=8 ranks, each with a prefill on 20% of steps: 1-(0.8)^8 = 83.2% of
    # steps wait for a prefill. Poisson per-rank rate with P(0) = 0.8 is lam = -ln 0.8.
    pmf = _max_of_ranks(_poisson_pmf(-np.log(0.8)), 8)
    assert 1 - pmf[0] == pytest.approx(0.832, abs=5e-4)
    assert pmf.sum() == pytest.approx(1.0)


def test_threshold_raises_p90_interactivity_under_long_prefills():
    # The post's mechanism (--long-prefill-token-threshold 512): with a compute-bound prefill, an
    # 8K chunk makes its step ~13x a decode step; 512-token chunks ride on memory-bound decode
    # steps. Same traffic and lanes: P90 interactivity must rise and TPGS must not fall.
    tr = _traffic(uncached=(4000, 12000))
    table = StepTable(RooflineStep(), tr.mean_context_tokens, 8192, 8192 * 8, 1024)
    conc = np.array([64.0])
    off = screen_aggregated(table, tr, 0, 1, 1, 1, conc, 0, 1, 1e9)
    on = screen_aggregated(table, tr, 0, 1, 1, 1, conc, 512, 1, 1e9)
    assert on["p90_interactivity_tok_s"][0] > 1.3 * off["p90_interactivity_tok_s"][0]
    assert on["tokens_per_s"][0] >= 0.99 * off["tokens_per_s"][0]
    # ...and the price the post names: the long request's own TTFT grows (more, smaller chunks)
    assert on["p90_ttft_s"][0] > off["p90_ttft_s"][0]


def test_disaggregated_closed_loop_at_a_given_concurrency():
    # Prefill instance (2 GPUs): 8192-token chunks in 0.5 s -> 16,384 tok/s, 8.192 rps at 2,000
    # uncached tokens (half 1,000, half 3,000). Decode instance (4 GPUs): 25 ms steps whatever
    # the batch. A lane's cycle (Little's law, N = r * cycle): Pollaczek-Khinchine wait in the
    # prefill queue, r E[S^2] / (2 (1 - rho)) with E[S^2] = E[U^2] / 16,384^2 = 5e6 / 16,384^2
    # (papers/research/theory.md §6) + 2,000 / 16,384 s of prefill + the KV hand-off (2,000 x 50 KB over 50 GB/s
    # + 32 descriptors x 2 us) + 400 decode steps x 25 ms + the 10 s gap.
    from scipy.optimize import brentq

    tr = _traffic()
    table = StepTable(ConstantStep(0.025), tr.mean_context_tokens, 8192, 8192, 1024)
    service, hand = 2000 / 16_384, 2000 * 50_000 / 50e9 + 32 * 2e-6

    def wait(r):
        return r * 5e6 / 16_384**2 / (2 * (1 - r / 8.192))

    def cycle(r):
        return wait(r) + service + hand + 400 * 0.025 + 10.0

    def run(t_prefill, b_cap, n=64.0):
        return pd.DataFrame(screen_disaggregated(t_prefill, 2, 1, table, 0, 4, b_cap, 1, 1, n,
                                                   tr, 8192, 50_000, 50e9)).iloc[0]

    free = run(0.5, 1e9)
    r = brentq(lambda r: r * cycle(r) - 64.0, 1e-6, 8.19)
    assert free["rate_rps"] == pytest.approx(r, rel=1e-4)
    assert free["decode_batch"] == pytest.approx(r * 400 * 0.025, rel=1e-4)  # b = r O T
    assert free["tpgs"] == pytest.approx(r * 100_400 / 6, rel=1e-4)
    assert free["p90_interactivity_tok_s"] == pytest.approx(40.0)
    assert free["limit"] == "lanes"
    # 16 decode slots: 16 / (400 x 25 ms) = 1.6 rps; the other lanes wait for a slot (TTFT)
    capped = run(0.5, 16.0)
    assert capped["rate_rps"] == pytest.approx(1.6, rel=1e-6) and capped["limit"] == "decode_rate"
    queue = 64 / 1.6 - cycle(1.6)
    # P90 prefill + wait, in tokens t: (1 - rho) P(U > t) + rho P(R > t - 2,000) = 0.1 with
    # rho = 1.6 / 8.192 = 0.195 and the residual law P(R > r) = E[(U - r)+] / E[U]. Below
    # t = 3,000 the free-server term alone is 0.805 x 0.5; at 3,000 only the busy term is left,
    # 0.195 x (3,000 - 1,000) / 4,000 = 0.098 < 0.1: the P90 is the 3,000-token prompt's own
    # prefill. + hand-off of the P90 2,800 tokens (+ 44 descriptors) + the slot queue.
    p90 = 3000 / 16_384 + 2800 * 50_000 / 50e9 + 44 * 2e-6
    assert capped["p90_ttft_s"] == pytest.approx(p90 + queue, rel=1e-4)
    # a prefill pool of 0.512 rps saturates: the queue's wait takes up the lanes it cannot serve
    slow = run(8.0, 1e9)
    assert 0.95 * 0.512 < slow["rate_rps"] < 0.512 and slow["limit"] == "prefill_rate"


def test_pareto_and_best_under_slo():
    df = pd.DataFrame({"tpgs": [100, 90, 80, 50, 60], "p90_interactivity_tok_s": [10, 30, 20, 60, 40],
                       "feasible": [True] * 5})
    front = pareto_front(df)
    # (80, 20) is dominated by (90, 30); the rest trade throughput for interactivity.
    assert list(front["tpgs"]) == [100, 90, 60, 50]
    assert best_under_slo(df, 35)["tpgs"] == 60
    with pytest.raises(Infeasible):
        best_under_slo(df, 100)


def test_finite_cache_misses_and_lower_tier_reloads():
    # Same constant-20 ms setting as above, threshold 512 tokens/step. Infinite cache: requests
    # of 1000 and 3000 new tokens take 2 and 6 chunks (mean 4 steps of prefill).
    # A finite cache that evicted 2048 more tokens per request: chunks = 4 + 2048/512 = 8, so
    # TTFT = 8 steps = 0.16 s; 500 tokens per request reloaded from host at 1 us/token add 0.5 ms.
    # cycle = 0.16 + 0.0005 + 400 * 0.02 + 10 = 18.1605 s -> rate = 10 / 18.1605 turns/s.
    tr = _traffic()
    table = StepTable(ConstantStep(0.02), tr.mean_context_tokens, 8192, 8192, 512)
    inf = screen_aggregated(table, tr, 0, 1, 1, 1, np.array([10.0]), 512, 1, 1e9)
    assert inf["mean_ttft_s"][0] == pytest.approx(4 * 0.02, rel=0.02)
    fin = screen_aggregated(table, tr, 0, 1, 1, 1, np.array([10.0]), 512, 1, 1e9,
                              reload_s_per_token=1e-6, miss_tokens=2048.0,
                              lower_tier_tokens=500.0)
    assert fin["mean_ttft_s"][0] == pytest.approx(8 * 0.02 + 500e-6, rel=0.02)
    assert fin["rate_rps"][0] == pytest.approx(10 / (0.16 + 0.0005 + 8 + 10), rel=1e-3)
    assert fin["tokens_per_s"][0] < inf["tokens_per_s"][0]


def test_fcfs_prefill_p90_mixes_the_free_server_and_the_residual_of_the_one_in_service():
    # Threshold off, one rank, 0.1 s per chunk; prompts of 1 and 3 chunks (1000 / 3000 tokens at
    # a 1000-token cap), 1 prompt/s: rho = 1 x 2 x 0.1 = 0.2. Pollaczek-Khinchine mean wait
    # lam E[S^2] / (2 (1 - rho)) = 1 x 5 x 0.01 / 1.6 = 31.25 ms. P90 TTFT in steps: free
    # server (0.8) -> own C in {1, 3}; busy (0.2) -> residual R then E[C] = 2, with
    # P(R > r) = E[(C - r)+] / E[C]. At t = 3 steps: 0.8 P(C > 3) + 0.2 P(R > 1)
    # = 0 + 0.2 x (0 + 2) / 2 / 2 = 0.1, so the P90 is 3 steps = 0.3 s.
    from model.plan.screening import _fcfs_prefill

    tr = _traffic()
    cap = np.array([1000.0])
    wait, p90 = _fcfs_prefill(tr, cap, 0.0, np.array([0]), 1.0, 0.1, 0.1, 0.1, 1, 1)
    assert wait[0] == pytest.approx(1 * 5 * 0.01 / 1.6)
    assert p90[0] == pytest.approx(0.3, rel=1e-6)
    # idle server: the P90 prompt's own 3 chunks
    assert tr.fcfs_p90_chunks(cap, 0.0)[0] == pytest.approx(3.0, rel=1e-6)
    # a threshold shares the budget: no FCFS wait
    assert _fcfs_prefill(tr, np.array([512.0]), 0.0, np.array([512]), 1.0, 0.1, 0.1, 0.1, 1,
                         1)[0][0] == 0.0


def test_fcfs_p90_solves_its_mixture_equation_at_any_load_and_extra():
    # The P90 is the smallest t with (1 - rho) P(C + e > t) + rho P(R > t - E[C]) <= 0.1
    # (Traffic.fcfs_p90_chunks), R's law P(R > r) = E[(C - r)+] / E[C] shifted by the extra
    # chunks e. Checked against that definition scanned on a 0.001-step grid, for a skewed
    # mix of 1..40-chunk prompts and loads and extras on both sides of the bracket's cases
    # (rho < 0.1, 0.1..0.9, > 0.9).
    rng = np.random.default_rng(7)
    tokens = np.ceil(rng.lognormal(7.5, 1.0, 400))
    tr = traffic_from_mix("skewed", np.full(400, 1e5), tokens, np.full(400, 300.0),
                          np.full(400, 5.0))
    cap = 512.0
    c = np.ceil(tokens / cap)
    rho = np.array([0.0, 0.05, 0.3, 0.6, 0.95, 0.999])
    extra = np.array([0.0, 0.5, 2.0, 0.0, 3.0, 1.0])
    got = tr.fcfs_p90_chunks(np.full(6, cap), rho, extra)
    t = np.arange(0.0, 200.0, 0.001)
    for r, e, value in zip(rho, extra, got, strict=True):
        own = (c[None, :] + e > t[:, None]).mean(1)
        b = t - (c.mean() + e) - e  # R > t - E[C]: residual excess at b
        excess = np.where(b < 0, c.mean() - b, np.maximum(c[None, :] - b[:, None], 0).mean(1))
        tail = (1 - r) * own + r * np.minimum(excess / (c.mean() + e), 1.0)
        assert value == pytest.approx(t[np.argmax(tail <= 0.1)], abs=2e-3)


@dataclass
class LinearDecodeStep:
    """A decode step of 20 ms + `slope` (1 ms) per decoding sequence."""

    slope: float = 0.001
    plan: ParallelPlan = ParallelPlan()

    def step_time_s(self, p, pctx, b, dctx, seqs=1.0):
        return 0.02 + self.slope * np.asarray(b, float) + 0.0 * np.asarray(p, float)


def test_disaggregated_p90_step_carries_the_decode_batch_fluctuation():
    # 30 sequences decoding on average out of 100 lanes, outputs all 400 tokens (P10 = mean):
    # M/G/inf occupancy, binomial-thinned, averaged over a window equal to the decode length:
    # var = 30 x (1 - 1/3) x (1 - 30/100) = 14; sd of the step = 1 ms/seq x sqrt(14).
    from model.plan.screening import _batch_step_sd

    tr = _traffic()
    table = StepTable(LinearDecodeStep(), tr.mean_context_tokens, 8192, 8192, 1024)
    sd = _batch_step_sd(table, 0, np.array([30.0]), np.array([100.0]), np.array([False]), tr,
                        1.0)
    # (the slope comes from the step table, bilinear in log1p(b): its chord between grid points
    # lies up to ~7% above a straight line's slope here)
    assert sd[0] == pytest.approx(0.001 * np.sqrt(14.0), rel=0.1)
    # at the decode cap queued lanes keep every slot full: no fluctuation
    assert _batch_step_sd(table, 0, np.array([30.0]), np.array([100.0]), np.array([True]), tr,
                          1.0)[0] == 0.0


def test_disaggregated_decode_workers_take_their_engine_factor():
    # Decode-only workers run slower than the same batch in an aggregated engine: the search
    # multiplies their steps by EngineFactors.disagg_decode_scale (fitted on the calibration
    # runs with recorded workers, model.fit.engine). Constant 20 ms steps with a factor 1.25:
    # every disaggregated candidate decodes at 25 ms, and the decode saturation row's
    # interactivity is 1 / 0.025 = 40 tok/s (one token per step).
    from model.perf.step import EngineFactors
    from model.plan.plan_models import PlanModel
    from model.plan.screening_search import search_disaggregated

    tr = _traffic()
    grid = StepTable(ConstantStep(0.02), tr.mean_context_tokens, 8192, 8192, 512)
    grid = (grid.p_grid, grid.b_grid)

    @dataclass
    class FactoredStep(ConstantStep):
        factors: EngineFactors = EngineFactors(disagg_decode_scale=1.25)

    def model(t):
        step = FactoredStep(t)
        return PlanModel(ParallelPlan(), "h100-sxm", step, 1e9, 1.0, tr.mean_context_tokens,
                         8192.0, grid)

    frame, sat = search_disaggregated([model(0.5)], [model(0.02)], tr, 2, 1e5, 1e11, 8192, 0.0,
                                      [4.0, 16.0])
    assert np.allclose(frame["step_time_s"], 0.025)
    decode = sat[sat["phase"] == "decode"].iloc[0]
    assert decode["at_interactivity_tok_s"] == pytest.approx(40.0)


@settings(max_examples=40, deadline=None)
@given(t_prefill=st.floats(0.02, 5.0), slope_ms=st.floats(0.0, 2.0), x=st.integers(1, 4),
       y=st.integers(1, 4), b_cap=st.floats(1.0, 1e4))
def test_disaggregated_decode_batch_holds_every_lane(t_prefill, slope_ms, x, y, b_cap):
    # Whatever the load, the decode batch the solver returns satisfies the closed loop's
    # Little's law: lanes = rate x (mean TTFT + O / q decode steps + gap), with the 10 s gap of
    # `_traffic` (under the AgentX idle cap, so its mean) and O = 400; at the decode cap the
    # lanes beyond it queue, so rate is the cap's: y b_cap / (O T_D(b_cap)). Lanes span 1 to
    # 3,000, from an idle pool to a saturated prefill pool (0.004 to 13 rps of prefill).
    tr = _traffic()
    step = LinearDecodeStep(slope=slope_ms * 1e-3)
    table = StepTable(step, tr.mean_context_tokens, 8192, 8192, 1e5)
    lanes = np.geomspace(1.0, 3000.0, 40)
    r = pd.DataFrame(screen_disaggregated(t_prefill, 2, 1, table, 0, 4, b_cap, x, y, lanes, tr,
                                            8192, 50_000, 50e9))
    free = r["limit"] != "decode_rate"
    cycle = r["mean_ttft_s"] + 400 * r["step_time_s"] + 10.0
    held = (r["rate_rps"] * cycle)[free]
    # (1e-4: the solver stops at 1e-8 in log b, and near prefill saturation the lanes held
    # climb steeply with b)
    assert np.allclose(held, lanes[free], rtol=1e-4)
    assert (r["decode_batch"][free] <= b_cap * (1 + 1e-9)).all()
    capped = r[~free]
    assert np.allclose(capped["rate_rps"], y * capped["decode_batch_cap"]
                       / (400 * capped["step_time_s"]), rtol=1e-9)
