"""`model.serve.closed_loop`: the closed-form pieces of the benchmark model on hand-derived cases."""

from __future__ import annotations

import numpy as np
import pytest

from model.perf.engine_factors import LoopFactors
from model.serve.closed_loop import (
    MAX_PREFILL_LOAD,
    Protocol,
    adp_balance_wait_s,
    arrival_sync,
    batch_wait_s,
    closed_loop,
    explain_terms,
    loop_terms,
)
from model.serve.mean_waits import md1_wait_s

# a bare run: one decode step of 10 ms, a single-prompt prefill step of 50 ms, nothing else
BASE = {"decode_kernel_s": 0.010, "decode_expert_s": 0.0, "decode_network_s": 0.0,
        "wave_kernel_s": 0.100, "wave_expert_s": 0.0, "wave_network_s": 0.0,
        "one_kernel_s": 0.050, "one_expert_s": 0.0, "one_network_s": 0.0,
        "wave_steps_mean": 1.5, "wave_steps": 2.0, "chunks": 1.0, "running_seqs": 4.0,
        "concurrency": 4.0, "osl_tokens": 101.0, "seqs_per_server": 4.0, "kv_transfer_s": 0.0,
        "disagg": 0.0, "tokens_per_step": 1.0, "rounds": 10.0, "fixed_lengths": 0.0,
        "prefill_first": 0.0, "prefill_servers": 1.0, "wave_prompts": 2.0,
        "decode_floor_s": 0.0, "wave_floor_s": 0.0, "one_floor_s": 0.0}
# no step overhead, unit scales, 20 ms per request, no streaming lag
PLAIN = {**{k: v for k, v in LoopFactors().__dict__.items() if k != "source"},
         "step_overhead_s": 0.0, "request_overhead_s": 0.020}


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


def test_prefill_pool_wait_is_md1_capped():
    # the prefill-pool queue takes model.serve.queueing's M/D/1 law, rho S / (2 (1 - rho)):
    # rho = 0.5, S = 0.2 s: 0.1 s; overload is capped at rho 0.95: 0.95 * 0.2 / (2 * 0.05) = 1.9 s
    assert md1_wait_s(0.5, 0.2, MAX_PREFILL_LOAD) == pytest.approx(0.1)
    assert md1_wait_s(3.0, 0.2, MAX_PREFILL_LOAD) == pytest.approx(1.9)


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
    assert explain_terms(run, {**PLAIN, "benchmark_rounds": 1e9})["ttft_terms_s"]["queueing"] > 1.0


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
    run = {**BASE, "disagg": 1.0, "running_seqs": 64.0, "concurrency": 64.0,
           "seqs_per_server": 64.0, "wave_kernel_s": 0.5, "wave_prompts": 2.0}
    ttft, tpot, x = closed_loop(run, PLAIN, sync=0.0)
    assert x == pytest.approx(4.0)
    assert tpot == pytest.approx(0.010)  # decode workers run undisturbed
    assert ttft == pytest.approx(64 / 4.0 - 100 * 0.010)


def test_an_engine_factor_never_takes_a_step_below_its_kernels_floor():
    # decode_scale 0.5 halves the 10 ms decode kernels to 5 ms where nothing stops it; with the
    # kernels' physical floor at 8 ms (FLOPs at peak, bytes at full bandwidth) the step is 8 ms
    f = {**PLAIN, "decode_scale": 0.5, "prefill_scale": 0.5}
    assert loop_terms(BASE, f, sync=0.0)["decode_step_s"] == pytest.approx(0.005)
    run = {**BASE, "decode_floor_s": 0.008, "one_floor_s": 0.040, "wave_floor_s": 0.030}
    t = loop_terms(run, f, sync=0.0)
    assert t["decode_step_s"] == pytest.approx(0.008)
    # prefill steps alike: the 50 ms single prompt scaled to 25 ms stops at its 40 ms floor; the
    # 100 ms wave scaled to 50 ms is above its 30 ms floor
    assert t["one_step_s"] == pytest.approx(0.040)
    assert t["wave_step_s"] == pytest.approx(0.050)
    # explain names the 3 ms the floor adds to each decode step
    assert explain_terms(run, f)["tpot_terms_s"]["kernel_floor"] == pytest.approx(0.003)


def test_loop_terms_add_up_to_ttft():
    f = {**PLAIN, "first_token_steps": 3.0}
    t = loop_terms({**BASE, "concurrency": 8.0}, f)
    parts = (t["prefill_s"] + t["kv_transfer_s"] + t["prefill_queue_s"] + t["request_overhead_s"]
             + t["waiting_s"] + t["first_token_lag_s"] + t["adp_balance_s"] + t["admission_s"]
             + t["batch_wait_s"])
    assert t["ttft_s"] == pytest.approx(parts)
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
    assert adp_balance_wait_s(8, 2.0, 0.020, 60) == pytest.approx(0.6)
    # 100 requests/s fill the ranks first: 7 / 200 s
    assert adp_balance_wait_s(8, 100.0, 0.020, 60) == pytest.approx(0.035)
    assert adp_balance_wait_s(1, 2.0, 0.020, 60) == 0.0  # nothing to balance without DP


def test_adp_balance_delays_staggered_requests_only():
    run = {**BASE, "dp": 8.0, "adp_timeout_iters": 60.0}
    t0, t = loop_terms(BASE, PLAIN, sync=0.0), loop_terms(run, PLAIN, sync=0.0)
    # rate of the staggered run: 4 / (0.08 s + 100 * 0.012 s) = 3.125/s; fill 7 / 6.25 s =
    # 1.12 s; timeout 0.5 * 60 * 10 ms = 0.3 s: 0.3 s more to the first token
    assert t["ttft_s"] - t0["ttft_s"] == pytest.approx(0.3)
    assert t["tpot_s"] == pytest.approx(t0["tpot_s"])
    # a synchronized wave fills every rank at once
    assert loop_terms(run, PLAIN, sync=1.0)["ttft_s"] == pytest.approx(
        loop_terms(BASE, PLAIN, sync=1.0)["ttft_s"])


def test_recv_interval_admission_wait():
    # SGLang --scheduler-recv-interval 30: a new request waits (30 - 1) / 2 decode iterations of
    # 10 ms for the scheduler to pick it up; every engine receives at least every iteration
    run = {**BASE, "recv_interval_iters": 30.0}
    for sync in (0.0, 1.0):
        gap = closed_loop(run, PLAIN, sync)[0] - closed_loop(BASE, PLAIN, sync)[0]
        assert gap == pytest.approx(14.5 * 0.010)
    assert loop_terms({**BASE, "recv_interval_iters": 1.0}, PLAIN)["admission_s"] == 0.0


def test_batch_wait_by_hand():
    # 1000 more tokens wanted, 1024-token prompts: one more prompt, 0.5 s away at 2/s; the
    # 20-iteration timeout (10 ms each) comes first: the first request waits 0.2 s, and the
    # 2 * 0.2 = 0.4 that join it on average less: 0.2 * (1.4 + 1) / (2 * 1.4)
    assert batch_wait_s(1000.0, 1024.0, 2.0, 0.010, 20.0) == pytest.approx(0.2 * 2.4 / 2.8)
    # enough tokens already: no wait; the feature off: no wait
    assert batch_wait_s(-5.0, 1024.0, 2.0, 0.010, 20.0) == 0.0
    assert batch_wait_s(1000.0, 1024.0, 2.0, 0.010, 0.0) == 0.0
