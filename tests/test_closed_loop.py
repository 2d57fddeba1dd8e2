"""`model.serve.closed_loop`: the closed-form pieces of the benchmark model on hand-derived cases."""

from __future__ import annotations

import numpy as np
import pytest

from model.perf.engine_factors import LoopFactors
from model.serve.closed_loop import (
    Protocol,
    adp_balance_wait,
    arrival_sync,
    batch_wait,
    closed_loop,
    explain_terms,
    loop_terms,
    md1_wait,
)

# a bare run: one decode step of 10 ms, a single-prompt prefill step of 50 ms, nothing else
BASE = {"k_dec": 0.010, "m_dec": 0.0, "n_dec": 0.0, "k_wave": 0.100, "m_wave": 0.0,
        "n_wave": 0.0, "k_one": 0.050, "m_one": 0.0, "n_one": 0.0, "wave_steps_mean": 1.5,
        "wave_steps": 2.0, "chunks": 1.0, "running": 4.0, "concurrency": 4.0, "osl": 101.0,
        "per_rank": 4.0, "t_kv": 0.0, "disagg": 0.0, "spec": 1.0, "rounds": 10.0,
        "fixed_lengths": 0.0, "prefill_first": 0.0, "prefill_servers": 1.0,
        "wave_prompts": 2.0}
# no step overhead, unit scales, 20 ms per request, no streaming lag
PLAIN = {**{k: v for k, v in LoopFactors().__dict__.items() if k != "source"}, "step_overhead_s": 0.0, "request_overhead_s": 0.020}


def test_arrival_sync_derived_from_protocol_and_scheduler():
    # the burst round is 1/rounds of the requests; the rest follow the 2x2 table
    assert arrival_sync(10.0, 0.0, 0.0, 0.0) == pytest.approx(0.1)  # mixed, varied lengths
    assert arrival_sync(10.0, 0.0, 1.0, 0.0) == pytest.approx(0.1)  # mixed, fixed lengths
    assert arrival_sync(10.0, 1.0, 1.0, 0.0) == pytest.approx(1.0)  # prefill-first, fixed
    # prefill-first with varied lengths: 0.1 + 0.9 * persistence
    assert arrival_sync(10.0, 1.0, 0.0, 0.0, 0.3) == pytest.approx(0.1 + 0.9 * 0.3)
    # a disaggregated prefill pool staggers after the burst
    assert arrival_sync(10.0, 1.0, 1.0, 1.0) == pytest.approx(0.1)
    assert arrival_sync(0.5, 0.0, 0.0, 0.0) == pytest.approx(1.0)  # < 1 round: all burst


def test_md1_wait_by_hand_and_capped():
    # rho = 0.5, S = 0.2 s: 0.5 * 0.2 / (2 * 0.5) = 0.1 s
    assert md1_wait(0.5, 0.2) == pytest.approx(0.1)
    # two servers share a load of 1.0: rho 0.5 each
    assert md1_wait(1.0, 0.2, 2.0) == pytest.approx(0.1)
    # overload is capped at rho 0.95: 0.95 * 0.2 / (2 * 0.05) = 1.9 s
    assert md1_wait(3.0, 0.2) == pytest.approx(1.9)


def test_staggered_run_by_hand():
    ttft, tpot, x = closed_loop(BASE, PLAIN, sync=0.0)
    # TTFT: the prompt's 50 ms step with the 10 ms decode batch riding along, + 20 ms request
    assert ttft == pytest.approx(0.050 + 0.010 + 0.020)
    # TPOT: the 10 ms decode step + 4 running prefills of 50 ms spread over 100 tokens
    assert tpot == pytest.approx(0.010 + 4 * 0.050 / 100)
    # Little's law: 4 clients / (0.08 s + 100 * 0.012 s) = 3.125 requests/s
    assert x == pytest.approx(4 / (0.080 + 100 * 0.012))


def test_synchronized_run_by_hand():
    ttft, tpot, _ = closed_loop(BASE, PLAIN, sync=1.0)
    # 1.5 wave steps of 100 ms on average to a prompt's last chunk, + 20 ms
    assert ttft == pytest.approx(1.5 * 0.100 + 0.020)
    # the early prompts decode through half the other wave step: 10 ms + 0.5 * 1 * 100 ms / 100
    assert tpot == pytest.approx(0.010 + 0.5 * 0.100 / 100)


def test_prefill_first_scheduler_stalls_instead_of_mixing():
    run = {**BASE, "prefill_first": 1.0}
    f = {**PLAIN, "step_overhead_s": 0.002}
    ttft, tpot, _ = closed_loop(run, f, sync=0.0)
    t_one = 0.050 + 0.002
    t_dec = 0.010 + 0.002
    # no decodes ride in the prefill step; each of the 4 prefills stalls the decode for all of it
    assert ttft == pytest.approx(t_one + 0.020)
    assert tpot == pytest.approx(t_dec + 4 * t_one / 100)


def test_kv_limit_makes_extra_clients_wait():
    # 8 clients but the pool runs 4: X stays 4 / 1.28 s, TTFT = C / X - (OSL - 1) TPOT
    run = {**BASE, "concurrency": 8.0}
    ttft, tpot, x = closed_loop(run, PLAIN, sync=0.0)
    assert x == pytest.approx(3.125)
    assert ttft == pytest.approx(8 / 3.125 - 100 * tpot)
    assert explain_terms(run, {**PLAIN, "benchmark_rounds": 1e9})["ttft"]["queueing"] > 1.0


