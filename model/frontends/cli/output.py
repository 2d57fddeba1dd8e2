"""One way to print results: a JSON object on stdout (`--json`) or a short human table."""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None  # JSON has no inf/nan; callers report infeasibility with a reason instead
    if hasattr(value, "model_dump"):
        return _plain(value.model_dump())
    return value


def to_json(obj: dict[str, Any]) -> str:
    return json.dumps(_plain(obj), indent=2, sort_keys=False)


def emit(obj: dict[str, Any], as_json: bool) -> None:
    """Print `obj` as JSON or as `key: value` lines (nested values as compact JSON)."""
    if as_json:
        print(to_json(obj))
        return
    for key, value in _plain(obj).items():
        shown = value if isinstance(value, (str, int, float)) or value is None else json.dumps(value)
        print(f"{key}: {shown}")
