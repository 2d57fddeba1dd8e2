"""`servecast plan`: the best deployment under a P90 interactivity SLO, its cost and launch lines
(every number from the full tier; the screening tier's for the chosen deployment under
`screening`). `--deployment LABEL` restricts the plan to one deployment."""

from __future__ import annotations

import typer

from model.frontends.cli.limits import readable_workload, require_nvme, within_session_cap
from model.frontends.cli.output import emit_plain, positive
from model.frontends.cli.perf import DRAFT_ATTENTION_HELP, FRONTEND_HELP
from model.specs.defaults import (
    DEFAULT_API_MODEL,
    DEFAULT_SCENARIO,
    MAX_NUM_BATCHED_TOKENS,
    MODES,
)

PARETO_POINTS = 8  # full-tier points added along the screening's front with --pareto
# the search's work grows with the step budget: 131,072 tokens (16x vLLM's default) takes about
# 3x the default's time; a budget of 10**12 does not finish in minutes
PLAN_BUDGET_CAP = 131_072


def register(app: typer.Typer) -> None:
    @app.command("plan")
    def plan_command(
        arch: str = typer.Option(DEFAULT_SCENARIO["arch"], "--arch", help="Architecture slug, "
                                 "HF id or config.json path."),
        hardware: str = typer.Option(DEFAULT_SCENARIO["hardware"], "--hardware",
                                     help="Chip / system name or alias."),
        gpus: int | None = typer.Option(
            None, "--gpus", min=1, help=f"GPU budget (default {DEFAULT_SCENARIO['gpus']}; with "
            "--deployment, the deployment's own)."),
        workload: str = typer.Option(DEFAULT_SCENARIO["workload"], "--workload",
                                     help="Workload profile name or YAML path."),
        slo_p90_interactivity: float = typer.Option(
            DEFAULT_SCENARIO["slo_p90_interactivity"], "--slo-p90-interactivity", callback=positive,
            help="Minimum P90 interactivity, tokens/s per user."),
        slo_p90_ttft: float | None = typer.Option(
            None, "--slo-p90-ttft", callback=positive, help="Also require P90 TTFT at most this many seconds."),
        long_prefill_token_threshold: int | None = typer.Option(
            None, "--long-prefill-token-threshold", min=0,
            help="Fix vLLM's per-request prefill cap (0 = off); searched when omitted."),
        prefill_schedule_interval: int | None = typer.Option(
            None, "--prefill-schedule-interval", min=1,
            help="Fix vLLM's prefill cadence (1 = every step); searched when omitted."),
        max_num_batched_tokens: int = typer.Option(
            MAX_NUM_BATCHED_TOKENS, "--max-num-batched-tokens", min=1, max=PLAN_BUDGET_CAP,
            help="Token budget per engine step and DP rank."),
        concurrency: str | None = typer.Option(
            None, "--concurrency", help="Fix the client sessions (closed-loop lanes), one number "
            "or a comma list such as 128,256; searched when omitted."),
        deployment: str | None = typer.Option(
            None, "--deployment", help="Restrict the plan to this deployment: a replica plan "
            "(dp8-ep8, tp4; replicas from --gpus), Rx[plan] (2x[tp4]) or xP[plan]yD[plan] "
            "(1P[dp4-ep4]1D[dp8-ep8]); reports what `servecast serve --deployment` does."),
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
        pareto: bool = typer.Option(False, "--pareto", help="Include the full tier's Pareto "
                                    f"front ({PARETO_POINTS} more points along the screening's)."),
        cpu_offload_gb: float = typer.Option(
            0.0, "--cpu-offload-gb", min=0.0, help="Weights per GPU every engine keeps in host "
            "memory, in GiB as vLLM's flag counts them; read over the host link each step."),
        attention_backend: str = typer.Option(
            "default", "--attention-backend", help="default (the chip's own kernels) | triton "
            "(vLLM's TRITON_ATTN: a speculative verify step walks each context in one program)."),
        draft_attention_backend: str = typer.Option(
            "same", "--draft-attention-backend", help=DRAFT_ATTENTION_HELP),
        frontend: str = typer.Option(None, "--frontend", help=FRONTEND_HELP),
        allow_beyond_window: bool = typer.Option(
            False, "--allow-beyond-window", help="Serve workload requests past the model's "
            "context window (extrapolated, stated in the assumptions)."),
        as_json: bool = typer.Option(False, "--json", help="Print one JSON object on stdout."),
    ) -> None:
        """Search parallelism, P/D ratio and concurrency; print the best deployment and its cost."""
        args = {k: v for k, v in locals().items() if k != "as_json"}  # the options, first
        from model.frontends.answers import answered

        emit_plain(answered("plan", args, lambda: _plan_answer(**args)), as_json)


