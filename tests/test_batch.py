"""Batch runner: grid validation, parallel papermill runs, failure isolation, resume, summaries.

The notebook is `tests/data/notebooks/tiny.py`: headline `product = x * y`, and a product above
`limit` (50) raises `Infeasible`, which stands in for an impossible deployment.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

from model.frontends.batch import run_batch
from model.frontends.grid import load_grid, notebook_parameters, scenario_id
from model.frontends.nbio import notebook_names, notebook_path
from model.specs.errors import ServecastError, SpecError

TINY = Path(__file__).parent / "data" / "notebooks" / "tiny.py"


def write_grid(tmp_path: Path, grid: dict, parameters: dict | None = None,
               notebook: str = str(TINY), name: str = "grid.yaml") -> Path:
    path = tmp_path / name
    body = {"notebook": notebook, "parameters": parameters or {}, "grid": grid}
    path.write_text(yaml.safe_dump(body))
    return path


def test_twelve_scenarios_one_impossible_then_resume(tmp_path):
    # x in {1,2,3,10} by y in {1,2,6}: products 1,2,6, 2,4,12, 3,6,18, 10,20,60; only 10*6 = 60
    # exceeds the limit of 50, so exactly one of the 12 scenarios is impossible.
    grid = write_grid(tmp_path, {"x": [1, 2, 3, 10], "y": [1, 2, 6]}, {"label": "t"})
    out = tmp_path / "out"
    first = run_batch(grid, out, workers=2, progress=False)
    assert (first.scenarios, first.succeeded, first.failed, first.skipped) == (12, 11, 1, 0)

    summary = pd.read_csv(out / "summary.csv")
    assert len(summary) == 12
    failed = summary[summary["status"] == "failed"]
    assert failed["scenario"].tolist() == ["x=10__y=6"]
    assert failed["error"].iloc[0] == "Infeasible: x*y = 60 exceeds limit 50"
    ok = summary[summary["status"] == "succeeded"]
    assert (ok["product"] == ok["x"] * ok["y"]).all()  # headline numbers flattened into columns
    assert set(ok["detail.x"]) == {1, 2, 3, 10}  # nested headline dicts become dotted columns
    assert ok["executed_notebook"].map(lambda p: Path(p).is_file()).all()
    parquet = pd.read_parquet(out / "summary.parquet")
    assert parquet["scenario"].tolist() == summary["scenario"].tolist()
    assert not list(out.glob(".summary*"))  # no temporary files left behind
    # summaries get the umask's usual permissions, not mkstemp's owner-only 0600
    mask = os.umask(0)
    os.umask(mask)
    for name in ("summary.csv", "summary.parquet"):
        assert (out / name).stat().st_mode & 0o777 == 0o666 & ~mask

    assert not ok["skipped"].any()
    assert (ok["elapsed_s"] > 0).all()

    # Rerun: the 11 finished scenarios are skipped (not re-executed), the failed one reruns.
    stamp = (out / "scenarios" / "x=1__y=1" / "headline.json").stat().st_mtime_ns
    second = run_batch(grid, out, workers=2, progress=False)
    assert (second.succeeded, second.failed, second.skipped) == (11, 1, 11)
    assert (out / "scenarios" / "x=1__y=1" / "headline.json").stat().st_mtime_ns == stamp
    # a skipped row keeps the run time its scenario recorded, not 0
    again = second.summary.set_index("scenario")
    first_elapsed = summary.set_index("scenario")["elapsed_s"]
    for sid in ok["scenario"]:
        assert bool(again.loc[sid, "skipped"])
        assert again.loc[sid, "elapsed_s"] == pytest.approx(first_elapsed[sid], abs=1e-3)
    assert not bool(again.loc["x=10__y=6", "skipped"])


def test_changed_parameters_are_not_taken_as_finished(tmp_path):
    # The completion marker records the parameters; a changed fixed parameter means rerun.
    out = tmp_path / "out"
    run_batch(write_grid(tmp_path, {"x": [2]}, {"y": 3}), out, workers=1, progress=False)
    again = run_batch(write_grid(tmp_path, {"x": [2]}, {"y": 4}), out, workers=1,
                      progress=False)
    assert again.skipped == 0
    assert again.summary["product"].tolist() == [8]  # 2 * 4, not the stale 2 * 3


def test_dask_scheduler_runs_scenarios(tmp_path):
    from distributed import LocalCluster

    grid = write_grid(tmp_path, {"x": [2, 30]}, {"y": 2})  # 2*2 = 4 fine; 30*2 = 60 > 50
    # In-process workers (threads): the test process already imported papermill.
    with LocalCluster(n_workers=1, threads_per_worker=2, processes=False,
                      dashboard_address=None) as cluster:
        result = run_batch(grid, tmp_path / "out", scheduler=cluster.scheduler_address,
                           progress=False)
    assert (result.succeeded, result.failed) == (1, 1)
    assert result.summary.set_index("scenario").loc["x=2", "product"] == 4


def test_scenarios_are_the_cartesian_product(tmp_path):
    grid = load_grid(write_grid(tmp_path, {"x": [1, 2, 3], "y": [4, 5]}, {"label": "L"}))
    scenarios = grid.scenarios()
    assert len(scenarios) == 6  # 3 x 2
    assert scenarios[0].parameters == {"label": "L", "x": 1, "y": 4}
    assert [s.id for s in scenarios][:2] == ["x=1__y=4", "x=1__y=5"]
    assert scenario_id({"arch": "kimi-k3", "gpus": -1}) == "arch=kimi-k3__gpus=-1"


@pytest.mark.parametrize(("body", "key", "message"), [
    ({"notebook": str(TINY), "grid": {"x": [1]}, "extra": 1}, "extra", "unknown key"),
    ({"grid": {"x": [1]}}, "notebook", "missing"),
    ({"notebook": str(TINY), "grid": {"x": []}}, "grid.x", "non-empty list"),
    ({"notebook": str(TINY), "grid": {"z": [1]}}, "grid.z", "not a parameter of tiny.py"),
    ({"notebook": str(TINY), "parameters": {"x": 1}, "grid": {"x": [2]}}, "grid.x",
     "also set under parameters"),
    ({"notebook": "no-such-notebook", "grid": {}}, "notebook", "unknown notebook"),
    ({"notebook": "../../../etc/passwd", "grid": {"x": [1]}}, "notebook", "jupytext .py"),
])
def test_grid_errors_name_file_and_key(tmp_path, body, key, message):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(body))
    with pytest.raises(SpecError) as err:
        load_grid(path)
    assert err.value.key == key
    assert message in err.value.problem
    assert str(path) in str(err.value)


def test_missing_grid_file_is_a_user_error(tmp_path):
    with pytest.raises(ServecastError, match="not found"):
        load_grid(tmp_path / "absent.yaml")


def test_cli_unknown_notebook_is_one_line_exit_2(tmp_path, cli):
    grid = tmp_path / "g.yaml"
    grid.write_text(yaml.safe_dump({"notebook": "nope", "grid": {"x": [1]}}))
    result = cli("batch", str(grid), "--out", str(tmp_path / "out"), "--json")
    assert result.code == 2
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "notebook" in lines[0] and "unknown notebook 'nope'" in lines[0]


def test_cases_multiply_the_grid(tmp_path):
    # Two cases (parameters that go together) x grid y in {1, 2} = 4 scenarios, cases first.
    path = tmp_path / "cases.yaml"
    path.write_text(yaml.safe_dump({"notebook": str(TINY), "grid": {"y": [1, 2]},
                                    "cases": [{"x": 1, "label": "a"}, {"x": 5, "label": "b"}]}))
    scenarios = load_grid(path).scenarios()
    # safe_dump sorts keys, so each case reads label then x.
    assert [s.id for s in scenarios] == ["label=a__x=1__y=1", "label=a__x=1__y=2",
                                         "label=b__x=5__y=1", "label=b__x=5__y=2"]
    assert scenarios[3].parameters == {"x": 5, "label": "b", "y": 2}


def test_default_grid_is_the_seed_deployments():
    # notebooks/grids/default.yaml (`make run`): the three rows of the seed's results table.
    grid = load_grid(Path(__file__).parent.parent / "notebooks" / "grids" / "default.yaml")
    rows = [(s.parameters["arch"], s.parameters["hardware"], s.parameters["gpus"])
            for s in grid.scenarios()]
    assert rows == [("deepseek-v4-pro", "gb300-nvl72", 12), ("minimax-m3", "b300", 2),
                    ("kimi-k3", "gb300-nvl72", 16)]
    assert [s.parameters["precision"] for s in grid.scenarios()] == ["", "fp8", ""]
    assert grid.scenarios()[1].id == "arch=minimax-m3__hardware=b300__gpus=2__precision=fp8"
    assert grid.notebook.name == "plan.py"
    assert grid.parameters == {"workload": "agentx", "slo_p90_interactivity": 50}


def test_cli_batch_json_contract(tmp_path, cli):
    # 2*3 = 6 runs; 30*3 = 90 > 50 fails: the JSON names both counts, then one error line on
    # stderr and exit status 2 flag the failure.
    grid = write_grid(tmp_path, {"x": [2, 30]}, {"y": 3})
    result = cli("batch", str(grid), "--out", str(tmp_path / "out"), "--workers", "2", "--json")
    assert result.code == 2, result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("servecast: error: 1 of 2 scenarios")
    out = result.json
    assert (out["scenarios"], out["succeeded"], out["failed"]) == (2, 1, 1)
    assert out["summary_path"] == str(tmp_path / "out" / "summary.csv")
    assert out["failures"] == [{"scenario": "x=30",
                                "error": "Infeasible: x*y = 90 exceeds limit 50"}]
    # the kernels' own log (transport warning, the KeyboardInterrupt jupyter_client sends
    # before every shutdown) stays out of the terminal
    assert "IPKernelApp" not in result.stderr and "KeyboardInterrupt" not in result.stderr


def test_every_notebook_parameter_cell_parses_for_papermill():
    # papermill's own parser (it logs "Unable to parse line" and drops the parameter otherwise)
    # must see every typed parameter the batch runner validates grids against.
    from papermill.translators import PythonTranslator

    from model.frontends.nbio import fast_notebook_imports

    fast_notebook_imports()
    import jupytext

    for name in notebook_names():
        path = notebook_path(name)
        cell = next(c for c in jupytext.read(path).cells
                    if "parameters" in c.metadata.get("tags", []))
        names = [p.name for p in PythonTranslator.inspect(cell)]
        assert names == list(notebook_parameters(path)), name


GATED = """# %% tags=["parameters"]
x: int = 1  # scenario number; x > 1 waits while the gate file exists
gate: str = ""  # path of the gate file
early: bool = False  # write a complete-looking headline and figure before the wait
output_dir: str = "."  # where headline.json goes

