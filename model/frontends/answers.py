"""The answer cache: a command's output for the same inputs, model and data, read back from disk
instead of computed again (`servecast plan` takes seconds to a minute cold, `reproduce` minutes; a
planner asking the same question twice gets it in a fraction of a second).

An entry is keyed by a SHA-256 over the command, its arguments, the content of every argument that
names a file, and `source_digest()`: the model's source, the specs and data it reads, and the
versions of Python and the numeric libraries. Any edit to the code or the data is a new key, so an
entry can never outlive what computed it. Only answers are stored (JSON), never errors.

Entries live in `answers/` under the draw cache's folder (`$SERVECAST_CACHE_DIR`, else
`$XDG_CACHE_HOME/servecast`, else `~/.cache/servecast`), in a `diskcache` store of at most
LIMIT_BYTES, least recently used first out. `SERVECAST_CACHE_DIR=off` turns every disk cache off;
`SERVECAST_ANSWER_CACHE=off` this one alone (the tests do: they patch the model at run time, which
no key can see). A store that cannot be opened or written only means computing again.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

from model import ROOT
from model.specs.draw_cache import cache_dir

ANSWER_ENV = "SERVECAST_ANSWER_CACHE"
LIMIT_BYTES = 256 * 1024**2  # a plan's answer is 5-50 KB: thousands of them
# what the model computes with besides its arguments: hashed by content (small trees) or by
# path, size and modification time (the large ones, whose edits change both)
CONTENT = (("model", "**/*.py"), ("hardware", "*.yaml"), ("data/calibration", "*.yaml"),
           ("data/workloads", "*"), ("data/deployments", "*"), ("data/prices", "*"),
           ("data/architectures", "*.yaml"), ("data/benchmarks", "*"), ("papers", "**/*.yaml"))
STAT = (("data/architectures", "**/*.json"), ("data/traces", "**/*"),
        ("data/calibration/ops", "**/*"))
LIBRARIES = ("numpy", "scipy", "pandas", "pydantic", "pyyaml", "numba")


def answers_dir() -> Path | None:
    """The store's folder (None: the answer cache is off)."""
    if os.environ.get(ANSWER_ENV, "").strip().lower() == "off":
        return None
    base = cache_dir()
    return None if base is None else base / "answers"


@functools.lru_cache(maxsize=1)
def source_digest(root: Path = ROOT) -> str:
    """SHA-256 over the model's source and the data it reads under `root` (CONTENT, STAT) and the
    versions of Python and LIBRARIES."""
    digest = hashlib.sha256(platform.python_version().encode())
    for name in LIBRARIES:
        digest.update(f"|{name}={_version(name)}".encode())
    for folder, pattern in CONTENT:
        for path in _files(root / folder, pattern):
            digest.update(f"|{path.relative_to(root)}|".encode())
            digest.update(path.read_bytes())
    for folder, pattern in STAT:
        for path in _files(root / folder, pattern):
            st = path.stat()
            digest.update(f"|{path.relative_to(root)}|{st.st_size}|{st.st_mtime_ns}".encode())
    return digest.hexdigest()


def _files(folder: Path, pattern: str) -> list[Path]:
    return sorted(p for p in folder.glob(pattern) if p.is_file() and "__pycache__" not in p.parts)


def _version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "absent"


def answer_key(command: str, args: dict[str, Any]) -> str:
    """The entry's name for `command` run with `args` (JSON-able values; a string naming a file
    adds that file's content)."""
    digest = hashlib.sha256(f"{command}|{source_digest()}|".encode())
    digest.update(json.dumps(args, sort_keys=True, default=str).encode())
    for value in args.values():
        if isinstance(value, str) and value and Path(value).is_file():
            digest.update(f"|{Path(value).resolve()}|".encode())
            digest.update(Path(value).read_bytes())
    return digest.hexdigest()


def answered(command: str, args: dict[str, Any], compute: Callable[[], dict]) -> dict:
    """`compute()`'s answer (as JSON-ready Python, model.frontends.nbio.plain) for `command` with
    `args`: read from the store when an entry holds it, else computed and stored."""
    folder = answers_dir()
    if folder is None:
        return _plain(compute())
    key = answer_key(command, args)
    stored = _read(folder, key)
    if stored is not None:
        return stored
    out = _plain(compute())
    _write(folder, key, out)
    return out


def _plain(out: dict) -> dict:
    from model.frontends.nbio import plain

    return plain(out)


def _read(folder: Path, key: str) -> dict | None:
    import sqlite3

    import diskcache

    try:
        with diskcache.Cache(str(folder), size_limit=LIMIT_BYTES) as store:
            text = store.get(key)
        return None if text is None else json.loads(text)
    except (OSError, ValueError, sqlite3.Error, diskcache.Timeout):  # unreadable: compute again
        return None


def _write(folder: Path, key: str, out: dict) -> None:
    import sqlite3

    import diskcache

    try:
        with diskcache.Cache(str(folder), size_limit=LIMIT_BYTES) as store:
            store.set(key, json.dumps(out))
    except (OSError, sqlite3.Error, diskcache.Timeout):  # read-only or full: only a speed-up
        return
