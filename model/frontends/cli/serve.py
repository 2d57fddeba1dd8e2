"""`servecast workload list|show`, `servecast serve`, `servecast simulate`: workload profiles and
the serving model (closed form and its discrete-event oracle) from the command line."""

from __future__ import annotations

from dataclasses import replace

import typer

from model.frontends.cli.limits import readable_workload, require_nvme, within_session_cap
from model.frontends.cli.output import emit, emit_plain, positive
from model.frontends.cli.perf import (
    ATTENTION_DP_HELP,
    DRAFT_ATTENTION_HELP,
    FRONTEND_HELP,
    REDUNDANT_HELP,
)
from model.specs.defaults import (
    MAX_NUM_BATCHED_TOKENS,
    MAX_NUM_SEQS,
    TURN_GAP_CAP_S,
)
from model.specs.errors import ServecastError

# `workload show` draws this many sessions at most: 100,000 take about 4 s and 0.6 GB
WORKLOAD_SESSIONS_CAP = 100_000
workload_app = typer.Typer(no_args_is_help=True, rich_markup_mode=None,
                           help="Workload profiles (data/workloads/).")


@workload_app.command("list")
def workload_list(as_json: bool = typer.Option(False, "--json", help="print one JSON object")):
    """Names of the workload profiles."""
    from model.specs.workload import list_workloads

    emit({"workloads": list_workloads()}, as_json)


@workload_app.command("show")
def workload_show(
    name: str = typer.Argument(..., help="profile name or path to a .yaml profile"),
    sessions: int = typer.Option(2000, "--sessions", min=1, max=WORKLOAD_SESSIONS_CAP,
                                 help="sessions drawn for the statistics"),
    seed: int = typer.Option(0, "--seed", min=0),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
):
    """The validated profile, the statistics of sessions drawn from it and the published checks."""
    from model.fit.workload import sample_statistics
    from model.specs.workload import load_workload

    w = load_workload(readable_workload(name))
    out = {"name": w.name, "kind": w.kind, "description": w.description, "source": w.source,
           "date": w.date, "hit_rate": w.hit_rate}
    mix = w.request_mix(20_000, seed)
    out["request_mix"] = {
        "mean_context_tokens": float(mix.context_tokens.mean()),
        "median_context_tokens": float(_median(mix.context_tokens)),
        "mean_uncached_tokens": float(mix.uncached_tokens.mean()),
        "mean_output_tokens": float(mix.output_tokens.mean()),
        "hit_rate": mix.hit_rate}
    if w.kind == "sessions":
        out["sample_statistics"] = sample_statistics(w, sessions, seed)
    out["checks"] = dict(w.checks)
    out["profile"] = w.model_dump()
    emit(out, as_json)


def _median(a):
    import numpy as np

    return np.median(a)


def _load(concurrency, rate, cv, gap_cap_s, workload):
    from model.specs.workload import ClosedLoop, OpenLoop

    if (concurrency is None) == (rate is None):
        raise ServecastError("serve: give exactly one of --concurrency (closed loop) or "
                             "--rate (open loop, requests/s)")
    if concurrency is not None:
        return ClosedLoop(concurrency, gap_cap_s)
    if rate <= 0:
        raise ServecastError(f"serve: --rate: must be > 0, got {rate}")
    return OpenLoop(rate, cv if cv is not None else (
        workload.arrivals.interarrival_cv if workload.arrivals else 1.0))


