"""model.serve.lockstep: the mean step of lock-stepped FCFS ranks against cases with a closed answer."""

import numpy as np
import pytest

from model.serve.lockstep import LockstepSlots
from model.serve.queueing import expected_max_poisson
from model.serve.step_balance import solve_mean_step


def test_one_rank_is_the_work_conservation_law():
    # One rank: every extension is paid once, so the mean step solves t = td + x t E[ext]
    # whatever the mix of runs and short prompts (papers/research/theory.md 1.1: the mean step is the
    # decode step plus the prefill work per step), t = td / (1 - x E[ext]).
    rng = np.random.default_rng(0)
    full = rng.integers(0, 4, 3000).astype(float)
    full_ext = np.where(full > 0, rng.uniform(0.2, 1.0, 3000), 0.0)
    last = rng.uniform(0.0, 0.05, 3000)
    slots = LockstepSlots(full, full_ext, last, decode_step_s=0.02, interval=1, dp=1)
    x = 0.5
    expected = 0.02 / (1.0 - x * float(np.mean(full * full_ext + last)))
    got, _ = solve_mean_step(x, 0.0, 0.0, 0.02, 1, 1, True, slots)
    assert got == pytest.approx(expected, rel=1e-4)


def test_runs_on_two_ranks_cluster_as_the_birth_death_chain_says():
    # Two ranks, every request one run chunk of extension h = 0.5 s, no short pieces, td 20 ms,
    # x = 1 request/s per rank. J (ranks on a run) moves up at (2 - J) x L(J) per slot, L(0) =
    # td, L(1) = L(2) = td + h (arrivals over the slot's length), and down at J (1 - x L(J))
    # (a busy rank's own arrivals queue behind its run). By hand: pi1 / pi0 = 2 (0.02) / 0.48,
    # pi2 / pi1 = 0.52 / (2 x 0.48), so pi = (0.886154, 0.073846, 0.040000) and the mean step
    # is td + (pi1 + pi2) h = 0.076923 s. Independent ranks (a binomial J at the same rate)
    # would give t = td + (2t - t^2) h, i.e. 0.2 s: runs that start while another holds the
    # slots overlap it and cost nothing more.
    n = 1000
    slots = LockstepSlots(np.ones(n), np.full(n, 0.5), np.zeros(n), decode_step_s=0.02,
                          interval=1, dp=2)
    assert slots.mean_step(1.0, 0.05) == pytest.approx(0.076923, rel=1e-3)
    # the expert group sees both chunks: 40 ms more when two ranks run (L(2) = 0.56 s). By
    # hand: pi2 / pi1 = 0.52 / (2 x 0.44), pi = (0.882943, 0.073579, 0.043478), mean step
    # 0.02 + 0.073579 x 0.5 + 0.043478 x 0.54 = 0.080268 s
    shared = LockstepSlots(np.ones(n), np.full(n, 0.5), np.zeros(n), decode_step_s=0.02,
                           interval=1, dp=2, shared_s=np.array([0.0, 0.0, 0.04]))
    assert shared.mean_step(1.0, 0.05) == pytest.approx(0.080268, rel=1e-3)
    # what a running rank's slot holds above its own chunk: with equal chunks only the expert
    # share, when the other runs too (J seen size-biased): 2 pi2 x 0.04 / (pi1 + 2 pi2)
    # = 0.086956 x 0.04 / 0.160535 = 0.021667 s
    assert shared.others_above_own(shared.law(1.0, 0.05)) == pytest.approx(0.021667, rel=1e-2)


def test_short_prompts_on_eight_ranks_pay_the_busiest_rank():
    # Only short prompts (no runs), all of extension h: a rank packs a Poisson(mu) number per
    # admitting step, mu = x (interval td + extension), and the lock-stepped step waits for the
    # busiest of the 8 ranks: h E[max of 8 Poisson(mu)] per admitting step (a closed form,
    # model.serve.engine.expected_max_poisson), spread over `interval` steps. At the fixed point the
    # slot is interval x the mean step t, so t = td + h E[max of 8 Poisson(x t interval)] /
    # interval, solved here by plain iteration.
    n, h, td, iv, x = 2000, 0.1, 0.02, 8, 0.3
    slots = LockstepSlots(np.zeros(n), np.zeros(n), np.full(n, h), decode_step_s=td, interval=iv, dp=8)
    t = td
    for _ in range(200):
        t = td + h * expected_max_poisson(x * t * iv, 8) / iv
    assert solve_mean_step(x, 0.0, 0.0, td, iv, 8, True, slots)[0] == pytest.approx(t, rel=0.02)


