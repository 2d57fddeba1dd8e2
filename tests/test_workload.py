"""Workload profiles: loading, validation, sampling, fitting, load models."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import yaml

from model import ROOT
from model.fit.workload import empirical, lognormal_params, sample_statistics
from model.specs.errors import ServecastError, SpecError
from model.specs.workload import (
    ClosedLoop,
    OpenLoop,
    UncachedMap,
    list_workloads,
    load_workload,
    trace_arrivals,
    workload_from_dict,
)

TRACES = ROOT / "data" / "traces"


def test_every_profile_loads_and_carries_provenance():
    names = list_workloads()
    for required in ("agentx", "fixed-1k1k", "fixed-8k1k", "fixed-1k8k", "mooncake-conversation",
                     "mooncake-synthetic", "azure-code", "azure-conv"):
        assert required in names
    for name in names:
        w = load_workload(name)
        assert w.source and w.date, name


def test_fixed_profiles_are_what_they_say():
    # definition of the classic benchmark shapes: 1k/1k, 8k/1k, 1k/8k, random prompts (no reuse)
    for name, isl, osl in (("fixed-1k1k", 1024, 1024), ("fixed-8k1k", 8192, 1024),
                           ("fixed-1k8k", 1024, 8192)):
        mix = load_workload(name).request_mix(100)
        assert np.all(mix.context_tokens == isl) and np.all(mix.output_tokens == osl)
        assert mix.hit_rate == pytest.approx(0.0, abs=1e-3)


def test_agentx_resamples_the_recorded_sessions():
    # computed on the cc-traces-weka-042026 derived requests CSV (data/traces/README.md; 710
    # traces, 49,334 requests): median 45 main turns, token-weighted infinite-cache hit 96.3%,
    # mean uncached 4.5K per request, mean input 123K, output median 216 / mean 440
    w = load_workload("agentx")
    assert w.bootstrap and w.hit_rate == pytest.approx(0.9632, abs=5e-4)
    mix = w.request_mix(20_000, seed=0)
    assert mix.hit_rate == pytest.approx(0.963, abs=0.005)
    assert mix.uncached_tokens.mean() == pytest.approx(4_500, rel=0.1)
    assert mix.context_tokens.mean() == pytest.approx(122_400, rel=0.05)
    assert np.median(mix.output_tokens) == pytest.approx(216, rel=0.05)
    stats = sample_statistics(w, sessions=1500, seed=0)
    assert stats["median_turns"] == pytest.approx(45, rel=0.1)
    assert stats["mean_output_tokens"] == pytest.approx(439, rel=0.05)
    # 17 of the 710 traces carry subagent groups (traces_derived.csv subagent_groups > 0)
    assert stats["subagent_session_fraction"] == pytest.approx(17 / 710, abs=0.01)


def test_agentx_synthetic_profile_matches_the_trace_it_was_fitted_to():
    # same trace statistics as above; subagent fan-out taken from the seed (44% of sessions,
    # median 4 runs), which this corpus does not show
    w = load_workload("agentx-synthetic")
    assert w.hit_rate == pytest.approx(0.9636, abs=5e-4)
    stats = sample_statistics(w, sessions=1500, seed=0)
    assert stats["median_turns"] == pytest.approx(45, rel=0.15)
    assert stats["median_output_tokens"] == pytest.approx(216, rel=0.1)
    assert stats["mean_output_tokens"] == pytest.approx(439, rel=0.15)
    assert stats["hit_rate"] == pytest.approx(0.963, abs=0.015)
    assert stats["subagent_session_fraction"] == pytest.approx(0.44, abs=0.04)
    assert stats["median_subagent_runs"] == pytest.approx(4, abs=1)
    # median input context per request: 105K in the trace, 142K in the seed; the generator lands
    # between them (no compaction model beyond the trace's negative deltas)
    assert 100_000 < stats["median_input_tokens"] < 150_000
    # its known bias, documented in the profile: mean uncached per request 6.5K vs 4.5K
    assert w.request_mix(20_000, seed=0).uncached_tokens.mean() > 1.3 * 4_500


def test_agentx_v1_profile_carries_the_stated_v1_laws():
    # SemiAnalysis AgentX v1.0 statistics (newsletter.semianalysis.com/p/agentx-inferencexv3-
    # does-cuda-moat): inter-turn gaps
    # ~log-normal, median 3.84 s, ~10% over 1 min; DeepSeek V4 runs OSL p50 413 / p90 2.2K /
    # p95 3.7K / p99 8.6K and ISL p50 88K / p90 272K / p95 404K / p99 675K. Sessions and fan-out
    # are agentx-synthetic's; the OSL law, stated over every request, is the subagents' too.
    import numpy as np

    from model.fit.workload import fit_agentx_v1

    w = load_workload("agentx-v1")
    syn = load_workload("agentx-synthetic")
    assert w.turns_per_session == syn.turns_per_session
    assert w.subagents.output_tokens == w.output_tokens
    assert w.subagents.model_copy(update={"output_tokens": syn.subagents.output_tokens}) \
        == syn.subagents
    rng = np.random.default_rng(0)
    gaps = w.think_time_s.sample(rng, 200_000)
    assert np.median(gaps) == pytest.approx(3.84, rel=0.02)
    assert (gaps > 60).mean() == pytest.approx(0.10, abs=0.005)
    osl = w.output_tokens.sample(rng, 200_000)
    for q, v in ((50, 413), (90, 2200), (95, 3700), (99, 8600)):
        assert np.percentile(osl, q) == pytest.approx(v, rel=0.08)
    # request contexts mapped onto a lognormal through v1.0's ISL p50 / p90 / p95 / p99
    isl = w.request_mix(200_000, seed=0).context_tokens
    for q, v in ((50, 88_000), (90, 272_000), (95, 404_000), (99, 675_000)):
        assert np.percentile(isl, q) == pytest.approx(v, rel=0.1)
    # the stored file is what the builder writes from the synthetic fit
    rebuilt = fit_agentx_v1(syn.model_dump(mode="json", exclude_none=True))
    assert rebuilt["output_tokens"]["dist"] == w.output_tokens.dist.model_dump()
    assert rebuilt["think_time_s"]["dist"] == w.think_time_s.dist.model_dump()
    assert UncachedMap(**rebuilt["uncached_map"]) == w.uncached_map
    assert rebuilt["hit_rate"] == w.hit_rate


def test_agentx_v1_new_prefill_follows_062126():
    # cc-traces-weka-062126, new prefill tokens per turn (global-order infinite cache, every
    # request once): p50 1,664, mean 3,792, p99 46,722 (papers/research/workloads.md §1.4(f),
    # source B). agentx-v1 maps its sessions' own law (042026's growth and resets: p50 781,
    # p99 103K) onto the lognormal through the three by least squares in log space, which meets
    # each within 15%.
    import numpy as np

    mix = load_workload("agentx-v1").request_mix(200_000, seed=0)
    unc = mix.uncached_tokens
    assert np.median(unc) == pytest.approx(1_664, rel=0.1)
    assert np.percentile(unc, 99) == pytest.approx(46_722, rel=0.1)
    assert unc.mean() == pytest.approx(3_792, rel=0.15)
    assert np.all(unc <= mix.context_tokens)
    # the token-weighted infinite-cache hit this gives: 1 - 4.3K / 124K
    assert mix.hit_rate == pytest.approx(0.966, abs=0.002)


def test_request_mix_hit_rate_override_is_exact_in_tokens():
    # scaling every request's cached part by h / h0 makes the token-weighted hit exactly h
    w = load_workload("agentx")
    for h in (0.5, 0.9):
        assert w.request_mix(3000, 1, hit_rate=h).hit_rate == pytest.approx(h, abs=2e-3)
    with pytest.raises(ServecastError):
        w.request_mix(100, 0, hit_rate=1.5)


def test_sampling_is_deterministic():
    w = load_workload("agentx")
    a, b = w.request_mix(500, 3), w.request_mix(500, 3)
    assert np.array_equal(a.uncached_tokens, b.uncached_tokens)


def test_empirical_distribution_mean_is_the_trapezoid_of_its_quantiles():
    # quantiles (0, 0.5, 1) -> (0, 10, 30): linear inverse CDF, mean = 0.5*5 + 0.5*20 = 12.5
    w = workload_from_dict({
        "name": "t", "description": "d", "source": "s", "date": "2026", "kind": "requests",
        "hit_rate": 0.0,
        "input_tokens": {"dist": {"kind": "empirical", "p": [0, 0.5, 1], "x": [0, 10, 30]}},
        "output_tokens": {"dist": {"kind": "fixed", "value": 4}}})
    assert w.input_tokens.mean() == pytest.approx(12.5)
    draws = w.input_tokens.sample(np.random.default_rng(0), 200_000)
    assert draws.mean() == pytest.approx(12.5, rel=0.01)


def test_bad_profile_names_file_and_key(tmp_path):
    from model.specs.workload import WORKLOADS_DIR

    good = yaml.safe_load((WORKLOADS_DIR / "fixed-1k1k.yaml").read_text())
    bad = dict(good, hit_rate=1.5)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(bad))
    with pytest.raises(SpecError) as err:
        load_workload(str(path))
    assert "bad.yaml" in str(err.value) and "hit_rate" in str(err.value)
    extra = dict(good, surprise=1)
    path.write_text(yaml.safe_dump(extra))
    with pytest.raises(SpecError, match="surprise"):
        load_workload.__wrapped__(str(path))
    with pytest.raises(ServecastError, match="unknown workload"):
        load_workload("no-such-profile")


def test_uncached_map_interpolates_in_log_space_and_caps_at_the_context():
    # source quantiles (100, 1,000) onto (200, 1,500): the anchors map exactly; between them the
    # log ratio is interpolated in log space (at 316.2 = sqrt(100 x 1,000), halfway: ratio
    # sqrt(2 x 1.5) = 1.732, so 547.7); beyond the ends the ratio is held (10 -> 20 at x2,
    # 5,000 -> 7,500 at x1.5, here capped at its 6,000-token context)
    m = UncachedMap(source=(100, 1000), target=(200, 1500))
    unc = np.array([10.0, 100.0, 316.2278, 1000.0, 5000.0])
    ctx = np.full(5, 6000.0)
    assert m.apply(unc, ctx).tolist() == [20.0, 200.0, 548.0, 1500.0, 6000.0]
    with pytest.raises(ValueError, match="source must increase strictly"):
        UncachedMap(source=(1000, 100), target=(200, 1500))


def test_sessions_profile_requires_its_distributions():
    with pytest.raises(SpecError, match="turns_per_session"):
        workload_from_dict({"name": "t", "description": "d", "source": "s", "date": "2026",
                            "kind": "sessions", "hit_rate": 0.5,
                            "output_tokens": {"dist": {"kind": "fixed", "value": 4}}})


def test_lognormal_fit_recovers_parameters():
    # maximum likelihood of ln x: mean and std of the logs
    x = np.random.default_rng(0).lognormal(3.67, 1.16, 200_000)
    mu, sigma = lognormal_params(x)
    assert mu == pytest.approx(3.67, abs=0.01) and sigma == pytest.approx(1.16, abs=0.01)
    d = empirical(np.arange(101.0))
    assert d["dist"]["x"][7] == 50.0  # p = 0.5 of 0..100


def test_load_models_validate():
    with pytest.raises(ServecastError):
        ClosedLoop(0)
    with pytest.raises(ServecastError):
        OpenLoop(-1.0)
    assert OpenLoop.from_workload(load_workload("azure-conv")).interarrival_cv == \
        pytest.approx(1.094, abs=1e-3)  # Azure 2023 conversation trace: CV 1.09


def test_trace_arrivals_uncached_tokens_from_hash_prefix():
    from model.specs.traces import Request, Session

    h = np.arange
    s = Session("s", (Request(0.0, 128, 5, h(2), 64), Request(2.0, 256, 7, h(4), 64)),
                root_id="s")
    ta = trace_arrivals([s])
    # second request shares its first 2 blocks (128 tokens) with the first: 256 - 128 uncached
    assert list(ta.uncached_tokens) == [128, 128]
    assert list(ta.arrival_s) == [0.0, 2.0]


@pytest.mark.skipif(not (TRACES / "derived").exists(), reason="shared traces not present")
def test_refit_from_the_derived_trace_reproduces_the_stored_profile():
    from model.fit.workload import fit_agentx

    fitted = fit_agentx(TRACES)
    stored = load_workload("agentx-synthetic")
    assert fitted["hit_rate"] == pytest.approx(stored.hit_rate, abs=1e-4)
    assert fitted["turns_per_session"]["dist"]["x"] == list(stored.turns_per_session.dist.x)
    # a third of subagent time is spent with the parent waiting on nothing else
    assert fitted["subagent_wall_share"] == stored.subagent_wall_share == pytest.approx(
        0.3336, abs=1e-4)
    for name in ("agentx", "agentx-v1"):
        assert load_workload(name).subagent_wall_share == stored.subagent_wall_share


def test_subagent_time_the_parent_waits_on_is_what_lengthens_a_session():
    """Two traces by hand, each with one subagent run of 10 s (gaps plus responses). In "a" the
    run (20-30 s) ends inside the parent's 5-90 s gap, so the parent waits on it: 10 s blocked.
    In "b" the run (8-18 s) overlaps the parent's next request (10-20 s) and ends in no gap of
    it: nothing blocked. Share: 10 / 20."""
    from model.fit.workload import subagent_wall_share

    rows = [("a", "main", "", 0.0, 5.0, 0.0), ("a", "main", "", 90.0, 10.0, 85.0),
            ("a", "sa", "r1", 20.0, 2.0, 0.0), ("a", "sa", "r1", 27.0, 3.0, 5.0),
            ("b", "main", "", 0.0, 6.0, 0.0), ("b", "main", "", 10.0, 10.0, 4.0),
            ("b", "sa", "r1", 8.0, 4.0, 0.0), ("b", "sa", "r1", 14.0, 4.0, 2.0)]
    frame = pd.DataFrame(rows, columns=["trace_id", "kind", "agent_id", "t_s", "api_time_s",
                                        "think_time_s"])
    assert subagent_wall_share(frame) == pytest.approx(10.0 / 20.0)


def test_a_session_with_subagents_beside_it_is_more_request_chains():
    """agentx-v1's closed loop: each session is 1 / E[w] chains, w = the wall share for
    subagent requests and 1 for the parent's, and the chains' mean gap is E[w gap] / E[w]."""
    from model.serve.request_mix import request_mix_for, request_sample
    from model.specs.workload import ClosedLoop

    w = load_workload("agentx-v1")
    mix = request_mix_for(w)
    weight = mix.wall_weight
    share = float(np.mean(weight < 1.0))
    assert 0.2 < share < 0.4  # subagent requests in the mix (44% of sessions spawn ~4 runs)
    assert mix.lanes_per_session == pytest.approx(1.0 / (1.0 - share * (1.0 - 0.3336)),
                                                  rel=1e-3)
    sample = request_sample(mix, ClosedLoop(8))
    capped = np.minimum(mix.gap_s, ClosedLoop(8).gap_cap_s)
    assert sample.gap_s.mean() == pytest.approx(np.mean(weight * capped) / weight.mean())
