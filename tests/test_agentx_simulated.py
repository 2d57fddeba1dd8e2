"""The simulator on the measured InferenceX AgentX runs (model.validate.agentx_simulated)."""

from __future__ import annotations

import pytest

from model.validate import agentx
from model.validate.agentx_simulated import (
    NOT_AGGREGATED,
    load_simulated,
    simulate_run,
    simulated_runs,
)


def test_stored_simulations_cover_every_mapped_run():
    # data/benchmarks/inferencex_agentx_simulated.csv holds one row per run that
    # inferencex_agentx_deployments.yaml maps; the disaggregated ones say why they have none
    runs, groups = agentx.load_runs(), agentx.load_groups()
    mapped = {int(i): g["mode"] for g in groups for i in agentx._group_runs(runs, g).id}
    sims = load_simulated().set_index("id")
    assert set(sims.index) == set(mapped)
    disagg = [i for i, mode in mapped.items() if mode == "disaggregated"]
    assert len(disagg) == 26 and (sims.loc[disagg, "skip_reason"] == NOT_AGGREGATED).all()
    simulated = sims[sims.skip_reason.isna()]
    assert len(simulated) >= 150 and (simulated.completed >= 500).all()


def test_a_stored_simulation_reproduces():
    # MiniMax M3 on 4 B300 (TP4), one session (run 439902): the stored row is what simulate_run
    # gives with seed 0, to the CSV's six significant digits
    g = next(g for g in agentx.load_groups() if g["model"] == "minimaxm3"
             and g["hardware"] == "b300" and int(g["gpus"]) == 4)
    stored = load_simulated().set_index("id").loc[439902]
    got = simulate_run(g, 1)
    for m in ("tpgs", "p90_interactivity", "p90_ttft", "completed"):
        assert got[m] == pytest.approx(float(stored[m]), rel=1e-5), m


def test_the_simulator_set_scores_every_run_of_the_export():
    # 245 measured runs; those without a stored simulation carry their reason, never a number
    out = simulated_runs()
    assert len(out) == 245
    sims = load_simulated().set_index("id")
    for r in out:
        simulated = int(r["id"]) in sims.index and not isinstance(
            sims.loc[int(r["id"]), "skip_reason"], str)
        assert (r["skip_reason"] is None) == simulated
        assert all((v is not None) == simulated for v in r["predicted"].values())


def test_the_runs_are_sliced_by_the_front_end_their_recipe_runs():
    # inferencex_agentx_deployments.yaml records each group's front end: MiniMax M3 on 8 H100
    # (run 440735) behind vLLM's Python server, DeepSeek V4 on 4 B300 (run 439521) with
    # VLLM_USE_RUST_FRONTEND=1, MiniMax M3 on 4 GB200 (run 441501) behind Dynamo; unmapped runs
    # have none
    from model.validate.scoreboard import score_set

    runs = {r["id"]: r for r in simulated_runs()}
    assert [runs[i]["slice"]["frontend"] for i in ("440735", "439521", "441501")] == [
        "python", "rust", "dynamo"]
    unmapped = [r for r in runs.values() if r["skip_reason"] == agentx.UNMAPPED]
    assert len(unmapped) == 4 and all(r["slice"]["frontend"] is None for r in unmapped)
    assert set(score_set("inferencex-agentx-simulator")["slices"]["frontend"]) == {
        "dynamo", "python", "rust"}


def test_only_replaces_the_named_runs_rows_in_place(tmp_path, monkeypatch):
    # --only=minimaxm3:h200 simulates the 8 MiniMax M3 runs on 8 H200 (data/benchmarks/
    # inferencex_agentx_2026-09-15.csv) and replaces just their rows, in the stored order
    from model.validate import agentx_simulated as S

    stored = load_simulated()
    table = tmp_path / "simulated.csv"
    stored.to_csv(table, index=False)
    monkeypatch.setattr(S, "SIMULATED", table)
    asked = []

    def fake_simulate_all(runs, progress=False):
        asked.extend(runs.id.tolist())
        return stored[stored.id.isin(runs.id)].assign(tpgs=-1.0)

    monkeypatch.setattr(S, "simulate_all", fake_simulate_all)
    S.main(["--only=minimaxm3:h200"])
    runs = agentx.load_runs()
    h200 = set(runs[(runs.model == "minimaxm3") & (runs.hardware == "h200")].id)
    assert set(asked) == h200 and len(h200) == 8
    after = S.load_simulated()
    assert after.id.tolist() == stored.id.tolist()
    changed = after[~((after.tpgs == stored.tpgs) | (after.tpgs.isna() & stored.tpgs.isna()))]
    assert set(changed.id) == h200 and (changed.tpgs == -1.0).all()
