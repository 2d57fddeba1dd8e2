"""The serving model answers to the prefix cache (issue 5 item 6): the hit rate and tier traffic
of model.serve.cache_model flow through model.serve.cache_effect into TTFT and TPGS."""

from __future__ import annotations

import numpy as np
import pytest

from model.perf.tiers import Tier
from model.serve.cache_effect import CacheEffect, from_cache_result
from model.serve.cache_model import hit_rate
from model.serve.engine import AffineStepModel, request_mix_for, serve
from model.serve.policy import EnginePolicy
from model.specs.workload import ClosedLoop, OpenLoop, load_workload

# affine step model with prefill cost linear in tokens (e = 0), so an idle engine's TTFT is
# k (a + c) + b u for a prompt of u uncached tokens in k chunks of the 8192-token budget
A, B, C = 0.008, 3e-5, 5e-5
SM = AffineStepModel(a=A, b=B, c=C, d=1e-9, e=0.0)
POLICY = EnginePolicy(8192, 256, 0)
KV_BYTES = 40960.0  # per token per GPU: e.g. Llama-3-70B bf16 KV (320 KiB/token) over 8 GPUs
LINKS = {"host": Tier("host", 1e12, 50e9, 10e-6, "pcie"), "hbm": Tier("hbm", 1e11, 4e12, 0, "")}
AGENTX = load_workload("agentx")


def _effect(capacity, policy="lru", prefetch=False) -> CacheEffect:
    res = hit_rate(AGENTX, capacity, policy=policy, concurrency=32)
    return from_cache_result(res, KV_BYTES, LINKS, prefetch)


def _idle_mean_ttft(effect: CacheEffect) -> float:
    """Hand derivation at a vanishing open-loop rate: no queue, no decodes; each request runs
    ceil(u / 8192) chunks at the decode step a + c (one decode slot) plus b per uncached token,
    after waiting for its lower-tier reload. The mix is the profile's, its misses scaled by the
    cache model's (hit / infinite hit)."""
    own = request_mix_for(AGENTX).hit_rate
    h = own * effect.hit_rate / effect.infinite_hit_rate
    mix = request_mix_for(AGENTX, hit_rate=h if h < own - 1e-12 else None)
    u = mix.uncached_tokens.astype(float)
    k = np.ceil(u / 8192.0)
    reload = effect.reload_s(mix.context_tokens, mix.gap_s)
    return float(np.mean(k * (A + C) + B * u + reload))


def test_reload_time_by_hand():
    # 18% of a 100K-token prompt in host memory: 0.18 * 1e5 * 40960 B = 737.28 MB over a
    # 50 GB/s link (14.7456 ms) + 10 us = 14.7556 ms; a 10 ms tool gap hides 10 ms of it with prefetch
    eff = CacheEffect(0.9, {"hbm": 0.72, "host": 0.18}, KV_BYTES, {"host": 10e-6},
                      {"host": 50e9}, prefetch=False)
    assert float(eff.reload_s(np.array([1e5]))[0]) == pytest.approx(0.0147556, rel=1e-6)
    pre = CacheEffect(0.9, {"hbm": 0.72, "host": 0.18}, KV_BYTES, {"host": 10e-6},
                      {"host": 50e9}, prefetch=True)
    assert float(pre.reload_s(np.array([1e5]), np.array([0.01]))[0]) == pytest.approx(
        0.0047556, rel=1e-5)


@pytest.mark.parametrize("small, big", [
    # more host memory: 2M tokens of HBM alone (hit 0.73) vs + 30M of host (hit 0.954)
    (({"hbm": 2e6}, "lru"), ({"hbm": 2e6, "host": 3e7}, "lru")),
    # a better policy at the same capacity: second-hit misses each turn's growth once more
    (({"hbm": 2e6, "host": 8e6}, "second-hit"), ({"hbm": 2e6, "host": 8e6}, "lru")),
])
def test_idle_ttft_moves_by_the_uncached_prefill_and_reload(small, big):
    lo, hi = _effect(*small), _effect(*big)
    assert hi.hit_rate > lo.hit_rate
    r_lo = serve(SM, AGENTX, POLICY, OpenLoop(1e-4), cache=lo)
    r_hi = serve(SM, AGENTX, POLICY, OpenLoop(1e-4), cache=hi)
    assert r_lo.mean_ttft_s == pytest.approx(_idle_mean_ttft(lo), rel=0.01)
    assert r_hi.mean_ttft_s == pytest.approx(_idle_mean_ttft(hi), rel=0.01)
    assert r_hi.mean_ttft_s < r_lo.mean_ttft_s
    # the result reports where its hit rate came from
    assert r_hi.cache["hits_by_tier"] == hi.hits_by_tier


