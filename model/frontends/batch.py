"""Papermill batches: one notebook over a grid of parameters, one tidy summary row per scenario.

The grid file (model.frontends.grid) gives the scenarios: cases x the cartesian product of the
grid. Each scenario runs in a hidden staging folder `OUT/scenarios/.<id>.running/` and is renamed
to `OUT/scenarios/<id>/` (executed notebook, headline.json, figures) when it ends, its completion
marker `.done` (recording the parameters) written last before the rename; so a scenario's folder
never shows a headline or a figure of a run that did not finish. A scenario is finished when its
folder holds a readable `headline.json` and `.done` for the same parameters: a rerun skips
finished scenarios, and an interrupted, partial or unreadable one is simply run again.
A failing scenario becomes one `failed` row carrying its error; the others finish.
`summary.csv` and `summary.parquet` are rewritten atomically after the batch.

Interrupts (Ctrl-C, SIGTERM): worker processes run in their own process group, so the terminal's
Ctrl-C reaches only the batch process, which stops the workers and their kernels, writes the
summary of what finished (the rest are `interrupted` rows) and raises `BatchInterrupted`: one
line on stderr from the CLI, a non-zero exit, no traceback. A rerun resumes.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
from tqdm import tqdm

from model.frontends.grid import Scenario, load_grid
from model.frontends.nbio import (
    HEADLINE,
    KERNEL_LOG,
    LiveKernels,
    execute_notebook,
    plain,
    read_headline,
)
from model.specs.errors import ServecastError
from model.specs.specio import publish, write_atomic

DONE = ".done"
STAGING_SUFFIX = ".running"  # a scenario runs in OUT/scenarios/.<id>.running, then is renamed
SCENARIOS_DIR = "scenarios"
SUMMARY = "summary"
FIGURE_SUFFIXES = (".png", ".svg")
KERNEL_START_RETRIES = 1
# Columns every summary row has, before the parameters and the headline numbers.
BASE_COLUMNS = ("scenario", "status", "error", "elapsed_s", "skipped", "output_dir",
                "executed_notebook", "figures")
INTERRUPTED = "interrupted"
WORKER_STOP_WAIT_S = 5.0  # after SIGTERM, how long a worker gets before SIGKILL


class BatchInterrupted(ServecastError):
    """The batch was interrupted; finished scenarios are kept and a rerun resumes."""


@dataclass(frozen=True)
class BatchResult:
    scenarios: int
    succeeded: int
    failed: int
    skipped: int
    summary_path: Path
    summary: pd.DataFrame

    def as_dict(self) -> dict[str, Any]:
        failures = self.summary.loc[self.summary["status"] == "failed", ["scenario", "error"]]
        return {
            "scenarios": self.scenarios, "succeeded": self.succeeded, "failed": self.failed,
            "skipped": self.skipped, "summary_path": str(self.summary_path),
            "summary_parquet_path": str(self.summary_path.with_suffix(".parquet")),
            "out_dir": str(self.summary_path.parent),
            "failures": failures.to_dict(orient="records"),
        }


# ---------------------------------------------------------------- running one scenario


def error_line(err: BaseException) -> str:
    """One readable line: the notebook's own exception name and message, not papermill's dump."""
    ename, evalue = getattr(err, "ename", None), getattr(err, "evalue", None)
    text = f"{ename}: {evalue}" if ename else f"{type(err).__name__}: {err}"
    text = re.sub(r"\x1b\[[0-9;]*m", "", text)  # ANSI colours from IPython tracebacks
    return " ".join(text.split())[:500]


def _kernel_start_failure(err: BaseException) -> bool:
    """The kernel never came up (a loaded machine, a port race): not the notebook's fault."""
    text = str(err)
    return getattr(err, "ename", None) is None and (
        "Kernel died before replying to kernel_info" in text
        or "Kernel didn't respond in" in text)


def is_finished(folder: Path, parameters: dict[str, Any]) -> bool:
    """Finished = a readable headline.json object plus a completion marker recording these same
    parameters; anything unreadable or partial (a truncated file) is unfinished and reruns."""
    marker, headline = folder / DONE, folder / HEADLINE
    if not (marker.is_file() and headline.is_file()):
        return False
    try:
        recorded = json.loads(marker.read_text()).get("parameters")
        if not isinstance(json.loads(headline.read_text()), dict):
            return False
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError):
        return False
    return recorded == _plain(parameters)


def staging_dir(folder: Path) -> Path:
    """Where a scenario runs before it is published as `folder`: hidden beside it."""
    return folder.with_name(f".{folder.name}{STAGING_SUFFIX}")


