"""Notebook plumbing shared by every notebook, the batch runner and the tests.

Notebooks live in `notebooks/<name>.py` (jupytext percent format, the source of truth, never with
outputs). Running one converts it to .ipynb, executes it with papermill and reads back the
`headline.json` it wrote into its `output_dir`: batches and tests read numbers, not plots.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

import numpy as np

from model import ROOT
from model.specs.errors import ServecastError
from model.specs.specio import write_atomic

NOTEBOOKS = ROOT / "notebooks"
HEADLINE = "headline.json"


def plain(value: Any) -> Any:
    """`value` as JSON-ready Python: numpy scalars as numbers, non-finite floats as None (JSON
    has no inf/nan; callers report infeasibility with a reason instead), pydantic models as
    dicts, tuples as lists."""
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if hasattr(value, "model_dump"):
        return plain(value.model_dump())
    return value


def write_headline(output_dir: str | Path, headline: dict[str, Any]) -> Path:
    """Record a notebook's headline numbers as `output_dir/headline.json`."""
    return write_atomic(Path(output_dir) / HEADLINE, json.dumps(plain(headline), indent=2))


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


KERNEL_LOG = ".kernel.log"


class LiveKernels:
    """The Jupyter kernels one notebook run started and has not yet seen exit: process ->
    (connection file, ipc socket prefix). The run reaps them when it ends; a batch worker that
    is told to stop kills them first (`kill_all`)."""

    def __init__(self) -> None:
        self._kernels: dict[Any, tuple[str, str]] = {}

    def add(self, process, connection_file: str, ipc_prefix: str) -> None:
        self._kernels[process] = (connection_file, ipc_prefix)

    def reap(self, process) -> None:
        """Kill a kernel that outlived its run (its own session: kill the whole group) and
        remove its connection file and sockets."""
        connection_file, ipc_prefix = self._kernels.pop(process, ("", ""))
        if process.poll() is None:
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except OSError:
                process.kill()
            with contextlib.suppress(Exception):  # best effort; the OS reaps it with its parent
                process.wait(timeout=5)
        if connection_file:
            Path(connection_file).unlink(missing_ok=True)
        if ipc_prefix:  # the kernel's Unix sockets (`ipc_prefix`-1 ... -5)
            for sock in Path(ipc_prefix).parent.glob(Path(ipc_prefix).name + "-*"):
                sock.unlink(missing_ok=True)

    def kill_all(self) -> None:
        """Kill every kernel still tracked."""
        for process in list(self._kernels):
            self.reap(process)


def _kernel_manager_class(log_path: Path, kernels: LiveKernels):
    """An nbclient kernel manager whose kernel writes its own stdout/stderr to `log_path` and
    is tracked in `kernels`.

    The kernel process logs to the terminal otherwise: ipykernel's transport warning at start,
    `KeyboardInterrupt caught in kernel` when jupyter_client interrupts it before every
    shutdown, and any fd-level print, which would land in `servecast batch --json`'s stdout.

    Kernels talk over Unix sockets under a path of their own (transport ipc), not TCP: with
    TCP, jupyter_client picks free ports and the kernel binds them later, and a kernel started
    in between by another batch worker can take one first ("ZMQError: Address already in use":
    the kernel dies before replying)."""
    from jupyter_client.manager import AsyncKernelManager  # heavy: only when a notebook runs
    from traitlets import default

    class LoggedKernelManager(AsyncKernelManager):
        @default("transport")
        def _transport_default(self):
            return "ipc"

        @default("ip")
        def _ip_default(self):
            return os.path.join(tempfile.gettempdir(), f"servecast-{uuid.uuid4().hex[:16]}-ipc")

        async def _async_launch_kernel(self, kernel_cmd, **kw):
            with open(log_path, "ab") as log:
                kw["stdout"] = kw["stderr"] = log
                await super()._async_launch_kernel(kernel_cmd, **kw)
            process = getattr(self.provisioner, "process", None)
            if process is not None:
                kernels.add(process, self.connection_file, self.ip)

    return LoggedKernelManager


def execute_notebook(notebook: Path, parameters: dict[str, Any], output_dir: str | Path,
                     timeout_s: int = 600, kernels: LiveKernels | None = None) -> dict[str, Any]:
    """Papermill-run one jupytext notebook file into `output_dir`; return its headline numbers.

    The kernel's own log goes to `output_dir/.kernel.log`, kept only when the run fails. The
    kernels it starts are tracked in `kernels` (a fresh set unless given) and reaped when the
    run ends."""
    fast_notebook_imports()
    import jupytext  # heavy: only when a notebook runs
    import papermill

    kernels = LiveKernels() if kernels is None else kernels
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    source = jupytext.read(notebook)
    source.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                     "language": "python"}
    staged = out / f".{notebook.stem}.input.ipynb"
    jupytext.write(source, staged, fmt="ipynb")
    log = out / KERNEL_LOG
    log.unlink(missing_ok=True)
    try:
        papermill.execute_notebook(
            str(staged), str(out / f"{notebook.stem}.ipynb"),
            parameters={**parameters, "output_dir": str(out)},
            kernel_name="python3", cwd=str(ROOT), progress_bar=False,
            execution_timeout=timeout_s, log_output=False,
            kernel_manager_class=_kernel_manager_class(log, kernels),
        )
    finally:
        kernels.kill_all()
        staged.unlink(missing_ok=True)
    if not (out / HEADLINE).is_file():
        raise ServecastError(f"{notebook.name} finished without writing {HEADLINE}")
    log.unlink(missing_ok=True)
    return read_headline(out)


def run_notebook(name: str, parameters: dict[str, Any], output_dir: str | Path,
                 timeout_s: int = 600) -> dict[str, Any]:
    """Execute notebook `name` (under notebooks/) into `output_dir`; return its headline."""
    return execute_notebook(notebook_path(name), parameters, output_dir, timeout_s)
