"""Measured benchmark runs as cases: the calibration CSV rows and `vllm bench serve` JSON files,
normalized, and the physics of each run before engine factors (`case_components`, what the
engine fit evaluates and `model.validate.check` scores).

Two formats:
- the calibration CSV (`data/calibration/e2e_measured.csv` columns: model_path, system, backend,
  precision, mode, isl, osl, batch_size, tp/pp/attention_dp/moe_tp/moe_ep sizes, prefill_* and
  decode_* for disaggregated runs, silicon_ttft_ms, silicon_tpot_ms); a row's cells are read
  through the pydantic models `PlanCells` and `MeasuredCells`, and a row with a bad cell is
  scored as skipped with the column and what it allows;
- the JSON `vllm bench serve --save-result` writes (mean_ttft_ms, mean_tpot_ms, completed,
  total_input_tokens, total_output_tokens, max_concurrency, model_id), with the deployment given
  by `--metadata` keys saved into the file (hardware, tp, pp, dp, ep, ...) or by CLI options.

What a record does not say, read by documented rules (each with its evidence):
- the benchmark protocol (`protocol_for_source`): rows of the aiconfigurator gap-analysis
  harness (source path `aic-auto-gap-analysis`) ran fixed-length requests for an unrecorded
  number of rounds; every other source of the calibration CSV (the InferenceMAX result dumps:
  `db-dump`, `source_file=2026-...csv`; ISL/OSL 1024/1024, 1024/8192, 8192/1024) ran
  InferenceMAX's client, `--num-prompts 10*C --random-range-ratio 0.8`: 10 rounds of requests
  whose lengths are drawn uniformly from [int(0.8 L), L], mean 0.9 L, the lengths the model runs
  (SemiAnalysisAI/InferenceX, benchmarks/benchmark_lib.sh and its sampler). Evidence for the
  aiconfigurator reading: there SGLang's TTFT grows with the whole wave (C ISL / budget prefill
  steps) and its TPOT carries the wave's prefill, which takes fixed-length requests that come
  back together;
- engine settings that change admission (`engine_for_row`): the InferenceMAX recipes behind
  the aggregated rows (SGLang's scheduler-recv-interval and chunked-prefill size for DeepSeek,
  TensorRT-LLM's attention-DP balancing and the Llama batch waiting; sources next to the
  rule); every other row runs the engines' defaults;
- disaggregated worker counts left blank (NaN): None, inferred by
  `model.serve.estimate.infer_decode_workers` / `infer_prefill_workers` (the fewest decode workers
  whose KV pools hold the C running sequences, the fewest prefill workers that keep up); those
  rows are reported as the deployment group "disagg inferred";
- square MoE groups: see `_normalize`.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any

import pandas as pd
from pydantic import BaseModel, BeforeValidator, ConfigDict, ValidationError, ValidationInfo

from model.perf.engine_factors import BACKENDS
from model.perf.parallel import ParallelPlan, is_moe
from model.serve.closed_loop import EngineConfig, Protocol
from model.serve.estimate import Disagg, estimate
from model.specs.architecture import load_architecture
from model.specs.defaults import MAX_NUM_BATCHED_TOKENS
from model.specs.dtypes import dtype
from model.specs.errors import ServecastError
from model.specs.hardware import load_hardware

QUANT = {"fp8": "fp8", "fp8_block": "fp8_block", "nvfp4": "nvfp4", "fp4": "nvfp4",
         "bf16": "bf16", "fp16": "bf16", "float16": "bf16", "mxfp4": "mxfp4", "w4a16": "int4_group128",
         "int4_wo": "int4_group128", "int8_wo": "int8"}


@dataclass(frozen=True)
class Case:
    """One measured run, normalized."""

    id: str
    model: str
    system: str
    backend: str
    mode: str  # agg | disagg
    isl: int
    osl: int
    concurrency: int
    gemm_quant: str | None
    moe_quant: str | None
    plan: ParallelPlan | None
    disagg: Disagg | None
    ttft_ms: float
    tpot_ms: float
    protocol: Protocol = Protocol()
    engine: EngineConfig = EngineConfig()
    unreadable: str = ""  # why the row cannot be scored (a bad cell), or ""


# Benchmark protocol by provenance (see the module docstring): first match in the source wins
HARNESS_PROTOCOLS = (("aic-auto-gap-analysis", Protocol(rounds=None, range_ratio=1.0)),)
INFERENCEMAX = Protocol(rounds=10.0, range_ratio=0.8)  # --num-prompts 10*C, range ratio 0.8


def protocol_for_source(source) -> Protocol:
    """The benchmark protocol of a calibration-CSV row, from its `silicon_data_source`."""
    text = str(source or "")
    for pattern, protocol in HARNESS_PROTOCOLS:
        if pattern in text:
            return protocol
    return INFERENCEMAX


# Engine settings of the InferenceMAX recipes that change admission (SemiAnalysisAI/InferenceX,
# benchmarks/*.sh at commit 1fc5d73, the scripts behind the `db-dump` / `source_file=2026-...`
# aggregated rows; disaggregated rows ran srt-slurm recipes, not read here):
# - SGLang DeepSeek on B200 (dsr1_fp8_b200.sh, dsr1_fp4_b200.sh): `--scheduler-recv-interval`
#   30 from 16 clients on (10 below; fp8 at TP4: 10), `--chunked-prefill-size` 32768 (fp8 TP8),
#   8192 (fp8 TP4), 16384 (fp4);
# - SGLang DeepSeek on H200 (dsr1_fp8_h200.sh): receive every iteration, chunked prefill 32768;
# - TensorRT-LLM DeepSeek with attention DP (dsr1_fp8_*_trt*.sh, dsr1_fp4_b200_trt*.sh):
#   `attention_dp_config: {enable_balance: true, timeout_iters: 60}`; gpt-oss with attention DP
#   (gptoss_fp4_b200_trt.sh): `enable_balance: true` with TensorRT-LLM's default timeout (50
#   iterations; assumption: the AttentionDpConfig default of the 1.x releases) and
#   `--max_num_tokens 20000`;
# - TensorRT-LLM Llama 3.1 70B at 1K/1K below TP8 (70b_fp4_b200_trt_slurm.sh,
#   70b_fp8_*_trt_slurm.sh): `batch_wait_timeout_iters: 20, batch_wait_max_tokens_ratio: 0.9`
#   with `--max_num_tokens` = the max model length (assumption: ISL + OSL + 256, what the
#   InferenceMAX workflow passes).
ADP_TIMEOUT_DEEPSEEK = 60.0
ADP_TIMEOUT_DEFAULT = 50.0


def engine_for_row(row, protocol: Protocol, plan: ParallelPlan | None) -> EngineConfig:
    """The engine settings a calibration-CSV row ran with, where its recipe is known (see
    above); the engines' defaults otherwise."""
    if protocol is not INFERENCEMAX or row.get("mode") != "agg" or plan is None:
        return EngineConfig()
    model = str(row.get("model_path", "")).lower()
    backend, system = str(row.get("backend")), str(row.get("system"))
    precision = str(row.get("precision"))
    conc = _concurrency(row)
    gpus = plan.tp * plan.dp
    if backend == "sglang" and "deepseek" in model:
        if system == "b200_sxm":
            if precision == "fp8" and gpus <= 4:
                return EngineConfig(recv_interval_iters=10.0,
                                    max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS)
            return EngineConfig(recv_interval_iters=30.0 if conc >= 16 else 10.0,
                                max_num_batched_tokens=32768 if precision == "fp8" else 16384)
        if system == "h200_sxm":
            return EngineConfig(max_num_batched_tokens=32768)
    if backend == "trtllm":
        if "gpt-oss" in model:
            return EngineConfig(adp_timeout_iters=ADP_TIMEOUT_DEFAULT,
                                max_num_batched_tokens=20000)
        if "deepseek" in model:
            return EngineConfig(adp_timeout_iters=ADP_TIMEOUT_DEEPSEEK)
        isl, osl = _int(row.get("isl")), _int(row.get("osl"))
        if "llama-3.1-70b" in model and isl == 1024 and osl == 1024 and gpus < 8:
            return EngineConfig(batch_wait_timeout_iters=20.0,
                                batch_wait_tokens=0.9 * (isl + osl + 256))
    return EngineConfig()


