"""`servecast estimate` and `servecast check`: the perf model from the command line."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from model.frontends.cli.output import emit
from model.specs.defaults import MAX_NUM_BATCHED_TOKENS
from model.specs.errors import ServecastError


def _plan(tp, pp, dp, ep, moe_tp, pcp, dcp, sp=False):
    from model.perf.parallel import ParallelPlan

    return ParallelPlan(tp=tp, pp=pp, dp=dp, ep=ep, moe_tp=moe_tp or 1, pcp=pcp, dcp=dcp, sp=sp)


def register(app: typer.Typer) -> None:
    @app.command("estimate")
    def estimate_cmd(
        arch: str = typer.Option(..., "--arch", help="architecture slug, HF id or config.json"),
        hardware: str = typer.Option(..., "--hardware", help="hardware name or YAML path"),
        isl: int = typer.Option(..., "--isl", help="input tokens per request"),
        osl: int = typer.Option(..., "--osl", help="output tokens per request"),
        concurrency: int = typer.Option(..., "--concurrency", help="concurrent clients (closed loop)"),
        precision: str = typer.Option(None, "--precision", help="GEMM weight format (fp8, nvfp4, ...)"),
        moe_precision: str = typer.Option(None, "--moe-precision", help="expert weight format"),
        kv_dtype: str = typer.Option(None, "--kv-dtype", help="KV cache format"),
        backend: str = typer.Option("vllm", "--backend", help="vllm | sglang | trtllm"),
        tp: int = typer.Option(1, "--tp"), pp: int = typer.Option(1, "--pp"),
        dp: int = typer.Option(1, "--dp"), ep: int = typer.Option(1, "--ep"),
        moe_tp: int = typer.Option(None, "--moe-tp", help="default: tp*dp*pcp/ep"),
        dcp: int = typer.Option(1, "--dcp"), pcp: int = typer.Option(1, "--pcp"),
        sp: bool = typer.Option(False, "--sp", help="sequence parallel norms (RS+AG for AR)"),
        prefix: int = typer.Option(0, "--prefix", help="prompt tokens already in the prefix cache"),
        prefill_tp: int = typer.Option(None, "--prefill-tp"),
        prefill_pp: int = typer.Option(1, "--prefill-pp"),
        prefill_dp: int = typer.Option(1, "--prefill-dp"),
        prefill_ep: int = typer.Option(1, "--prefill-ep"),
        prefill_moe_tp: int = typer.Option(None, "--prefill-moe-tp"),
        prefill_pcp: int = typer.Option(1, "--prefill-pcp"),
        decode_tp: int = typer.Option(None, "--decode-tp"),
        decode_pp: int = typer.Option(1, "--decode-pp"),
        decode_dp: int = typer.Option(1, "--decode-dp"),
        decode_ep: int = typer.Option(1, "--decode-ep"),
        decode_moe_tp: int = typer.Option(None, "--decode-moe-tp"),
        decode_dcp: int = typer.Option(1, "--decode-dcp"),
        prefill_workers: int = typer.Option(None, "--prefill-workers"),
        decode_workers: int = typer.Option(None, "--decode-workers"),
        max_num_batched_tokens: int = typer.Option(MAX_NUM_BATCHED_TOKENS, "--max-num-batched-tokens"),
        arrival: str = typer.Option("benchmark", "--arrival",
                                    help="benchmark (a burst first round, then the "
                                    "engine's scheduler decides; model.serve.closed_loop) | "
                                    "synchronized | staggered"),
        spec_tokens: int = typer.Option(0, "--spec-tokens",
                                        help="MTP / speculative tokens per decode step"),
        spec_acceptance: float = typer.Option(0.0, "--spec-acceptance",
                                              help="acceptance rate per speculative position"),
        breakdown: bool = typer.Option(False, "--breakdown", help="per-op table and bottleneck"),
        as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
    ):
        """Predict TTFT, TPOT and throughput of a deployment under closed-loop concurrency."""
        from model.serve.estimate import Disagg, estimate
        from model.specs.architecture import load_architecture
        from model.specs.hardware import load_hardware

        a = load_architecture(arch)
        hw = load_hardware(hardware)
        disagg = None
        wants_disagg = any(v is not None for v in (prefill_tp, decode_tp, prefill_workers,
                                                    decode_workers)) or any(
            v != 1 for v in (prefill_pp, prefill_dp, prefill_ep, prefill_pcp, decode_pp,
                             decode_dp, decode_ep, decode_dcp))
        if wants_disagg:
            disagg = Disagg(_plan(prefill_tp or 1, prefill_pp, prefill_dp, prefill_ep,
                                  prefill_moe_tp, prefill_pcp, 1),
                            _plan(decode_tp or 1, decode_pp, decode_dp, decode_ep, decode_moe_tp,
                                  1, decode_dcp),
                            prefill_workers or 1, decode_workers or 1)
            disagg = Disagg(_fill_moe(disagg.prefill_plan, prefill_moe_tp),
                            _fill_moe(disagg.decode_plan, decode_moe_tp),
                            disagg.prefill_workers, disagg.decode_workers)
        plan = _fill_moe(_plan(tp, pp, dp, ep, moe_tp, pcp, dcp, sp), moe_tp)
        out = estimate(a, hw, plan, isl, osl, concurrency, precision=precision,
                       prefix_tokens=prefix, disagg=disagg, kv_dtype=kv_dtype, backend=backend,
                       breakdown=breakdown, max_num_batched_tokens=max_num_batched_tokens,
                       moe_precision=moe_precision, arrival=arrival,
                       spec_tokens=spec_tokens, spec_acceptance=spec_acceptance)
        out.pop("components", None)
        emit(out, as_json)

    @app.command("check")
    def check_cmd(
        file: Annotated[Path, typer.Argument(help="calibration CSV or vllm bench serve JSON")],
        out: Annotated[Path | None, typer.Option("--out", help="per-row predictions CSV")] = None,
        hardware: str = typer.Option(None, "--hardware", help="for JSON runs: the hardware"),
        model: str = typer.Option(None, "--model", help="for JSON runs: override model_id"),
        tp: int = typer.Option(None, "--tp"), pp: int = typer.Option(None, "--pp"),
        dp: int = typer.Option(None, "--dp"), ep: int = typer.Option(None, "--ep"),
        concurrency: int = typer.Option(None, "--concurrency",
                                        help="for JSON runs without max_concurrency"),
        precision: str = typer.Option(None, "--precision"),
        show_skipped: int = typer.Option(50, "--show-skipped",
                                         help="list at most this many skipped rows (-1: all)"),
        as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
    ):
        """Predict every measured run in FILE and report the errors (fractions)."""
        from model.validate.check import check

        overrides = {k: v for k, v in (("hardware", hardware), ("model_id", model), ("tp", tp),
                     ("pp", pp), ("dp", dp), ("ep", ep), ("max_concurrency", concurrency),
                     ("precision", precision)) if v is not None}
        result = check(file, out, overrides)
        if show_skipped >= 0 and len(result["skipped"]) > show_skipped:
            result["skipped_total"] = len(result["skipped"])
            result["skipped"] = result["skipped"][:show_skipped]
        emit(result, as_json)


def _fill_moe(plan, moe_tp_given):
    """--moe-tp defaults to the GPUs of the stage not used by --ep."""
    from dataclasses import replace

    if moe_tp_given is None:
        g = plan.attention_gpus
        if g % plan.ep:
            raise ServecastError(f"--ep {plan.ep} does not divide tp*dp*pcp = {g}")
        return replace(plan, moe_tp=g // plan.ep)
    return plan
