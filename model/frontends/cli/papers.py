"""`servecast reproduce PAPER`: the model's prediction beside every claim of a publication."""

from __future__ import annotations

import os

import typer

from model.frontends.cli.output import JSON, emit

PAPER = typer.Argument(..., help="paper folder under papers/, e.g. vllm-agentx")
ONLY = typer.Option(None, "--only", help="claim ids or globs (repeatable), e.g. 'workload.*'")
WORKERS = typer.Option(min(os.cpu_count() or 1, 4), "--workers", min=1,
                       help="processes for the independent plan searches")
REPORT = typer.Option(False, "--report", help="also write papers/PAPER/report.md")


def register(app: typer.Typer) -> None:
    @app.command("reproduce")
    def reproduce_cmd(paper: str = PAPER, only: list[str] = ONLY, workers: int = WORKERS,
                      report: bool = REPORT, as_json: bool = JSON) -> None:
        """Evaluate each claim's predictor; a claim the model cannot predict shows its reason."""
        from model.frontends.answers import answered

        # the workers change how fast, not what: they stay out of the answer's key
        result = answered("reproduce", {"paper": paper, "only": sorted(only or [])},
                          lambda: _reproduced(paper, only, workers))
        if report:
            from model.validate.reproduce import write_report  # loads on use

            result["report_path"] = str(write_report(result))
        if as_json:
            emit(result, True)
            return
        for row in result["claims"]:
            if row["predicted"] is None:
                shown = f"—  ({row['reason']})"
            else:
                verdict = "ok " if row["within_tolerance"] else "OFF"
                shown = f"{row['predicted']:.4g}  {verdict} {row['rel_error']:+.1%}"
            print(f"{row['id']:<48} published {row['published']:<10.4g} predicted {shown}")
        emit({k: v for k, v in result.items() if k not in ("claims", "title")}, False)


def _reproduced(paper: str, only: list[str] | None, workers: int) -> dict:
    from model.validate.reproduce import reproduce  # loads on use

    return reproduce(paper, only=only or None, workers=workers)
