"""Discrete-event oracle (model.serve.simulate) and the closed form's agreement with it on named
scenarios. The tolerances follow the closed form's agreement with the simulation (quoted per
scenario); where they exceed 10% the comment says why the two part."""

from __future__ import annotations

import numpy as np
import pytest
import yaml

from model import ROOT
from model.serve.engine import AffineStepModel, serve
from model.serve.policy import EnginePolicy
from model.serve.simulate import simulate
from model.specs.workload import (
    WORKLOADS_DIR,
    ClosedLoop,
    OpenLoop,
    TraceArrivals,
    load_workload,
    workload_from_dict,
)

SM = AffineStepModel(a=0.012, b=3e-5, c=1e-4, d=1.5e-9, e=2e-10)


def _rel(cf: dict, sim: dict) -> dict:
    return {k: cf[k] / sim[k] - 1.0 for k in cf}


def test_single_request_replays_the_step_model_exactly():
    # one 1024-token prompt, 4 output tokens, idle engine: TTFT = one prefill step
    # a + b*1024 + e*1024*1024 (end-of-chunk context); then 3 decode steps of a + c + d*ctx
    ta = TraceArrivals(np.array([0.0]), np.array([1024.0]), np.array([1024.0]), np.array([4.0]))
    r = simulate(SM, None, EnginePolicy(), ta, duration_s=10.0, warmup_s=0.0)
    prefill = 0.012 + 3e-5 * 1024 + 2e-10 * 1024 * 1024
    assert r.ttft_s[0] == pytest.approx(prefill, rel=1e-9)
    decode = [0.012 + 1e-4 + 1.5e-9 * (1024 + g) for g in (1, 2, 3)]
    assert r.tpot_s[0] == pytest.approx(np.mean(decode), rel=1e-9)


def test_threshold_chunks_a_prompt_into_threshold_sized_steps():
    # 2048-token prompt, threshold 512, idle engine: 4 chunk steps (theory T21), the i-th at
    # end-of-chunk context 512*i
    ta = TraceArrivals(np.array([0.0]), np.array([2048.0]), np.array([2048.0]), np.array([1.0]))
    r = simulate(SM, None, EnginePolicy(8192, 256, 512), ta, duration_s=10.0, warmup_s=0.0)
    steps = [0.012 + 3e-5 * 512 + 2e-10 * 512 * 512 * i for i in (1, 2, 3, 4)]
    assert r.ttft_s[0] == pytest.approx(sum(steps), rel=1e-9)


@pytest.mark.parametrize("out, measured_tpot, unfinished", [(200, 1, 0), (1000, 0, 1)])
def test_requests_arriving_before_the_end_are_drained(out, measured_tpot, unfinished):
    # a request arriving 1 s before duration_s: its first token comes inside the run, its
    # decode ends after duration_s. The drain (up to 1.25 x duration_s) finishes the 200-token
    # output (~2.4 s of decode) with the step model's exact TPOT, a + c + d*ctx averaged over
    # ctx 1025..1223; the 1000-token one (~12 s) stays unfinished, its TTFT still measured
    ta = TraceArrivals(np.array([9.0]), np.array([1024.0]), np.array([1024.0]),
                       np.array([float(out)]))
    r = simulate(SM, None, EnginePolicy(), ta, duration_s=10.0, warmup_s=0.0)
    assert r.ttft_s[0] == pytest.approx(0.012 + 3e-5 * 1024 + 2e-10 * 1024 * 1024, rel=1e-9)
    assert (len(r.tpot_s), r.completed, r.unfinished) == (measured_tpot, measured_tpot, unfinished)
    if measured_tpot:
        decode = [0.012 + 1e-4 + 1.5e-9 * (1024 + g) for g in range(1, out)]
        assert r.tpot_s[0] == pytest.approx(np.mean(decode), rel=1e-5)
    # step samples: the prefill and the decode steps that start before duration_s
    # ((10 - 9 - 0.0429) / 0.0121 -> 80 of them)
    assert len(r.step_s) == 81