def test_more_host_memory_raises_closed_loop_tpgs_by_the_response_time_law():
    # 32 sessions: X = N / (Z + R) (response-time law), TPGS = X E[c + o] with the same c and o,
    # so TPGS_big / TPGS_small = (Z + R_small) / (Z + R_big); R = TTFT + (o - 1) TPOT, i.e.
    # more hits -> shorter prefill -> more turns per second from the same sessions
    lo, hi = _effect({"hbm": 2e6}), _effect({"hbm": 2e6, "host": 3e7})
    load = ClosedLoop(32)
    r_lo = serve(SM, AGENTX, POLICY, load, cache=lo)
    r_hi = serve(SM, AGENTX, POLICY, load, cache=hi)
    mix = request_mix_for(AGENTX)
    z = float(np.minimum(mix.gap_s, load.gap_cap_s).mean())
    o1 = float(np.maximum(mix.output_tokens - 1.0, 0).mean())

    def resp(r):
        return r.mean_ttft_s + o1 * r.mean_tpot_s

    assert r_hi.tpgs / r_lo.tpgs == pytest.approx((z + resp(r_lo)) / (z + resp(r_hi)), rel=0.02)
    assert r_hi.tpgs > 1.05 * r_lo.tpgs


def test_prefetch_during_the_tool_gap_hides_the_reload():
    # host hits cost E[reload] without prefetch; with it each request waits only
    # max(reload - gap, 0), and its mean TTFT falls by exactly the hidden part (no queueing
    # at a vanishing rate)
    on, off = (_effect({"hbm": 2e6, "host": 3e7}, prefetch=p) for p in (True, False))
    mix = request_mix_for(AGENTX)
    reload = off.reload_s(mix.context_tokens)
    hidden = float(np.mean(reload - np.maximum(reload - mix.gap_s, 0.0)))
    r_off = serve(SM, AGENTX, POLICY, OpenLoop(1e-4), cache=off)
    r_on = serve(SM, AGENTX, POLICY, OpenLoop(1e-4), cache=on)
    assert r_off.mean_reload_s == pytest.approx(float(reload.mean()), rel=1e-9)
    assert r_off.mean_ttft_s - r_on.mean_ttft_s == pytest.approx(hidden, rel=1e-6)
    assert hidden > 0


def test_reference_step_model_keeps_the_profile_hit():
    # no deployment behind the affine model: the profile's own (infinite per-session) hit
    r = serve(SM, AGENTX, POLICY, ClosedLoop(8))
    assert r.cache is None
    assert r.hit_rate == pytest.approx(request_mix_for(AGENTX).hit_rate)


def test_cli_serve_reports_the_cache_behind_its_hit_rate(cli):
    # DeepSeek V4 Pro on B300, DP8/EP8, 1024 AgentX sessions: the HBM pool alone holds less
    # than the sessions' contexts, so the closed form (model.serve.cache_model) hits below the
    # profile's infinite-cache ceiling; host memory as a second tier raises the hit and TPGS
    args = ("serve", "--arch", "deepseek-v4-pro", "--hardware", "b300", "--dp", "8", "--ep", "8",
            "--concurrency", "1024", "--long-prefill-token-threshold", "512", "--json")
    hbm = cli(*args, "--cache-tiers", "hbm")
    host = cli(*args)
    assert hbm.code == 0 and host.code == 0, (hbm.stderr, host.stderr)
    assert hbm.json["cache"]["hit_rate"] < hbm.json["cache"]["infinite_hit_rate"] - 0.02
    assert host.json["cache"]["hits_by_tier"]["host"] > 0
    assert host.json["hit_rate"] > hbm.json["hit_rate"]
    assert host.json["tpgs"] > hbm.json["tpgs"]
