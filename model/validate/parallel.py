"""Independent predictions in worker processes: the scoreboards' runs share nothing but the data
they read, so each CPU can take one."""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import Any


def fork_context():
    """fork where the OS has it (the workers inherit the loaded data and never re-run the
    caller's __main__), else spawn."""
    methods = multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("fork" if "fork" in methods else "spawn")


def default_workers(items: int, workers: int | None = None) -> int:
    """`workers` (default one per CPU), at most one per item and at least one."""
    return max(1, min(workers or os.cpu_count() or 1, items))


def ordered_map(fn: Callable[[Any], Any], items: Sequence, workers: int | None = None) -> list:
    """[fn(item) for item in items], in that order, over `default_workers` processes (in this
    process when that is one)."""
    n = default_workers(len(items), workers)
    if n == 1:
        return [fn(item) for item in items]
    with ProcessPoolExecutor(max_workers=n, mp_context=fork_context()) as pool:
        return list(pool.map(fn, items))
