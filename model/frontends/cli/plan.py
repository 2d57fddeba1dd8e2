"""`servecast plan`: the best deployment under a P90 interactivity SLO, its cost and launch lines."""

from __future__ import annotations

import typer

from model.frontends.cli.output import emit
from model.plan.planner import DEFAULT_API_MODEL, DEFAULT_SCENARIO, MODES


def register(app: typer.Typer) -> None:
    @app.command("plan")
    def plan_command(
        arch: str = typer.Option(DEFAULT_SCENARIO["arch"], "--arch", help="Architecture slug, "
                                 "HF id or config.json path."),
        hardware: str = typer.Option(DEFAULT_SCENARIO["hardware"], "--hardware",
                                     help="Chip / system name or alias."),
        gpus: int = typer.Option(DEFAULT_SCENARIO["gpus"], "--gpus", help="GPU budget."),
        workload: str = typer.Option(DEFAULT_SCENARIO["workload"], "--workload",
                                     help="Workload profile name or YAML path."),
        slo_p90_interactivity: float = typer.Option(
            DEFAULT_SCENARIO["slo_p90_interactivity"], "--slo-p90-interactivity",
            help="Minimum P90 interactivity, tokens/s per user."),
        slo_p90_ttft: float | None = typer.Option(
            None, "--slo-p90-ttft", help="Also require P90 TTFT at most this many seconds."),
        long_prefill_token_threshold: int | None = typer.Option(
            None, "--long-prefill-token-threshold",
            help="Fix vLLM's per-request prefill cap (0 = off); searched when omitted."),
        concurrency: str | None = typer.Option(
            None, "--concurrency", help="Fix the client sessions (closed-loop lanes), one number "
            "or a comma list such as 128,256; searched when omitted."),
        mode: str | None = typer.Option(None, "--mode", help="aggregated | disaggregated "
                                        "(both when omitted)."),
        prefill_hardware: str | None = typer.Option(None, "--prefill-hardware",
                                                    help="A different chip for prefill workers."),
        precision: str | None = typer.Option(None, "--precision", help="Serve the weights in "
                                             "this format (fp8, mxfp8, ...) or a part=format "
                                             "scheme such as experts=nvfp4,indexer_cache=fp8 "
                                             "(model.specs.precision); the family's recipe when "
                                             "omitted."),
        kv_dtype: str | None = typer.Option(None, "--kv-dtype", help="KV-cache dtype (e.g. fp8, "
                                            "bf16); the family's recipe when omitted."),
        cache_policy: str = typer.Option("lru", "--cache-policy",
                                         help="Prefix retention: lru | interval | second-hit."),
        cache_tiers: str = typer.Option("hbm,host", "--cache-tiers",
                                        help="KV tiers, fastest first, from hbm,host,nvme."),
        api_model: str = typer.Option(DEFAULT_API_MODEL, "--api-model",
                                      help="API whose prices give the API-equivalent cost."),
        cost_basis: str = typer.Option("owned", "--cost-basis",
                                       help="owned | rental_low | rental_high | owned_model"),
        pareto: bool = typer.Option(False, "--pareto", help="Include the Pareto front rows."),
        verify: bool = typer.Option(True, "--verify/--no-verify", help="Re-evaluate the best "
                                    "aggregated candidate with the serving model."),
        as_json: bool = typer.Option(False, "--json", help="Print one JSON object on stdout."),
    ) -> None:
        """Search parallelism, P/D ratio and concurrency; print the best deployment and its cost."""
        from model.plan.planner import plan
        from model.specs.errors import ServecastError

        if mode is not None and mode not in MODES:
            raise ServecastError(f"--mode {mode!r}: allowed {', '.join(MODES)}")
        result = plan(arch=arch, hardware=hardware, gpus=gpus, workload=workload,
                      slo_p90_interactivity=slo_p90_interactivity,
                      long_prefill_token_threshold=long_prefill_token_threshold,
                      modes=(mode,) if mode else MODES, prefill_hardware=prefill_hardware,
                      precision=precision, kv_dtype=kv_dtype, api_model=api_model,
                      cost_basis=cost_basis, cache_policy=cache_policy,
                      cache_tiers=tuple(t.strip() for t in cache_tiers.split(",") if t.strip()),
                      concurrency=_concurrencies(concurrency), verify=verify,
                      slo_p90_ttft_s=slo_p90_ttft)
        out = result.contract()
        if pareto:
            out["pareto"] = result.pareto.to_dict(orient="records")
        emit(out, as_json)


def _concurrencies(text: str | None) -> list[int] | None:
    """`--concurrency 256` or `--concurrency 128,256`: positive integers, else one error line."""
    from model.specs.errors import ServecastError

    if text is None:
        return None
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise ServecastError(f"--concurrency {text!r}: allowed positive integers, e.g. 256 or "
                             "128,256")
    return sorted({int(p) for p in parts})