def test_md1_prefill_queue_agrees_within_10_percent():
    # 4000-token prompts, 2 output tokens, Poisson 2/s: an M/D/1 queue of one-step prefills,
    # two of which can share one step (model.serve.fcfs_prefill). Closed form against 4000 s
    # simulated: TTFT p50 +0.1%, p90 -3.3%, p99 -3.4%.
    d = yaml.safe_load((WORKLOADS_DIR / "fixed-8k1k.yaml").read_text())
    d["input_tokens"]["dist"]["value"] = 4000
    d["output_tokens"]["dist"]["value"] = 2
    w = workload_from_dict(d)
    sm = AffineStepModel(a=0.012, b=3e-5, c=1e-4, d=1.5e-9, e=0.0)
    pol = EnginePolicy(8192, 256, 0)
    sim = simulate(sm, w, pol, OpenLoop(2.0), duration_s=4000, seed=3).summary()
    cf = serve(sm, w, pol, OpenLoop(2.0))
    for k, v in _rel(cf.ttft_s, sim["ttft_s"]).items():
        assert abs(v) < 0.10, (k, v)
    assert cf.tpgs == pytest.approx(sim["tpgs"], rel=0.03)


def test_fixed_8k1k_open_loop_agreement():
    # Poisson 1 req/s of 8k/1k, threshold off. Against 1500 s simulated: TTFT p50 -2.0%,
    # p90 -10.4%, p99 -8.6%; TPOT p50 0.0%, p90 -6.1%, p99 -6.3%; TPGS +0.9%. The 8-token
    # remainder of an 8192-token prompt rides in a step with the next prompt's 8176-token chunk,
    # so that prompt's first token waits a whole extra prefill step (the closed form's shared
    # last step, model.serve.fcfs_prefill). What remains at p90: a prompt that joins the previous
    # one's last step needs one step fewer than the closed form counts, and queue length and
    # service time correlate.
    w = load_workload("fixed-8k1k")
    pol = EnginePolicy(8192, 256, 0)
    sim = simulate(SM, w, pol, OpenLoop(1.0), duration_s=1500, seed=1).summary()
    cf = serve(SM, w, pol, OpenLoop(1.0))
    tpot, ttft = _rel(cf.tpot_s, sim["tpot_s"]), _rel(cf.ttft_s, sim["ttft_s"])
    assert all(abs(v) < 0.10 for v in tpot.values()), tpot
    assert abs(ttft["p50"]) < 0.10 and abs(ttft["p99"]) < 0.10, ttft
    assert abs(ttft["p90"]) < 0.12, ttft
    assert cf.tpgs == pytest.approx(sim["tpgs"], rel=0.03)


def test_fixed_8k1k_light_poisson_agrees_within_10_percent():
    # Poisson 0.5 req/s of 8k/1k, threshold off (model.validate.agreement scenario
    # fixed-8k1k-poisson-0.5). Against 1500 s simulated: TTFT p50 -0.9%, p90 -0.5%, p99 -4.2%;
    # TPOT p50 -1.5%, p90 -4.2%, p99 -7.5%; TPGS -3.1%. 13.5% of prompts (x * one prefill step =
    # 0.5 * 0.27 s) see the next prompt arrive during their first chunk and pay its 8176-token
    # chunk in their last step, +0.26 s: the TTFT p90 rests on that shared last step.
    from model.validate.agreement import agreement

    rel = agreement("fixed-8k1k-poisson-0.5", 1500)
    assert all(abs(v) < 0.10 for v in rel.values()), rel


def test_threshold_ttft_tails_carry_self_excited_runs():
    # Poisson 1 req/s of 8k/1k at long_prefill_token_threshold 512 (scenario
    # fixed-8k1k-poisson-1.0-t512): 16 chunks per prompt, prefill ~25% of each step. Runs
    # arriving in wall time crowd the long steps (a Poisson stream per step would put the TTFT
    # p90 / p99 about 20% short; processor sharing with step td + N h gives a mean of 0.64 s,
    # simulated 0.66 s). With the negative-binomial counts and the mean-field rate, against
    # 1500 s simulated: TTFT +1.1 / -1.5 / +0.2%, TPOT 0.0 / -5.5 / -5.5%.
    from model.validate.agreement import agreement

    rel = agreement("fixed-8k1k-poisson-1.0-t512", 1500)
    assert all(abs(v) < 0.10 for v in rel.values()), rel


@pytest.mark.parametrize("scenario", ["fixed-8k1k-think10-n16", "fixed-8k1k-think10-n32"])
def test_fixed_lengths_closed_loop_with_think_time_agrees_within_10_percent(scenario):
    # 8k/1k sessions with lognormal think time (mean 10 s), 16 and 32 sessions, threshold off.
    # Against 1500 s simulated: n16 TTFT -2.7/-1.4/+3.8%, TPOT +0.5/+2.6/+5.6%, TPGS -1.3%;
    # n32 TTFT -3.9/-8.1/-9.6%, TPOT -0.4/+1.8/+4.8%, TPGS -1.6% (p50/p90/p99)
    from model.validate.agreement import agreement

    rel = agreement(scenario, 1500)
    assert all(abs(v) < 0.10 for v in rel.values()), rel


