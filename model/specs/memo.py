"""Memoization keyed by object identity, for immutable inputs that are slow to hash (nested
architecture dataclasses, hardware specs, session samples) on hot paths."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any


class IdentityMemo:
    """`get(obj, extra, compute)` returns compute() once per (obj, extra). The entry holds `obj`,
    so its id cannot be reused while the entry lives; past `max_size` entries it starts over."""

    def __init__(self, max_size: int = 256) -> None:
        self.max_size = max_size
        self._entries: dict[tuple[int, Hashable], tuple[Any, Any]] = {}

    def get(self, obj: Any, extra: Hashable, compute: Callable[[], Any]) -> Any:
        key = (id(obj), extra)
        hit = self._entries.get(key)
        if hit is not None and hit[0] is obj:
            return hit[1]
        if len(self._entries) >= self.max_size:
            self._entries.clear()
        value = compute()
        self._entries[key] = (obj, value)
        return value

    def clear(self) -> None:
        self._entries.clear()
