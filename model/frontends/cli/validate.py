"""`servecast validate [SET...]`: the model against every measured set, one scoreboard."""

from __future__ import annotations

import typer

from model.frontends.cli.output import JSON, emit
from model.validate.registry import percent, set_names  # no numpy, no model code

SETS = typer.Argument(None, metavar="SET...",
                      help=f"measured sets (default: all): {', '.join(set_names())}")
NAME_WIDTH = max(len(name) for name in set_names())
REPORT = typer.Option(False, "--report", help="also write each set's <set>_scoreboard.md "
                                              "beside its data")
VERBOSE = typer.Option(False, "--verbose", "-v", help="also print the scores per slice")
CROSS = typer.Option(False, "--cross-validate",
                     help="recompute held-out errors where a set can (calibration: a refit per "
                          "fold, minutes) instead of reading the stored ones")


def register(app: typer.Typer) -> None:
    app.command("validate")(validate_cmd)


def set_lines(result: dict, verbose: bool) -> list[str]:
    """One line per metric of a set (runs, predicted, median |error|, median error, held-out
    median |error|), then with `verbose` one line per slice value and metric."""
    lines = []
    for m, v in result["median_abs_error"].items():
        held = ", ".join(f"{scheme} {percent(s['median_abs_error'].get(m))}"
                         for scheme, s in (result.get("held_out") or {}).items())
        lines.append(f"{result['name']:<{NAME_WIDTH}} {m:<24} {result['rows']:>6} {result['predicted']:>9}"
                     f" {percent(v):>12} {percent(result['median_error'][m], True):>11}  {held}")
    if verbose:
        for key, by_value in result["slices"].items():
            for value, s in by_value.items():
                for m, v in s["median_abs_error"].items():
                    lines.append(f"  {key + '=' + value:<42} {m:<24} {s['rows']:>6} "
                                 f"{s['predicted']:>9} {percent(v):>12} "
                                 f"{percent(s['median_error'][m], True):>11}")
    return lines


def validate_cmd(sets: list[str] = SETS, report: bool = REPORT, verbose: bool = VERBOSE,
                 cross_validate: bool = CROSS, as_json: bool = JSON) -> None:
    """Score the model on measured sets: median |error| and median error (predicted / measured
    - 1) per metric, overall and per slice (chip, vendor, model, backend, mode, load band)."""
    from model.validate.scoreboard import validate, write_report

    result = validate(sets or None, cross_validate)
    results = result.get("sets", [result])
    if report:
        for r in results:
            r["report_path"] = str(write_report(r))
    if as_json:
        emit(result, True)
        return
    print(f"{'set':<{NAME_WIDTH}} {'metric':<24} {'runs':>6} {'predicted':>9} {'median |err|':>12} "
          f"{'median err':>11}  held-out median |err|")
    for r in results:
        print("\n".join(set_lines(r, verbose)))
        if report:
            print(f"{'':<{NAME_WIDTH}} report: {r['report_path']}")
