"""`servecast validate` (model.validate.scoreboard): the scoreboard of the model against the
measured sets. The calibration set must score exactly what `servecast check` scores on
data/calibration/e2e_measured.csv (model.validate.check, the `check` contract of
../shared/DESIGN.md); the kernel set what the stored kernel curves give on
data/calibration/ops; the AgentX set what model.validate.agentx predicts."""

from __future__ import annotations

import json

import numpy as np
import pytest

from model.frontends.cli import main
from model.perf.kernels import fitted_table
from model.specs.errors import ServecastError
from model.validate.agentx import UNMAPPED, agentx_runs, load_groups, load_runs
from model.validate.check import E2E_CSV, calibration_held_out, check
from model.validate.kernels import kernel_runs, measured_tables
from model.validate.scoreboard import (
    SETS,
    SLICE_KEYS,
    measured_set,
    report_markdown,
    run_record,
    run_slice,
    score_runs,
    validate,
)

RUN_KEYS = {"id", "measured", "predicted", "skip_reason", "slice"}
SET_KEYS = {"name", "source", "date", "rows", "predicted", "median_abs_error", "median_error",
            "slices", "runs"}


@pytest.fixture(scope="module")
def calibration() -> dict:
    """The calibration set as `servecast validate calibration` scores it."""
    return validate(["calibration"])


@pytest.fixture(scope="module")
def checked() -> dict:
    """`servecast check data/calibration/e2e_measured.csv`: the figures the set must repeat."""
    return check(E2E_CSV)


def test_calibration_set_scores_what_check_scores(calibration, checked):
    # check on e2e_measured.csv: 2,425 rows, all predicted; median APE TTFT 0.2384, TPOT 0.1256;
    # MAPE 0.4464 / 0.3347 (engine.yaml scores.in_sample.overall stores 0.1303 / 0.3325 for TPOT:
    # its fit predates the steps' physical floor, which lifts 45 TensorRT-LLM H100 decode steps)
    assert calibration["rows"] == checked["rows"] == 2425
    assert calibration["predicted"] == checked["predicted"] == 2425
    mae, mean = calibration["median_abs_error"], calibration["mean_abs_error"]
    assert mae["ttft_ms"] == pytest.approx(checked["ttft_median_ape"], rel=1e-12)
    assert mae["tpot_ms"] == pytest.approx(checked["tpot_median_ape"], rel=1e-12)
    assert mean["ttft_ms"] == pytest.approx(checked["ttft_mape"], rel=1e-12)
    assert mean["tpot_ms"] == pytest.approx(checked["tpot_mape"], rel=1e-12)
    assert mae["ttft_ms"] == pytest.approx(0.2384, abs=5e-5)
    assert mae["tpot_ms"] == pytest.approx(0.1256, abs=5e-5)


@pytest.mark.parametrize("slice_key, check_key", [
    ("backend", "by_backend"), ("model", "by_model"), ("deployment", "by_deployment")])
def test_calibration_slices_match_checks_groups(calibration, checked, slice_key, check_key):
    # check's by_backend / by_model / by_deployment groups are the set's slices of that key
    ours = calibration["slices"][slice_key]
    assert set(ours) == set(checked[check_key])
    for value, s in ours.items():
        theirs = checked[check_key][value]
        assert s["rows"] == theirs["rows"]
        assert s["median_abs_error"]["tpot_ms"] == pytest.approx(theirs["tpot_median_ape"],
                                                                 rel=1e-12)


def test_calibration_chips_are_hardware_names_and_slices_sum_to_rows(calibration, checked):
    # e2e_measured.csv `system`: b200_sxm 1,097, h100_sxm 712, h200_sxm 616 rows, named as
    # hardware/*.yaml names them
    chips = calibration["slices"]["chip"]
    assert {k: v["rows"] for k, v in chips.items()} == {"b200": 1097, "h100-sxm": 712,
                                                       "h200-sxm": 616}
    for key in SLICE_KEYS:
        assert sum(s["rows"] for s in calibration["slices"][key].values()) == 2425, key
    assert list(calibration["slices"]["load_band"]) == ["1-4 sessions", "5-24", "25-99", "100+"]


