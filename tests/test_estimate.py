"""`model.serve.estimate` / `servecast estimate`: contract keys, closed-loop consistency, physics bounds."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from model.perf.engine_factors import load_loop_factors
from model.perf.parallel import ParallelPlan
from model.serve.closed_loop import loop_terms
from model.serve.estimate import (
    Disagg,
    EngineConfig,
    estimate,
    infer_decode_workers,
    infer_prefill_workers,
)
from model.specs.architecture import load_architecture
from model.specs.errors import ServecastError
from model.specs.hardware import load_hardware

CONTRACT = {"ttft_ms", "tpot_ms", "output_tokens_per_s_per_gpu", "total_tokens_per_s_per_gpu",
            "memory_bytes_per_gpu", "feasible", "reason"}


@pytest.fixture(scope="module")
def llama70b():
    return load_architecture("llama-3.1-70b")


@pytest.fixture(scope="module")
def h200():
    return load_hardware("h200-sxm")


def test_contract_keys_and_littles_law(llama70b, h200):
    out = estimate(llama70b, h200, ParallelPlan(tp=4, moe_tp=4), 1024, 1024, 32,
                   precision="fp8")
    assert set(out) >= CONTRACT
    assert out["feasible"] is True and out["reason"] is None
    # closed loop with all 32 clients running: C = X (TTFT + (OSL-1) TPOT)
    cycle_s = (out["ttft_ms"] + 1023 * out["tpot_ms"]) / 1e3
    assert out["output_tokens_per_s_per_gpu"] == pytest.approx(32 / cycle_s * 1024 / 4, rel=1e-6)
    assert out["total_tokens_per_s_per_gpu"] == pytest.approx(
        2 * out["output_tokens_per_s_per_gpu"])


def test_tpot_at_least_weight_read_time(llama70b, h200):
    # fp8 Llama-70B over TP4: 70.6e9 B / 4 GPUs at 4.8e12 B/s is 3.68 ms per decode step at best
    out = estimate(llama70b, h200, ParallelPlan(tp=4, moe_tp=4), 1024, 1024, 1, precision="fp8")
    assert out["tpot_ms"] >= 70.6e9 / 4 / 4.8e12 * 1e3
    # and memory per GPU holds at least the weight shard
    assert out["memory_bytes_per_gpu"] >= 70.6e9 / 4


def test_more_concurrency_more_throughput_slower_tokens(llama70b, h200):
    lo = estimate(llama70b, h200, ParallelPlan(tp=4, moe_tp=4), 1024, 1024, 4, precision="fp8")
    hi = estimate(llama70b, h200, ParallelPlan(tp=4, moe_tp=4), 1024, 1024, 64, precision="fp8")
    assert hi["output_tokens_per_s_per_gpu"] > 3 * lo["output_tokens_per_s_per_gpu"]
    assert hi["tpot_ms"] > lo["tpot_ms"]


def test_arrival_modes_bracket_benchmark(llama70b, h200):
    kw = dict(precision="fp8")
    plan = ParallelPlan(tp=4, moe_tp=4)
    sync = estimate(llama70b, h200, plan, 2048, 512, 32, arrival="synchronized", **kw)
    spread = estimate(llama70b, h200, plan, 2048, 512, 32, arrival="staggered", **kw)
    bench = estimate(llama70b, h200, plan, 2048, 512, 32, **kw)
    # 32 prompts arriving together wait behind each other's prefill chunks
    assert sync["ttft_ms"] > 2 * spread["ttft_ms"]
    assert spread["ttft_ms"] <= bench["ttft_ms"] <= sync["ttft_ms"]


def test_infeasible_answers_carry_a_reason(llama70b):
    h100 = load_hardware("h100-sxm")
    ds = load_architecture("deepseek-v3")
    out = estimate(ds, h100, ParallelPlan(tp=4, moe_tp=4), 1024, 1024, 8)
    assert out["feasible"] is False and "GB" in out["reason"] and out["ttft_ms"] is None
    bad = estimate(llama70b, h100, ParallelPlan(tp=3, moe_tp=3), 1024, 1024, 8)
    assert bad["feasible"] is False and "tp=3" in bad["reason"]


def test_malformed_questions_raise(llama70b, h200):
    with pytest.raises(ServecastError, match="isl"):
        estimate(llama70b, h200, ParallelPlan(tp=4, moe_tp=4), 0, 10, 1)
    with pytest.raises(ServecastError, match="prefix"):
        estimate(llama70b, h200, ParallelPlan(tp=4, moe_tp=4), 100, 10, 1, prefix_tokens=100)
    with pytest.raises(ServecastError, match="arrival"):
        estimate(llama70b, h200, ParallelPlan(tp=4, moe_tp=4), 100, 10, 1, arrival="poisson")


def test_prefix_cache_hits_cut_ttft(llama70b, h200):
    plan = ParallelPlan(tp=4, moe_tp=4)
    cold = estimate(llama70b, h200, plan, 8192, 256, 8, precision="fp8")
    warm = estimate(llama70b, h200, plan, 8192, 256, 8, precision="fp8", prefix_tokens=7680)
    assert warm["ttft_ms"] < 0.5 * cold["ttft_ms"]


def test_disaggregated_counts_both_pools(h200):
    ds = load_architecture("deepseek-v3")
    d = Disagg(ParallelPlan(tp=8, moe_tp=8), ParallelPlan(dp=8, ep=8), prefill_workers=2,
               decode_workers=1)
    out = estimate(ds, h200, ParallelPlan(), 8192, 1024, 64, disagg=d, breakdown=True)
    assert out["feasible"] and out["gpus"] == 24 and out["mode"] == "disaggregated"
    # KV of one 8192-token prompt (61 x 576 x 2 B x 8192 = 575.6 MB) crosses the network
    assert out["kv_transfer_ms"] > 0
    assert out["breakdown"]["decode"]["decode_step"]["bottleneck"] in (
        "compute", "hbm", "network", "overhead")


def test_worker_inference_rules_by_hand():
    plan = ParallelPlan(dp=8, ep=8)
    blank = Disagg(plan, plan, None, None)
    # 1000 clients, one decode worker's KV holds 300.7 sequences: ceil(1000 / 300) = 4 workers
    assert infer_decode_workers(blank, 1000, 300.7) == 4
    assert infer_decode_workers(blank, 10, 300.7) == 1
    assert infer_decode_workers(Disagg(plan, plan, 2, 9), 1000, 300.7) == 9  # recorded wins
    # 10 requests/s x 0.25 s of busy-server prefill each = 2.5 server-seconds per second:
    # 3 single-rank workers, or 1 worker of 8 DP ranks
    assert infer_prefill_workers(blank, 10.0, 0.25, 1) == 3
    assert infer_prefill_workers(blank, 10.0, 0.25, 8) == 1
    assert infer_prefill_workers(Disagg(plan, plan, 2, None), 10.0, 0.25, 1) == 2


def test_disaggregated_blank_worker_counts_are_inferred(h200):
    ds = load_architecture("deepseek-v3")
    plan = ParallelPlan(dp=8, ep=8)
    out = estimate(ds, h200, ParallelPlan(), 1024, 1024, 4096, disagg=Disagg(plan, plan, None,
                                                                               None))
    assert out["feasible"] and out["workers_inferred"] is True
    comp = out["components"]
    # the fewest decode workers whose KV pools hold all 4096 running sequences
    per_worker = np.floor(comp["max_running_seqs"] / out["decode_workers"])
    assert out["running_seqs"] == 4096
    assert (out["decode_workers"] - 1) * per_worker < 4096 <= out["decode_workers"] * per_worker
    assert out["gpus"] == 8 * (out["prefill_workers"] + out["decode_workers"])


def test_cli_estimate_json_and_exit_codes(cli):
    ok = cli("estimate", "--arch", "llama-3.1-70b", "--hardware", "h200-sxm", "--isl", "1024",
             "--osl", "256", "--concurrency", "8", "--tp", "4", "--precision", "fp8", "--json")
    assert ok.code == 0, ok.stderr
    assert set(ok.json) >= CONTRACT and ok.json["feasible"] is True
    infeasible = cli("estimate", "--arch", "deepseek-v3", "--hardware", "h100-sxm", "--isl",
                     "1024", "--osl", "256", "--concurrency", "8", "--tp", "2", "--json")
    assert infeasible.code == 0 and infeasible.json["feasible"] is False
    bad = cli("estimate", "--arch", "no-such-model", "--hardware", "h100-sxm", "--isl", "1",
              "--osl", "1", "--concurrency", "1", "--json")
    assert bad.code == 2 and bad.stdout == "" and "no-such-model" in bad.stderr


def test_mtp_speculative_decoding_cuts_tpot(h200):
    ds = load_architecture("deepseek-v3")
    plan = ParallelPlan(dp=8, ep=8)
    base = estimate(ds, h200, plan, 1024, 1024, 8)
    mtp = estimate(ds, h200, plan, 1024, 1024, 8, spec_tokens=3, spec_acceptance=0.7)
    # 1 + 0.7 + 0.49 + 0.343 = 2.533 tokens per step, each step a little dearer (4 tokens per
    # sequence through the model plus the MTP draft layer): TPOT falls, but by less than 2.533x
    assert base["tpot_ms"] / 2.533 < mtp["tpot_ms"] < base["tpot_ms"]
    with pytest.raises(ServecastError, match="spec"):
        estimate(ds, h200, plan, 1024, 1024, 8, spec_tokens=2, spec_acceptance=1.5)


def test_engine_config_reaches_the_closed_loop(llama70b, h200):
    plan = ParallelPlan(tp=4, moe_tp=4)
    kw = dict(precision="fp8", backend="sglang")
    base = estimate(llama70b, h200, plan, 1024, 1024, 32, **kw)
    slow = estimate(llama70b, h200, plan, 1024, 1024, 32,
                    engine=EngineConfig(recv_interval_iters=30.0, max_num_batched_tokens=16384), **kw)
    comp = slow["components"]
    assert comp["recv_interval_iters"] == 30.0
    assert base["components"]["recv_interval_iters"] == 1.0
    # the budget reaches the wave: 32 prompts of 1024 tokens in 16384-token steps
    assert comp["wave_steps"] == 2.0 and base["components"]["wave_steps"] == 4.0
    # the admission wait is (30 - 1) / 2 decode iterations of the run itself
    t = loop_terms(comp, load_loop_factors("sglang"))
    assert float(t["admission_s"]) == pytest.approx(14.5 * float(t["decode_step_s"]))
    assert slow["ttft_ms"] > base["ttft_ms"] + 0.5 * float(t["admission_s"]) * 1e3


@settings(max_examples=40, deadline=None)
@given(isl=st.integers(16, 60_000), osl=st.integers(2, 20_000),
       concurrency=st.integers(1, 1024), tp=st.sampled_from([1, 2, 4]),
       chip=st.sampled_from(["h100-sxm", "h200-sxm", "b200"]))
def test_a_feasible_estimate_never_reports_more_memory_than_the_chip_has(isl, osl, concurrency,
                                                                       tp, chip):
    # Llama 3.1 70B FP8 (config.json, 70.6B parameters): whatever the lengths and the load, a
    # deployment called feasible fits its chip's HBM (hardware/*.yaml hbm_capacity_usable);
    # engines admit on the blocks a sequence holds, so the running sequences fill at most the
    # KV pool left after the weights
    hw = load_hardware(chip)
    out = estimate(load_architecture("llama-3.1-70b"), hw, ParallelPlan(tp=tp), isl, osl,
                   concurrency, precision="fp8")
    if out["feasible"]:
        assert out["memory_bytes_per_gpu"] <= hw.hbm_bytes


def test_minimax_m3_long_prompt_prefill_matches_published_ttft():
    # MiniMax M3 NVFP4 on 8 B200, TP8, one request at a time, cache-busted prose (no prefix
    # hits): P50 TTFT 2.65 s at 128K and 43.2 s at 1,011,492 prompt tokens
    # (vllm-project/vllm#51494, 2026-08-08). The MSA tables stop at 32K; the indexer and the
    # top-k attention beyond are priced from their roofline. Measured here: -11% and +5%.
    from model.specs.precision import with_precision

    arch = with_precision(load_architecture("minimax-m3"), "experts=nvfp4,indexer_cache=fp8")
    hw = load_hardware("b200")
    for isl, measured_s in ((131072, 2.65), (1011492, 43.2)):
        out = estimate(arch, hw, ParallelPlan(tp=8, moe_tp=8), isl, 256, 1,
                       kv_dtype="fp8", backend="vllm")
        assert out["ttft_ms"] / 1e3 == pytest.approx(measured_s, rel=0.15), isl