def register(app: typer.Typer) -> None:
    app.add_typer(workload_app, name="workload")

    @app.command("serve")
    def serve_cmd(
        arch: str = typer.Option(..., "--arch", help="architecture slug, HF id or config.json"),
        hardware: str = typer.Option(..., "--hardware", help="hardware name or YAML path"),
        workload: str = typer.Option("agentx", "--workload", help="workload profile"),
        concurrency: int = typer.Option(None, "--concurrency", min=1, help="sessions (closed loop)"),
        rate: float = typer.Option(None, "--rate", help="requests/s (open loop)"),
        interarrival_cv: float = typer.Option(None, "--interarrival-cv",
                                              help="open loop burstiness (default: profile/1)"),
        gap_cap_s: float = typer.Option(TURN_GAP_CAP_S, "--gap-cap-s", help="cap on tool/think gaps"),
        hit_rate: float = typer.Option(None, "--hit-rate", min=0.0, max=1.0, help="prefix-cache hit (default: "
                                       "model.serve.cache_model for this replica's tiers)"),
        cache_policy: str = typer.Option("lru", "--cache-policy",
                                         help="lru | interval | second-hit"),
        cache_tiers: str = typer.Option("hbm,host", "--cache-tiers",
                                        help="comma list from hbm,host,nvme,remote"),
        prefetch_reload: bool = typer.Option(False, "--prefetch-reload", help="copy lower-tier "
                                             "hits up during the tool/think gap"),
        infinite_cache: bool = typer.Option(False, "--infinite-cache",
                                            help="use the profile's infinite-cache hit"),
        long_prefill_token_threshold: int = typer.Option(0, "--long-prefill-token-threshold", min=0,
                                                         help="0 = off (vLLM)"),
        max_num_batched_tokens: int = typer.Option(MAX_NUM_BATCHED_TOKENS, "--max-num-batched-tokens",
                                                min=1),
        max_num_seqs: int = typer.Option(MAX_NUM_SEQS, "--max-num-seqs", min=1),
        prefill_schedule_interval: int = typer.Option(1, "--prefill-schedule-interval", min=1),
        cpu_offload_gb: float = typer.Option(
            0.0, "--cpu-offload-gb", min=0.0, help="weights per GPU, in GiB as vLLM's flag counts "
            "them, kept in host memory and read over the host link every step"),
        attention_backend: str = typer.Option(
            "default", "--attention-backend", help="default (the chip's own kernels) | triton "
            "(vLLM's TRITON_ATTN: a speculative verify step walks each context in one program)"),
        draft_attention_backend: str = typer.Option(
            "same", "--draft-attention-backend", help=DRAFT_ATTENTION_HELP),
        frontend: str = typer.Option(None, "--frontend", help=FRONTEND_HELP),
        slo_p90_interactivity: float = typer.Option(
            None, "--slo-p90-interactivity", callback=positive,
            help="also say whether P90 interactivity (tok/s per user) reaches this"),
        precision: str = typer.Option(None, "--precision"),
        kv_dtype: str = typer.Option(None, "--kv-dtype"),
        tp: int = typer.Option(1, "--tp"), pp: int = typer.Option(1, "--pp"),
        dp: int = typer.Option(1, "--dp"), ep: int = typer.Option(1, "--ep"),
        moe_tp: int = typer.Option(None, "--moe-tp", min=1),
        dcp: int = typer.Option(1, "--dcp"), pcp: int = typer.Option(1, "--pcp"),
        attention_dp: bool = typer.Option(False, "--attention-dp", help=ATTENTION_DP_HELP),
        redundant_experts: int = typer.Option(0, "--redundant-experts", min=0,
                                              help=REDUNDANT_HELP),
        spec_tokens: int = typer.Option(0, "--spec-tokens", min=0, help="MTP draft tokens per step"),
        spec_acceptance: float = typer.Option(0.0, "--spec-acceptance", min=0.0, max=1.0,
                                              help="per-position draft acceptance rate"),
        deployment: str = typer.Option(
            None, "--deployment", help="a whole deployment instead of one replica of the "
            "--tp/--dp/... plan: a replica plan (dp8-ep8, tp4; replicas from --gpus), "
            "Rx[plan] (2x[tp4]) or xP[plan]yD[plan] (1P[dp4-ep4]1D[dp8-ep8]); load, cache and "
            "engine flags apply to it as a whole"),
        gpus: int = typer.Option(None, "--gpus", min=1, help="with --deployment: GPUs of the whole "
                                 "deployment (replicas of a bare plan follow it)"),
        prefill_hardware: str = typer.Option(None, "--prefill-hardware", help="with "
                                             "--deployment: the prefill workers' chip"),
        recipe: bool = typer.Option(True, "--recipe/--no-recipe", help="fill the precision, KV "
                                    "dtype and speculative decoding left unset from the "
                                    "family's recipe (data/deployments/), as plan does"),
        simulate_s: float = typer.Option(0.0, "--simulate-s", min=0.0, help="also run the discrete-event "
                                         "oracle for this many simulated seconds"),
        seed: int = typer.Option(0, "--seed", min=0),
        allow_beyond_window: bool = typer.Option(
            False, "--allow-beyond-window", help="serve workload requests past the model's "
            "context window (extrapolated, stated in the output's assumptions)"),
        as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
    ):
        """The full tier of one replica of the --tp/--dp/... plan or, with --deployment, of a whole
        deployment (what `plan --deployment` reports): TTFT/TPOT percentiles, interactivity,
        TPGS."""
        args = {k: v for k, v in locals().items() if k != "as_json"}  # the options, first
        from model.frontends.answers import answered

        emit_plain(answered("serve", args, lambda: _serve_answer(**args)), as_json)