def _workers(v) -> int | None:
    """A disaggregated worker count; blank / NaN (not recorded) is None (inferred later)."""
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(f) or f < 1 else int(round(f))


def _int(v, default=1) -> int:
    """Integer of a CSV cell; blank, NaN and 0 (unused degree) become `default`."""
    try:
        f = float(v)
    except (TypeError, ValueError):
        return default
    return default if math.isnan(f) or f == 0 else int(round(f))


class BadCell(ValueError):
    """A CSV cell the row cannot be scored with: its column and what it allows."""


def _whole_number(v: Any, info: ValidationInfo) -> int:
    """A positive whole number; a blank cell is the field's default where it has one (a plan
    degree not used: 1), else refused."""
    try:
        f = float(v)
    except (TypeError, ValueError):
        raise ValueError(f"must be a whole number >= 1, got {v!r}") from None
    if math.isnan(f) and info.field_name in _BLANK_IS_ONE:
        return 1
    if math.isnan(f) or f < 1 or f != round(f):
        raise ValueError(f"must be a whole number >= 1, got {v!r}")
    return int(f)


def _time(v: Any) -> float:
    try:
        f = float(v)
    except (TypeError, ValueError):
        f = float("nan")
    if not f > 0 or math.isinf(f):
        raise ValueError(f"must be a time in ms > 0, got {v!r}")
    return f


