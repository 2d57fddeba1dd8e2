"""Notebook plumbing shared by every notebook, the batch runner and the tests.

Notebooks live in `notebooks/<name>.py` (jupytext percent format, the source of truth, never with
outputs). Running one converts it to .ipynb, executes it with papermill and reads back the
`headline.json` it wrote into its `output_dir`: batches and tests read numbers, not plots.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from model import ROOT
from model.specs.errors import ServecastError

NOTEBOOKS = ROOT / "notebooks"
HEADLINE = "headline.json"


def _plain(value: Any) -> Any:
    from model.frontends.cli.output import _plain as plain

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


KERNEL_LOG = ".kernel.log"
# Kernels this process started and has not yet seen exit: Popen -> (connection file, ipc socket
# prefix). A batch worker that is told to stop kills them (`kill_kernels`) before it exits.
_LIVE_KERNELS: dict[Any, tuple[str, str]] = {}


def _kernel_manager_class(log_path: Path, started: list):
    """An nbclient kernel manager whose kernel writes its own stdout/stderr to `log_path`.

    The kernel process logs to the terminal otherwise: ipykernel's transport warning at start,
    `KeyboardInterrupt caught in kernel` when jupyter_client interrupts it before every
    shutdown, and any fd-level print, which would land in `servecast batch --json`'s stdout.

    Kernels talk over Unix sockets under a path of their own (transport ipc), not TCP: with
    TCP, jupyter_client picks free ports and the kernel binds them later, and a kernel started
    in between by another batch worker can take one first ("ZMQError: Address already in use",
    seen under pytest -n 2: the kernel dies before replying)."""
    import uuid

    from jupyter_client.manager import AsyncKernelManager
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
                started.append(process)
                _LIVE_KERNELS[process] = (self.connection_file, self.ip)

    return LoggedKernelManager


def _reap(process) -> None:
    """Kill a kernel that outlived its run (its own session: kill the whole group)."""
    import signal

    connection_file, ipc_prefix = _LIVE_KERNELS.pop(process, ("", ""))
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


def kill_kernels() -> None:
    """Kill every kernel this process started that is still running (batch workers on stop)."""
    for process in list(_LIVE_KERNELS):
        _reap(process)


def execute_notebook(notebook: Path, parameters: dict[str, Any], output_dir: str | Path,
                     timeout_s: int = 600) -> dict[str, Any]:
    """Papermill-run one jupytext notebook file into `output_dir`; return its headline numbers.

    The kernel's own log goes to `output_dir/.kernel.log`, kept only when the run fails."""
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
    log = out / KERNEL_LOG
    log.unlink(missing_ok=True)
    started: list = []
    try:
        papermill.execute_notebook(
            str(staged), str(out / f"{notebook.stem}.ipynb"),
            parameters={**parameters, "output_dir": str(out)},
            kernel_name="python3", cwd=str(ROOT), progress_bar=False,
            execution_timeout=timeout_s, log_output=False,
            kernel_manager_class=_kernel_manager_class(log, started),
        )
    finally:
        for process in started:
            _reap(process)
        staged.unlink(missing_ok=True)
    if not (out / HEADLINE).is_file():
        raise ServecastError(f"{notebook.name} finished without writing {HEADLINE}")
    log.unlink(missing_ok=True)
    return read_headline(out)


def run_notebook(name: str, parameters: dict[str, Any], output_dir: str | Path,
                 timeout_s: int = 600) -> dict[str, Any]:
    """Execute notebook `name` (under notebooks/) into `output_dir`; return its headline."""
    return execute_notebook(notebook_path(name), parameters, output_dir, timeout_s)