def test_mooncake_conversation_open_loop_agreement():
    # Mooncake conversation lengths (37% prefix hit), Poisson 1 req/s, threshold off, against
    # the mean of four 1500 s simulations (one seed's TTFT P90 spans -8% to +11% of the closed
    # form): TTFT p50 -0.9%, p90 +2.3%, p99 +1.0%; TPOT p50 +3.5%, p90 -8.6%, p99 +3.4%; TPGS
    # -1.8%. The TPOT tail rests on a decode window opening on the prompts queued behind its
    # own (the FCFS backlog); without that term the P99 would sit about half short.
    w = load_workload("mooncake-conversation")
    pol = EnginePolicy(8192, 256, 0)
    sims = [simulate(SM, w, pol, OpenLoop(1.0), duration_s=1500, seed=s).summary()
            for s in (1, 2, 3, 4)]
    sim = {m: {k: np.mean([r[m][k] for r in sims]) for k in ("p50", "p90", "p99")}
           for m in ("ttft_s", "tpot_s")}
    cf = serve(SM, w, pol, OpenLoop(1.0))
    ttft, tpot = _rel(cf.ttft_s, sim["ttft_s"]), _rel(cf.tpot_s, sim["tpot_s"])
    assert all(abs(v) < 0.10 for v in ttft.values()), ttft
    assert abs(tpot["p50"]) < 0.06 and abs(tpot["p90"]) < 0.10 and abs(tpot["p99"]) < 0.10
    assert cf.tpgs == pytest.approx(np.mean([r["tpgs"] for r in sims]), rel=0.05)


def test_prefill_schedule_interval_keeps_prefill_off_the_steps_between():
    # interval 2: prefill only on even steps (theory §1.1), so with a steady decode load at most
    # half of the steps carry prefill tokens
    w = load_workload("fixed-1k1k")
    r = simulate(SM, w, EnginePolicy(8192, 256, 0, 2), OpenLoop(4.0), duration_s=120, seed=0)
    assert np.mean(r.step_prefill_tokens > 0) <= 0.5 + 1e-9
    assert r.completed > 200


def test_agentx_sample_trace_replay_agreement():
    # The 20 AgentX (WEKA 042026) sample sessions replayed closed-loop, 16 lanes, recorded think
    # times capped at AgentX's 10 s idle cap, threshold 512 (the agreement report's
    # agentx-sample-n16-t512). Against its 10 stored runs of 30,000 s (serving_agreement_sims.csv):
    # TTFT P50 / P90 / P99 +0.0 / +1.6 / -0.2%, TPOT P50 / P90 / P99 -0.8 / -0.2 / -0.3%, TPGS
    # +0.4% (the decode window's run count self-excited, threshold_prefill.run_excitation).
    # One 3,000 s run is no reference: its TTFT P90 reads -0.3% on one draw of first sessions
    # and +23.9% on the next (seed 1). The same replay with each turn drawn independently
    # (sessions=False, 4 seeds' mean) isolates the closed form: TTFT and TPOT within 10% (TPOT
    # P50 / P90 / P99 -1.5 / -1.3 / +1.0%).
    import pandas as pd

    from model.specs.traces import load_trace
    from model.specs.workload import ClosedLoop, RecordedWorkload
    from model.validate.agreement import SIMS, compare

    sample = ROOT / "data" / "traces" / "cc_traces_weka_042026_sample"
    if not sample.exists():
        pytest.skip("AgentX sample traces not in the repository")
    rw = RecordedWorkload(load_trace(sample), "agentx-sample")
    assert rw.hit_rate == pytest.approx(0.950, abs=0.002)  # per-session prefix replay
    rel = compare(pd.read_csv(SIMS), ["agentx-sample-n16-t512"]).set_index("metric")["rel"]
    keys = ("ttft_p50", "ttft_p90", "ttft_p99", "tpot_p50", "tpot_p90", "tpot_p99", "tpgs")
    assert all(abs(rel[k]) < 0.10 for k in keys), rel
    sm = AffineStepModel(a=0.008, b=3e-5, c=5e-5, d=1e-9, e=2e-10)
    pol, load = EnginePolicy(8192, 256, 512), ClosedLoop(16, 10.0)
    cf = serve(sm, rw, pol, load)
    runs = [simulate(sm, rw, pol, load, duration_s=3000, seed=s, sessions=False).summary()
            for s in (1, 2, 3, 4)]
    for metric in ("ttft_s", "tpot_s"):
        mean = {k: np.mean([r[metric][k] for r in runs]) for k in ("p50", "p90", "p99")}
        rel = _rel(getattr(cf, metric), mean)
        assert all(abs(v) < 0.10 for v in rel.values()), (metric, rel)