def test_calibration_runs_carry_the_record_schema(calibration):
    runs = calibration["runs"]
    assert len(runs) == 2425
    first = runs[0]
    assert set(first) >= RUN_KEYS and set(first["slice"]) >= set(SLICE_KEYS)
    # first row of e2e_measured.csv: DeepSeek-V3 on 8 x H200, SGLang, 16 clients, measured
    # 2026-03-25, mean TTFT 285.876 ms, mean TPOT 16.630 ms
    assert first["id"] == "dsr1_h200_sglang_fp8_agg_1024x1024_c16_cfg81"
    assert first["measured"]["ttft_ms"] == pytest.approx(285.8761207331554)
    assert first["measured"]["tpot_ms"] == pytest.approx(16.62984173279305)
    assert first["slice"] == {
        "chip": "h200-sxm", "vendor": "NVIDIA", "model": "deepseek-ai/DeepSeek-V3",
        "backend": "sglang", "mode": "aggregated", "load_band": "5-24",
        "deployment": "aggregated"}
    assert first["date"] == "2026-03-25"
    # 1,780 of the 2,425 rows state `measured=` in silicon_data_source: 2025-10-29 to 2026-03-27
    assert calibration["date"].startswith("2025-10-29 to 2026-03-27 (1780 of 2425")


def test_calibration_held_out_is_what_engine_yaml_stores(calibration):
    # data/calibration/engine.yaml scores: 5-fold by configuration TTFT 0.2590 / TPOT 0.1395,
    # leaving one model out 0.4004 / 0.2258 (median APE)
    held = calibration["held_out"]
    assert held == calibration_held_out()
    assert held["5fold_by_config"]["median_abs_error"]["ttft_ms"] == pytest.approx(0.2590, abs=1e-4)
    assert held["5fold_by_config"]["median_abs_error"]["tpot_ms"] == pytest.approx(0.1395, abs=1e-4)
    lomo = held["leave_one_model_out"]["median_abs_error"]
    assert (lomo["ttft_ms"], lomo["tpot_ms"]) == pytest.approx((0.4004, 0.2258), abs=1e-4)