def test_own_chunk_masks_the_other_ranks_below_it():
    # E[max(h + c N0, c M)] - h with N0 ~ Poisson(m) on the own rank and M the most of the
    # other ranks' Poisson(m) counts: the three limits have closed answers.
    from model.serve.busiest_rank import others_above

    c, m = 0.1, 0.7
    # one rank: nothing to mask, the own rank's other chunks add c m
    assert others_above(np.array([0.0, 1.0]), c, m, 1) == pytest.approx([c * m, c * m])
    # no own chunk: the busiest of 8 ranks, c E[max of 8 Poisson(m)]
    assert others_above(np.array([0.0]), c, m, 8)[0] == pytest.approx(
        c * expected_max_poisson(m, 8))
    # an own chunk taller than any other rank's pack masks them all: only its own rank's add
    assert others_above(np.array([100.0]), c, m, 8)[0] == pytest.approx(c * m)


def test_busiest_rank_of_whole_chunk_counts():
    # E[most of s balls in one of 8 bins], counted by hand: 2 balls share a bin with
    # probability 1/8 (1 + 1/8); 3 balls: all apart 8*7*6/512, one pair 3*8*7/512, all
    # together 8/512 (1 * 336/512 + 2 * 168/512 + 3 * 8/512 = 696/512).
    from model.serve.queueing import expected_max_occupancy

    got = expected_max_occupancy(np.array([0.0, 0.5, 1.0, 2.0, 3.0]), 8)
    assert got == pytest.approx([0.0, 0.5, 1.0, 1.125, 696 / 512], rel=1e-9)
    # Poissonization: over s ~ Poisson(8 m) it is E[max of 8 Poisson(m)] (the mean step's law)
    from scipy.stats import poisson

    s = np.arange(600)
    for m in (0.3, 4.0, 40.0):  # 40 per bin is past the exact range (the normal limit)
        mixed = float(np.sum(poisson.pmf(s, 8 * m) * expected_max_occupancy(s, 8)))
        assert mixed == pytest.approx(expected_max_poisson(m, 8), rel=0.005)


def test_lockstep_window_sees_a_lone_run_whole_and_piles_masked():
    # The TPOT window map (model.serve.tpot_law.lockstep_masked): Y of one chunk's worth per
    # admitting step is one run, which no other rank masks; 3 chunks per admitting step cost
    # the busiest rank's E[max] = 696/512 chunks (counted above), not 3.
    from model.serve.tpot_law import TPOT_GRID, lockstep_masked

    win, iv, c = 40.0, 8, 0.01
    one_run, three = win / iv * c, 3 * win / iv * c
    y = np.array([0.0, one_run, three])
    # 10 ms of headroom keeps the largest value inside the grid (each lands on its nearest cell)
    pmf, dy = lockstep_masked(np.array([0.2, 0.5, 0.3]), y, win, iv, c, 8, 0.01)
    assert len(pmf) == TPOT_GRID and pmf.sum() == pytest.approx(1.0)
    seen = np.flatnonzero(pmf) * dy
    assert seen == pytest.approx([0.0, one_run, 696 / 512 * win / iv * c], abs=dy / 2)