def test_threshold_decode_windows_see_self_excited_run_counts():
    # With a threshold the runs arrive in wall time, so a step that runs extend lets more
    # arrive: in the simulated replay of the 20 recorded AgentX sessions at 32 lanes on one rank
    # 22% of steps carry prefill, against 31% for Poisson counts of the same mean (3 runs of
    # 30,000 s, seeds 1, 3, 4). With the TPOT law's negative-binomial count (the TTFT law's) the
    # report's TPOT P90 / P99 there sit at -9.4 / -3.6% of the 10 stored runs (Poisson counts:
    # about -15 / -21%), and on DSV4 DEP8 at 128 sessions, cadence 1, within 2 / 10% of the 5
    # stored runs.
    import pandas as pd

    from model.validate.agreement import SIMS, compare

    one, dep = "agentx-sample-n32-t512", "dsv4-dep8-pop64-n128-t512-iv1"
    rel = compare(pd.read_csv(SIMS), [one, dep]).set_index(["scenario", "metric"])["rel"]
    assert -0.10 < rel[(one, "tpot_p90")] < -0.06
    assert -0.05 < rel[(one, "tpot_p99")] < 0.01
    assert -0.03 < rel[(dep, "tpot_p90")] < 0.02
    assert -0.10 < rel[(dep, "tpot_p99")] < -0.04


def test_one_rank_closed_loop_arrivals_thin_while_runs_stretch_the_steps():
    # Sessions keep cycling on one rank, at the pace the stretched steps allow: hand case, gaps
    # of 10 s, cycles of 15 s (5 s active), a 10 ms step stretched to 40 ms (s = 4). Over a
    # run far longer than a gap the sessions arrive at (Z + A) / (Z + A s) = 15 / 30 = 0.5 of
    # the rate; over a 1 ms run the idle ones still arrive: E[min(10, 0.001)] / 0.001 = 1, so
    # the share is 1; without a stretch nothing thins.
    from model.serve.queueing import arrivals_kept_cycling

    gaps = np.full(100, 10.0)
    long_run, short_run = arrivals_kept_cycling(gaps, 15.0, 0.01, [0.03, 0.03], [1e6, 0.025])
    assert long_run == pytest.approx(0.5 + 0.5 * 10.0 / (1e6 * 0.04), rel=1e-9)
    assert short_run == pytest.approx(1.0)
    assert arrivals_kept_cycling(gaps, 15.0, 0.01, [0.0], [1e6])[0] == pytest.approx(1.0)
    # Against the simulator: in the runs (agentx-n16-t512-indep, 2 x 30,000 s) 0.26 sessions/s
    # arrive during runs of 50+ chunks against 0.32/s overall; with windows opening inside runs
    # at the thinned rate the 48-lane AgentX TPOT P90s with a threshold sit within 3% of the
    # stored runs (at the full (1 + h / T) they read 10-12% long).
    import pandas as pd

    from model.validate.agreement import SIMS, compare

    names = ["agentx-n48-t512", "agentx-pop64-n48-t512"]
    rel = compare(pd.read_csv(SIMS), names).set_index(["scenario", "metric"])["rel"]
    assert all(abs(rel[(n, "tpot_p90")]) < 0.03 for n in names), rel


def test_slot_chain_window_sum_by_hand():
    # J in two states (0: adds nothing, 1: adds one unit a slot), P(0 -> 1) = 0.3,
    # P(1 -> 0) = 0.4, windows opening in state 0. Over two slots: Y = J1 + J2 with
    # P(Y = 0) = 0.7 x 0.7 = 0.49, P(Y = 1) = 0.7 x 0.3 + 0.3 x 0.4 = 0.33, P(Y = 2) = 0.3 x 0.6
    # = 0.18; 1.5 slots mix one slot (0.7, 0.3) and two half and half.
    from model.serve.lockstep import SlotChain

    pmfs = np.zeros((2, 8))
    pmfs[0, 0] = pmfs[1, 1] = 1.0
    chain = SlotChain(np.array([[0.7, 0.3], [0.4, 0.6]]), pmfs, 1.0, np.array([1.0, 0.0]))
    assert chain.sum_pmf(2.0, 1.0, 8)[:3] == pytest.approx([0.49, 0.33, 0.18], abs=1e-9)
    assert chain.sum_pmf(1.5, 1.0, 8)[:3] == pytest.approx([0.595, 0.315, 0.09],
                                                                 abs=1e-9)