def test_cli_json_is_one_set_object(capsys):
    assert main(["validate", "calibration", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) >= SET_KEYS and out["name"] == "calibration"
    assert out["median_abs_error"]["ttft_ms"] == pytest.approx(0.2384, abs=5e-5)
    assert all(set(r) >= RUN_KEYS for r in out["runs"])


def test_unknown_set_is_one_error_line_naming_the_sets(capsys):
    assert main(["validate", "calibration", "no-such-set"]) == 2
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert out == "" and len(lines) == 1
    assert lines[0] == ("servecast: error: unknown measured set 'no-such-set'; allowed: "
                        "calibration, kernels, inferencex-agentx, inferencex-agentx-simulator, "
                        "published")
    with pytest.raises(ServecastError, match="allowed: calibration, kernels"):
        measured_set("mlperf")


def test_errors_are_predicted_over_measured_minus_one():
    # two runs, errors +50% and -20%, and one without a prediction: median |error| 35%, median
    # error +15%; the skipped run counts in rows, not in predicted or the medians
    sl = run_slice("h200_sxm", "m", "vllm", "aggregated", "1-4 sessions")
    runs = [run_record("a", {"x_s": 2.0}, {"x_s": 3.0}, None, sl),
            run_record("b", {"x_s": 5.0}, {"x_s": 4.0}, None, sl | {"chip": None}),
            run_record("c", {"x_s": 1.0}, None, "no deployment", sl)]
    out = score_runs(SETS[0], runs)
    assert (out["rows"], out["predicted"]) == (3, 2)
    assert out["median_abs_error"]["x_s"] == pytest.approx(0.35)
    assert out["median_error"]["x_s"] == pytest.approx(0.15)
    assert out["slices"]["chip"]["h200-sxm"]["rows"] == 2  # run b has no chip
    assert runs[2]["predicted"] == {"x_s": None}
    text = report_markdown(out)
    assert "| x_s | 35.0% | +15.0% |" in text and "| no deployment | 1 |" in text


def test_kernel_runs_are_shape_groups_per_load_band():
    # h100_sxm GEMM bf16: 35,742 measured shapes (kernel_report.md) in 483 (n, k) groups; each
    # run is one group in one rows band, its time the geometric mean of the group's rows there
    fitted = fitted_table()["h100_sxm"]
    rows = next(r for op, key, r in measured_tables("h100_sxm", fitted)
                if (op, key) == ("gemm", "bf16"))
    runs = [r for r in kernel_runs(("h100_sxm",)) if r["slice"]["op"] == "gemm"
            and r["slice"]["format"] == "bf16"]
    assert len(rows) == sum(r["table_rows"] for r in runs) == 35742
    assert len({r["id"].split("/")[3] for r in runs}) == 483
    assert {r["slice"]["load_band"] for r in runs} == {"1-16 rows", "17-256 rows",
                                                      "257-4096 rows", "4097+ rows"}
    # per measured row the stored curve is off by a median 7.5% in sample, next to the 7.6%
    # held out that kernels.yaml stores for it (heldout_median_ape 0.0758); a run's geometric
    # mean averages its rows' scatter, so the runs' median is smaller
    per_row = np.median(np.abs(rows.predicted_s / rows.measured_s - 1))
    assert per_row == pytest.approx(fitted["gemm"]["bf16"]["heldout_median_ape"], abs=0.005)
    per_run = np.median([abs(r["predicted"]["kernel_time_s"] / r["measured"]["kernel_time_s"] - 1)
                         for r in runs])
    assert 0.5 * per_row < per_run < per_row


def test_agentx_runs_score_one_mapped_run():
    # run 439907 (MiniMax M3, TP2 on 2 B300, 24 sessions: measured TPGS 69,902 tok/s/GPU, P90
    # interactivity 74.2 tok/s; data/benchmarks/README.md); the full tier predicts it, as
    # model.validate.agentx.predict does
    runs = load_runs()
    group = next(g for g in load_groups() if g["model"] == "minimaxm3"
                 and g["hardware"] == "b300" and g["gpus"] == 2)
    got = agentx_runs(runs[runs.id.isin([439907, 439873])], [group])
    assert [r["id"] for r in got] == ["439907", "439873"]
    mapped, unmapped = got
    assert mapped["skip_reason"] is None
    assert mapped["measured"]["tpgs"] == pytest.approx(69_902, rel=1e-4)
    assert mapped["measured"]["p90_interactivity_tok_s"] == pytest.approx(74.24, abs=0.01)
    assert mapped["predicted"]["tpgs"] > 0
    # the group's recipe serves it behind vLLM's Python API server (inferencex_agentx_deployments)
    assert mapped["slice"] == {"chip": "b300", "vendor": "NVIDIA", "model": "minimax-m3",
                               "backend": "vllm", "mode": "aggregated", "load_band": "5-24",
                               "frontend": "python"}
    assert unmapped["skip_reason"] == UNMAPPED and unmapped["predicted"]["tpgs"] is None
    assert unmapped["slice"]["frontend"] is None
    # 439873: DeepSeek V4 Pro, 4 prefill + 8 decode GB300, 83,332 tok/s/GPU (README); its
    # group is not passed, so it is listed without a prediction
    assert unmapped["measured"]["tpgs"] == pytest.approx(83_332, rel=1e-4)
    assert unmapped["slice"]["mode"] == "disaggregated"


def test_reports_go_beside_each_sets_data():
    paths = {s.name: str(s.report_path.relative_to(s.report_path.parents[2])) for s in SETS}
    assert paths == {"calibration": "data/calibration/calibration_scoreboard.md",
                     "kernels": "data/calibration/kernels_scoreboard.md",
                     "inferencex-agentx": "data/benchmarks/inferencex-agentx_scoreboard.md",
                     "inferencex-agentx-simulator":
                         "data/benchmarks/inferencex-agentx-simulator_scoreboard.md",
                     "published": "data/benchmarks/published_scoreboard.md"}
