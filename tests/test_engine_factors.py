"""`model.perf.engine_factors`: the engine factors the core reads from data/calibration/engine.yaml,
and the import rule the move of the factors out of the fit serves."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from model.perf.engine_factors import (
    BACKENDS,
    ENGINE_YAML,
    EngineFactors,
    LoopFactors,
    engine_factors,
    load_loop_factors,
)
from model.specs.errors import ServecastError

ROOT = Path(__file__).resolve().parent.parent


def test_stored_factors_are_engine_yaml_values():
    stored = yaml.safe_load(ENGINE_YAML.read_text())
    for backend in BACKENDS:
        f = engine_factors(backend)
        for name, value in stored["backends"][backend].items():
            assert getattr(f, name) == pytest.approx(value, rel=1e-15)
        assert f.source.startswith("engine.yaml:" + backend)


def test_loop_factors_add_the_shared_benchmark_factors():
    stored = yaml.safe_load(ENGINE_YAML.read_text())
    loop = load_loop_factors("sglang")
    assert set(loop) == {f for f in LoopFactors.__dataclass_fields__}
    assert loop["benchmark_rounds"] == pytest.approx(stored["shared"]["benchmark_rounds"])
    assert loop["decode_scale"] == pytest.approx(stored["backends"]["sglang"]["decode_scale"])


def test_unknown_backend_is_a_user_error():
    with pytest.raises(ServecastError, match="allowed: vllm, sglang, trtllm"):
        engine_factors("tgi")
    assert EngineFactors().step_overhead_s == 0.004  # the unfitted default


def test_core_modules_load_without_fit_or_validate():
    # the step model and the benchmark-client model are core: importing them loads no module
    # of model.fit, model.validate or model.frontends
    code = ("import sys; import model.perf.step, model.serve.estimate, model.serve.closed_loop; "
            "print(sorted(m for m in sys.modules if m.startswith(('model.fit', 'model.validate', "
            "'model.frontends'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                         check=True)
    assert out.stdout.strip() == "[]"


def test_the_serving_model_loads_without_scipy_stats():
    # model.specs.probability evaluates the laws on scipy.special so that no command pays for
    # importing scipy.stats (0.4-1.3 s on a 2-core machine, `python -X importtime`)
    code = ("import sys; import model.plan.evaluate, model.serve.engine, model.serve.simulate; "
            "print('scipy.stats' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                         check=True)
    assert out.stdout.strip() == "False"