def test_dep8_fcfs_tpot_takes_the_larger_of_the_shot_and_chain_laws():
    # FCFS on lock-stepped ranks where runs cover most slots (DSV4 DEP8, 256 sessions, cadence
    # 8): the shot law's clusters stack, so a window's mean varies too much and skews right
    # (simulated mean step over blocks of 64 / 1,024 steps: sd 32 / 17 ms; shot law 28 / 34 ms;
    # J's Markov chain 28 / 11 ms, seed 1, 8,000 s). With the larger quantile of the two laws
    # the TPOT P50 sits within 3% of the 5 stored runs (the shot law alone reads it 13% short).
    import pandas as pd

    from model.validate.agreement import SIMS, compare

    name = "dsv4-dep8-pop64-n256-t0-iv8"
    rel = compare(pd.read_csv(SIMS), [name]).set_index("metric")["rel"]
    assert abs(rel["tpot_p50"]) < 0.03
    assert all(abs(rel[m]) < 0.10 for m in ("tpot_p90", "tpot_p99", "e2e_p90", "tpgs")), rel


def test_dep8_lockstep_fcfs_against_long_simulations():
    # DeepSeek V4 Pro DP8+EP8 on B300 (calibrated step model, recipe MTP), closed-loop AgentX
    # sessions from one shared 64-session population, no threshold: eight lock-stepped ranks
    # and cold prefills of up to 850K tokens. Against the stored seeds of 12,000 s
    # (data/calibration/serving_agreement_sims.csv). Runs cluster across ranks
    # (model.serve.lockstep's birth-death chain; independent ranks would put the mean step at
    # 128 sessions, cadence 1, at 88.5 ms against ~72 ms simulated); clusters are the TPOT law's
    # shots, one at a time (single_inside); the closed loop times decodes at the step they see
    # (85 ms there). Runs on several ranks pay the expert group's share of each further chunk,
    # and a prompt's further chunks hold slots as long as what the other ranks add above its
    # own chunk (the others' mean extension on top would read the cadence-8 TTFT P90 / P99
    # 16 / 26% long). The first-step mixture thins arrivals during another rank's run. With
    # the finite-source wait law (model.serve.finite_source) the cadence-8 TTFT P90 sits about
    # 12% short: within the five seeds' noise (the report's verdict), not within 10% of their
    # mean.
    import pandas as pd

    from model.validate.agreement import SIMS, compare

    names = ["dsv4-dep8-pop64-n128-t0-iv8", "dsv4-dep8-pop64-n128-t0-iv1",
             "dsv4-dep8-pop64-n32-t0-iv1"]
    frame = compare(pd.read_csv(SIMS), names).set_index(["scenario", "metric"])
    d = frame["rel"]
    iv8, n128, n32 = names
    for name in (iv8, n128):
        assert abs(d[(name, "tpgs")]) < 0.06, d
        assert all(abs(d[(name, f"tpot_{q}")]) < 0.15 for q in ("p50", "p90", "p99")), d
    assert abs(d[(iv8, "ttft_p90")]) < 0.15 and frame.verdict[(iv8, "ttft_p90")] != "parts", d
    assert abs(d[(iv8, "ttft_p99")]) < 0.10, d
    for name in (n128, n32):  # cadence 1: the 128-session P50 reads -10.5%, within noise
        for m in ("ttft_p50", "ttft_p90"):
            assert abs(d[(name, m)]) < 0.12 and frame.verdict[(name, m)] != "parts", d