def publish_dir(stage: Path, folder: Path) -> None:
    """Put the finished `stage` in place of `folder` by renames: `folder` is at every moment
    the old run, absent, or the new run whole (an interrupt in between leaves it absent, and
    the scenario reruns)."""
    old = folder.with_name(f".{folder.name}.old")
    shutil.rmtree(old, ignore_errors=True)
    if folder.exists():
        os.replace(folder, old)
    os.replace(stage, folder)
    shutil.rmtree(old, ignore_errors=True)


def recorded_elapsed_s(folder: Path) -> float:
    """The run time a finished scenario recorded in its completion marker (NaN if unknown)."""
    try:
        return float(json.loads((folder / DONE).read_text()).get("elapsed_s", float("nan")))
    except (OSError, ValueError, TypeError, AttributeError):
        return float("nan")


def run_scenario(notebook: str, scenario_dir: str, parameters: dict[str, Any],
                 timeout_s: int = 600) -> dict[str, Any]:
    """Run one scenario; never raises (a failure is returned as a row). Picklable for workers.

    The notebook runs in a hidden staging folder; the completion marker is written there last
    and the folder is then renamed into place, so the scenario's own folder never holds a
    headline or figure of a run that did not finish. A failed run is published without its
    headline (its executed notebook, figures and error.txt stay for reading)."""
    folder = Path(scenario_dir)
    stage = staging_dir(folder)
    shutil.rmtree(stage, ignore_errors=True)  # what an interrupted run left
    stage.mkdir(parents=True)
    start = time.perf_counter()
    kernels = LiveKernels()
    for attempt in range(1 + KERNEL_START_RETRIES):
        try:
            with _kernels_die_with_worker(kernels):
                headline = execute_notebook(Path(notebook), parameters, stage, timeout_s,
                                            kernels)
            status, error = "succeeded", ""
            elapsed = time.perf_counter() - start
            write_atomic(stage / DONE, json.dumps({"parameters": _plain(parameters),
                                                   "elapsed_s": elapsed,
                                                   "finished_unix_s": time.time()}))
            break
        except Exception as err:  # isolate: any failure inside the scenario is its row's error
            headline, status, error = {}, "failed", error_line(err)
            elapsed = time.perf_counter() - start
            if not _kernel_start_failure(err) or attempt == KERNEL_START_RETRIES:
                log = stage / KERNEL_LOG
                if "Kernel died" in error and log.is_file() and log.stat().st_size:
                    error = f"{error} (kernel log: {folder / KERNEL_LOG})"
                (stage / HEADLINE).unlink(missing_ok=True)
                write_atomic(stage / "error.txt", error + "\n")
                break
    publish_dir(stage, folder)
    # the time the marker records, so a skipped rerun reports the same number
    return {"status": status, "error": error, "elapsed_s": elapsed, "headline": headline}


# ---------------------------------------------------------------- the batch


def run_batch(grid_path: str | Path, out_dir: str | Path, workers: int | None = None,
              scheduler: str | None = None, progress: bool = True,
              timeout_s: int = 600) -> BatchResult:
    """Run every unfinished scenario of a grid; write summary.csv/.parquet; return the counts.

    Ctrl-C or SIGTERM stops the workers and raises `BatchInterrupted` (a `ServecastError`, so
    the CLI prints one line and exits non-zero) after writing the summary of what finished."""
    with _sigterm_as_interrupt():
        try:
            return _run_batch(grid_path, out_dir, workers, scheduler, progress, timeout_s)
        except KeyboardInterrupt:  # before any scenario started (loading the grid)
            raise BatchInterrupted("batch interrupted before any scenario ran; nothing was "
                                   "written") from None


