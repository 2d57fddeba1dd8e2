"""A disk cache for deterministic random draws (the workload's request sample): the same inputs
and the same sampling code always draw the same arrays, and drawing a 320,000-request sample of
an agentic profile costs a fresh process about a second, more than the rest of a `serve`.

An entry is keyed by a SHA-256 over the caller's inputs, the source of the modules that draw
(`code`) and numpy's version (its generators' streams), so editing the sampler or upgrading
numpy can never return a stale draw. It lives in `$SERVECAST_CACHE_DIR`, else
`$XDG_CACHE_HOME/servecast`, else `~/.cache/servecast`; `SERVECAST_CACHE_DIR=off` turns it off.
A directory that cannot be written, or an entry that cannot be read, only means drawing again.
The entries a process reads are touched; past LIMIT_BYTES in all, the least recently used go.
"""

from __future__ import annotations

import functools
import hashlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # numpy loads with the first draw: the cache's folder needs none of it
    import numpy as np

CACHE_ENV = "SERVECAST_CACHE_DIR"
LIMIT_BYTES = 2 * 1024**3  # an AgentX queue sample is 13-32 MB: about a hundred of them


def cache_dir() -> Path | None:
    """Where entries live (None: caching is off)."""
    chosen = os.environ.get(CACHE_ENV)
    if chosen is not None:
        return None if chosen.strip().lower() in ("", "off") else Path(chosen).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "servecast"


@functools.lru_cache(maxsize=16)
def _source_digest(path: str) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def entry_key(inputs: str, code: tuple[ModuleType, ...]) -> str:
    """The entry's name: a digest of `inputs`, the `code` modules' source and numpy's version."""
    import numpy as np

    digest = hashlib.sha256(inputs.encode())
    for module in code:
        digest.update(_source_digest(module.__file__).encode())
    digest.update(np.__version__.encode())
    return digest.hexdigest()


def cached_arrays(kind: str, key: str, draw: Callable[[], dict[str, np.ndarray]]
                  ) -> dict[str, np.ndarray]:
    """`draw()`'s named arrays, read from the entry `kind`-`key`.npz when it exists, else drawn
    and stored (written to a temporary file and renamed, so concurrent processes never read
    half an entry)."""
    import numpy as np

    folder = cache_dir()
    path = None if folder is None else folder / f"{kind}-{key}.npz"
    if path is not None and path.is_file():
        try:
            with np.load(path, allow_pickle=False) as stored:
                arrays = {name: stored[name] for name in stored.files}
            os.utime(path)  # recently used: kept the longest
            return arrays
        except (OSError, ValueError, KeyError):  # a damaged entry: draw it again
            pass
    arrays = draw()
    if path is not None:
        _store(path, arrays)
        _prune(path.parent)
    return arrays


def _prune(folder: Path) -> None:
    """Remove the least recently used entries while all of them hold more than LIMIT_BYTES."""
    try:
        entries = sorted(((p.stat().st_mtime, p.stat().st_size, p) for p in folder.glob("*.npz")),
                         key=lambda e: e[0])
        total = sum(size for _, size, _ in entries)
        for _, size, path in entries[:-1]:  # never the newest, just written
            if total <= LIMIT_BYTES:
                break
            path.unlink(missing_ok=True)
            total -= size
    except OSError:  # another process pruned first, or the folder is read-only
        return


def _store(path: Path, arrays: dict[str, np.ndarray]) -> None:
    import numpy as np

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=".npz")
        with os.fdopen(fd, "wb") as handle:
            np.savez(handle, **arrays)
        os.replace(tmp, path)
    except OSError:  # read-only or full: the cache is only a speed-up
        return