def test_closed_loop_fcfs_wait_and_e2e_against_stored_simulations():
    # FCFS, 48 sessions replaying one shared population of 16 / 64 AgentX sessions (affine
    # AgentX step model), against the 10 stored seeds (data/calibration/serving_agreement_sims
    # .csv). The TTFT P90 sits where the TTFT law is flat (P(TTFT <= 2 s) 0.905 simulated): the
    # idle pool drains over the busy period (model.serve.finite_source; a fresh pool at every
    # job start with the Pollaczek-Khinchine ladder would count twice the queue ahead of an
    # arrival that the runs hold, 0.35 against 0.17 s). A request that waited long decodes
    # beside the prompts queued behind it, and made independent of its TTFT that slow decode
    # lands on other requests (shuffling TPOT among the simulated requests of each of 40 output
    # bins moves their P90 of E2EL / OSL +13%): the E2E law splits the backlog by the request's
    # own sojourn (e2e_law.E2E_SOJOURN_SLICES).
    import pandas as pd

    from model.validate.agreement import SIMS, compare

    d = compare(pd.read_csv(SIMS), ["agentx-pop16-n48", "agentx-pop64-n48"]).set_index(
        ["scenario", "metric"])["rel"]
    assert d[("agentx-pop16-n48", "ttft_p90")] == pytest.approx(0.011, abs=0.02), d
    assert d[("agentx-pop64-n48", "ttft_p90")] == pytest.approx(-0.045, abs=0.02), d
    assert d[("agentx-pop16-n48", "e2e_p90")] == pytest.approx(-0.059, abs=0.02), d
    assert d[("agentx-pop64-n48", "e2e_p90")] == pytest.approx(0.006, abs=0.02), d


def test_fcfs_decode_windows_open_on_the_queued_backlog():
    # One shared 64-session AgentX population, 48 sessions, threshold off (affine AgentX step
    # model). A decode window opens when its prompt's prefill ends, on the prompts that arrived
    # during its sojourn (M/G/1: a departure leaves its sojourn's arrivals behind). Against the
    # 10 stored seeds of 12,000 s (data/calibration/serving_agreement_sims.csv): TPOT p50 /
    # p90 / p99 -2.0 / +0.4 / -5.1% (without the backlog term the p90 / p99 read about a fifth
    # and a third short). One run of this row varies 15% at P99: the mean, not a run, is the
    # reference.
    import pandas as pd

    from model.validate.agreement import SIMS, compare

    name = "agentx-pop64-n48"
    rel = compare(pd.read_csv(SIMS), [name]).set_index("metric")["rel"]
    assert all(abs(rel[f"tpot_{q}"]) < 0.10 for q in ("p50", "p90", "p99")), rel


def test_dep8_threshold_ttft_is_masked_by_the_own_chunk():
    # DeepSeek V4 Pro DP8+EP8 on B300, 128 sessions of the shared 64-session AgentX population,
    # threshold 512, cadence 1. A prompt's chunk step waits for the busiest rank, so the other
    # ranks' chunks add only where they exceed its own. Against the 5 stored seeds of 12,000 s
    # (data/calibration/serving_agreement_sims.csv): TTFT P50 / P90 / P99 -5.4 / -0.6 / +9.7%,
    # TPGS +2.8% (without the masking the tails read a quarter long).
    import pandas as pd

    from model.validate.agreement import SIMS, compare

    d = compare(pd.read_csv(SIMS), ["dsv4-dep8-pop64-n128-t512-iv1"]).set_index("metric")["rel"]
    assert all(abs(d[f"ttft_{q}"]) < 0.10 for q in ("p50", "p90", "p99")), d
    assert abs(d["tpgs"]) < 0.05


def test_e2e_normalized_interactivity_folds_ttft_into_the_rate():
    # InferenceX AgentX's E2E normalized interactivity, 1 / pXX of E2EL / OSL (SemiAnalysisAI/
    # InferenceX MODELS.md: "r_i = E2EL_i / OSL_i ... 1 / percentile_q({r_i})"). One 8k/1k
    # session: E2EL = TTFT + 1023 TPOT for all 1024 tokens, so the median rate is
    # 1024 / (TTFT + 1023 TPOT) of the median TTFT and TPOT, and below 1 / TPOT.
    from model.validate.agreement import BY_NAME

    sm, w, pol = BY_NAME["fixed-8k1k-think10-n16"].build()
    r = serve(sm, w, pol, ClosedLoop(1))
    t, p = r.ttft_s["p50"], r.tpot_s["p50"]
    assert r.e2e_interactivity_tok_s["p50"] == pytest.approx(1024 / (t + 1023 * p), rel=0.005)
    assert r.e2e_interactivity_tok_s["p90"] < r.interactivity_tok_s["p90"]