_BLANK_IS_ONE = ("tp_size", "pp_size", "attention_dp_size")
WholeNumber = Annotated[int, BeforeValidator(_whole_number)]
TimeMs = Annotated[float, BeforeValidator(_time)]
LenientDegree = Annotated[int, BeforeValidator(lambda v: _int(v))]  # MoE degrees: blank/0 are 1


class PlanCells(BaseModel):
    """A row's parallel plan: attention degrees blank where not used (1), never 0; the MoE
    degrees 0 or blank on dense models (1)."""

    model_config = ConfigDict(frozen=True)
    tp_size: WholeNumber
    pp_size: WholeNumber
    attention_dp_size: WholeNumber
    moe_tp_size: LenientDegree
    moe_ep_size: LenientDegree

    def plan(self) -> ParallelPlan:
        return ParallelPlan(tp=self.tp_size, pp=self.pp_size, dp=self.attention_dp_size,
                            moe_tp=self.moe_tp_size, ep=self.moe_ep_size)


class MeasuredCells(BaseModel):
    """The lengths and the measured times of a calibration-CSV row."""

    model_config = ConfigDict(frozen=True)
    isl: WholeNumber
    osl: WholeNumber
    silicon_ttft_ms: TimeMs
    silicon_tpot_ms: TimeMs


def _cells(model: type[BaseModel], row: dict, prefix: str = ""):
    """`model` read from the row's cells (column = prefix + field); a bad cell is one BadCell
    naming its column and what it allows."""
    try:
        return model.model_validate({k: row.get(f"{prefix}{k}") for k in model.model_fields})
    except ValidationError as err:
        first = err.errors()[0]
        why = str(first["msg"]).removeprefix("Value error, ")
        raise BadCell(f"{prefix}{first['loc'][0]}: {why}") from None


def _plan(row, prefix: str = "") -> ParallelPlan:
    return _cells(PlanCells, row, prefix).plan()


def _concurrency(row) -> int:
    m = re.search(r"silicon_concurrency=(\d+)", str(row.get("silicon_data_source", "")))
    if m:
        return int(m.group(1))
    if row.get("mode") == "disagg":
        return (_int(row.get("decode_batch_size")) * _int(row.get("decode_attention_dp_size"))
                * _int(row.get("decode_num_workers")))
    return _int(row.get("batch_size"))


def cases_from_csv(path: Path) -> list[Case]:
    need = {"model_path", "system", "backend", "mode", "isl", "osl", "silicon_ttft_ms",
            "silicon_tpot_ms"}
    try:
        df = pd.read_csv(path)
    except (pd.errors.EmptyDataError, pd.errors.ParserError, UnicodeDecodeError) as err:
        raise ServecastError(f"{path}: not a readable CSV ({type(err).__name__}); expected the "
                             f"calibration CSV format (e2e_measured.csv)") from None
    missing = need - set(df.columns)
    if missing:
        raise ServecastError(f"{path}: missing columns {', '.join(sorted(missing))}; expected the "
                             f"calibration CSV format (e2e_measured.csv)")
    if df.empty:
        raise ServecastError(f"{path}: no rows under the header; expected at least one measured "
                             f"configuration")
    out = []
    for i, row in enumerate(df.to_dict("records")):
        try:
            out.append(_case_from_row(i, row))
        except (BadCell, ServecastError) as err:  # scored as skipped, with the reason
            out.append(Case(str(row.get("id", i)), str(row.get("model_path")),
                            str(row.get("system")), str(row.get("backend")), str(row.get("mode")),
                            0, 0, 0, None, None, None, None, float("nan"), float("nan"),
                            unreadable=f"unreadable row: {err}"))
    return out


