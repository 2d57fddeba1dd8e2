"""`servecast estimate` and `servecast check`: the benchmark-client model from the command line."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from model.frontends.cli.output import JSON, emit
from model.specs.defaults import MAX_NUM_BATCHED_TOKENS
from model.specs.errors import ServecastError

if TYPE_CHECKING:
    from model.perf.parallel import ParallelPlan

ARRIVAL_HELP = ("benchmark (a burst first round, then the engine's scheduler decides; "
                "model.serve.closed_loop) | synchronized | staggered")


def register(app: typer.Typer) -> None:
    app.command("estimate")(estimate_cmd)
    app.command("check")(check_cmd)


def _plan(tp, pp, dp, ep, moe_tp, pcp=1, dcp=1, sp=False, redundant_experts=0,
          attention_dp=False) -> ParallelPlan:
    """A plan from the command line; --moe-tp defaults to the GPUs of the stage not used by
    --ep. With `attention_dp` the degrees are written as SGLang and TensorRT-LLM write them:
    --tp counts every GPU of the stage and --dp of them run attention data-parallel
    (model.perf.parallel.attention_dp_plan)."""
    from model.perf.parallel import ParallelPlan, attention_dp_plan  # loads sympy: only on use

    if attention_dp:
        plan = attention_dp_plan(1 if tp is None else tp, dp, ep, pp, redundant_experts)
        return replace(plan, pcp=pcp, dcp=dcp, sp=sp,
                       moe_tp=plan.moe_tp if moe_tp is None else moe_tp)
    plan = ParallelPlan(tp=1 if tp is None else tp, pp=pp, dp=dp, ep=ep, moe_tp=moe_tp or 1,
                        pcp=pcp, dcp=dcp, sp=sp, redundant_experts=redundant_experts)
    if moe_tp is not None:
        return plan
    gpus = plan.attention_gpus
    if gpus % plan.ep:
        raise ServecastError(f"--ep {plan.ep} does not divide tp*dp*pcp = {gpus}")
    return replace(plan, moe_tp=gpus // plan.ep)


ATTENTION_DP_HELP = ("--tp counts every GPU and --dp of them run attention data-parallel "
                     "(SGLang --enable-dp-attention; TensorRT-LLM enable_attention_dp: --dp "
                     "defaults to --tp)")
REDUNDANT_HELP = "redundant experts (EPLB): experts + N must divide by --ep"
FRONTEND_HELP = ("the request front end: python (vLLM's OpenAI server, which also renders the chat "
                 "template), rust or dynamo; default: its tokenization alone")
DRAFT_ATTENTION_HELP = ("the speculative drafter's attention kernels: same (as --attention-backend, "
                        "vLLM's default), default or triton")



def estimate_cmd(
    arch: str = typer.Option(..., "--arch", help="architecture slug, HF id or config.json"),
    hardware: str = typer.Option(..., "--hardware", help="hardware name or YAML path"),
    isl: int = typer.Option(..., "--isl", min=1, help="input tokens per request"),
    osl: int = typer.Option(..., "--osl", min=1, help="output tokens per request"),
    concurrency: int = typer.Option(..., "--concurrency", min=1, help="concurrent clients (closed loop)"),
    precision: str = typer.Option(None, "--precision", help="GEMM weight format (fp8, nvfp4, ...)"),
    moe_precision: str = typer.Option(None, "--moe-precision", help="expert weight format"),
    kv_dtype: str = typer.Option(None, "--kv-dtype", help="KV cache format"),
    backend: str = typer.Option("vllm", "--backend", help="vllm | sglang | trtllm"),
    tp: int = 1, pp: int = 1, dp: int = 1, ep: int = 1, dcp: int = 1, pcp: int = 1,
    moe_tp: int = typer.Option(None, "--moe-tp", min=1, help="default: tp*dp*pcp/ep"),
    sp: bool = typer.Option(False, "--sp", help="sequence parallel norms (RS+AG for AR)"),
    attention_dp: bool = typer.Option(False, "--attention-dp", help=ATTENTION_DP_HELP),
    redundant_experts: int = typer.Option(0, "--redundant-experts", min=0, help=REDUNDANT_HELP),
    prefix: int = typer.Option(0, "--prefix", min=0, help="prompt tokens already in the prefix cache"),
    prefill_tp: int | None = None, prefill_pp: int = 1, prefill_dp: int = 1, prefill_ep: int = 1,
    prefill_moe_tp: int | None = typer.Option(None, "--prefill-moe-tp", min=1),
    prefill_pcp: int = 1,
    prefill_attention_dp: bool = typer.Option(False, "--prefill-attention-dp",
                                              help=ATTENTION_DP_HELP),
    prefill_redundant_experts: int = typer.Option(0, "--prefill-redundant-experts", min=0),
    prefill_workers: int | None = typer.Option(None, "--prefill-workers", min=1),
    decode_tp: int | None = None, decode_pp: int = 1, decode_dp: int = 1, decode_ep: int = 1,
    decode_moe_tp: int | None = typer.Option(None, "--decode-moe-tp", min=1),
    decode_dcp: int = 1,
    decode_workers: int | None = typer.Option(None, "--decode-workers", min=1),
    decode_redundant_experts: int = typer.Option(0, "--decode-redundant-experts", min=0),
    decode_attention_dp: bool = typer.Option(False, "--decode-attention-dp",
                                             help=ATTENTION_DP_HELP),
    max_num_batched_tokens: int = typer.Option(MAX_NUM_BATCHED_TOKENS, "--max-num-batched-tokens",
                                               min=1),
    arrival: str = typer.Option("benchmark", "--arrival", help=ARRIVAL_HELP),
    spec_tokens: int = typer.Option(0, "--spec-tokens",
                                    help="MTP / speculative tokens per decode step"),
    spec_acceptance: float = typer.Option(0.0, "--spec-acceptance",
                                          help="acceptance rate per speculative position"),
    cpu_offload_gb: float = typer.Option(
        0.0, "--cpu-offload-gb", min=0.0, help="weights per GPU kept in host memory, in GiB as "
        "vLLM's flag counts them; read over the host link each step"),
    attention_backend: str = typer.Option(
        "default", "--attention-backend", help="default (the chip's own kernels) | triton "
        "(vLLM's TRITON_ATTN: a speculative verify step walks each context in one program)"),
    draft_attention_backend: str = typer.Option(
        "same", "--draft-attention-backend", help=DRAFT_ATTENTION_HELP),
    breakdown: bool = typer.Option(False, "--breakdown", help="per-op table and bottleneck"),
    allow_beyond_window: bool = typer.Option(
        False, "--allow-beyond-window", help="extrapolate past the model's context window "
        "(isl + osl > max_position_embeddings) and say so in the output"),
    as_json: bool = JSON,
) -> None:
    """Predict TTFT, TPOT and throughput of a deployment under closed-loop concurrency
    (disaggregated when any --prefill-* / --decode-* option is given)."""
    from model.perf.parallel import check_redundant_experts
    from model.serve.estimate import Disagg, estimate  # the model loads only when a command runs
    from model.specs.architecture import load_architecture, within_window
    from model.specs.hardware import load_hardware

    model = load_architecture(arch)
    disagg = None
    if any(v is not None for v in (prefill_tp, decode_tp, prefill_workers, decode_workers)) or any(
            v != 1 for v in (prefill_pp, prefill_dp, prefill_ep, prefill_pcp, decode_pp,
                             decode_dp, decode_ep, decode_dcp)):
        disagg = Disagg(_plan(prefill_tp, prefill_pp, prefill_dp, prefill_ep, prefill_moe_tp,
                              pcp=prefill_pcp, redundant_experts=prefill_redundant_experts,
                              attention_dp=prefill_attention_dp),
                        _plan(decode_tp, decode_pp, decode_dp, decode_ep, decode_moe_tp,
                              dcp=decode_dcp, redundant_experts=decode_redundant_experts,
                              attention_dp=decode_attention_dp),
                        prefill_workers or 1, decode_workers or 1)
        check_redundant_experts(model, disagg.prefill_plan, "--prefill-redundant-experts")
        check_redundant_experts(model, disagg.decode_plan, "--decode-redundant-experts")
    plan = _plan(tp, pp, dp, ep, moe_tp, pcp, dcp, sp, redundant_experts, attention_dp)
    check_redundant_experts(model, plan)
    beyond = within_window(model, isl + osl, "--isl + --osl", allow_beyond_window)
    out = estimate(model, load_hardware(hardware), plan, isl, osl, concurrency,
                   precision=precision, prefix_tokens=prefix, disagg=disagg, kv_dtype=kv_dtype,
                   backend=backend, breakdown=breakdown,
                   max_num_batched_tokens=max_num_batched_tokens, moe_precision=moe_precision,
                   arrival=arrival, spec_tokens=spec_tokens, spec_acceptance=spec_acceptance,
                   cpu_offload_gib=float(cpu_offload_gb), attention_backend=attention_backend,
                   draft_attention_backend=draft_attention_backend)
    out.pop("components", None)
    if beyond:
        out["assumptions"] = [beyond]
    emit(out, as_json)


def check_cmd(
    file: Annotated[Path, typer.Argument(help="calibration CSV or vllm bench serve JSON")],
    out: Annotated[Path | None, typer.Option("--out", help="per-row predictions CSV")] = None,
    hardware: str = typer.Option(None, "--hardware", help="for JSON runs: the hardware"),
    model: str = typer.Option(None, "--model", help="for JSON runs: override model_id"),
    tp: int | None = typer.Option(None, "--tp", min=1, help="for JSON runs"),
    pp: int | None = typer.Option(None, "--pp", min=1, help="for JSON runs"),
    dp: int | None = typer.Option(None, "--dp", min=1, help="for JSON runs"),
    ep: int | None = typer.Option(None, "--ep", min=1, help="for JSON runs"),
    concurrency: int = typer.Option(None, "--concurrency", min=1,
                                    help="for JSON runs without max_concurrency"),
    precision: str = typer.Option(None, "--precision"),
    show_skipped: int = typer.Option(50, "--show-skipped", min=-1,
                                     help="list at most this many skipped rows (-1: all)"),
    as_json: bool = JSON,
) -> None:
    """Predict every measured run in FILE and report the errors (fractions)."""
    from model.validate.check import check  # the model loads only when a command runs

    overrides = {k: v for k, v in (("hardware", hardware), ("model_id", model), ("tp", tp),
                 ("pp", pp), ("dp", dp), ("ep", ep), ("max_concurrency", concurrency),
                 ("precision", precision)) if v is not None}
    result = check(file, out, overrides)
    if show_skipped >= 0 and len(result["skipped"]) > show_skipped:
        result["skipped_total"] = len(result["skipped"])
        result["skipped"] = result["skipped"][:show_skipped]
    emit(result, as_json)
