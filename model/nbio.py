"""Notebook plumbing shared by every notebook, the batch runner and the tests.

Notebooks live in `notebooks/<name>.py` (jupytext percent format, the source of truth, never with
outputs). Running one converts it to .ipynb, executes it with papermill and reads back the
`headline.json` it wrote into its `output_dir`: batches and tests read numbers, not plots.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from model import ROOT
from model.errors import ServecastError

NOTEBOOKS = ROOT / "notebooks"
HEADLINE = "headline.json"


def _plain(value: Any) -> Any:
    from model.cli.output import _plain as plain

    return plain(value)


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


def write_headline(output_dir: str | Path, headline: dict[str, Any]) -> Path:
    """Record a notebook's headline numbers as `output_dir/headline.json`."""
    return write_atomic(Path(output_dir) / HEADLINE, json.dumps(_plain(headline), indent=2))


def read_headline(output_dir: str | Path) -> dict[str, Any]:
    return json.loads((Path(output_dir) / HEADLINE).read_text())


def notebook_names() -> list[str]:
    return sorted(p.stem for p in NOTEBOOKS.glob("*.py") if not p.stem.startswith("_"))


def notebook_path(name: str) -> Path:
    path = NOTEBOOKS / f"{name}.py"
    if not path.exists():
        raise ServecastError(f"unknown notebook {name!r}; allowed: {', '.join(notebook_names())}")
    return path


def fast_notebook_imports() -> None:
    """Skip jsonschema's optional IRI checker: `rfc3987_syntax` builds a grammar at import
    (~3 s of CPU per process) and nbformat never validates IRIs. Call before importing
    nbformat/jupytext/papermill; a no-op once they are loaded."""
    if "jsonschema" not in sys.modules:
        sys.modules.setdefault("rfc3987_syntax", None)  # type: ignore[arg-type]


def execute_notebook(notebook: Path, parameters: dict[str, Any], output_dir: str | Path,
                     timeout_s: int = 600) -> dict[str, Any]:
    """Papermill-run one jupytext notebook file into `output_dir`; return its headline numbers."""
    fast_notebook_imports()
    import jupytext
    import papermill

    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    source = jupytext.read(notebook)
    source.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                     "language": "python"}
    staged = out / f".{notebook.stem}.input.ipynb"
    jupytext.write(source, staged, fmt="ipynb")
    try:
        papermill.execute_notebook(
            str(staged), str(out / f"{notebook.stem}.ipynb"),
            parameters={**parameters, "output_dir": str(out)},
            kernel_name="python3", cwd=str(ROOT), progress_bar=False,
            execution_timeout=timeout_s, log_output=False,
        )
    finally:
        staged.unlink(missing_ok=True)
    if not (out / HEADLINE).is_file():
        raise ServecastError(f"{notebook.name} finished without writing {HEADLINE}")
    return read_headline(out)


def run_notebook(name: str, parameters: dict[str, Any], output_dir: str | Path,
                 timeout_s: int = 600) -> dict[str, Any]:
    """Execute notebook `name` (under notebooks/) into `output_dir`; return its headline."""
    return execute_notebook(notebook_path(name), parameters, output_dir, timeout_s)