def _plan_answer(arch: str, hardware: str, gpus: int | None, workload: str,
                 slo_p90_interactivity: float, slo_p90_ttft: float | None,
                 long_prefill_token_threshold: int | None, prefill_schedule_interval: int | None,
                 max_num_batched_tokens: int, concurrency: str | None, deployment: str | None,
                 mode: str | None, prefill_hardware: str | None, precision: str | None,
                 kv_dtype: str | None, cache_policy: str, cache_tiers: str, api_model: str,
                 cost_basis: str, pareto: bool, cpu_offload_gb: float, attention_backend: str,
                 draft_attention_backend: str, frontend: str | None,
                 allow_beyond_window: bool) -> dict:
    """The plan's answer (its contract, and the Pareto front with `pareto`) for the command's
    options."""
    from model.perf.step_inputs import check_attention_flags
    from model.plan.planner import plan
    from model.specs.errors import ServecastError

    check_attention_flags(attention_backend, draft_attention_backend)
    if mode is not None and mode not in MODES:
        raise ServecastError(f"--mode {mode!r}: allowed {', '.join(MODES)}")
    if prefill_hardware is not None and mode == "aggregated":
        raise ServecastError(f"--prefill-hardware {prefill_hardware}: prefill workers exist "
                             "only in disaggregated deployments; allowed: --mode "
                             "disaggregated, or no --mode")
    if gpus is None and deployment is None:
        gpus = DEFAULT_SCENARIO["gpus"]
    tiers = tuple(t.strip() for t in cache_tiers.split(",") if t.strip())
    sessions = _concurrencies(concurrency)
    _check_before_search(hardware, prefill_hardware, cost_basis, tiers, sessions,
                         gpus or _deployment_gpus(deployment))
    result = plan(arch=arch, hardware=hardware, gpus=gpus, workload=readable_workload(workload),
                  slo_p90_interactivity=slo_p90_interactivity,
                  long_prefill_token_threshold=long_prefill_token_threshold,
                  modes=(mode,) if mode else MODES, prefill_hardware=prefill_hardware,
                  precision=precision, kv_dtype=kv_dtype, api_model=api_model,
                  cost_basis=cost_basis, cache_policy=cache_policy,
                  cache_tiers=tiers, concurrency=sessions, slo_p90_ttft_s=slo_p90_ttft,
                  deployment=deployment, prefill_schedule_interval=prefill_schedule_interval,
                  max_num_batched_tokens=max_num_batched_tokens,
                  pareto_points=PARETO_POINTS if pareto else 0,
                  allow_beyond_window=allow_beyond_window, cpu_offload_gib=float(cpu_offload_gb),
                  frontend=frontend, attention_backend=attention_backend,
                  draft_attention_backend=draft_attention_backend)
    out = result.contract()
    if pareto:
        out["pareto"] = result.pareto.to_dict(orient="records")
    return out


def _check_before_search(hardware: str, prefill_hardware: str | None, cost_basis: str,
                         tiers: tuple[str, ...], sessions: list[int] | None, gpus: int) -> None:
    """What the request needs, checked before the search rather than after it: sessions within
    the cap on the deployment's GPUs, a price on the cost basis for each chip, local NVMe for an
    nvme cache tier."""
    from model.plan.cost import gpu_hour_usd
    from model.specs.hardware import load_hardware

    if sessions:
        within_session_cap(max(sessions), gpus)
    for name in {hardware, prefill_hardware or hardware}:
        hw = load_hardware(name)
        gpu_hour_usd(hw, cost_basis)
        require_nvme(hw, tiers, "--cache-tiers")


def _deployment_gpus(label: str) -> int:
    from model.plan.deployment import parse_deployment_label

    return parse_deployment_label(label).resolve(None)[1]


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