def _case_from_row(i: int, row: dict) -> Case:
    disagg = None
    plan = None
    if row["mode"] == "disagg":
        disagg = Disagg(_plan(row, "prefill_"), _plan(row, "decode_"),
                        _workers(row.get("prefill_num_workers")),
                        _workers(row.get("decode_num_workers")))
    else:
        plan = _plan(row)
    protocol = protocol_for_source(row.get("silicon_data_source"))
    cells = _cells(MeasuredCells, row)
    return Case(str(row.get("id", i)), str(row["model_path"]), str(row["system"]),
                str(row["backend"]), str(row["mode"]), cells.isl, cells.osl,
                _concurrency(row), QUANT.get(str(row.get("gemm_quant_mode"))),
                QUANT.get(str(row.get("moe_quant_mode"))), plan, disagg,
                cells.silicon_ttft_ms, cells.silicon_tpot_ms,
                protocol, engine_for_row(row, protocol, plan))


def cases_from_vllm_json(path: Path, overrides: dict | None = None) -> list[Case]:
    """One case from a `vllm bench serve --save-result` file (metadata keys give the deployment)."""
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ServecastError(f"{path}: not JSON ({err.msg} at line {err.lineno})") from None
    items = data if isinstance(data, list) else [data]
    out = []
    for i, d in enumerate(items):
        meta = {**d, **(overrides or {})}
        for key in ("mean_ttft_ms", "mean_tpot_ms", "completed", "total_input_tokens",
                    "total_output_tokens"):
            if key not in d:
                raise ServecastError(f"{path}: {key}: missing; expected `vllm bench serve "
                                     f"--save-result` JSON")
        done = max(int(d["completed"]), 1)
        conc = meta.get("max_concurrency") or meta.get("concurrency")
        ratio = meta.get("random_range_ratio")
        ratio = float(ratio) if ratio is not None and 0.0 < float(ratio) < 1.0 else 1.0
        protocol = Protocol(rounds=done / int(conc) if conc else None, range_ratio=ratio)
        # the file's averages are the sampler's means; the case keeps nominal lengths
        nominal = 2.0 / (1.0 + ratio)
        plan = ParallelPlan(tp=_int(meta.get("tp")), pp=_int(meta.get("pp")),
                            dp=_int(meta.get("dp")), ep=_int(meta.get("ep")),
                            moe_tp=_int(meta.get("moe_tp")), pcp=_int(meta.get("pcp")),
                            dcp=_int(meta.get("dcp")))
        out.append(Case(str(meta.get("id", f"{path.stem}[{i}]")),
                        str(meta.get("model_id") or meta.get("model") or ""),
                        str(meta.get("hardware") or ""), str(meta.get("backend_name", "vllm")),
                        "agg", int(round(d["total_input_tokens"] / done * nominal)),
                        int(round(d["total_output_tokens"] / done * nominal)),
                        int(conc) if conc else 0, QUANT.get(str(meta.get("precision"))),
                        QUANT.get(str(meta.get("moe_precision") or meta.get("precision"))),
                        plan, None, float(d["mean_ttft_ms"]), float(d["mean_tpot_ms"]),
                        protocol))
    return out


def load_cases(path: str | Path, overrides: dict | None = None) -> list[Case]:
    p = Path(path)
    if not p.exists():
        raise ServecastError(f"{p}: no such file")
    if p.suffix.lower() == ".json":
        return cases_from_vllm_json(p, overrides)
    if p.suffix.lower() == ".csv":
        return cases_from_csv(p)
    raise ServecastError(f"{p}: unknown format; allowed: .csv (calibration format), "
                         f".json (vllm bench serve --save-result)")


@lru_cache(maxsize=64)
def _arch(name: str):
    return load_architecture(name)


@lru_cache(maxsize=16)
def _hw(name: str):
    return load_hardware(name)


def _precision(arch, quant: str | None) -> str | None:
    """Keep the checkpoint's own formats when the run's rate class matches them."""
    if quant is None:
        return None
    if dtype(arch.weight_dtype).rate == dtype(quant).rate:
        return None
    return quant


SQUARE_MOE_GROUP_IS_N_GPUS = True  # see _normalize


