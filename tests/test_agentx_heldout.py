"""Held-out MiniMax M3 AgentX runs (data/benchmarks/inferencex_agentx_minimax_m3_2026-09-15.csv,
InferenceX export 2026-09-15; provenance in data/benchmarks/README.md): never fitted, scored by
model.agentx_heldout."""

import pytest

from model.agentx_heldout import load_runs, predict, summary


def test_export_row_is_the_posts_minimax_result():
    # the vLLM AgentX post (seed 000, research/theory.md §1.0): MiniMax M3 on 2 B300, 70K TPGS at
    # P90 interactivity 74.2 tok/s with 24 sessions; the export row must say the same
    runs = load_runs().set_index("id")
    r = runs.loc[439907]
    assert (r.hardware, r.total_gpus, r.decode_tp, r.conc) == ("b300", 2, 2, 24)
    assert r.tput_per_gpu == pytest.approx(70_000, rel=0.01)
    assert r.p90_intvty == pytest.approx(74.2, abs=0.05)


def test_tpgs_tracks_the_b200_tp4_sweep_below_saturation():
    # 4 x B200 TP4, 10-32 sessions (8 runs, measured 16.4K-44.1K tok/s/GPU):
    # before the engine saturates (above ~32 sessions measured TPGS stays at ~43K) the model's
    # TPGS is within 20% of every run, and its median error is within 10%
    runs = load_runs()
    runs = runs[(runs.hardware == "b200") & (runs.decode_tp == 4) & runs.conc.between(10, 32)]
    table = predict(runs)
    assert len(table) == 8
    assert table.tpgs_err.abs().max() < 0.20
    assert abs(summary(table)["all"]["tpgs"]) < 0.10
