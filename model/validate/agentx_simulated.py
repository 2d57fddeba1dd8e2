"""The simulator scored on the measured InferenceX AgentX runs, beside the closed form.

`python -m model.validate.agentx_simulated` runs model.serve.simulate on every aggregated run
that model.validate.agentx predicts: the same replica step model, engine policy (with the API
server in front), traffic (agentx-v1 sessions) and prefix-cache hit rate as the full tier, each
lane sticky to its DP rank. It stores the simulated TPGS, P90 interactivity and P90 TTFT in
data/benchmarks/inferencex_agentx_simulated.csv (about an hour on one core); `servecast validate
inferencex-agentx-simulator` scores the stored results like any measured set.

What the simulator leaves out: the reload time of prefixes from lower KV tiers (it takes the
full tier's hit rate, as an infinite cache would serve it), and disaggregated deployments (it
runs one aggregated replica). A run simulates long enough for about REQUESTS requests at the
closed form's request rate, within [MIN_S, MAX_S] simulated seconds, the first 20% as warm-up.
"""

from __future__ import annotations

import sys
from dataclasses import replace

import numpy as np
import pandas as pd

from model import ROOT
from model.perf.microbatch import pipeline_lanes
from model.plan.deployment import parse_deployment_label
from model.plan.evaluate import evaluate_deployment, labelled_deployment, worker_step_model
from model.plan.inputs import ServingChoices, setup_for
from model.serve.policy import frontend_rate_s_per_token
from model.serve.simulate import simulate
from model.specs.hardware import load_hardware
from model.specs.workload import ClosedLoop, load_workload
from model.validate import agentx
from model.validate.parallel import ordered_map
from model.validate.scoreboard import concurrency_band, run_record, run_slice

SIMULATED = ROOT / "data" / "benchmarks" / "inferencex_agentx_simulated.csv"
REQUESTS, MIN_S, MAX_S = 1500, 1200.0, 30000.0
SEED = 0
NOT_AGGREGATED = "the simulator runs one aggregated replica"
NOT_PREDICTED = "the closed form has no prediction for this run"


def _setup(g: dict, concurrency: int):
    """(serving setup, deployment, engine policy with the front end) of group `g`'s run at
    `concurrency` sessions, as model.validate.agentx.predict_group builds them."""
    arch, chip = agentx.ARCHES[g["model"]], agentx.CHIPS[g["hardware"]]
    tokens, al, method = agentx._spec_by_concurrency(g, arch, load_hardware(chip))[concurrency]
    setup = setup_for(arch, chip, agentx.WORKLOAD, ServingChoices(
        precision=g.get("precision"), kv_dtype=g.get("kv_dtype"), spec_tokens=tokens,
        acceptance_length=al or None, spec_method=method))
    shape, _ = parse_deployment_label(agentx.deployment_label(g)).resolve(
        int(g.get("deployed_gpus", g["gpus"])))
    policy = agentx._policy(g, concurrency)
    deployment = labelled_deployment(shape, setup, concurrency, policy, g.get("frontend"))
    return setup, deployment, replace(policy, frontend_s_per_prompt_token=(
        frontend_rate_s_per_token(deployment.frontend)))


def simulate_run(g: dict, concurrency: int, seed: int = SEED) -> dict:
    """The simulated metrics of group `g` at `concurrency` sessions: {"tpgs", "p90_interactivity",
    "p90_ttft", "duration_s", "completed"}, or {"skip_reason": why}."""
    if g["mode"] != "aggregated":
        return {"skip_reason": NOT_AGGREGATED}
    try:
        setup, deployment, policy = _setup(g, concurrency)
        full = evaluate_deployment(setup, deployment, e2e=False).result
    except Exception as err:  # one run's failure must not sink the table; it is reported
        return {"skip_reason": f"{type(err).__name__}: {err}"}
    if not full.stable:
        return {"skip_reason": NOT_PREDICTED}
    step_model = worker_step_model(setup, setup.hardware, deployment.replica, True, policy)
    lanes_model, lanes = pipeline_lanes(step_model)
    duration = float(np.clip(REQUESTS / max(full.requests_per_s, 1e-9), MIN_S, MAX_S))
    sim = simulate(lanes_model, load_workload(agentx.WORKLOAD), policy, ClosedLoop(concurrency),
                   duration_s=duration, seed=seed, hit_rate=full.hit_rate, dp_ranks=lanes)
    s = sim.summary()
    # the export's TPGS divides by its own GPU count (model.validate.agentx.predict_group)
    tpgs = s["tpgs"] * sim.gpus / int(g["gpus"])
    return {"tpgs": tpgs, "p90_interactivity": s["interactivity_tok_s"]["p90"],
            "p90_ttft": s["ttft_s"]["p90"], "duration_s": duration, "completed": s["completed"]}