def test_first_token_lag_shifts_ttft_not_the_cycle():
    f = {**PLAIN, "first_token_steps": 5.0}
    ttft0, tpot0, x0 = closed_loop(BASE, PLAIN, sync=0.0)
    ttft, tpot, x = closed_loop(BASE, f, sync=0.0)
    # 5 decode steps of 10 ms later to the client; TPOT as measured loses them over 100 tokens
    assert ttft - ttft0 == pytest.approx(0.050)
    assert tpot0 - tpot == pytest.approx(0.050 / 100)
    assert x == pytest.approx(x0)
    assert ttft + 100 * tpot == pytest.approx(ttft0 + 100 * tpot0)


def test_disaggregated_prefill_pool_bounds_throughput():
    # one prefill server, 2 prompts per 0.5 s wave step: at most 4 prompts/s, however many
    # clients; 64 clients each decoding 100 tokens at 10 ms then wait for the prefill pool
    run = {**BASE, "disagg": 1.0, "running": 64.0, "concurrency": 64.0, "per_rank": 64.0,
           "k_wave": 0.5, "wave_prompts": 2.0}
    ttft, tpot, x = closed_loop(run, PLAIN, sync=0.0)
    assert x == pytest.approx(4.0)
    assert tpot == pytest.approx(0.010)  # decode workers run undisturbed
    assert ttft == pytest.approx(64 / 4.0 - 100 * 0.010)


def test_loop_terms_add_up_to_ttft():
    f = {**PLAIN, "first_token_steps": 3.0}
    t = loop_terms({**BASE, "concurrency": 8.0}, f)
    parts = (t["prefill"] + t["kv_transfer"] + t["prefill_queue"] + t["request_overhead"]
             + t["waiting"] + t["first_token_lag"] + t["adp_balance"] + t["admission"]
             + t["batch_wait"])
    assert t["ttft"] == pytest.approx(parts)
    # derived sync of the run: 10 rounds on a mixed engine -> the burst share 0.1
    assert t["sync"] == pytest.approx(0.1)


def test_protocol_mean_lengths():
    # InferenceMAX: lengths uniform on [int(0.8 L), L]; the run averages (819 + 1024) / 2
    p = Protocol(rounds=10.0, range_ratio=0.8)
    assert p.mean_length(1024) == 922 and not p.fixed_lengths
    assert Protocol().mean_length(1024) == 1024 and Protocol().fixed_lengths


def test_vectorized_over_runs():
    runs = {k: np.array([v, v]) for k, v in BASE.items()}
    runs["concurrency"] = np.array([4.0, 8.0])
    ttft, tpot, x = closed_loop(runs, PLAIN, sync=0.0)
    assert ttft.shape == (2,) and ttft[1] > ttft[0] and tpot[0] == tpot[1]


def test_adp_balance_wait_by_hand():
    # 8 DP ranks, 2 requests/s: a group fills after 7 more arrivals, 7 / (2 * 2) = 1.75 s on
    # average; the 60-iteration timeout at 20 ms per iteration releases every 1.2 s: 0.6 s
    assert adp_balance_wait(8, 2.0, 0.020, 60) == pytest.approx(0.6)
    # 100 requests/s fill the ranks first: 7 / 200 s
    assert adp_balance_wait(8, 100.0, 0.020, 60) == pytest.approx(0.035)
    assert adp_balance_wait(1, 2.0, 0.020, 60) == 0.0  # nothing to balance without DP


def test_adp_balance_delays_staggered_requests_only():
    run = {**BASE, "dp": 8.0, "adp_timeout_iters": 60.0}
    t0, t = loop_terms(BASE, PLAIN, sync=0.0), loop_terms(run, PLAIN, sync=0.0)
    # rate of the staggered run: 4 / (0.08 s + 100 * 0.012 s) = 3.125/s; fill 7 / 6.25 s =
    # 1.12 s; timeout 0.5 * 60 * 10 ms = 0.3 s: 0.3 s more to the first token
    assert t["ttft"] - t0["ttft"] == pytest.approx(0.3)
    assert t["tpot"] == pytest.approx(t0["tpot"])
    # a synchronized wave fills every rank at once
    assert loop_terms(run, PLAIN, sync=1.0)["ttft"] == pytest.approx(
        loop_terms(BASE, PLAIN, sync=1.0)["ttft"])


def test_recv_interval_admission_wait():
    # SGLang --scheduler-recv-interval 30: a new request waits (30 - 1) / 2 decode iterations of
    # 10 ms for the scheduler to pick it up; every engine receives at least every iteration
    run = {**BASE, "recv_interval": 30.0}
    for sync in (0.0, 1.0):
        gap = closed_loop(run, PLAIN, sync)[0] - closed_loop(BASE, PLAIN, sync)[0]
        assert gap == pytest.approx(14.5 * 0.010)
    assert loop_terms({**BASE, "recv_interval": 1.0}, PLAIN)["admission"] == 0.0


def test_batch_wait_by_hand():
    # 1000 more tokens wanted, 1024-token prompts: one more prompt, 0.5 s away at 2/s; the
    # 20-iteration timeout (10 ms each) comes first: the first request waits 0.2 s, and the
    # 2 * 0.2 = 0.4 that join it on average less: 0.2 * (1.4 + 1) / (2 * 1.4)
    assert batch_wait(1000.0, 1024.0, 2.0, 0.010, 20.0) == pytest.approx(0.2 * 2.4 / 2.8)
    # enough tokens already: no wait; the feature off: no wait
    assert batch_wait(-5.0, 1024.0, 2.0, 0.010, 20.0) == 0.0
    assert batch_wait(1000.0, 1024.0, 2.0, 0.010, 0.0) == 0.0