def test_e2e_normalized_interactivity_agrees_on_agentx_sessions():
    # Shared 64-session AgentX population at 48 sessions, threshold off and 512, and the fixed
    # 8k/1k closed loop: E2E normalized P90 against the simulator's per-request E2EL / OSL.
    # One run of 12,000 s varies too much to compare with (the closed form's TTFT P90 reads
    # -27% against one such run and -1.9% against the ten seeds' mean). Against the 10 stored
    # seeds (data/calibration/serving_agreement_sims.csv): +0.6% / -2.3% / -3.5%.
    import pandas as pd

    from model.validate.agreement import SIMS, compare

    names = ["agentx-pop64-n48", "agentx-pop64-n48-t512", "fixed-8k1k-think10-n32"]
    d = compare(pd.read_csv(SIMS), names).set_index(["scenario", "metric"])["rel"]
    for name, want in zip(names, (0.006, -0.023, -0.035), strict=True):
        assert d[(name, "e2e_p90")] == pytest.approx(want, abs=0.02), d


def test_fcfs_ttft_body_draws_the_shared_last_step_with_the_own_wait():
    # FCFS at 48 AgentX sessions: a prompt's last step is shared with the next queued prompt
    # when someone arrived during its own wait W (probability 1 - exp(-x (W + tau))), not with
    # the mean probability for every W, and a prompt that waited past its predecessor's last
    # step starts in it. Against the 10 stored seeds per scenario
    # (data/calibration/serving_agreement_sims.csv, runs of 24,000 / 12,000 / 20,000 s): TTFT
    # P50 +0.8% / -1.5% / -2.2% (with the mean probability for every W, 11% of the prompts that
    # never waited would get a next prompt's ~90 ms chunk and the P50 read a fifth long).
    import pandas as pd

    from model.validate.agreement import SIMS, compare

    sims = pd.read_csv(SIMS)
    names = ["agentx-pop16-n48", "agentx-pop64-n48", "agentx-n48-indep"]
    rel = compare(sims, names).set_index(["scenario", "metric"])["rel"]
    for name in names:
        assert abs(rel[(name, "ttft_p50")]) < 0.10, (name, rel[(name, "ttft_p50")])


def test_e2e_pairs_each_output_length_with_its_own_ttft():
    # In sessions long prompts come with long outputs (Spearman 0.24 in the simulation), and a
    # long output dilutes its TTFT. Against the 10 stored seeds per scenario
    # (data/calibration/serving_agreement_sims.csv; 12,000 s DEP runs): pairing each output
    # length with its own requests' TTFT law puts the E2E P90 at -2.6% / -3.3% (every request's
    # TTFT law for every length reads about 14% short).
    import pandas as pd

    from model.validate.agreement import SIMS, compare

    sims = pd.read_csv(SIMS)
    names = ["dsv4-dep8-pop64-n32-t512-iv8", "agentx-pop64-n16-t512"]
    rel = compare(sims, names).set_index(["scenario", "metric"])["rel"]
    assert -0.045 < rel[(names[0], "e2e_p90")] < -0.01
    assert -0.05 < rel[(names[1], "e2e_p90")] < -0.02


def test_agreement_verdict_tells_noise_from_error():
    # model.validate.agreement's verdict: within 10% of the simulated mean agrees; beyond it but
    # within 10% of a value inside the mean's 95% interval is noise (the simulation cannot
    # tell); beyond both parts
    from model.validate.agreement import verdict

    assert verdict(0.08, 0.0) == "agrees"
    assert verdict(-0.15, 0.07) == "noise"
    assert verdict(0.15, 0.03) == "parts"


def test_agreement_compares_with_the_mean_of_the_seeds_and_its_student_interval():
    # five seeds of TPGS 10..14: mean 12, sample sd 1.5811, 95% half-width t(0.975, 4) = 2.776
    # (Student's t table) x 1.5811 / sqrt(5) = 1.963, i.e. 16.4% of the mean
    import pandas as pd

    from model.validate.agreement import METRICS, closed_form, compare

    name = "fixed-8k1k-think10-n16"
    sims = pd.DataFrame([{"scenario": name, "seed": s, **{m: 1.0 for m in METRICS},
                          "tpgs": 10.0 + s} for s in range(5)])
    row = compare(sims, [name]).set_index("metric").loc["tpgs"]
    assert row.sim_mean == pytest.approx(12.0)
    assert row.half_width == pytest.approx(0.1636, abs=5e-4)
    assert row.rel == pytest.approx(closed_form(name)["tpgs"] / 12.0 - 1.0)


