"""The published measured set (data/benchmarks/published_results.csv) and its scorer
(model.validate.published)."""

import math

import pytest

from model.perf.parallel import ParallelPlan
from model.serve.estimate import estimate
from model.specs.architecture import load_architecture
from model.specs.hardware import load_hardware
from model.validate import published

ROWS = published.load_rows()
BY_ID = {r["id"]: r for r in ROWS}


@pytest.fixture(scope="module")
def runs():
    return {r["id"]: r for r in published.published_runs()}


def test_every_row_cites_a_source_and_a_date_and_measures_positive_output():
    assert len(ROWS) >= 40
    for row in ROWS:
        assert row["source_url"].startswith("https://"), row["id"]
        assert len(row["source_date"]) == 10 and row["source_date"][4] == "-", row["id"]
        assert row["assumptions"].strip(), row["id"]
        total, per_gpu = float(row["output_tps_total"]), float(row["output_tps_per_gpu"])
        assert total > 0 and per_gpu > 0, row["id"]
        assert per_gpu == pytest.approx(total / int(row["gpus"]), rel=1e-3), row["id"]


def test_ids_are_unique_and_rows_span_vendors_and_chips():
    assert len(BY_ID) == len(ROWS)
    assert {r["vendor"] for r in ROWS} == {"nvidia", "amd"}
    assert {"h100-sxm", "h200-sxm", "b200", "gb200-nvl72", "mi300x", "mi325x"} <= {
        r["chip"] for r in ROWS}


def test_mlperf_lengths_come_from_the_dataset_and_the_reference_generation(runs):
    # OpenOrca: 24,576 samples, mean input 222.33 tokens (per-sample lengths of the MLCommons
    # dataset in openshift-psap/performance-dashboard mlperf-data/summaries/llama2-70b-99.csv);
    # mean output 294.45, the reference's tokens_per_sample (submission_checker/constants.py)
    row = BY_ID["mlperf-v5.1-5.1-0069-b200-llama-2-70b-offline"]
    assert float(row["isl_mean"]) == 222.33 and float(row["osl_mean"]) == 294.45
    assert "llama2-70b-99.csv" in row["lengths_source"]
    run = runs[row["id"]]
    assert run["skip_reason"] is None and run["concurrency"] == 2048


def test_a_row_without_a_mean_input_length_is_skipped_not_guessed():
    row = {**BY_ID["mlperf-v5.1-5.1-0069-b200-llama-2-70b-offline"], "isl_mean": ""}
    out, concurrency, reason = published.predict_row(row)
    assert out is None and concurrency is None and "mean input length" in reason


def test_predicted_rows_are_finite(runs):
    for rid in ("trtllm-perf-llama33-70b-h200-sxm-tp1-128x2048",
                "amd-rocm-perf-llama-3.1-405b-mi300x-tp8-2048x2048",
                "nim-1.8-llama33-70b-h100-tp2-5000x500-c25"):
        value = runs[rid]["predicted"]["output_tps_per_gpu"]
        assert value is not None and math.isfinite(value) and value > 0, rid
        assert runs[rid]["skip_reason"] is None


def test_error_of_one_row_is_the_estimate_over_the_measured_value(runs):
    # TensorRT-LLM perf overview: Llama 3.3 70B FP8, H200 TP1, 128 in / 2048 out, 4,336
    # output tok/s; offline at TensorRT-LLM's default max batch 2048
    out = estimate(load_architecture("llama-3.1-70b"), load_hardware("h200-sxm"),
                   ParallelPlan(tp=1, pp=1, dp=1, ep=1, moe_tp=1), 128, 2048, 2048,
                   precision="fp8", kv_dtype="fp8", backend="trtllm")
    expected = out["output_tokens_per_s_per_gpu"] / 4336.0 - 1.0
    run = runs["trtllm-perf-llama33-70b-h200-sxm-tp1-128x2048"]
    assert run["measured"]["output_tps_per_gpu"] == 4336.0
    assert published.relative_error(run) == pytest.approx(expected, rel=1e-12)


