"""Batch grid files: which notebook to run over which parameters, validated before anything runs.

A grid YAML names a `notebook` (a name under notebooks/ or a path to a jupytext .py / .ipynb),
`parameters` fixed for every scenario and `grid` (name -> list of values); scenarios are the
cartesian product, in the grid's key order. An optional `cases` list (each a mapping of
parameters that go together, e.g. a model with its hardware and GPU count) multiplies the grid:
scenarios = cases x grid.

The file's shape is the pydantic model `GridFile`; every name it sets must be a parameter of the
notebook's `parameters` cell, and every value must have the type that cell declares (`int`,
`float`, `str`, `bool`, `list`). Every problem is one `SpecError` naming the file, the key and
what is allowed.
"""

from __future__ import annotations

import ast
import hashlib
import itertools
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, field_validator

from model import ROOT
from model.frontends.nbio import fast_notebook_imports, notebook_path
from model.specs.errors import ServecastError, SpecError
from model.specs.specio import Strict, validated

NOTEBOOK_SUFFIXES = (".py", ".ipynb")
# a batch of more scenarios than this is a typo in the grid (each one starts a kernel)
MAX_SCENARIOS = 10_000
# the parameter-cell annotations whose values a grid is checked against; other annotations
# (none, or a type this list lacks) take any value
DECLARED_TYPES: dict[str, tuple[type, ...]] = {
    "int": (int,), "float": (int, float), "str": (str,), "bool": (bool,), "list": (list,)}


def _none_as_empty(value: Any) -> Any:
    # `parameters:` with nothing under it reads as None: no fixed parameters
    return {} if value is None else value


class GridFile(Strict):
    """The on-disk schema of a grid YAML."""

    notebook: Annotated[str, Field(min_length=1)]
    parameters: dict[str, Any] = {}
    grid: dict[str, Annotated[list[Any], Field(min_length=1)]] = {}
    cases: Annotated[list[Annotated[dict[str, Any], Field(min_length=1)]],
                     Field(min_length=1)] | None = None

    _empty = field_validator("parameters", "grid", mode="before")(_none_as_empty)


@dataclass(frozen=True)
class Scenario:
    id: str
    parameters: dict[str, Any]
    swept: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Grid:
    """A validated batch grid: the notebook file, fixed parameters and swept values."""

    path: Path
    notebook: Path
    parameters: dict[str, Any]
    grid: dict[str, list[Any]]
    cases: tuple[dict[str, Any], ...] = ({},)

    def scenarios(self) -> list[Scenario]:
        names = list(self.grid)
        out = []
        for case in self.cases:
            for values in itertools.product(*(self.grid[n] for n in names)):
                swept = {**case, **dict(zip(names, values, strict=True))}
                out.append(Scenario(scenario_id(swept), {**self.parameters, **swept}, swept))
        ids = [s.id for s in out]
        if len(set(ids)) != len(ids):
            raise SpecError(self.path, "grid", "two scenarios share an id (duplicate values?)")
        return out


def scenario_id(swept: dict[str, Any]) -> str:
    """Readable, filesystem-safe and stable: `arch=kimi-k3__gpus=16` (hashed when too long)."""
    if not swept:
        return "default"
    # Empty strings (a notebook's "use the default") add nothing to the name.
    text = "__".join(f"{k}={_slug(v)}" for k, v in swept.items() if v != "") or "default"
    if len(text) > 120:
        digest = hashlib.sha1(json.dumps(swept, sort_keys=True, default=str).encode()).hexdigest()
        text = f"{text[:100]}__{digest[:10]}"
    return text


def _slug(value: Any) -> str:
    text = json.dumps(value, default=str) if isinstance(value, (list, dict)) else str(value)
    return re.sub(r"[^A-Za-z0-9._+-]+", "_", text) or "empty"