def _serve_answer(arch: str, hardware: str, workload: str, concurrency: int | None,
                  rate: float | None, interarrival_cv: float | None, gap_cap_s: float,
                  hit_rate: float | None, cache_policy: str, cache_tiers: str,
                  prefetch_reload: bool, infinite_cache: bool, long_prefill_token_threshold: int,
                  max_num_batched_tokens: int, max_num_seqs: int, prefill_schedule_interval: int,
                  cpu_offload_gb: float, attention_backend: str,
                  draft_attention_backend: str, frontend: str | None,
                  slo_p90_interactivity: float | None, precision: str | None,
                  kv_dtype: str | None, tp: int, pp: int, dp: int, ep: int, moe_tp: int | None,
                  dcp: int, pcp: int, attention_dp: bool, redundant_experts: int,
                  spec_tokens: int, spec_acceptance: float, deployment: str | None,
                  gpus: int | None, prefill_hardware: str | None, recipe: bool,
                  simulate_s: float, seed: int, allow_beyond_window: bool) -> dict:
    """The serve command's answer for its options."""
    from model.perf.step_inputs import check_attention_flags
    from model.serve.policy import EnginePolicy
    from model.specs.workload import load_workload

    check_attention_flags(attention_backend, draft_attention_backend)
    w = load_workload(readable_workload(workload))
    policy = EnginePolicy(max_num_batched_tokens, max_num_seqs, long_prefill_token_threshold,
                          prefill_schedule_interval, cpu_offload_gib=float(cpu_offload_gb),
                          attention_backend=attention_backend,
                          draft_attention_backend=draft_attention_backend)
    load = _load(concurrency, rate, interarrival_cv, gap_cap_s, w)
    tiers = tuple(t.strip() for t in cache_tiers.split(",") if t.strip())
    cache = {"hit_rate": hit_rate, "infinite": infinite_cache, "policy": cache_policy,
             "tiers": tiers, "prefetch": prefetch_reload}
    if deployment is None:  # one replica of the flags' plan
        deployment = _replica_label(arch, (tp, pp, dp, ep, moe_tp, pcp, dcp), attention_dp,
                                    redundant_experts)
    out, setup, dep = _serve_deployment(
        arch, hardware, w, deployment, gpus, prefill_hardware, policy, load, cache,
        (precision, kv_dtype, spec_tokens, spec_acceptance, recipe), seed,
        allow_beyond_window, frontend)
    if slo_p90_interactivity is not None:
        p90 = out["p90_interactivity_tok_s"]
        out["meets_slo"] = p90 is not None and p90 >= slo_p90_interactivity
    if simulate_s > 0:
        out["simulated"] = _simulated(setup, dep, w, policy, load, simulate_s, seed,
                                      out.get("hit_rate"), cache)
    return out


def _replica_label(arch: str, degrees: tuple, attention_dp: bool, redundant_experts: int
                   ) -> str:
    """`1x[plan]` of the --tp/--pp/--dp/--ep/--moe-tp/--pcp/--dcp flags (with --attention-dp:
    written as SGLang and TensorRT-LLM write it), its redundant experts checked."""
    from model.perf.parallel import (  # the model loads only when it runs
        ParallelPlan,
        attention_dp_plan,
        check_redundant_experts,
    )
    from model.specs.architecture import load_architecture

    tp, pp, dp, ep, moe_tp, pcp, dcp = degrees
    if attention_dp:
        plan = replace(attention_dp_plan(tp, dp, ep, pp, redundant_experts), pcp=pcp, dcp=dcp)
    else:
        plan = ParallelPlan(tp=tp, pp=pp, dp=dp, ep=ep, moe_tp=moe_tp or 1, pcp=pcp, dcp=dcp,
                            redundant_experts=redundant_experts)
    check_redundant_experts(load_architecture(arch), plan)
    return f"1x[{plan.label()}]"


