"""The `benchmark_check` notebook, run on a small slice of the calibration CSV."""

from __future__ import annotations

from model.frontends.nbio import run_notebook


def test_benchmark_check_notebook_headline(tmp_path):
    head = run_notebook("benchmark_check", {"max_rows": 40, "group_by": "system"}, tmp_path)
    assert head["rows"] == 40 and head["predicted"] == 40
    assert head["dominant_tpot_term"] in ("decode_kernels", "decode_experts", "network",
                                          "step_overhead", "prefill_interference")
    assert head["dominant_ttft_term"] in ("prefill", "kv_transfer", "request_overhead",
                                          "first_token_stream", "queueing")
    assert 0 < head["tpot_median_ape"] < 0.5
    assert (tmp_path / "measured_vs_predicted.png").exists()
    assert (tmp_path / "error_by_group.svg").exists()
