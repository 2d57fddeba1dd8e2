"""One way to print results: a JSON object on stdout (`--json`) or a short human table."""

from __future__ import annotations

import json
from typing import Any

import typer

JSON = typer.Option(False, "--json", help="Print one JSON object on stdout.")


def to_json(obj: dict[str, Any]) -> str:
    from model.frontends.nbio import plain  # loads numpy: only once a command has a result

    return json.dumps(plain(obj), indent=2, sort_keys=False)


def emit(obj: dict[str, Any], as_json: bool) -> None:
    """Print `obj` as JSON or as `key: value` lines (nested values as compact JSON)."""
    from model.frontends.nbio import plain

    emit_plain(plain(obj), as_json)


def emit_plain(obj: dict[str, Any], as_json: bool) -> None:
    """`emit` of an object that is JSON-ready already (an answer: model.frontends.answers)."""
    if as_json:
        print(json.dumps(obj, indent=2, sort_keys=False))
        return
    for key, value in obj.items():
        shown = value if isinstance(value, (str, int, float)) or value is None else json.dumps(value)
        print(f"{key}: {shown}")


def positive(value: float | None) -> float | None:
    """Option callback: a rate, an SLO or a duration must be above zero (unset passes)."""
    if value is not None and not value > 0:
        raise typer.BadParameter(f"must be > 0, got {value}")
    return value