def _run_batch(grid_path, out_dir, workers, scheduler, progress, timeout_s) -> BatchResult:
    grid = load_grid(grid_path)
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise ServecastError(f"--out {out}: an existing file; give a folder (new or a batch's)")
    try:
        (out / SCENARIOS_DIR).mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ServecastError(f"--out {out}: cannot create the folder ({err.strerror})") from None
    scenarios = grid.scenarios()
    folders = {s.id: out / SCENARIOS_DIR / s.id for s in scenarios}
    results: dict[str, dict[str, Any]] = {}
    todo = []
    for s in scenarios:
        if is_finished(folders[s.id], s.parameters):
            results[s.id] = {"status": "succeeded", "error": "", "skipped": True,
                             "elapsed_s": recorded_elapsed_s(folders[s.id]),
                             "headline": read_headline(folders[s.id])}
        else:
            todo.append(s)
    jobs = [(s.id, (str(grid.notebook), str(folders[s.id]), s.parameters, timeout_s))
            for s in todo]
    runner = _run_dask if scheduler else _run_processes
    interrupted = False
    try:
        with tqdm(total=len(scenarios), initial=len(scenarios) - len(todo), unit="scenario",
                  desc=grid.notebook.stem, file=sys.stderr, disable=not progress) as bar:
            def done(sid: str, row: dict[str, Any]) -> None:
                results[sid] = row
                bar.update(1)

            if jobs:
                runner(jobs, done, workers=workers, scheduler=scheduler)
    except KeyboardInterrupt:
        interrupted = True
    for s in scenarios:  # scenarios the interrupt stopped or never started
        results.setdefault(s.id, {"status": INTERRUPTED, "elapsed_s": float("nan"),
                                  "error": "interrupted before it finished; rerun to resume"})
    with _no_interrupts():  # a second Ctrl-C must not tear the summary
        summary = summarize(scenarios, results, folders)
        summary_path = write_summary(summary, out)
    counts = summary["status"].value_counts()
    succeeded, failed = int(counts.get("succeeded", 0)), int(counts.get("failed", 0))
    if interrupted:
        left = int(counts.get(INTERRUPTED, 0))
        raise BatchInterrupted(
            f"batch interrupted: {succeeded + failed} of {len(scenarios)} scenarios finished "
            f"({succeeded} succeeded, {failed} failed); summary in {summary_path}; rerun the "
            f"same command to run the other {left}")
    skipped = sum(1 for r in results.values() if r.get("skipped"))
    return BatchResult(len(scenarios), succeeded, failed, skipped, summary_path, summary)


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@contextlib.contextmanager
def _sigterm_as_interrupt():
    """SIGTERM (a scheduler or `kill` stopping the batch) takes the Ctrl-C path."""
    previous = signal.signal(signal.SIGTERM, _raise_interrupt) if _in_main_thread() else None
    try:
        yield
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt


@contextlib.contextmanager
def _no_interrupts():
    """Hold off SIGINT/SIGTERM while the summary is written (both are atomic and quick)."""
    sigs = (signal.SIGINT, signal.SIGTERM) if _in_main_thread() else ()
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in sigs}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def worker_context():
    """fork where the OS has it: workers inherit the imported modules, and unlike spawn it never
    re-runs the caller's __main__ (e.g. `python -m model.frontends.cli` without a main guard).
    Each worker only drives a kernel subprocess, so no state shared across the fork is used
    concurrently."""
    methods = multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("fork" if "fork" in methods else "spawn")


def _default_workers(n_jobs: int) -> int:
    return max(1, min(n_jobs, os.cpu_count() or 1))


def _worker_init() -> None:
    """Each worker leads its own process group: the terminal's Ctrl-C (sent to the foreground
    group) reaches only the batch process, which then stops the workers deliberately. SIGTERM
    from the batch process ends the worker without a traceback (`_kernels_die_with_worker`
    kills a running scenario's kernels first)."""
    os.setpgrp()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _stop_worker)


def _stop_worker(signum, frame) -> None:
    os._exit(128 + signum)


@contextlib.contextmanager
def _kernels_die_with_worker(kernels: LiveKernels):
    """Inside a batch worker (its SIGTERM handler is `_stop_worker`), a SIGTERM kills the
    scenario's kernels before the worker exits; elsewhere (the batch process, a Dask thread)
    nothing changes."""
    if not _in_main_thread() or signal.getsignal(signal.SIGTERM) is not _stop_worker:
        yield
        return

    def stop(signum, frame) -> None:
        kernels.kill_all()
        _stop_worker(signum, frame)

    signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, _stop_worker)


def _stop_workers(processes: list) -> None:
    """SIGTERM every worker (it kills its kernel and exits), SIGKILL any that lingers."""
    for process in processes:
        if process.is_alive():
            process.terminate()
    deadline = time.monotonic() + WORKER_STOP_WAIT_S
    for process in processes:
        process.join(max(deadline - time.monotonic(), 0.0))
        if process.is_alive():
            process.kill()
            process.join(1.0)


