"""Spec files (YAML data with provenance): the shared reading and validation machinery.

Every data file is read the same way: a top-level mapping (bad YAML is one line naming the file
and line), validated by a strict pydantic schema whose first error becomes one `SpecError` naming
the file, the dotted key and what is allowed. Dates stay text; `source:` takes one id or a list.
"""

from __future__ import annotations

import datetime
import os
import re
import tempfile
from pathlib import Path
from types import UnionType
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from model.specs.errors import SpecError

ID = r"^[A-Za-z0-9][A-Za-z0-9_-]*$"
DATE = r"^\d{4}(-\d{2}){0,2}$"  # 2026, 2026-07 or 2026-07-24


def id_list(value: Any) -> Any:
    # `source: S05` and `source: [S05, S07]` both mean a list of source ids
    return [value] if isinstance(value, str) else value


def date_text(value: Any) -> Any:
    # PyYAML reads 2026-07-24 as a date and 2026 as an int; keep dates as text (2026-07 already is).
    if isinstance(value, datetime.date):
        return value.isoformat()
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return value


def load_yaml(text: str) -> Any:
    """yaml.safe_load, through libyaml's C parser when PyYAML has it (same results, ~10x faster
    on the calibration tables)."""
    return yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


class Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


class Sourced(Strict):
    """A number's provenance: its unit, the source ids it comes from, when, and a note."""

    unit: str
    source: list[str]
    date: Annotated[str, Field(pattern=DATE)]
    note: str | None = None

    _dates = field_validator("date", mode="before")(date_text)
    _ids = field_validator("source", mode="before")(id_list)


class Source(Strict):
    title: str
    url: str | None = None
    method: str | None = None  # how the figure was obtained, where no public page gives it
    accessed: Annotated[str, Field(pattern=DATE)]
    kind: Literal["vendor", "third_party", "weak", "assumption"]

    _dates = field_validator("accessed", mode="before")(date_text)


# Validation errors -> one line naming file, key and what is allowed


def _unwrap(annotation: Any) -> Any:
    while get_origin(annotation) is Annotated:
        annotation = get_args(annotation)[0]
    return annotation


def _model_at(root: type[BaseModel], loc: tuple) -> type[BaseModel] | None:
    """The pydantic model class that the error location `loc` points into, if any."""
    current: Any = root
    for part in loc:
        current = _unwrap(current)
        if isinstance(current, type) and issubclass(current, BaseModel):
            field = current.model_fields.get(str(part))
            if field is None:
                return None
            current = field.annotation
            continue
        origin = get_origin(current)
        if origin is dict:
            current = get_args(current)[1]
        elif origin in (list, tuple):
            current = get_args(current)[0]
        elif origin in (Union, UnionType):
            members = [a for a in get_args(current) if a is not type(None)]
            current = members[0]
        else:
            return None
    current = _unwrap(current)
    return current if isinstance(current, type) and issubclass(current, BaseModel) else None


def _literal_choices(root: type[BaseModel], loc: tuple) -> list[str]:
    """Allowed values of the Literal field at `loc` (its items or, for a dict, its keys)."""
    while loc and isinstance(loc[-1], int):
        loc = loc[:-1]
    parent = _model_at(root, loc[:-1])
    if parent is None or str(loc[-1]) not in parent.model_fields:
        return []
    annotation = _unwrap(parent.model_fields[str(loc[-1])].annotation)
    if get_origin(annotation) in (list, dict):
        annotation = _unwrap(get_args(annotation)[0])
    return [str(a) for a in get_args(annotation)] if get_origin(annotation) is Literal else []


def validation_problem(error: dict, root: type[BaseModel]) -> tuple[str, str]:
    """(dotted key, problem) for the first pydantic error, phrased for a person editing YAML."""
    loc = tuple(p for p in error["loc"] if p != "[key]")
    key = ".".join(str(p) for p in loc) or "(top level)"
    kind, value = error["type"], error.get("input")
    if kind == "extra_forbidden":
        parent = _model_at(root, loc[:-1])
        allowed = ", ".join(parent.model_fields) if parent else "?"
        return key, f"unknown key; allowed keys: {allowed}"
    if kind == "missing":
        return key, "missing; this key is required"
    if kind in ("float_type", "int_type") and isinstance(value, str):
        hint = ""
        if re.fullmatch(r"[-+]?\d+(\.\d*)?e\d+", value.strip()):
            hint = f" (YAML reads {value} as text: write {value.strip().replace('e', 'e+')})"
        return key, f"expected a number, got the text {value!r}{hint}"
    if kind in ("float_type", "int_type"):
        return key, f"expected a number, got {value!r}"
    if kind == "literal_error":
        if "[key]" in error["loc"]:  # a bad dict key, e.g. peak_flops.fp16
            choices = _literal_choices(root, loc[:-1])
            return key, f"unknown key {value!r}; allowed: {', '.join(choices) or error['msg']}"
        choices = _literal_choices(root, loc)
        return key, f"{value!r} is not allowed; allowed: {', '.join(choices) or error['msg']}"
    if kind == "string_pattern_mismatch" and error["ctx"]["pattern"] == DATE:
        return key, f"{value!r} is not a date; write YYYY, YYYY-MM or YYYY-MM-DD"
    if kind == "list_type":
        return key, f"expected a list, got {value!r}"
    if kind == "string_type":
        return key, f"expected text, got {value!r}"
    if kind == "string_pattern_mismatch":
        return key, f"{value!r} does not match the required pattern {error['ctx']['pattern']}"
    if kind in ("dict_type", "model_type"):
        return key, f"expected a mapping (key: value), got {type(value).__name__}"
    if kind in ("too_short", "string_too_short"):
        what = {list: "list", dict: "mapping", str: "text"}.get(type(value), "value")
        return key, f"expected a non-empty {what}, got {value!r}"
    return key, f"{error['msg']} (got {value!r})"


def read_yaml_mapping(path: Path) -> dict:
    """A YAML file's top-level mapping; a missing file or bad YAML is a one-line SpecError."""
    if not path.is_file():
        raise SpecError(path, "file", "not found")
    try:
        data = load_yaml(path.read_text())
    except UnicodeDecodeError:
        raise SpecError(path, "file", "not UTF-8 text; allowed: a YAML text file") from None
    except OSError as err:
        raise SpecError(path, "file", f"cannot read ({err.strerror})") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"line {mark.line + 1}: " if mark is not None else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise SpecError(path, "yaml", f"not valid YAML: {where}{problem}") from None
    if not isinstance(data, dict):
        raise SpecError(path, "(top level)", "expected a mapping of keys to values")
    return data


def validated(path: Path, schema: type[BaseModel], data: Any | None = None) -> Any:
    """`data` (default: the file's mapping) checked against `schema`; errors as one SpecError."""
    raw = read_yaml_mapping(path) if data is None else data
    try:
        return schema.model_validate(raw)
    except ValidationError as err:
        key, problem = validation_problem(err.errors()[0], schema)
        raise SpecError(path, key, problem) from None


def write_atomic(path: Path, text: str) -> Path:
    """Write through a temporary file and rename, so an interrupt never leaves half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
    publish(tmp, path)
    return path


def publish(tmp: str | Path, path: Path) -> None:
    """Give a finished temporary file the usual permissions (mkstemp's 0600 would hide results
    from other users) and rename it into place."""
    mask = os.umask(0)
    os.umask(mask)
    os.chmod(tmp, 0o666 & ~mask)
    os.replace(tmp, path)
