"""Exact prefix-cache replay of `hash_ids` traces: hit rate by capacity, policy and tier.

The replay is an LRU stack-distance pass (Mattson et al. 1970): a block reference hits an LRU
cache of C blocks iff fewer than C distinct blocks were referenced since its previous use. One
O(N log N) pass (a Fenwick tree, compiled with numba when installed, else a numpy merge-sort
tree) gives the distance of every reference, so any capacity, and every tier of an inclusive
hierarchy (each tier an LRU over the same stream), is answered without re-simulating.
tests/test_cache.py checks it against a brute-force LRU.

Semantics (vLLM prefix caching, papers/research/theory.md §1.5, §8):
- a request looks its whole prompt up in the cache as it found it on arrival and hits the
  longest leading run of full blocks that are resident (the partial tail block is never cached:
  AgentX lists floor(in/64) ids);
- then it touches its blocks tail first, so its first blocks are the most recent and eviction
  takes a prompt's tail before its head (vLLM frees a finished request's blocks in reverse);
- requests are replayed in arrival order; sessions of a multi-file trace run concurrently from
  t=0; `local` hash ids are private to a root session and its subagents.

Policies:
- `lru`: every prompt block is admitted on first sighting.
- `interval`: hybrid-model state retention (seed post; vLLM PR #43447): a hit must end where a
  recurrent/SWA state checkpoint was saved: at an earlier prompt's end, or every
  `interval_tokens` (0 = prompt ends only). KV blocks stay LRU.
- `second-hit`: Marconi-style selective admission (vLLM PR #37898): a block is admitted on its
  second sighting, so one-off prefixes never displace reusable ones; its first reuse misses.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

from model.specs.errors import ServecastError
from model.specs.traces import Session

POLICIES = ("lru", "interval", "second-hit")
COLD = np.iinfo(np.int64).max // 4  # distance of a first sighting: misses at any capacity


# ------------------------------------------------------------------------------ stack distances


def _stack_distances_numpy(prev: np.ndarray, nxt: np.ndarray, at: np.ndarray) -> np.ndarray:
    """Pure-numpy fallback: d_i = #{prev_i < k < at_i : next_k >= at_i} (distinct keys touched
    after i's previous use and before position at_i) via a merge-sort tree."""
    n = len(prev)
    open_at = at - np.searchsorted(np.sort(nxt), at - 1, side="right")  # #{k<at: next_k>=at}
    d = np.full(n, COLD, dtype=np.int64)
    q = np.flatnonzero(prev >= 0)
    if q.size:
        p1 = prev[q] + 1
        d[q] = open_at[q] - (p1 - _dominance_count(nxt, p1, at[q] - 1))
    inside = (prev >= 0) & (prev >= at)  # repeated inside the same group: resident
    d[inside] = 0
    return d


