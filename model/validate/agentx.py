"""Held-out check of the serving model against measured InferenceX AgentX runs.

`python -m model.validate.agentx [--report]` predicts every run of
data/benchmarks/inferencex_agentx_2026-09-15.csv that data/benchmarks/inferencex_agentx_deployments.yaml
maps to a deployment (DeepSeek V4 Pro, Kimi K3 and MiniMax M3 on vLLM and Dynamo + vLLM, B200 to
GB300 and H200, aggregated and disaggregated, 1 to 1,152 sessions) with the full tier on the
run's deployment (what `servecast serve --deployment` and `servecast plan --deployment` report), and prints (or writes to data/benchmarks/inferencex_agentx_check.md) the
relative errors of TPGS, P90 interactivity and P90 TTFT. Nothing here is fitted: these runs are
outside the calibration set, so the table says how far the model carries.

Each group's deployment (plan, worker counts, scheduler knobs, speculative decoding per
concurrency) is read from its InferenceX recipe (the YAML names file and commit); precision, KV
dtype and the draft's acceptance length come from data/deployments/ as `plan` serves them, unless
the group's recipe states its own (`precision`, `kv_dtype`, `spec_method`,
`acceptance_length`). Traffic is `agentx-v1` (the AgentX v1.0 traffic these runs replay).

Where the export counts fewer GPUs than the recipe deploys (`deployed_gpus`: a DEP prefill worker
configured as `tp: 1` counts as one GPU), the measured TPGS is total throughput over the export's
count, so the model's total throughput is divided by that count too.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd

from model import ROOT
from model.plan.deployment import parse_deployment_label
from model.plan.evaluate import evaluate_deployment, labelled_deployment
from model.plan.inputs import ServingChoices, setup_for
from model.serve.policy import EnginePolicy
from model.specs.defaults import (
    ATTENTION_BACKEND,
    DRAFT_ATTENTION_BACKEND,
    KERNEL_LAUNCH,
    MAX_NUM_SEQS,
)
from model.specs.errors import ServecastError
from model.specs.hardware import load_hardware
from model.validate.parallel import ordered_map
from model.validate.scoreboard import CONCURRENCY_BANDS as BANDS
from model.validate.scoreboard import concurrency_band, run_record, run_slice

RUNS = ROOT / "data" / "benchmarks" / "inferencex_agentx_2026-09-15.csv"
DEPLOYMENTS = ROOT / "data" / "benchmarks" / "inferencex_agentx_deployments.yaml"
REPORT = ROOT / "data" / "benchmarks" / "inferencex_agentx_check.md"
WORKLOAD = "agentx-v1"
ARCHES = {"dsv4": "deepseek-v4-pro", "kimik3": "kimi-k3", "minimaxm3": "minimax-m3"}
CHIPS = {"b200": "b200", "b300": "b300", "gb200": "gb200-nvl72", "gb300": "gb300-nvl72",
         "h100": "h100-sxm", "h200": "h200-sxm", "mi300x": "mi300x", "mi325x": "mi325x",
         "mi355x": "mi355x"}
# export columns a group may also select its runs by (`match`): where one point ran on two
# deployments of the same GPU count
MATCH_COLUMNS = ("decode_tp", "spec_method")
COLUMNS = {"metrics.tput_per_gpu": "tpgs", "metrics.p90_intvty": "p90_interactivity",
           "metrics.median_intvty": "p50_interactivity", "metrics.p90_ttft": "p90_ttft",
           "total_gpus": "gpus"}
METRICS = {"tpgs": "tpgs", "p90_interactivity": "p90_interactivity_tok_s",
           "p90_ttft": "p90_ttft_s"}
UNMAPPED = f"no deployment mapped ({DEPLOYMENTS.name} says why in its header)"


def load_runs(path: Path = RUNS) -> pd.DataFrame:
    runs = pd.read_csv(path).rename(columns=COLUMNS)
    runs["disagg"] = runs["disagg"].astype(str).str.lower() == "true"
    return runs


def load_groups(path: Path = DEPLOYMENTS) -> list[dict]:
    from model.specs.specio import load_yaml

    return list(load_yaml(path.read_text())["groups"])


def _group_runs(runs: pd.DataFrame, g: dict) -> pd.DataFrame:
    sel = ((runs.model == g["model"]) & (runs.hardware == g["hardware"])
           & (runs.framework == g["framework"]) & (runs.disagg == bool(g["disagg"]))
           & (runs.gpus == int(g["gpus"])) & runs.conc.isin(g["conc"]))
    for column, value in (g.get("match") or {}).items():
        if column not in MATCH_COLUMNS:
            raise ServecastError(f"{DEPLOYMENTS.name}: match: {column!r}: allowed "
                                 f"{', '.join(MATCH_COLUMNS)}")
        sel &= runs[column] == value
    return runs[sel]


def _at(value, concurrency: int, default=None):
    """A group field at one concurrency: one value for all, or a {concurrency: value} map."""
    if isinstance(value, dict):
        return value.get(concurrency, default)
    return default if value is None else value


def _spec_by_concurrency(g: dict, arch: str, hw) -> dict[int, tuple[int, float, str]]:
    """Speculative decoding per concurrency: the family recipe's, or the group's draft tokens
    (`spec`, one count or per concurrency) and method; the acceptance length is the one the
    group's recipe pins for that draft count (`acceptance_length`), else the family's through
    model.specs.recipes.acceptance_for_tokens; `off` turns it off."""
    from model.specs.recipes import SPEC_OFF, acceptance_for_tokens, recipe_for

    tokens, al, method = recipe_for(arch).spec_on(hw)
    pinned = g.get("acceptance_length") or {}
    out = {}
    for c in g["conc"]:
        k = _at(g.get("spec"), c, tokens)
        if k in ("off", 0, None):
            out[c] = SPEC_OFF
        else:
            k_al = pinned.get(int(k)) or acceptance_for_tokens(tokens, al, int(k))
            out[c] = (int(k), float(k_al), g.get("spec_method", method))
    return out


def _policy(g: dict, concurrency: int) -> EnginePolicy:
    """The engine knobs at one concurrency (max_num_seqs per DP rank; vLLM's default where the
    recipe leaves it; `kernel_launch` as the recipe runs the engine: eager-blocking for
    --enforce-eager with CUDA_LAUNCH_BLOCKING=1, CUDA graphs where it says nothing;
    `cpu_offload_gib` as the recipe's --cpu-offload-gb; `attention_backend` as its
    --attention-backend, the chip's default where it names none; `draft_attention_backend` as
    its speculative config's, the target's where it names none)."""
    return EnginePolicy(int(_at(g["max_num_batched_tokens"], concurrency)),
                        int(_at(g.get("max_num_seqs"), concurrency, MAX_NUM_SEQS)),
                        int(g.get("long_prefill_token_threshold", 0)),
                        int(g.get("prefill_schedule_interval", 1)),
                        str(g.get("kernel_launch", KERNEL_LAUNCH)),
                        cpu_offload_gib=float(g.get("cpu_offload_gib", 0.0)),
                        attention_backend=str(g.get("attention_backend", ATTENTION_BACKEND)),
                        draft_attention_backend=str(g.get("draft_attention_backend",
                                                          DRAFT_ATTENTION_BACKEND)))


def deployment_label(g: dict) -> str:
    """The group's deployment as a label (model.plan.deployment): one replica of its plan, or
    x prefill + y decode workers."""
    if g["mode"] == "aggregated":
        return f"1x[{g['plan']}]"
    return f"{int(g['x'])}P[{g['prefill']}]{int(g['y'])}D[{g['decode']}]"


def predict_group(g: dict, runs: pd.DataFrame) -> list[dict]:
    """One row per measured run of group `g`: measured and predicted metrics, relative errors
    (model / measured - 1). Each run is the full tier on the group's deployment at the run's
    sessions (model.plan.evaluate.evaluate_deployment, as `servecast serve --deployment`)."""
    arch, chip = ARCHES[g["model"]], CHIPS[g["hardware"]]
    spec = _spec_by_concurrency(g, arch, load_hardware(chip))
    deployed = int(g.get("deployed_gpus", g["gpus"]))
    shape, _ = parse_deployment_label(deployment_label(g)).resolve(deployed)
    deployment = g.get("plan") or f"{g['x']}P {g['prefill']} + {g['y']}D {g['decode']}"
    if deployed != int(g["gpus"]):
        deployment += f" ({deployed} GPUs)"
    out = []
    for _, run in runs.sort_values("conc").iterrows():
        tokens, al, method = spec[int(run.conc)]
        setup = setup_for(arch, chip, WORKLOAD, ServingChoices(
            precision=g.get("precision"), kv_dtype=g.get("kv_dtype"), spec_tokens=tokens,
            acceptance_length=al or None, spec_method=method))
        predicted, reason = _served(setup, shape, int(run.conc), _policy(g, int(run.conc)),
                                    g.get("frontend"))
        if "tpgs" in predicted:  # the export's TPGS divides by its own GPU count
            predicted["tpgs"] *= deployed / int(g["gpus"])
        row = {"id": int(run.id), "model": g["model"], "hardware": g["hardware"],
               "framework": g["framework"], "mode": g["mode"], "gpus": int(run.gpus),
               "deployment": deployment, "frontend": g.get("frontend", ""),
               "concurrency": int(run.conc), "spec_tokens": tokens, "skip_reason": reason}
        for name in METRICS:
            m, p = float(run[name]), float(predicted.get(name) or np.nan)
            row |= {f"{name}_measured": m, f"{name}_model": p, f"{name}_err": p / m - 1}
        out.append(row)
    return out


def _served(setup, shape, concurrency: int, policy: EnginePolicy, frontend: str | None
            ) -> tuple[dict[str, float], str]:
    """(the full tier's TPGS, P90 interactivity and P90 TTFT, why there are none) behind the
    group's front end: a plan the model cannot place (Infeasible) is a reason too."""
    try:
        deployment = labelled_deployment(shape, setup, concurrency, policy, frontend)
        r = evaluate_deployment(setup, deployment, e2e=False).result
    except Exception as err:  # one run's failure must not sink the table; it is reported
        return {}, f"{type(err).__name__}: {err}"
    if not r.stable:
        return {}, r.reason
    return {"tpgs": r.tpgs, "p90_interactivity": r.interactivity_tok_s["p90"],
            "p90_ttft": r.ttft_s["p90"]}, ""


def predict(runs: pd.DataFrame | None = None, groups: list[dict] | None = None,
            workers: int | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(predictions, unmapped runs): every run a deployment group maps, and the rest; the
    groups go to `workers` processes (default one per CPU)."""
    runs = load_runs() if runs is None else runs
    groups = load_groups() if groups is None else groups
    selected = [(g, _group_runs(runs, g)) for g in groups]
    for g, sel in selected:
        if sel.empty:
            raise ServecastError(f"{DEPLOYMENTS.name}: group {g['model']} / {g['hardware']} / "
                                 f"{g['gpus']} GPUs matches no run of {RUNS.name}")
    rows = [row for part in ordered_map(_predict_selected, selected, workers) for row in part]
    mapped = set().union(*(set(sel.id) for _, sel in selected)) if selected else set()
    return pd.DataFrame(rows), runs[~runs.id.isin(mapped)]


def _predict_selected(group_and_runs: tuple[dict, pd.DataFrame]) -> list[dict]:
    return predict_group(*group_and_runs)


def frontends(runs: pd.DataFrame | None = None, groups: list[dict] | None = None
              ) -> dict[int, str]:
    """Each mapped run's front end as its group records it (python, rust, dynamo): a scoreboard
    slice, since the API server before the engine renders and tokenizes every prompt."""
    runs = load_runs() if runs is None else runs
    return {int(i): str(g.get("frontend") or "")
            for g in (load_groups() if groups is None else groups)
            for i in _group_runs(runs, g).id}


def agentx_runs(runs: pd.DataFrame | None = None, groups: list[dict] | None = None
                ) -> list[dict]:
    """The runs as scoreboard runs (model.validate.scoreboard): each run a group maps, predicted
    by `predict`, then each other run of `runs` without a prediction (UNMAPPED)."""
    runs = load_runs() if runs is None else runs
    table, unmapped = predict(runs, groups)
    out = [run_record(r.id, {METRICS[m]: getattr(r, f"{m}_measured") for m in METRICS},
                      {METRICS[m]: getattr(r, f"{m}_model") for m in METRICS}, r.skip_reason,
                      run_slice(CHIPS[r.hardware], ARCHES[r.model], r.framework, r.mode,
                                concurrency_band(r.concurrency), {"frontend": r.frontend or None}))
           for r in table.itertuples()]
    return out + [run_record(r.id, {METRICS[m]: getattr(r, m) for m in METRICS}, None, UNMAPPED,
                             run_slice(r.hardware, ARCHES.get(r.model, r.model), r.framework,
                                       "disaggregated" if r.disagg else "aggregated",
                                       concurrency_band(r.conc), {"frontend": None}))
                  for r in unmapped.itertuples()]


def summary(table: pd.DataFrame, by: str = "model") -> pd.DataFrame:
    """Median relative error and median |error| per metric, by `by` and load band."""
    t = table.assign(band=table.concurrency.map(concurrency_band))
    rows = []
    order = {name: i for i, (_, _, name) in enumerate(BANDS)}
    groups = sorted(t.groupby([by, "band"]), key=lambda kv: (kv[0][0], order[kv[0][1]]))
    for key, grp in [(("all", "all"), t)] + groups:
        row = {by: key[0], "band": key[1], "runs": len(grp)}
        for m in METRICS:
            e = grp[f"{m}_err"].to_numpy()
            row |= {m: float(np.nanmedian(e)), f"|{m}|": float(np.nanmedian(np.abs(e)))}
        rows.append(row)
    return pd.DataFrame(rows)


def _pct(x: float) -> str:
    return f"{x * 100:+.0f}%"


def _without(table: pd.DataFrame) -> str:
    n = int((table.skip_reason != "").sum())
    return f"{n} mapped without a prediction" + (" (below)" if n else "")


def write_report(table: pd.DataFrame, unmapped: pd.DataFrame, path: Path = REPORT) -> str:
    lines = ["# Held-out: InferenceX AgentX runs of DeepSeek V4 Pro, Kimi K3 and MiniMax M3 "
             "(2026-09-15)", "",
             "Generated by `python -m model.validate.agentx --report`; do not edit. Measured: "
             f"`{RUNS.relative_to(ROOT)}`; deployments read from the InferenceX recipes: "
             f"`{DEPLOYMENTS.relative_to(ROOT)}` (sources in data/benchmarks/README.md). Model: "
             "the full tier on each run's deployment behind its front end (`servecast serve "
             "--deployment --frontend`), traffic agentx-v1; nothing fitted to these runs. "
             "Error = model / measured - 1. P90 interactivity is 1 / P90 of per-request TPOT, as "
             "InferenceX reports it. `frontend`: python = vLLM's OpenAI server, rust = "
             "VLLM_USE_RUST_FRONTEND=1, dynamo = the Dynamo frontend.", "",
             f"{int((table.skip_reason == '').sum())} runs predicted, {_without(table)}; "
             f"{len(unmapped)} runs of the file have no deployment mapped (see the YAML's "
             "header for why).", "",
             "Median error (median |error|) by model and load band:", "",
             "| model | sessions | runs | TPGS | P90 interactivity | P90 TTFT |",
             "|---|---|---:|---:|---:|---:|"]
    for d in summary(table).to_dict("records"):
        lines.append(f"| {d['model']} | {d['band']} | {d['runs']} | " + " | ".join(
            f"{_pct(d[m])} ({d['|' + m + '|'] * 100:.0f}%)" for m in METRICS) + " |")
    lines += ["", "| id | model | chip | deployment | frontend | sessions | TPGS meas | model | "
              "err | P90 int. meas | model | err | P90 TTFT meas (s) | model | err |",
              "|---|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in table.sort_values(["model", "hardware", "gpus", "deployment",
                                "concurrency"]).itertuples():
        lines.append(
            f"| {r.id} | {r.model} | {r.hardware} | {r.deployment} | {r.frontend} | "
            f"{r.concurrency} | {r.tpgs_measured:,.0f} | {r.tpgs_model:,.0f} | "
            f"{_pct(r.tpgs_err)} | {r.p90_interactivity_measured:.1f} | "
            f"{r.p90_interactivity_model:.1f} | {_pct(r.p90_interactivity_err)} | "
            f"{r.p90_ttft_measured:.2f} | {r.p90_ttft_model:.2f} | {_pct(r.p90_ttft_err)} |")
    skipped = table[table.skip_reason != ""]
    if len(skipped):
        lines += ["", "Runs without a prediction:", ""]
        lines += [f"- {r.id} ({r.model}, {r.deployment}, {r.concurrency} sessions): "
                  f"{r.skip_reason}" for r in skipped.itertuples()]
    text = "\n".join(lines) + "\n"
    path.write_text(text)
    return text


def main(argv=None) -> None:
    """Predict every mapped AgentX run with the closed form; `--report` writes the check."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m model.validate.agentx", description=main.__doc__)
    ap.add_argument("--report", action="store_true", help=f"write {REPORT.name}")
    args = ap.parse_args(sys.argv[1:] if argv is None else argv)
    table, unmapped = predict()
    if args.report:
        print(write_report(table, unmapped))
    else:
        print(table.to_string(index=False, float_format=lambda v: f"{v:.3g}"))
        print(summary(table).to_string(index=False, float_format=lambda v: f"{v:.3g}"))


if __name__ == "__main__":
    main()
