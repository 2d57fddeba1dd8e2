"""`servecast batch GRID.yaml --out DIR`: run a notebook over a parameter grid (papermill)."""

from __future__ import annotations

from pathlib import Path

import typer

from model.frontends.cli.output import JSON, emit
from model.specs.errors import ServecastError

GRID = typer.Argument(..., help="grid YAML: notebook, parameters, grid (and optional cases)")
OUT = typer.Option(..., "--out", help="output folder (scenarios/, summary.csv, summary.parquet)")
WORKERS = typer.Option(None, "--workers", min=1, help="parallel worker processes (default: cores)")
SCHEDULER = typer.Option(None, "--scheduler", help="Dask scheduler address, e.g. tcp://host:8786")
TIMEOUT = typer.Option(600, "--timeout-s", min=1, help="per-cell execution timeout, seconds")


def register(app: typer.Typer) -> None:
    @app.command("batch")
    def batch(grid: Path = GRID, out: Path = OUT, workers: int = WORKERS,
              scheduler: str = SCHEDULER, timeout_s: int = TIMEOUT, as_json: bool = JSON) -> None:
        """Run every unfinished scenario (finished ones are skipped). If any failed, the JSON
        still comes out, then one error line and exit status 2."""
        from model.frontends.batch import run_batch  # papermill and Dask load only when it runs

        result = run_batch(grid, out, workers=workers, scheduler=scheduler, timeout_s=timeout_s)
        report = result.as_dict()
        if not as_json:
            report["figures_under"] = str(Path(report["out_dir"]) / "scenarios")
        emit(report, as_json)
        if result.failed:
            raise ServecastError(f"{result.failed} of {result.scenarios} scenarios failed; "
                                 f"errors in {result.summary_path}")