def test_fixed_concurrency_rows_use_the_stated_concurrency_and_score_latency(runs):
    # NVIDIA NIM 1.8.0, Llama-3.3-70B fp8 TP2 on 2 H100, 5000 in / 500 out, 25 clients:
    # TTFT 688.69 ms, ITL 38.75 ms
    run = runs["nim-1.8-llama33-70b-h100-tp2-5000x500-c25"]
    assert run["concurrency"] == 25
    assert run["measured"] == {"output_tps_per_gpu": 311.7, "ttft_ms": 688.69, "tpot_ms": 38.75}
    assert run["slice"]["load_band"] == "5-32"
    assert all(v is not None and v > 0 for v in run["predicted"].values())


def test_latency_bound_concurrency_is_the_highest_grid_point_meeting_the_limits():
    # a server row made from the H200 TensorRT-LLM row: 1,000 in / 1,000 out, limits of
    # MLPerf's llama2-70b server scenario (TTFT 2 s, TPOT 200 ms)
    row = {**BY_ID["trtllm-perf-llama33-70b-h200-sxm-tp1-1000x1000"], "mode": "server",
           "concurrency": "", "max_batch": "256", "ttft_limit_ms": "2000", "tpot_limit_ms": "200"}
    out, concurrency, reason = published.predict_row(row)
    assert reason is None and concurrency in {2 ** k for k in range(9)}
    assert out["ttft_ms"] <= 2000 and out["tpot_ms"] <= 200
    if concurrency < 256:
        above = published._estimate(row, 2 * concurrency)
        assert above["ttft_ms"] > 2000 or above["tpot_ms"] > 200


def test_summary_medians_cover_the_predicted_rows(runs):
    result = published.summary(list(runs.values()))
    assert result["rows"] == len(ROWS)
    assert result["predicted"] == sum(r["predicted"]["output_tps_per_gpu"] is not None
                                      for r in runs.values())
    assert 0 <= result["median_abs_error"] < 10
    assert sum(v["rows"] for v in result["by"]["vendor"].values()) == result["predicted"]


def test_mlperf_rows_state_the_running_batch_context_of_their_dataset():
    # per-sample lengths of the MLCommons sets (openshift-psap/performance-dashboard
    # mlperf-data/summaries/*.csv): DeepSeek-R1's 4,388 samples have mean input 803.79, mean
    # reference output 4043.45 and an output-weighted mean of input + output / 2 of 5826.0
    # tokens: share (5826.0 - 803.79) / 4043.45 = 1.2421 (fixed lengths: 0.5)
    shares = {r["model"]: r["decode_context_share"] for r in ROWS if r["source"].startswith(
        "MLPerf")}
    assert shares == {"llama-2-70b": "0.7056", "mixtral-8x7b": "0.8802",
                      "llama-3.1-405b": "0.2285", "deepseek-r1": "1.2421"}
    assert all(r["decode_context_share"] == "" for r in ROWS if not r["source"].startswith(
        "MLPerf"))
    from model.serve.closed_loop import Protocol

    assert Protocol(decode_context_share=1.2421).running_context(803.79, 4043.45) == \
        pytest.approx(5826.0, abs=0.5)
    assert Protocol().running_context(803.79, 4043.45) == pytest.approx(803.79 + 4043.45 / 2)


def test_a_longer_running_context_slows_the_deepseek_r1_offline_row():
    # the same row at fixed lengths (share 0.5) decodes at a 2.4x shorter mean context
    row = BY_ID["mlperf-v5.1-5.1-0069-b200-deepseek-r1-offline"]
    biased = published._estimate(row, 4096)
    fixed = published._estimate({**row, "decode_context_share": ""}, 4096)
    assert biased["tpot_ms"] > 1.15 * fixed["tpot_ms"]
