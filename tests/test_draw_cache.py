"""The disk cache of workload draws (model.specs.draw_cache): a cached draw is the sampler's own
draw, array for array; any change to what was drawn is a new entry; off means nothing written."""

from __future__ import annotations

import os

import numpy as np
import pytest

from model.specs import draw_cache
from model.specs.workload import MIX_FIELDS, _draw_mix, load_workload

N = 3000  # requests per draw: small, the cache does not care about size


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv(draw_cache.CACHE_ENV, str(tmp_path))
    return tmp_path


def _same(a, b) -> bool:
    return all((getattr(a, f) is None and getattr(b, f) is None)
               or np.array_equal(getattr(a, f), getattr(b, f)) for f in MIX_FIELDS)


def test_a_cached_draw_is_the_samplers_own_draw(cache):
    # agentx-v1 has subagents (wall weights below 1), so all five arrays go through the entry
    w = load_workload("agentx-v1")
    fresh = _draw_mix(w, N, 3)
    first = w.request_mix(N, 3)
    entries = list(cache.glob("request-mix-*.npz"))
    second = w.request_mix(N, 3)  # read back from the entry
    assert len(entries) == 1
    assert fresh.wall_weight is not None
    assert _same(first, fresh) and _same(second, fresh)


def test_another_seed_or_profile_is_another_entry(cache):
    w = load_workload("agentx-v1")
    w.request_mix(N, 0)
    w.request_mix(N, 1)
    changed = w.model_copy(update={"reset_probability": 0.5})
    drawn = changed.request_mix(N, 0)
    assert len(list(cache.glob("request-mix-*.npz"))) == 3
    assert _same(drawn, _draw_mix(changed, N, 0))


def test_a_damaged_entry_is_drawn_again(cache):
    w = load_workload("agentx-v1")
    w.request_mix(N, 5)
    (entry,) = cache.glob("request-mix-*.npz")
    entry.write_bytes(b"not an npz")
    assert _same(w.request_mix(N, 5), _draw_mix(w, N, 5))


def test_off_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv(draw_cache.CACHE_ENV, "off")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    w = load_workload("agentx-v1")
    assert _same(w.request_mix(N, 7), _draw_mix(w, N, 7))
    assert draw_cache.cache_dir() is None
    assert not any(tmp_path.rglob("*.npz"))


def test_past_the_limit_the_least_recently_used_entries_go(cache, monkeypatch):
    # three entries of about 100 KB (3,000 requests x 5 float64 arrays + npz headers); a limit
    # of two of them keeps the two most recently used: the first, read again, and the third
    w = load_workload("agentx-v1")
    w.request_mix(N, 0)
    (first,) = cache.glob("request-mix-*.npz")
    size = first.stat().st_size
    monkeypatch.setattr(draw_cache, "LIMIT_BYTES", 2 * size + size // 2)
    w.request_mix(N, 1)
    second = next(p for p in cache.glob("request-mix-*.npz") if p != first)
    os.utime(second, (1.0, 1.0))  # used long ago
    w.request_mix(N, 0)  # a read touches the first
    w.request_mix(N, 2)
    left = set(cache.glob("request-mix-*.npz"))
    assert first in left and second not in left and len(left) == 2