# %%
import time
from pathlib import Path

from model.frontends.nbio import write_headline

if early:
    write_headline(output_dir, {"x": x})
    (Path(output_dir) / "early.png").write_bytes(b"")
while x > 1 and Path(gate).exists():
    time.sleep(0.05)
(Path(output_dir) / "past_the_gate").write_text("")
write_headline(output_dir, {"x": x})
"""


def _start_batch(grid: Path, out: Path) -> subprocess.Popen:
    """`servecast batch` as a terminal runs it: its own process group, SIGINT at its default
    (a shell's background job would otherwise inherit SIGINT ignored)."""
    return subprocess.Popen(
        [sys.executable, "-m", "model.frontends.cli", "batch", str(grid), "--out", str(out),
         "--workers", "2", "--json"], cwd=Path(__file__).parent.parent,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def _wait_for(condition, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def test_ctrl_c_is_one_line_nonzero_and_resumable(tmp_path):
    # x=1 finishes at once; x=2 writes a complete-looking headline and figure, then blocks on
    # the gate until interrupted. Ctrl-C goes to the whole foreground process group, as a
    # terminal sends it.
    notebook = tmp_path / "gated.py"
    notebook.write_text(GATED)
    gate = tmp_path / "gate"
    gate.write_text("")
    grid = write_grid(tmp_path, {"x": [1, 2]}, {"gate": str(gate), "early": True},
                      notebook=str(notebook))
    out = tmp_path / "out"
    stage = out / "scenarios" / ".x=2.running"  # where x=2 runs until it is published
    proc = _start_batch(grid, out)
    _wait_for(lambda: (out / "scenarios" / "x=1" / ".done").is_file()
              and (stage / "early.png").is_file())
    time.sleep(1.0)  # x=2 is inside its cell now
    os.killpg(proc.pid, signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode != 0
    assert stdout == ""
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr
    errors = [line for line in stderr.splitlines() if line.startswith("servecast:")]
    assert len(errors) == 1
    assert errors[0].startswith("servecast: error: batch interrupted: 1 of 2 scenarios finished "
                                "(1 succeeded, 0 failed)")
    # the interrupted scenario's complete-looking headline and figure stay in its hidden
    # staging folder: its own folder never shows them without the completion marker
    assert not (out / "scenarios" / "x=2").exists()
    assert (stage / "headline.json").is_file() and not (stage / ".done").exists()
    summary = pd.read_csv(out / "summary.csv").set_index("scenario")
    assert summary.loc["x=1", "status"] == "succeeded"
    assert summary.loc["x=2", "status"] == "interrupted"
    assert not [p for p in out.iterdir() if p.name.startswith(".")]  # no half-written summary
    # no orphaned kernel goes on with x=2: opening the gate would let it past
    gate.unlink()
    time.sleep(2.0)
    assert not (stage / "past_the_gate").exists()

    # Rerun (the gate is open): x=1 is skipped and keeps its recorded time, x=2 runs.
    elapsed = json.loads((out / "scenarios" / "x=1" / ".done").read_text())["elapsed_s"]
    again = run_batch(grid, out, workers=2, progress=False)
    assert (again.succeeded, again.failed, again.skipped) == (2, 0, 1)
    rows = again.summary.set_index("scenario")
    assert rows.loc["x=1", "elapsed_s"] == pytest.approx(elapsed, abs=1e-3)
    assert rows.loc["x=2", "x"] == 2 and not bool(rows.loc["x=2", "skipped"])
    assert (out / "scenarios" / "x=2" / "past_the_gate").is_file() and not stage.exists()


def test_kernels_talk_over_their_own_unix_sockets(tmp_path):
    # Over TCP, jupyter_client picks free ports and the kernel binds them later; a kernel another
    # worker starts in between can take one first ("ZMQError: Address already in use": the
    # kernel dies before replying). Each kernel gets ipc transport under a socket path of its own.
    from model.frontends.nbio import LiveKernels, _kernel_manager_class

    cls = _kernel_manager_class(tmp_path / "k.log", LiveKernels())
    a, b = cls(), cls()
    assert a.transport == b.transport == "ipc"
    assert a.ip != b.ip and Path(a.ip).parent == Path(b.ip).parent


def test_live_kernels_kill_their_process_group_and_files(tmp_path):
    # a stand-in kernel: a process leading its own session, with a connection file and the
    # ipc sockets `<prefix>-1 ...`; kill_all ends it and removes them, and forgets it
    from model.frontends.nbio import LiveKernels

    process = subprocess.Popen(["sleep", "60"], start_new_session=True)
    connection = tmp_path / "kernel.json"
    connection.write_text("{}")
    prefix = tmp_path / "servecast-test-ipc"
    sockets = [Path(f"{prefix}-{i}") for i in (1, 2)]
    for sock in sockets:
        sock.write_text("")
    kernels = LiveKernels()
    kernels.add(process, str(connection), str(prefix))
    kernels.kill_all()
    assert process.poll() is not None
    assert not connection.exists() and not any(s.exists() for s in sockets)
    kernels.kill_all()  # nothing left to reap


def test_out_that_is_a_file_is_a_user_error(tmp_path):
    taken = tmp_path / "taken"
    taken.write_text("not a folder")
    with pytest.raises(ServecastError, match="an existing file"):
        run_batch(write_grid(tmp_path, {"x": [2]}, {"y": 3}), taken, workers=1, progress=False)


def test_a_truncated_headline_reruns_that_scenario_only(tmp_path):
    # an interrupted write can leave headline.json cut short beside its completion marker: the
    # rerun must take that scenario as unfinished (and rerun it), not crash the batch
    out = tmp_path / "out"
    grid = write_grid(tmp_path, {"x": [2, 3]}, {"y": 3})
    run_batch(grid, out, workers=1, progress=False)
    cut = out / "scenarios" / "x=2" / "headline.json"
    cut.write_text(cut.read_text()[:5])
    again = run_batch(grid, out, workers=1, progress=False)
    assert (again.succeeded, again.failed, again.skipped) == (2, 0, 1)
    assert again.summary.set_index("scenario").loc["x=2", "product"] == 6  # 2 * 3, rerun


def test_a_complete_looking_scenario_without_its_marker_reruns(tmp_path):
    # what an interrupted run of an older layout left: headline.json and the figure in the
    # scenario's folder, no completion marker. The rerun takes it as unfinished and runs it
    # (2 * 3 = 6), and the other scenario is skipped.
    out = tmp_path / "out"
    grid = write_grid(tmp_path, {"x": [2, 3]}, {"y": 3, "figure": True})
    run_batch(grid, out, workers=1, progress=False)
    folder = out / "scenarios" / "x=2"
    assert (folder / "line.png").is_file()
    (folder / ".done").unlink()
    (folder / "headline.json").write_text(json.dumps({"product": 999}))
    again = run_batch(grid, out, workers=1, progress=False)
    assert (again.succeeded, again.failed, again.skipped) == (2, 0, 1)
    assert again.summary.set_index("scenario").loc["x=2", "product"] == 6
    assert (folder / ".done").is_file()


def test_a_failed_scenario_is_published_without_a_headline(tmp_path):
    # 30 * 2 = 60 > 50 fails after nothing was written: its folder holds the error and the
    # executed notebook, never a headline; the staging folder is gone
    out = tmp_path / "out"
    run_batch(write_grid(tmp_path, {"x": [30]}, {"y": 2}), out, workers=1, progress=False)
    folder = out / "scenarios" / "x=30"
    assert (folder / "error.txt").read_text().startswith("Infeasible: x*y = 60")
    assert (folder / "tiny.ipynb").is_file()
    assert not (folder / "headline.json").exists() and not (folder / ".done").exists()
    assert [p.name for p in (out / "scenarios").iterdir()] == ["x=30"]