def _dominance_count(y: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """For each query q: #{j < a_q : y_j <= b_q}; prefix [0, a) split into power-of-two blocks."""
    n = len(y)
    size = 1 << max(1, (n - 1).bit_length())
    big = np.int64(size + 2)
    level = np.full(size, big - 1, dtype=np.int64)
    level[:n] = y
    count = np.zeros(len(a), dtype=np.int64)
    width, k = 1, 0
    while True:
        sel = np.flatnonzero((a >> k) & 1)
        if sel.size:
            blk = (a[sel] >> (k + 1)) << 1
            flat = (np.arange(size, dtype=np.int64) // width) * big + level
            count[sel] += np.searchsorted(flat, blk * big + b[sel], side="right") - blk * width
        if width == size:
            return count
        level = np.sort(level.reshape(-1, 2 * width), axis=1, kind="stable").ravel()
        width, k = width * 2, k + 1


def _fenwick_distances(prev, bounds):  # compiled by numba when available (see _stack_kernel)
    n = prev.shape[0]
    tree = np.zeros(n + 1, dtype=np.int64)
    out = np.empty(n, dtype=np.int64)
    total = 0
    for g in range(bounds.shape[0] - 1):
        lo, hi = bounds[g], bounds[g + 1]
        # every reference of the group sees the cache as it was when the group started
        for i in range(lo, hi):
            p = prev[i]
            if p < 0:
                out[i] = COLD
            elif p >= lo:
                out[i] = 0
            else:
                s = 0
                j = p + 1
                while j > 0:
                    s += tree[j]
                    j -= j & -j
                out[i] = total - s  # markers (latest use of each key) after p
        for i in range(lo, hi):
            p = prev[i]
            if p >= 0:
                j = p + 1
                while j <= n:
                    tree[j] -= 1
                    j += j & -j
                total -= 1
            j = i + 1
            while j <= n:
                tree[j] += 1
                j += j & -j
            total += 1
    return out


def _previous_use(keys, n_keys):  # compiled by numba when available: O(N) instead of a sort
    last = np.full(n_keys, -1, dtype=np.int64)
    prev = np.empty(keys.shape[0], dtype=np.int64)
    for i in range(keys.shape[0]):
        prev[i] = last[keys[i]]
        last[keys[i]] = i
    return prev


@lru_cache(maxsize=1)
def _stack_kernel():
    try:
        import numba
    except ImportError:  # numba is optional: the numpy tree gives the same numbers, ~20x slower
        return None
    return numba.njit(cache=True)(_fenwick_distances), numba.njit(cache=True)(_previous_use)


def _prev_next(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    n = len(keys)
    order = np.argsort(keys, kind="stable")
    same = keys[order[1:]] == keys[order[:-1]]
    prev = np.full(n, -1, dtype=np.int64)
    prev[order[1:][same]] = order[:-1][same]
    nxt = np.full(n, n, dtype=np.int64)
    nxt[order[:-1][same]] = order[1:][same]
    return prev, nxt


def stack_distances(keys: np.ndarray, bounds: np.ndarray | None = None,
                    use_numba: bool = True) -> np.ndarray:
    """LRU stack distance of every reference: distinct other keys touched since its previous
    use; first sightings get COLD. With `bounds` (group start offsets, ending with len(keys)),
    every reference of a group is measured against the cache as the group found it: a request
    looks up its whole prompt before it touches anything."""
    keys = np.ascontiguousarray(keys, dtype=np.int64)
    n = len(keys)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    bounds = np.arange(n + 1, dtype=np.int64) if bounds is None else np.asarray(bounds, np.int64)
    kernels = _stack_kernel() if use_numba else None
    if kernels is not None:
        fenwick, previous = kernels
        if keys.min() >= 0 and keys.max() < 4 * n + 1024:  # dense keys: a last-seen table
            prev = previous(keys, int(keys.max()) + 1)
        else:
            prev = _prev_next(keys)[0]
        return fenwick(prev, bounds)
    prev, nxt = _prev_next(keys)
    at = np.repeat(bounds[:-1], np.diff(bounds))
    return _stack_distances_numpy(prev, nxt, at)


def sighting_index(keys: np.ndarray) -> np.ndarray:
    """0 for a key's first reference, 1 for its second, ..."""
    order = np.argsort(keys, kind="stable")
    sk = keys[order]
    starts = np.r_[0, np.flatnonzero(sk[1:] != sk[:-1]) + 1]
    group_start = np.repeat(starts, np.diff(np.r_[starts, len(sk)]))
    out = np.empty(len(keys), dtype=np.int64)
    out[order] = np.arange(len(keys)) - group_start
    return out


def policy_distances(keys: np.ndarray, policy: str, bounds: np.ndarray | None = None
                     ) -> np.ndarray:
    """Stack distances under a policy's admission rule (stream order, groups at `bounds`)."""
    check_policy(policy)
    if policy != "second-hit":
        return stack_distances(keys, bounds)
    admitted = sighting_index(keys) >= 1
    d = np.full(len(keys), COLD, dtype=np.int64)
    sub_bounds = None
    if bounds is not None:  # the same groups, counted in the admitted sub-stream
        sub_bounds = np.unique(np.r_[np.searchsorted(np.flatnonzero(admitted), bounds), 0])
    d[admitted] = stack_distances(keys[admitted], sub_bounds)
    return d


def check_policy(policy: str) -> None:
    if policy not in POLICIES:
        raise ServecastError(f"unknown cache policy {policy!r}; allowed: {', '.join(POLICIES)}")


# ---------------------------------------------------------------------------------- block stream


@dataclass(frozen=True, eq=False)
class BlockStream:
    """A trace flattened to block references. Arrays over references are in prompt order
    (request after request in replay order, block 0 first); `flip` maps to the replay's touch
    order (each request tail first) and back."""

    keys: np.ndarray  # dense block key per reference
    req: np.ndarray  # request index per reference
    pos: np.ndarray  # block position in its prompt
    starts: np.ndarray  # first reference of each request; len = requests + 1
    flip: np.ndarray  # prompt-order index <-> touch-order index (an involution)
    block_tokens: int
    input_tokens: np.ndarray  # per request
    output_tokens: np.ndarray
    t_s: np.ndarray  # arrival on the common clock
    think_time_s: np.ndarray
    api_time_s: np.ndarray  # recorded server time (nan where the trace has none)
    session: np.ndarray  # index into session_ids
    root: np.ndarray  # index into root_ids
    session_ids: tuple[str, ...]
    root_ids: tuple[str, ...]
    _sd: dict = field(default_factory=dict, repr=False)

    @property
    def requests(self) -> int:
        return len(self.input_tokens)

    @property
    def blocks(self) -> np.ndarray:
        return np.diff(self.starts)

    def distances(self, policy: str) -> np.ndarray:
        """Prompt-order stack distances of the whole stream under `policy` (cached)."""
        key = "second-hit" if policy == "second-hit" else "lru"
        if key not in self._sd:
            self._sd[key] = policy_distances(self.keys[self.flip], key, self.starts)[self.flip]
        return self._sd[key]

    def distances_within(self, mask_requests: np.ndarray, policy: str) -> np.ndarray:
        """Stack distances of the sub-stream made of the selected requests only (one replica's
        view); COLD elsewhere."""
        cache_key = (policy if policy == "second-hit" else "lru",
                     hash(np.packbits(mask_requests).tobytes()))
        if cache_key not in self._sd:
            sel_ref = mask_requests[self.req]
            touch = self.flip[np.flatnonzero(sel_ref[self.flip])]  # prompt indices, touch order
            counts = np.diff(self.starts)[mask_requests]
            bounds = np.r_[0, np.cumsum(counts)].astype(np.int64)
            values = policy_distances(self.keys[touch], policy, bounds)
            if len(self._sd) > 64:  # keep memory bounded: replicas x routings x policies
                self._sd.clear()
            self._sd[cache_key] = (touch, values)
        touch, values = self._sd[cache_key]
        out = np.full(len(self.keys), COLD, dtype=np.int64)
        out[touch] = values
        return out


def block_stream(sessions: Sequence[Session]) -> BlockStream:
    """Build the replay stream; requests without `hash_ids` cannot be replayed."""
    if not sessions:
        raise ServecastError("cache replay: the trace has no sessions")
    block_sizes = set()
    rows = []  # (t_s, session order, request order, session, request)
    session_ids = tuple(s.session_id for s in sessions)
    root_ids = tuple(dict.fromkeys(s.root_id or s.session_id for s in sessions))
    root_index = {r: i for i, r in enumerate(root_ids)}
    for si, s in enumerate(sessions):
        for ri, r in enumerate(s.requests):
            if r.hash_ids is None or r.block_tokens is None:
                raise ServecastError(f"{s.source or s.session_id}: request {ri} has no hash_ids; "
                                     "cache replay needs an AgentX or Mooncake trace")
            block_sizes.add(r.block_tokens)
            rows.append((r.t_s, si, ri))
    if len(block_sizes) != 1:
        raise ServecastError(f"cache replay: mixed block sizes {sorted(block_sizes)}; replay one "
                             "trace format at a time")
    rows.sort()
    # Namespaces: local ids are offset per root session so sessions never share by accident.
    lo = np.zeros(len(root_ids), dtype=np.int64)
    span = np.zeros(len(root_ids), dtype=np.int64)
    for s in sessions:
        if s.hash_scope == "local":
            for r in s.requests:
                if len(r.hash_ids):
                    ri = root_index[s.root_id or s.session_id]
                    hi = lo[ri] + span[ri]
                    lo[ri] = min(lo[ri], int(r.hash_ids.min()))
                    span[ri] = max(hi, int(r.hash_ids.max()) + 1) - lo[ri]
    offset = np.r_[0, np.cumsum(span)][:-1] - lo  # each root's ids land in their own range
    global_base = int(span.sum())
    global_ids = [r.hash_ids for s in sessions if s.hash_scope != "local" for r in s.requests
                  if len(r.hash_ids)]
    global_min = min((int(h.min()) for h in global_ids), default=0)
    parts, n_blocks = [], []
    inputs, outputs, times, thinks, apis, sess, roots = [], [], [], [], [], [], []
    for t_s, si, ri in rows:
        s = sessions[si]
        r = s.requests[ri]
        root = root_index[s.root_id or s.session_id]
        if s.hash_scope == "local":
            parts.append(r.hash_ids + offset[root])
        else:  # global ids share one range above every local one
            parts.append(r.hash_ids - global_min + global_base)
        n_blocks.append(len(r.hash_ids))
        inputs.append(r.input_tokens)
        outputs.append(r.output_tokens)
        times.append(t_s)
        thinks.append(r.think_time_s)
        apis.append(np.nan if r.api_time_s is None else r.api_time_s)
        sess.append(si)
        roots.append(root)
    raw = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
    _, keys = np.unique(raw, return_inverse=True)
    counts = np.asarray(n_blocks, dtype=np.int64)
    starts = np.r_[0, np.cumsum(counts)].astype(np.int64)
    req = np.repeat(np.arange(len(counts)), counts)
    pos = np.arange(len(raw), dtype=np.int64) - starts[req]
    flip = starts[req] + (starts[req + 1] - 1 - np.arange(len(raw)))
    return BlockStream(
        keys=keys.astype(np.int64), req=req, pos=pos, starts=starts, flip=flip,
        block_tokens=block_sizes.pop(), input_tokens=np.asarray(inputs, dtype=np.int64),
        output_tokens=np.asarray(outputs, dtype=np.int64), t_s=np.asarray(times, dtype=float),
        think_time_s=np.asarray(thinks, dtype=float), api_time_s=np.asarray(apis, dtype=float),
        session=np.asarray(sess),
        root=np.asarray(roots), session_ids=session_ids, root_ids=root_ids,
    )


@lru_cache(maxsize=8)
def _stream_for_paths(paths: tuple[str, ...]) -> BlockStream:
    from model.specs.traces import load_traces

    return block_stream(load_traces(paths))


def stream_for(trace) -> BlockStream:
    """A BlockStream from a stream, a list of sessions, or trace path(s) (cached per paths)."""
    if isinstance(trace, BlockStream):
        return trace
    if isinstance(trace, (str, bytes)) or hasattr(trace, "__fspath__"):
        trace = [trace]
    trace = list(trace)
    if trace and all(isinstance(t, Session) for t in trace):
        return block_stream(trace)
    from pathlib import Path

    return _stream_for_paths(tuple(str(Path(p).resolve()) for p in trace))


# --------------------------------------------------------------------------------------- replay


@dataclass(frozen=True)
class ReplayResult:
    policy: str
    capacity_tokens: dict[str, float]  # per tier, fastest first
    input_tokens: int
    hit_tokens: int
    hit_tokens_by_tier: dict[str, int]
    requests: int
    request_hit_tokens: np.ndarray = field(repr=False)  # per request (replay order)
    request_tier_tokens: np.ndarray = field(repr=False)  # requests x tiers

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.input_tokens if self.input_tokens else 0.0

    @property
    def hit_rate_by_tier(self) -> dict[str, float]:
        return {k: (v / self.input_tokens if self.input_tokens else 0.0)
                for k, v in self.hit_tokens_by_tier.items()}

    def summary(self) -> dict:
        return {"policy": self.policy, "capacity_tokens": self.capacity_tokens,
                "hit_rate": self.hit_rate, "hit_tokens": self.hit_tokens,
                "input_tokens": self.input_tokens, "requests": self.requests,
                "hit_tokens_by_tier": self.hit_tokens_by_tier,
                "hit_rate_by_tier": self.hit_rate_by_tier}


def _segment_min(values: np.ndarray, starts: np.ndarray, empty: np.ndarray) -> np.ndarray:
    """Minimum of each request's segment; `empty` where a request has no blocks."""
    counts = np.diff(starts)
    out = empty.astype(np.int64).copy()
    has = counts > 0
    if values.size:
        out[has] = np.minimum.reduceat(values, starts[:-1][has])
    return out


def _checkpoint_mask(stream: BlockStream, interval_tokens: int) -> np.ndarray:
    """References whose end is a saved state checkpoint when their request arrives: an earlier
    request's prompt ended on that block, or the position is a multiple of the interval."""
    counts = stream.blocks
    has = counts > 0
    last_ref = stream.starts[1:][has] - 1
    end_keys = stream.keys[last_ref]
    first_end = np.full(int(stream.keys.max()) + 1 if stream.keys.size else 1,
                        np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(first_end, end_keys, np.flatnonzero(has))
    mask = first_end[stream.keys] < stream.req
    if interval_tokens > 0:
        every = max(1, interval_tokens // stream.block_tokens)
        mask |= (stream.pos + 1) % every == 0
    return mask


def replay_distances(stream: BlockStream, tier_distances: Sequence[np.ndarray],
                     tier_blocks: Sequence[float], policy: str,
                     interval_tokens: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Core: per-request hit blocks and per-request-per-tier hit blocks, given each tier's
    stack distances (prompt order) and capacity in blocks. A block is served by the first tier
    that holds it; the request's hit is the leading run resident in any tier (cut back to a
    checkpoint under `interval`)."""
    resident_by_tier = [d < cap for d, cap in zip(tier_distances, tier_blocks, strict=True)]
    resident = np.logical_or.reduce(resident_by_tier) if resident_by_tier else np.zeros(
        len(stream.keys), dtype=bool)
    counts = stream.blocks
    first_miss = _segment_min(np.where(resident, counts[stream.req], stream.pos), stream.starts,
                              counts)
    run = np.minimum(first_miss, counts)
    if policy == "interval":
        ok = _checkpoint_mask(stream, interval_tokens) & (stream.pos < run[stream.req])
        # the best checkpoint is the last one inside the run: max(pos+1) over eligible refs
        run = -_segment_min(np.where(ok, -(stream.pos + 1), 0), stream.starts,
                            np.zeros(stream.requests, dtype=np.int64))
    in_hit = stream.pos < run[stream.req]
    tier_hits = np.zeros((stream.requests, len(tier_blocks)), dtype=np.int64)
    taken = ~in_hit
    for k, res in enumerate(resident_by_tier):
        here = res & ~taken
        tier_hits[:, k] = np.bincount(stream.req[here], minlength=stream.requests)
        taken |= here
    return run, tier_hits


def _tiers(capacity_tokens: float | Mapping[str, float]) -> dict[str, float]:
    tiers = dict(capacity_tokens) if isinstance(capacity_tokens, Mapping) else {
        "hbm": float(capacity_tokens)}
    if not tiers:
        raise ServecastError("cache replay: give at least one tier capacity")
    for name, cap in tiers.items():
        if cap is None or not cap >= 0:
            raise ServecastError(f"cache capacity for tier {name!r} must be >= 0 tokens, got {cap}")
    return tiers


def _blocks(capacity_tokens: float, block_tokens: int) -> int:
    """Capacity in whole blocks; infinite becomes COLD so that first sightings still miss."""
    return COLD if np.isinf(capacity_tokens) else int(min(capacity_tokens // block_tokens, COLD))


def replay(trace, capacity_tokens: float | Mapping[str, float] = np.inf, policy: str = "lru",
           interval_tokens: int = 0) -> ReplayResult:
    """Replay a trace through a prefix cache. `capacity_tokens` is one number (one HBM pool) or
    {tier: tokens} fastest first (inclusive tiers, each an LRU over the same stream)."""
    check_policy(policy)
    stream = stream_for(trace)
    tiers = _tiers(capacity_tokens)
    d = stream.distances(policy)
    caps = [_blocks(c, stream.block_tokens) for c in tiers.values()]
    run, tier_hits = replay_distances(stream, [d] * len(caps), caps, policy, interval_tokens)
    return _result(stream, policy, tiers, run, tier_hits)


def _result(stream: BlockStream, policy: str, tiers: dict[str, float], run: np.ndarray,
            tier_hits: np.ndarray) -> ReplayResult:
    b = stream.block_tokens
    hit = np.minimum(run * b, stream.input_tokens)
    tier_tokens = np.minimum(tier_hits * b, stream.input_tokens[:, None])
    return ReplayResult(
        policy=policy, capacity_tokens=tiers, input_tokens=int(stream.input_tokens.sum()),
        hit_tokens=int(hit.sum()),
        hit_tokens_by_tier={k: int(tier_tokens[:, i].sum()) for i, k in enumerate(tiers)},
        requests=stream.requests, request_hit_tokens=hit, request_tier_tokens=tier_tokens,
    )


def hit_rate_curve(trace, capacities_tokens: Sequence[float] | np.ndarray, policy: str = "lru",
                   interval_tokens: int = 0) -> np.ndarray:
    """Hit rate at each capacity (one tier), vectorized: for LRU and second-hit a request hits
    the blocks whose running maximum distance (from block 0) is below the capacity."""
    check_policy(policy)
    stream = stream_for(trace)
    caps = np.asarray(capacities_tokens, dtype=float)
    total = stream.input_tokens.sum()
    if policy == "interval":
        return np.array([replay(stream, c, policy, interval_tokens).hit_rate for c in caps])
    d = np.minimum(stream.distances(policy), len(stream.keys) + 1)
    width = np.int64(len(stream.keys) + 2)
    cm = np.maximum.accumulate(d + stream.req * width) - stream.req * width
    sorted_cm = np.sort(cm)
    blocks = np.where(np.isinf(caps), np.inf, np.floor(caps / stream.block_tokens))
    blocks = np.minimum(blocks, len(stream.keys) + 1)
    hit_blocks = np.searchsorted(sorted_cm, blocks, side="left")
    return hit_blocks * stream.block_tokens / total if total else np.zeros_like(caps)


def working_set_tokens(trace) -> int:
    """Distinct prompt tokens in full blocks: the capacity beyond which LRU equals infinite."""
    stream = stream_for(trace)
    return int(len(np.unique(stream.keys)) * stream.block_tokens)
