"""Engine factors: the named empirical factors of an inference engine, read from
`data/calibration/engine.yaml` (written by `python -m model.fit.engine`, which documents what
each factor absorbs and how it is fitted).

The step model applies the per-backend `EngineFactors`; the benchmark-client model
(`model.serve.closed_loop`) takes them with the two factors shared by all backends
(`LoopFactors`). A backend or factor the file lacks takes the defaults below.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from functools import cache

from model import ROOT
from model.specs.errors import ServecastError
from model.specs.specio import load_yaml

ENGINE_YAML = ROOT / "data" / "calibration" / "engine.yaml"
BACKENDS = ("vllm", "sglang", "trtllm")


@dataclass(frozen=True)
class EngineFactors:
    """Named empirical factors of an inference engine (fitted by model.fit.engine on the
    end-to-end calibration runs; what each one absorbs is documented there)."""

    step_overhead_s: float = 0.004  # scheduler + sampling + launch per engine step
    prefill_scale: float = 1.0  # multiplies the non-expert kernel time of prefill steps
    decode_scale: float = 1.0  # multiplies the non-expert kernel time of decode steps
    moe_scale: float = 1.0  # routed-expert kernel time of decode tokens (routing, permute)
    moe_prefill_scale: float = 1.0  # the same for prefill tokens (expert load imbalance)
    request_overhead_s: float = 0.0  # fixed per-request time before the first token
    first_token_steps: float = 0.0  # residual first-token path, in decode steps (engines send
    # the first token at once; what the fit puts here is streaming/detokenize lag left over)
    disagg_prefill_scale: float = 1.0  # prefill_scale of disaggregated prefill workers
    disagg_decode_scale: float = 1.0  # decode step of disaggregated decode workers
    disagg_request_overhead_s: float = 0.0  # request path router -> prefill -> decode worker
    source: str = "default (unfitted)"


@dataclass(frozen=True)
class LoopFactors(EngineFactors):
    """A backend's engine factors plus the benchmark-protocol ones the closed loop needs
    (fitted by model.fit.engine, shared by all backends)."""

    benchmark_rounds: float = 10.0
    varied_wave_persistence: float = 0.0


@cache
def engine_table() -> dict:
    """The parsed engine.yaml ({} when the file does not exist)."""
    if not ENGINE_YAML.exists():
        return {}
    return load_yaml(ENGINE_YAML.read_text()) or {}


def _backend_entry(backend: str) -> dict:
    return engine_table().get("backends", {}).get(backend) or {}


def load_factors(backend: str) -> EngineFactors:
    """Fitted factors of a backend (defaults when engine.yaml has none)."""
    entry = _backend_entry(backend)
    if not entry:
        return EngineFactors()
    values = {f.name: float(entry[f.name]) for f in fields(EngineFactors) if f.name in entry
              and f.name != "source"}
    values["source"] = f"{ENGINE_YAML.name}:{backend} (fitted {engine_table().get('fitted', '?')})"
    return EngineFactors(**values)


def load_loop_factors(backend: str) -> dict:
    """All closed-loop factors of a backend (LoopFactors names -> value), defaults where
    engine.yaml has none."""
    out = asdict(LoopFactors())
    out.update({k: float(v) for k, v in _backend_entry(backend).items() if k in out})
    out.update({k: float(v) for k, v in (engine_table().get("shared") or {}).items() if k in out})
    return out


@cache
def engine_factors(backend: str) -> EngineFactors:
    """The stored factors of a backend; a backend outside BACKENDS is a user error."""
    if backend not in BACKENDS:
        raise ServecastError(f"unknown backend {backend!r}; allowed: {', '.join(BACKENDS)}")
    return load_factors(backend)