def resolve_notebook(spec: str, base: Path) -> Path:
    """A notebook name under notebooks/, or a path (relative to the grid file, then the repo)."""
    if spec.endswith(NOTEBOOK_SUFFIXES) or "/" in spec:
        if not spec.endswith(NOTEBOOK_SUFFIXES):
            raise ServecastError(f"notebook {spec!r}: a path must name a jupytext .py or an "
                                 f".ipynb file")
        for candidate in (base / spec, ROOT / spec, Path(spec)):
            if candidate.is_file():
                return candidate.resolve()
        raise ServecastError(f"notebook file {spec!r} not found (looked beside the grid file "
                             f"and in {ROOT})")
    return notebook_path(spec)


def notebook_parameters(path: Path) -> dict[str, str]:
    """Names declared in the notebook's `parameters` cell -> their annotation (or '')."""
    fast_notebook_imports()
    import jupytext  # heavy: only when a grid is loaded

    try:
        nb = jupytext.read(path)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:  # not a notebook
        raise ServecastError(f"{path}: not a readable notebook ({type(err).__name__})") from None
    for cell in nb.cells:
        if cell.cell_type == "code" and "parameters" in cell.metadata.get("tags", []):
            try:
                body = ast.parse(cell.source).body
            except SyntaxError as err:
                raise ServecastError(f"{path}: the parameters cell is not valid Python (line "
                                     f"{err.lineno}: {err.msg})") from None
            names: dict[str, str] = {}
            for node in body:
                if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                    names[node.target.id] = ast.unparse(node.annotation)
                elif isinstance(node, ast.Assign):
                    for target in node.targets:
                        if isinstance(target, ast.Name):
                            names[target.id] = ""
            return names
    raise ServecastError(f"{path}: no cell tagged 'parameters' (papermill needs one)")


def load_grid(path: str | Path) -> Grid:
    """Read and validate a grid YAML; every problem names the file and the key."""
    path = Path(path)
    spec = validated(path, GridFile)
    try:
        notebook = resolve_notebook(spec.notebook, path.parent)
        declared = notebook_parameters(notebook)
    except ServecastError as err:
        raise SpecError(path, "notebook", str(err)) from None
    cases = spec.cases or [{}]
    _check_names(path, spec, cases, notebook.name, declared)
    count = len(cases) * math.prod(len(v) for v in spec.grid.values())
    if count > MAX_SCENARIOS:
        raise SpecError(path, "grid", f"{count:,} scenarios (cases x grid); allowed: at most "
                        f"{MAX_SCENARIOS:,}: split the grid into several files")
    return Grid(path, notebook, dict(spec.parameters), {k: list(v) for k, v in spec.grid.items()},
                tuple(dict(c) for c in cases))


def _check_names(path: Path, spec: GridFile, cases: list[dict[str, Any]], notebook: str,
                 declared: dict[str, str]) -> None:
    """Each name set once, a parameter of the notebook, with a value of its declared type."""
    both = sorted(set(spec.parameters) & set(spec.grid))
    if both:
        raise SpecError(path, f"grid.{both[0]}", "also set under parameters; keep one")
    clash = sorted({n for c in cases for n in c} & (set(spec.parameters) | set(spec.grid)))
    if clash:
        raise SpecError(path, f"cases.{clash[0]}", "also set under parameters or grid; keep one")
    allowed = ", ".join(n for n in declared if n != "output_dir")
    settings = [(f"parameters.{n}", n, [v]) for n, v in spec.parameters.items()]
    settings += [(f"grid.{n}", n, values) for n, values in spec.grid.items()]
    settings += [(f"cases[{i}].{n}", n, [v]) for i, c in enumerate(cases) for n, v in c.items()]
    for key, name, values in settings:
        if name == "output_dir":
            raise SpecError(path, key, "set by the batch runner")
        if name not in declared:
            raise SpecError(path, key, f"not a parameter of {notebook}; allowed: {allowed}")
        kinds = DECLARED_TYPES.get(declared[name])
        for value in values:
            if kinds and (not isinstance(value, kinds) or (isinstance(value, bool)
                                                           and bool not in kinds)):
                raise SpecError(path, key, f"{value!r} is not of type {declared[name]}; "
                                f"allowed: {declared[name]} values ({notebook} declares "
                                f"{name}: {declared[name]})")