def _simulated(setup, dep, w, policy, load, duration_s: float, seed: int, hit_rate,
               cache: dict) -> dict:
    """The discrete-event simulator on one replica of the deployment, with the step model, front
    end and hit rate the full tier used."""
    from model.plan.evaluate import worker_step_model
    from model.serve.policy import frontend_rate_s_per_token
    from model.serve.simulate import simulate

    policy = replace(policy, frontend_s_per_prompt_token=frontend_rate_s_per_token(dep.frontend))
    if dep.mode != "aggregated" or dep.replica.instances != 1:
        raise ServecastError("serve: --simulate-s: the simulator runs one replica; give no "
                             "--deployment, or one replica (1x[plan])")
    step = worker_step_model(setup, setup.hardware, dep.replica, True, policy)
    hit = cache["hit_rate"] if cache["hit_rate"] is not None else (
        None if cache["infinite"] else hit_rate)
    return simulate(step, w, policy, load, duration_s=duration_s, seed=seed, hit_rate=hit,
                    dp_ranks=step.plan.dp).summary()


def _serve_deployment(arch, hardware, w, label: str, gpus, prefill_hardware, policy, load,
                      cache: dict, serving: tuple, seed: int, allow_beyond_window: bool,
                      frontend: str | None = None) -> dict:
    """A whole deployment through the full tier, as `plan --deployment` evaluates it
    (model.plan.evaluate.evaluate_deployment)."""
    from model.plan.deployment import parse_deployment_label
    from model.plan.evaluate import evaluate_deployment, labelled_deployment
    from model.plan.inputs import ServingChoices, setup_for, workload_within_window
    from model.specs.workload import ClosedLoop

    precision, kv_dtype, spec_tokens, spec_acceptance, recipe = serving
    shape, total_gpus = parse_deployment_label(label).resolve(gpus)
    if prefill_hardware is not None and shape.mode != "disaggregated":
        raise ServecastError(f"--prefill-hardware {prefill_hardware}: prefill workers exist only "
                             f"in a disaggregated --deployment (xP[plan]yD[plan]); allowed: "
                             f"leave it out for {label}")
    if isinstance(load, ClosedLoop):
        within_session_cap(load.concurrency, total_gpus)
    spec = {}
    if spec_tokens:  # a per-position acceptance rate a gives 1 + a + ... + a^k tokens a step
        spec = {"spec_tokens": spec_tokens, "spec_method": "mtp",
                "acceptance_length": 1.0 + sum(spec_acceptance**i
                                               for i in range(1, spec_tokens + 1))}
    choices = ServingChoices(precision, kv_dtype, recipe=recipe, cache_policy=cache["policy"],
                             cache_tiers=cache["tiers"], finite_cache=not cache["infinite"],
                             hit_rate=cache["hit_rate"], prefetch_reload=cache["prefetch"],
                             allow_beyond_window=allow_beyond_window, **spec)
    setup = setup_for(arch, hardware, w, choices, prefill_hardware, seed)
    for chip in {setup.hardware, setup.prefill_hardware}:
        require_nvme(chip, cache["tiers"], "--cache-tiers")
    concurrency = load.concurrency if isinstance(load, ClosedLoop) else 0
    dep = labelled_deployment(shape, setup, concurrency, policy, frontend)
    served = evaluate_deployment(setup, dep, load)
    r = served.result
    out = {"arch": arch, "hardware": hardware, "workload": w.name, "gpus": dep.gpus,
           "plan": dep.shape_label(), "deployment": dep.as_dict(), **served.as_dict(),
           "p90_interactivity_tok_s": r.interactivity_tok_s["p90"],
           "p90_ttft_s": r.ttft_s["p90"]}
    beyond = workload_within_window(setup.arch, w, allow_beyond_window)
    if beyond:
        out["assumptions"] = [*out.get("assumptions", []), beyond]
    return out, setup, dep