def _normalize(arch, plan: ParallelPlan | None) -> ParallelPlan | None:
    """Make a recorded plan self-consistent: dense models drop MoE degrees; a MoE group larger
    than tp*dp means the attention ran data parallel over the rest (moe_tp*ep GPUs in all).

    Square MoE groups (documented reading of the records, `SQUARE_MOE_GROUP_IS_N_GPUS`): a
    record with moe_tp = moe_ep = N >= 4 and tp*dp = N*N (tp or attention_dp 16 / 64 with MoE
    4x4 / 8x8: 2 to 8 nodes for one 8-GPU-class model) describes an N-GPU deployment run with
    `--tp N --ep N` (the record multiplies the two MoE degrees into the attention degree); it
    is read as attention TP (or DP) N with experts EP N. Evidence (the 190 such aggregated
    rows, DeepSeek-R1/V3 and gpt-oss on B200/H200, under the fitted engine factors): read as N*N
    GPUs the predicted TPOT misses by a median 20-100% (0.42 on SGLang B200) while their
    N-GPU neighbours fit; read as N GPUs the median miss is 4-25%. N = 2 (tp 4, MoE 2x2) stays
    literal: 4 GPUs is plausible there and some of those runs cannot fit on 2."""
    if plan is None:
        return None
    if not is_moe(arch):
        return replace(plan, ep=1, moe_tp=plan.attention_gpus)
    n = plan.ep
    if (SQUARE_MOE_GROUP_IS_N_GPUS and n >= 4 and plan.moe_tp == n
            and plan.tp * plan.dp == n * n and plan.pcp == 1):
        return replace(plan, tp=n if plan.tp > 1 else 1, dp=n if plan.tp == 1 else 1,
                       moe_tp=1, ep=n)
    moe = plan.moe_tp * plan.ep
    if moe > plan.attention_gpus and moe % (plan.tp * plan.pcp) == 0:
        return replace(plan, dp=moe // (plan.tp * plan.pcp))
    return plan


QUANTIZED_KV = True  # assumption: quantized (fp8 / fp4) runs keep an fp8 KV cache


def kv_dtype_for(case: Case) -> str | None:
    """The records carry no KV dtype. Assumption: runs with 8/4-bit GEMMs use an fp8 KV cache
    (what the aiconfigurator-collected deployments of fp8/fp4 checkpoints typically enable);
    others the model's default (bf16)."""
    if QUANTIZED_KV and case.gemm_quant and dtype(case.gemm_quant).bits <= 8.5:
        return "fp8"
    return None


@lru_cache(maxsize=8192)
def case_components(case: Case) -> dict:
    """The run's physics (model.serve.estimate components) before engine factors, or {'skip': why}."""
    if case.unreadable:
        return {"skip": case.unreadable}
    if case.concurrency < 1:
        return {"skip": "no closed-loop concurrency (max_concurrency) recorded"}
    if not case.system:
        return {"skip": "hardware not recorded (pass --hardware or --metadata hardware=...)"}
    if case.backend not in BACKENDS:
        return {"skip": f"backend {case.backend!r} not modeled; allowed: {', '.join(BACKENDS)}"}
    try:
        arch = _arch(case.model)
        hw = _hw(case.system)
    except ServecastError as err:
        return {"skip": str(err)}
    kw = dict(precision=_precision(arch, case.gemm_quant),
              moe_precision=_precision(arch, case.moe_quant), backend=case.backend,
              cross_domain_tp=True, kv_dtype=kv_dtype_for(case))
    plan = _normalize(arch, case.plan)
    disagg = case.disagg
    if disagg is not None:
        disagg = replace(disagg, prefill_plan=_normalize(arch, disagg.prefill_plan),
                         decode_plan=_normalize(arch, disagg.decode_plan))
    try:
        isl, osl = case.protocol.mean_length(case.isl), case.protocol.mean_length(case.osl)
        out = estimate(arch, hw, plan or ParallelPlan(), isl, osl, case.concurrency,
                       disagg=disagg, protocol=case.protocol, engine=case.engine, **kw)
    except ServecastError as err:
        return {"skip": str(err)}
    if not out["feasible"]:
        return {"skip": f"model says infeasible: {out['reason']}"}
    return out["components"]



def deployment_kind(c: Case) -> str:
    """'aggregated', 'disagg recorded' (worker counts in the record) or 'disagg inferred' (worker
    counts inferred by model.serve.estimate): the three groups the errors are reported by."""
    if c.unreadable:
        return "unreadable"
    if c.disagg is None:
        return "aggregated"
    known = c.disagg.prefill_workers is not None and c.disagg.decode_workers is not None
    return "disagg recorded" if known else "disagg inferred"


def case_plan_label(c: Case) -> str:
    """The deployment as recorded: plan, or P<workers>x<plan>/D<workers>x<plan> (`?`: a worker
    count the record leaves out)."""
    if c.plan is not None:
        return c.plan.label()
    d = c.disagg
    if d is None:
        return "unreadable"
    w = lambda n: "?" if n is None else str(n)  # noqa: E731
    return (f"P{w(d.prefill_workers)}x{d.prefill_plan.label()}/"
            f"D{w(d.decode_workers)}x{d.decode_plan.label()}")