def test_queue_behind_a_run_fills_full_slots():
    # Chunk 8 tokens; one request in four is a run (one full chunk), every prompt ends in a
    # 4-token piece. Behind a run its rank queues its own 4-token piece and N ~ Poisson(m)
    # prompts' pieces: 4 + 4N tokens go out 8 a slot, floor((N + 1) / 2) full slots that the
    # per-prompt count (0 each) misses. By hand at m = 1: sum_N e^-1 / N! floor((N + 1) / 2)
    # = e^-1 (1 + 1/2 + 2/6 + 2/24 + 3/120 + 3/720 + 4/5040 + ...) = 0.716166, a quarter of
    # that per request.
    from math import exp, factorial

    from model.serve.lockstep import _MergeLaw

    law = _MergeLaw(np.array([1.0, 0.0, 0.0, 0.0]), np.full(4, 4.0), chunk=8.0)
    by_hand = sum(exp(-1.0) / factorial(n) * ((n + 1) // 2) for n in range(40))
    assert by_hand == pytest.approx(0.716166, abs=1e-6)
    assert law.extra(1.0) == pytest.approx(by_hand / 4.0, rel=1e-4)
    # a run of two chunks queues twice the arrivals (m = 2 for the same rate per chunk)
    two = _MergeLaw(np.array([2.0, 0.0, 0.0, 0.0]), np.full(4, 4.0), chunk=8.0)
    by_hand2 = sum(exp(-2.0) * 2.0**n / factorial(n) * ((n + 1) // 2) for n in range(60))
    assert two.extra(1.0) == pytest.approx(by_hand2 / 4.0, rel=1e-4)


def test_queue_behind_runs_of_several_lengths_sums_them():
    # The law of test_queue_behind_a_run_fills_full_slots with runs of one chunk (a quarter of
    # the requests) and of three (half of them): each length f queues Poisson(f m) pieces, and
    # the law takes every length's transform as the one-chunk factor to the f-th power. By
    # hand at m = 1: (E_1 + 2 E_3) / 4, E_f = sum_N e^-f f^N / N! floor((N + 1) / 2). A run length that
    # is not a whole number of chunks takes the exponential directly: 1.5 chunks give E_1.5.
    from math import exp, factorial

    from model.serve.lockstep import _MergeLaw

    def by_hand(f):
        return sum(exp(-f) * f**n / factorial(n) * ((n + 1) // 2) for n in range(80))

    mixed = _MergeLaw(np.array([1.0, 3.0, 3.0, 0.0]), np.full(4, 4.0), chunk=8.0)
    assert mixed.extra(1.0) == pytest.approx((by_hand(1.0) + 2 * by_hand(3.0)) / 4.0,
                                             rel=1e-4)
    odd = _MergeLaw(np.array([1.5, 0.0, 0.0, 0.0]), np.full(4, 4.0), chunk=8.0)
    assert odd.extra(1.0) == pytest.approx(by_hand(1.5) / 4.0, rel=1e-4)


def test_first_slot_follows_the_chain_time_weighted():
    # The two-rank chain of test_runs_on_two_ranks_cluster_as_the_birth_death_chain_says: pi =
    # (0.886154, 0.073846, 0.040000), chunk 0.5 s, td 20 ms, cadence 1, x = 1. A prompt reaching
    # a free rank lands in a slot time-weighted: quiet ones (the other rank free too, pi0 x 2
    # ways) last 0.02 s, run ones (pi1 x 1) 0.52 s, so a run holds it with probability
    # 0.073846 x 0.52 / (0.886154 x 2 x 0.02 + 0.073846 x 0.52) = 0.52. It waits out the slot
    # (half on average) and takes the next: still a run unless the run ends (1 - 0.52 of its
    # chunks are last ones) and no new one starts (e^-0.52): 1 - 0.48 e^-0.52 = 0.714630; after
    # a quiet slot one starts with probability 1 - e^-0.04 = 0.039211. Mean offset by hand:
    # 0.52 (0.26 + 0.5 x 0.714630) + 0.48 (0.01 + 0.5 x 0.039211) = 0.335214 s.
    n = 1000
    slots = LockstepSlots(np.ones(n), np.full(n, 0.5), np.zeros(n), decode_step_s=0.02,
                          interval=1, dp=2)
    offsets, weights, in_run, own = slots.first_step(slots.law(1.0, 0.05), levels=4, phases=8)
    assert float(weights[in_run].sum()) == pytest.approx(0.52, rel=1e-3)
    assert float(np.sum(weights * offsets)) == pytest.approx(0.335214, rel=1e-3)
    # the own slot holds the run's chunk exactly when the next slot is a run
    assert float(np.sum(weights * own)) == pytest.approx(
        0.5 * (0.52 * 0.714630 + 0.48 * 0.039211), rel=1e-3)