def _run_processes(jobs: list[tuple[str, tuple]], done: Callable[[str, dict], None], *,
                   workers: int | None, scheduler: str | None = None) -> None:
    n = workers or _default_workers(len(jobs))
    if n < 1:
        raise ServecastError(f"--workers must be >= 1, got {n}")
    pool = ProcessPoolExecutor(max_workers=n, mp_context=worker_context(),
                               initializer=_worker_init)
    try:
        futures = {pool.submit(run_scenario, *args): sid for sid, args in jobs}
        for future in as_completed(futures):
            done(futures[future], _collect(future))
    except BaseException:  # Ctrl-C: drop queued scenarios, stop running ones (no .done marker)
        with _no_interrupts():
            # shutdown() forgets the worker processes, so take them first
            processes = list((getattr(pool, "_processes", None) or {}).values())
            pool.shutdown(wait=False, cancel_futures=True)
            _stop_workers(processes)
        raise
    pool.shutdown()


def _run_dask(jobs: list[tuple[str, tuple]], done: Callable[[str, dict], None], *,
              workers: int | None, scheduler: str | None) -> None:
    from distributed import Client  # optional and heavy: only with --scheduler
    from distributed import as_completed as dask_completed

    try:
        client = Client(scheduler, timeout="10s")
    except OSError as err:
        raise ServecastError(f"cannot reach Dask scheduler {scheduler!r}: {err}") from None
    try:
        futures = {client.submit(run_scenario, *args, key=f"servecast-{sid}-{time.time_ns()}",
                                 pure=False): sid for sid, args in jobs}
        for future in dask_completed(list(futures)):
            done(futures[future], _collect(future))
    except KeyboardInterrupt:  # drop what has not started; running tasks finish on the cluster
        client.cancel(list(futures))
        raise
    finally:
        client.close()


def _collect(future: Any) -> dict[str, Any]:
    try:
        return future.result()
    except Exception as err:  # the worker itself died; still one failed row
        return {"status": "failed", "error": error_line(err), "elapsed_s": 0.0, "headline": {}}


# ---------------------------------------------------------------- summary table


def flatten(obj: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in obj.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten(value, f"{name}."))
        else:
            flat[name] = value
    return flat


def summarize(scenarios: Iterable[Scenario], results: dict[str, dict[str, Any]],
              folders: dict[str, Path]) -> pd.DataFrame:
    rows = []
    for s in scenarios:
        result, folder = results[s.id], folders[s.id]
        executed = sorted(p for p in folder.glob("*.ipynb") if not p.name.startswith("."))
        figures = sorted(str(p) for p in folder.rglob("*") if p.suffix in FIGURE_SUFFIXES
                         and not p.name.startswith("."))
        row: dict[str, Any] = {
            "scenario": s.id, "status": result["status"], "error": result["error"],
            "elapsed_s": round(float(result["elapsed_s"]), 3),
            "skipped": bool(result.get("skipped", False)), "output_dir": str(folder),
            "executed_notebook": str(executed[0]) if executed else "",
            "figures": ";".join(figures),
        }
        row.update(s.parameters)
        for key, value in flatten(result.get("headline") or {}).items():
            row[key if key not in row else f"headline.{key}"] = value
        rows.append(row)
    return pd.DataFrame(rows)


def _plain(value: Any) -> Any:
    """JSON-ready and round-tripped through JSON, as a completion marker records it."""
    return json.loads(json.dumps(plain(value), default=str))


def _tabular(df: pd.DataFrame) -> pd.DataFrame:
    """Parquet wants one type per column: lists/dicts become JSON, mixed columns become text."""
    out = df.copy()
    for col in out.columns:
        values = out[col]
        if values.dtype != object:
            continue
        if values.map(lambda v: isinstance(v, (list, dict, tuple))).any():
            out[col] = values.map(lambda v: v if v is None else json.dumps(_plain(v)))
            continue
        kinds = {type(v) for v in values if v is not None and not _isnan(v)}
        if len(kinds) > 1 and not kinds <= {int, float, bool}:
            out[col] = values.map(lambda v: None if v is None else str(v))
    return out


def _isnan(value: Any) -> bool:
    return isinstance(value, float) and value != value


def write_summary(summary: pd.DataFrame, out: Path) -> Path:
    """Write summary.csv and summary.parquet, each via a temporary file and an atomic rename."""
    out.mkdir(parents=True, exist_ok=True)
    table = _tabular(summary)
    csv_path = out / f"{SUMMARY}.csv"
    write_atomic(csv_path, table.to_csv(index=False))
    fd, tmp = tempfile.mkstemp(dir=out, prefix=f".{SUMMARY}.parquet.")
    os.close(fd)
    try:
        table.to_parquet(tmp, index=False)
        publish(tmp, out / f"{SUMMARY}.parquet")
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return csv_path