def test_independent_turn_pool_holds_the_workloads_cold_prompts():
    # An FCFS wait goes with the service's second moment (Pollaczek-Khinchine), which AgentX's
    # rare cold prompts (up to 850K tokens) dominate. The simulator's pool of independent turns
    # (sessions=False) is drawn as the closed form's sample, so its E[uncached^2] over pools of
    # seeds 1-8 sits at the 320,000-request sample's (1.017x), where 50,000 requests drawn as
    # whole sessions (~1,250 of them) give 0.909x and a TTFT P90 46% short.
    from model.serve.request_mix import request_mix_for
    from model.serve.simulate import _MixPool

    w = load_workload("agentx")
    ref = np.mean(request_mix_for(w, 320_000, 0, None).uncached_tokens.astype(float) ** 2)
    pools = [np.mean(_MixPool(w, s, None).arrays[1].astype(float) ** 2) for s in range(1, 9)]
    assert np.mean(pools) / ref == pytest.approx(1.0, abs=0.05)


def test_agreement_reports_the_closed_forms_own_mix_seed_spread():
    # agentx-n48-indep's FCFS TTFT P90 rests on the rare cold prompts of up to 850K tokens. The
    # wait law's service sample is the whole 320,000-request draw (model.serve.request_mix), so
    # serve(..., seed=k) gives 1.554 s for seed 0 and a coefficient of variation over seeds 0-2
    # (sd, ddof 1, over the seed-0 value) of 1.0% (simulated 1.650 s); the 20,000-request
    # sample alone (one cold prompt in 16 of the sessions drawn) would spread them by 16.6%.
    import pandas as pd

    from model.validate.agreement import SIMS, compare

    name = "agentx-n48-indep"
    row = compare(pd.read_csv(SIMS), [name], cf_seeds=3).set_index("metric").loc["ttft_p90"]
    assert row.closed_form == pytest.approx(1.554, abs=0.002)
    assert row.cf_cv == pytest.approx(0.0100, abs=0.001)


def test_the_fcfs_wait_law_samples_every_session_the_mix_is_thinned_from():
    # A session profile's sample keeps every 16th request of a 16x draw
    # (model.serve.request_mix); the queue sample is that whole draw, so the sample is its
    # every 16th request. A requests profile (fixed lengths) is not thinned: its queue sample
    # is the sample itself.
    from model.serve.request_mix import MIX_SESSIONS_FACTOR, request_mix_for

    w = load_workload("agentx")
    mix, queue = request_mix_for(w, 2000, 3), request_mix_for(w, 2000, 3, queue=True)
    assert len(queue.context_tokens) >= MIX_SESSIONS_FACTOR * 2000  # whole sessions: a few more
    for field in ("context_tokens", "uncached_tokens", "output_tokens", "gap_s"):
        assert np.array_equal(getattr(queue, field)[::MIX_SESSIONS_FACTOR], getattr(mix, field))
    hit = request_mix_for(w, 2000, 3, 0.5, queue=True).hit_rate  # the override holds on it too
    assert hit == pytest.approx(0.5, abs=0.01)
    fixed = load_workload("fixed-8k1k")
    assert request_mix_for(fixed, 2000, 3, queue=True) is request_mix_for(fixed, 2000, 3)


def test_a_run_cut_short_by_max_steps_is_an_error():
    # 100 Poisson requests/s of 8K prompts need thousands of steps per simulated minute: a cap
    # of 50 steps ends the run long before duration_s, which must not pass for a shorter window
    from model.specs.errors import ServecastError

    w = load_workload("fixed-8k1k")
    with pytest.raises(ServecastError, match="max_steps: 50 steps reached"):
        simulate(SM, w, EnginePolicy(), OpenLoop(100.0), duration_s=60.0, max_steps=50)


def test_lanes_start_in_sessions_in_proportion_to_their_turns():
    # At steady state a lane is inside a session in proportion to its length (the inspection
    # paradox of a renewal process; Ross, Introduction to Probability Models, 12th ed., 7.7):
    # with a 1-turn and a 99-turn session in equal supply, 99% of lanes start in the long one.
    # A uniformly drawn first session puts them there half the time, so lanes leave their first
    # session early and start cold sessions at about twice the steady rate (AgentX population
    # of 64: 40 turns left on average instead of 90).
    from model.serve.simulate import _first_sessions

    class Pool:
        k = 0

        def next(self):
            self.k += 1
            n = 1 if self.k % 2 else 99
            return (np.ones(n), np.ones(n), np.ones(n), np.zeros(n))

    firsts = _first_sessions(Pool(), 20_000, np.random.default_rng(0))
    share_long = np.mean([len(s[0]) == 99 for s in firsts])
    assert share_long == pytest.approx(0.99, abs=0.003)