def simulate_all(runs: pd.DataFrame | None = None, groups: list[dict] | None = None,
                 progress: bool = False, workers: int | None = None) -> pd.DataFrame:
    """One row per run a group maps: its id and the simulated metrics (or the skip reason); the
    runs go to `workers` processes (default one per CPU)."""
    runs = agentx.load_runs() if runs is None else runs
    groups = agentx.load_groups() if groups is None else groups
    todo = [(g, int(run.id), int(run.conc), progress) for g in groups
            for run in agentx._group_runs(runs, g).sort_values("conc").itertuples()]
    return pd.DataFrame(ordered_map(_simulated_row, todo, workers))


def _simulated_row(job: tuple[dict, int, int, bool]) -> dict:
    g, run_id, concurrency, progress = job
    row = {"id": run_id, "skip_reason": "", **simulate_run(g, concurrency)}
    if progress:
        print(row, file=sys.stderr, flush=True)
    return row


def load_simulated() -> pd.DataFrame:
    return pd.read_csv(SIMULATED, keep_default_na=False, na_values=[""])


def simulated_runs() -> list[dict]:
    """The stored simulations as scoreboard runs (model.validate.scoreboard), every run of the
    measured file; runs without a simulation carry the reason."""
    runs = agentx.load_runs()
    sims = load_simulated().set_index("id")
    fronts = agentx.frontends(runs)
    out = []
    for r in runs.itertuples():
        measured = {agentx.METRICS[m]: getattr(r, m) for m in agentx.METRICS}
        if r.id in sims.index:
            s = sims.loc[r.id]
            reason = s.skip_reason if isinstance(s.skip_reason, str) and s.skip_reason else None
            predicted = None if reason else {agentx.METRICS[m]: s[m] for m in agentx.METRICS}
        else:
            reason, predicted = agentx.UNMAPPED, None
        out.append(run_record(r.id, measured, predicted, reason, run_slice(
            agentx.CHIPS.get(r.hardware, r.hardware), agentx.ARCHES.get(r.model, r.model),
            r.framework, "disaggregated" if r.disagg else "aggregated",
            concurrency_band(r.conc), {"frontend": fronts.get(int(r.id)) or None})))
    return out


def main(argv=None) -> None:
    """Simulate every mapped run, or with `--only model:hardware[,...]` (export names, e.g.
    minimaxm3:h200) those runs alone, replacing their rows in the stored table."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m model.validate.agentx_simulated",
                                 description=main.__doc__)
    ap.add_argument("--only", help="model:hardware[,...] of the export (e.g. minimaxm3:h200)")
    ap.add_argument("--progress", action="store_true", help="print each run as it finishes")
    args = ap.parse_args(sys.argv[1:] if argv is None else argv)
    runs = agentx.load_runs()
    if args.only:
        pairs = {tuple(p.split(":", 1)) for p in args.only.split(",")}
        known = set(zip(runs.model, runs.hardware, strict=True))
        if not pairs <= known:
            ap.error(f"--only: no runs for {', '.join(sorted(map(':'.join, pairs - known)))}; "
                     f"allowed: {', '.join(sorted(map(':'.join, known)))}")
        runs = runs[[(m, h) in pairs for m, h in zip(runs.model, runs.hardware, strict=True)]]
    table = simulate_all(runs, progress=args.progress)
    if args.only:  # the stored rows in their order, these runs' replaced
        kept, new = load_simulated().set_index("id"), table.set_index("id")
        order = kept.index.tolist() + [i for i in new.index if i not in kept.index]
        table = pd.concat([kept.drop(new.index, errors="ignore"), new]).loc[order].reset_index()
    table.to_csv(SIMULATED, index=False, float_format="%.6g")
    print(table.to_string(index=False, float_format=lambda v: f"{v:.3g}"))


if __name__ == "__main__":
    main()
