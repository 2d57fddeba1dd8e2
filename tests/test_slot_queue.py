"""model.serve.slot_queue: the wait for a threshold engine's prefill slots against closed answers."""

import numpy as np
import pytest

from model.serve.slot_queue import _departure_dispersion, slot_wait

# exponential slot times of mean 1 s, drawn on quantiles (no sampling noise)
EXPONENTIAL = -np.log1p(-(np.arange(20000) + 0.5) / 20000)


def test_open_loop_exponential_slots_are_erlang_c():
    # M/M/2 at 1.5 arrivals/s, mean service 1 s (offered load a = 1.5): Erlang's C formula
    # gives P(wait) = (a^2 / 2!) (2 / (2 - a)) / (1 + a + (a^2 / 2!) (2 / (2 - a))) = 9 / 14
    # and a mean wait of C / (c mu - lambda) = 9 / 7 s (Kleinrock, Queueing Systems I, 1975,
    # eqs. 3.40-3.41).
    law = slot_wait(2.0, EXPONENTIAL, 1.5)
    assert law.weights.sum() == pytest.approx(9 / 14, rel=0.02)
    assert law.mean == pytest.approx(9 / 7, rel=0.03)


def test_two_sessions_on_one_slot_is_the_machine_repairman():
    # M/M/1//2 (two sessions, 1 s outside and 1 s in the slot on average): states 0, 1, 2 in
    # proportion 1 : 2 : 2, throughput 0.8/s, 0.4 queued, so a mean wait of 0.5 s (Little's law;
    # Kleinrock 1975, 3.8, the finite-source queue).
    law = slot_wait(1.0, EXPONENTIAL, 0.0, sessions=2, outside_s=1.0)
    assert law.mean == pytest.approx(0.5, rel=0.02)


def test_saturated_sessions_wait_what_their_cycle_leaves():
    # 200 sessions, 30 s outside, 4 slots of 1 s: the slots pass at most 4 prompts/s and, with
    # ~80 sessions in line, never idle; a session's cycle is 200 / 4 = 50 s, and it waits
    # 50 - 30 - 1 = 19 s of it (Little's law)
    law = slot_wait(4.0, EXPONENTIAL, 0.0, sessions=200, outside_s=30.0)
    assert law.mean == pytest.approx(19.0, rel=0.01)


def test_departure_dispersion_of_renewal_processes():
    # Stationary renewal counts: with lifetimes of exactly 1 s a 0.5 s window holds one
    # departure with probability 0.5 (Bernoulli: variance / mean 0.5) and a 2 s window exactly
    # two (0); exponential lifetimes make a Poisson process (1 at every window; Cox, Renewal
    # Theory, 1962, 4.5).
    fixed = _departure_dispersion(np.ones(1000), 20.0)
    assert fixed(0.5) == pytest.approx(0.5, abs=0.01)
    assert fixed(2.0) == pytest.approx(0.0, abs=0.01)
    poisson = _departure_dispersion(EXPONENTIAL, 20.0)
    assert poisson(np.array([0.5, 2.0, 10.0])) == pytest.approx(1.0, abs=0.03)


def test_heavy_tailed_slots_wait_longer_than_exponential_ones():
    # Same mean slot time, same load: slot times with a heavy tail (here 2% of prompts 40x the
    # others) hold several slots at once for long, so arrivals queue longer than the M/M/c law
    # (the same chain with I = 1) says: Kingman's (1 + cs2) / 2 in heavy traffic.
    heavy = np.where(np.arange(20000) % 50 == 0, 40.0, 1.0)
    heavy = heavy / heavy.mean()
    light = slot_wait(16.0, EXPONENTIAL, 14.0)
    tail = slot_wait(16.0, heavy, 14.0)
    assert tail.mean > 1.5 * light.mean
