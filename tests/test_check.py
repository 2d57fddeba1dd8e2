"""`model.check` / `servecast check` on slices of the calibration data (repo copy)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from model.check import check, load_cases, predict_case
from model.errors import ServecastError

ROOT = Path(__file__).resolve().parent.parent
CSV = ROOT / "data" / "calibration" / "e2e_measured.csv"
VLLM_JSON = ROOT / "data" / "benchmarks" / "vllm_bench_llama70b_h200_tp4_c32.json"


@pytest.fixture(scope="module")
def vllm_llama70b(tmp_path_factory) -> Path:
    """The vLLM Llama-3.1-70B runs of the calibration CSV (H100/H200/B200, TP1-8, fp8/fp4)."""
    df = pd.read_csv(CSV)
    part = df[(df.backend == "vllm") & (df.model_path == "meta-llama/Llama-3.1-70B")]
    path = tmp_path_factory.mktemp("slice") / "slice.csv"
    part.to_csv(path, index=False)
    return path


def test_slice_errors_at_measured_values(vllm_llama70b, tmp_path):
    out = check(vllm_llama70b, tmp_path / "rows.csv")
    assert out["rows"] == out["predicted"] > 100
    # Measured with data/calibration/engine.yaml fitted 2026-11-29 on this CSV (in-sample for
    # these 173 rows; kernels from data/calibration/kernels.yaml of 2026-11-29 11:17): TTFT
    # median APE 0.410, TPOT 0.072. Bounds leave room for a refit after the kernel tables change.
    assert out["tpot_median_ape"] < 0.15
    assert out["ttft_median_ape"] < 0.55
    assert set(out["by_system"]) == {"h100_sxm", "h200_sxm", "b200_sxm"}
    rows = pd.read_csv(tmp_path / "rows.csv")
    assert {"pred_ttft_ms", "pred_tpot_ms", "ttft_ape", "tpot_ape"} <= set(rows.columns)


def test_contract_keys_and_skips(vllm_llama70b, tmp_path):
    df = pd.read_csv(vllm_llama70b).head(6)
    df.loc[0, "model_path"] = "acme/not-a-model"
    df.loc[1, "system"] = "tpu_v9"
    path = tmp_path / "mixed.csv"
    df.to_csv(path, index=False)
    out = check(path)
    for key in ("rows", "predicted", "skipped", "ttft_mape", "tpot_mape", "ttft_median_ape",
                "tpot_median_ape"):
        assert key in out
    assert out["rows"] == 6 and out["predicted"] == 4
    reasons = {s["id"]: s["reason"] for s in out["skipped"]}
    assert "not-a-model" in reasons[df.loc[0, "id"]]
    assert "tpu_v9" in reasons[df.loc[1, "id"]]


def test_vllm_bench_json(tmp_path):
    (case,) = load_cases(VLLM_JSON)
    # 327680 input / 2621440 output tokens over 320 requests -> ISL 1024, OSL 8192; 32 clients
    assert (case.isl, case.osl, case.concurrency, case.system) == (1024, 8192, 32, "h200_sxm")
    pred = predict_case(case)
    # measured: TTFT 177.95 ms, TPOT 15.84 ms (the CSV row the file was built from); the model
    # said 13.15 ms (-17%) and 274.6 ms (+54%) when fitted 2026-11-29
    assert pred["tpot_ms"] == pytest.approx(15.84, rel=0.25)
    assert 177.95 / 2 < pred["ttft_ms"] < 177.95 * 2


def test_malformed_inputs(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("a,b\n1,2\n")
    with pytest.raises(ServecastError, match="missing columns"):
        check(bad)
    junk = tmp_path / "junk.json"
    junk.write_text("{not json")
    with pytest.raises(ServecastError, match="not JSON"):
        check(junk)
    txt = tmp_path / "x.txt"
    txt.write_text("")
    with pytest.raises(ServecastError, match="unknown format"):
        check(txt)


def test_cli_check(cli, tmp_path):
    res = cli("check", str(VLLM_JSON), "--out", str(tmp_path / "o.csv"), "--json")
    assert res.code == 0, res.stderr
    data = json.loads(res.stdout)
    assert data["rows"] == 1 and data["predicted"] == 1 and data["skipped"] == []
    assert (tmp_path / "o.csv").exists()
    missing = cli("check", str(tmp_path / "nope.csv"), "--json")
    assert missing.code == 2 and "no such file" in missing.stderr
