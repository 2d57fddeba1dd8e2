"""The step model tabulated once, for the two tiers of the serving model.

`StepTable` (screening tier, model.plan.screening): step time over a shared (prefill tokens, decode
sequences) grid at the traffic's mean context, bilinear in log1p space; plans stack into one
array, so every candidate of a search is a few numpy operations.

`ExtensionTable` (full tier, model.serve.rank_engine): the decode step over the decode batch,
and the time a prefill chunk adds to a step over (decodes, chunk tokens, context) at the decode
context, linear between grid points of geometric grids (step times affine in tokens are exact).
Both read `step_time_s` of one step model; on lock-stepped DP ranks one rank carries the prefill
and every rank its decodes (`lockstep_step_time_s`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np


def lockstep_step_time_s(step_model, dp: int, decode_context_tokens: float, prefill_tokens,
                         prefill_context_tokens, decode_batch, prefill_seqs=1.0) -> np.ndarray:
    """Step time when one rank carries the prefill tokens (in `prefill_seqs` sequences) and
    every rank `decode_batch` decodes: the lock-stepped ranks wait for it, and the expert group
    sees its tokens plus all decodes (the step model's prefill_ranks=1)."""
    p, pctx, b, c_d = prefill_tokens, prefill_context_tokens, decode_batch, decode_context_tokens
    if dp == 1:
        return np.asarray(step_model.step_time_s(p, pctx, b, c_d, prefill_seqs), float)
    return np.asarray(step_model.step_time_s(np.asarray(p, float), pctx,
                                             dp * np.asarray(b, float), c_d,
                                             np.asarray(prefill_seqs, float), prefill_ranks=1.0),
                      float)


@lru_cache(maxsize=32)
def extension_table(step_model, dp: int, decode_context_tokens: float,
                    max_num_batched_tokens: int, max_num_seqs: int) -> ExtensionTable:
    """The full tier's table of one step model (kept by identity) and engine policy at a decode
    context; a serve() sweep over loads asks for the same one again."""
    return ExtensionTable.build(step_model, dp, decode_context_tokens, max_num_batched_tokens,
                                max_num_seqs)


def step_grid(p_max: float, b_max: float, points: int = 28) -> tuple[np.ndarray, np.ndarray]:
    """The (prefill tokens, decode seqs) grid every step table uses: `points` + 1 nodes from 0,
    evenly spaced in log1p, so a lookup finds its cell by one multiply (no search)."""
    return tuple(np.expm1(np.linspace(0.0, np.log1p(max(top, 2.0)), points + 1))
                 for top in (p_max, b_max))


class StepTable:
    """Step times of one or more plans on a shared (prefill tokens, decode seqs) grid at the
    traffic's context, bilinear in log1p space. One vectorized step-model call per plan builds it;
    `stack` joins plans so candidates of all plans are evaluated in one array operation."""

    def __init__(self, step_model, context: float, chunk: float, p_max: float, b_max: float,
                 points: int = 28, grid: tuple[np.ndarray, np.ndarray] | None = None):
        self.step_model = step_model
        self.p_grid, self.b_grid = grid if grid is not None else step_grid(p_max, b_max, points)
        p, b = np.meshgrid(self.p_grid, self.b_grid, indexing="ij")
        seqs = np.maximum(p / max(chunk, 1.0), 1.0)
        dp = int(getattr(getattr(step_model, "plan", None), "dp", 1) or 1)
        # DP plans also get the table with all prefill on one rank, in the same vectorized call
        ranks = np.array([dp, 1.0]).reshape(2, 1, 1) if dp > 1 else None
        t = np.asarray(step_model.step_time_s(p, context, b, context, seqs,
                                              **({"prefill_ranks": ranks} if dp > 1 else {})),
                       float)
        t = np.broadcast_to(t, ((2,) if dp > 1 else ()) + p.shape).copy()
        t[..., 0, 0] = t[..., 0, 1]  # an empty step never runs; keep the table monotone
        self.tables = t[:1] if dp > 1 else t[None]
        self._tables_one = t[1:] if dp > 1 else self.tables
        self._set_log_grid()

    def _set_log_grid(self):
        self._lp, self._lb = np.log1p(self.p_grid), np.log1p(self.b_grid)
        self._inv_dp, self._inv_db = (self._inverse_steps(g) for g in (self._lp, self._lb))

    @staticmethod
    def _inverse_steps(log_grid):
        """1 / cell width in log1p: one number on an evenly spaced grid (step_grid's), else per
        cell (a grid given by the caller)."""
        steps = np.diff(log_grid)
        return 1.0 / steps[0] if np.allclose(steps, steps[0], rtol=1e-9) else 1.0 / steps

    @property
    def tables_one(self) -> np.ndarray:
        """The same grid with all prefill tokens on one DP rank (the others decode and wait)."""
        return self._tables_one

    @classmethod
    def stack(cls, tables: list[StepTable], scales=None) -> StepTable:
        """One table of several plans; `scales` multiplies each plan's step times (the
        disaggregated decode workers' engine factor)."""
        first = tables[0]
        for t in tables[1:]:
            if not (np.array_equal(t.p_grid, first.p_grid) and np.array_equal(t.b_grid,
                                                                              first.b_grid)):
                raise ValueError("StepTable.stack: tables must share one grid")
        out = cls.__new__(cls)
        out.step_model = None
        out.p_grid, out.b_grid = first.p_grid, first.b_grid
        out._set_log_grid()
        k = np.ones(len(tables)) if scales is None else np.asarray(scales, float)
        out.tables = np.concatenate([t.tables * f for t, f in zip(tables, k, strict=True)])
        out._tables_one = np.concatenate([t.tables_one * f for t, f in zip(tables, k,
                                                                             strict=True)])
        return out

    def __call__(self, prefill_tokens, decode_seqs, which=0) -> np.ndarray:
        """Step time, prefill tokens spread evenly over the DP ranks; `which` selects the plan
        of a stacked table (broadcast with the others)."""
        return self._lookup(self.tables, prefill_tokens, decode_seqs, which)

    def decode(self, decode_seqs, which=0) -> np.ndarray:
        """Step time of a decode-only step: `self(0, decode_seqs, which)` on the table's first
        row, without locating a prefill coordinate (the search's inner loops call it most)."""
        j, fb = self._b_index(decode_seqs)
        base = np.asarray(which) * (len(self.p_grid) * len(self.b_grid)) + j
        flat = self.tables.reshape(-1)
        return flat.take(base) * (1 - fb) + flat.take(base + 1) * fb

    def busiest(self, rank_tokens, total_tokens, decode_seqs, dp, which=0) -> np.ndarray:
        """Step time when the busiest DP rank carries `rank_tokens` prefill tokens and all ranks
        `total_tokens`: the lock-stepped ranks wait for the busiest one's attention and dense
        layers while the experts see the total. Linear in the total between the one-rank case
        (total = rank_tokens) and the even one (total = dp * rank_tokens)."""
        x = np.asarray(rank_tokens, float)
        dp = np.asarray(dp, float)
        j, fb = self._b_index(decode_seqs)
        one = self._interp(self.tables_one, *self._p_index(x), j, fb, which)
        even = self._interp(self.tables, *self._p_index(x * dp), j, fb, which)
        span = np.maximum(x * (dp - 1.0), 1e-9)
        w = np.clip((np.asarray(total_tokens, float) - x) / span, 0.0, 1.0)
        return one + w * (even - one)

    def _lookup(self, tables, prefill_tokens, decode_seqs, which) -> np.ndarray:
        return self._interp(tables, *self._p_index(prefill_tokens), *self._b_index(decode_seqs),
                            which)

    @staticmethod
    def _index(grid, log_grid, inv_step, values):
        """(cell, fraction) of `values` on a log1p grid, clamped to its ends."""
        # log(1 + v), not log1p: ~2x faster here, and v (tokens, sequences) is never tiny
        lv = np.log(1.0 + np.minimum(np.maximum(values, 0.0), grid[-1]))
        if np.ndim(inv_step) == 0:  # evenly spaced: the cell is the scaled position's floor
            pos = lv * inv_step
            i = np.minimum(pos.astype(np.intp), len(log_grid) - 2)
            return i, pos - i
        i = np.minimum(np.maximum(np.searchsorted(log_grid, lv) - 1, 0), len(log_grid) - 2)
        return i, (lv - log_grid[i]) * inv_step[i]

    def _p_index(self, prefill_tokens):
        return self._index(self.p_grid, self._lp, self._inv_dp, prefill_tokens)

    def _b_index(self, decode_seqs):
        return self._index(self.b_grid, self._lb, self._inv_db, decode_seqs)

    def _interp(self, tables, i, fp, j, fb, which) -> np.ndarray:
        nb = len(self.b_grid)
        flat = tables.reshape(-1)
        base = (np.asarray(which) * len(self.p_grid) + i) * nb + j
        t00, t01 = flat.take(base), flat.take(base + 1)
        t10, t11 = flat.take(base + nb), flat.take(base + nb + 1)
        return (t00 + fp * (t10 - t00)) * (1 - fb) + (t01 + fp * (t11 - t01)) * fb



@dataclass(frozen=True)
class ExtensionTable:
    """The step model tabulated once per (model, policy, decode context): decode step time over
    the decode batch, and the prefill extension (the time a chunk adds to a step) over (decodes,
    chunk tokens, context), linear between grid points (geometric grids, so step times affine in
    tokens are exact)."""

    step_model: object
    decode_step_s: tuple[np.ndarray, np.ndarray]  # (decode batch grid, decode step seconds)
    decode_batch_grid: np.ndarray
    chunk_tokens_grid: np.ndarray
    context_tokens_grid: np.ndarray
    extension_s: np.ndarray  # [decode batch, chunk tokens, context]

    @staticmethod
    def build(step_model, dp: int, decode_context_tokens: float, max_num_batched_tokens: int,
              max_num_seqs: int) -> ExtensionTable:
        def t(p, pctx, b):
            return lockstep_step_time_s(step_model, dp, decode_context_tokens, p, pctx, b)

        seqs = float(max(max_num_seqs, 2))
        low = np.arange(1.0, dp) / dp  # 1 .. dp - 1 decodes on the whole replica
        b_dec = np.unique(np.r_[low, np.arange(1.0, min(seqs, 32.0) + 1),
                                np.geomspace(32, seqs, 48) if seqs > 32 else []])
        t_dec = t(0.0, 0.0, b_dec)
        b_grid = np.unique(np.r_[low[:1], low[1::2], 1.0, 2.0, 4.0, np.geomspace(1, seqs, 10)])
        p_grid = np.unique(np.r_[np.geomspace(1, max_num_batched_tokens, 26)])
        c_grid = np.geomspace(16, 4e6, 26)
        bb, pp, cc = np.meshgrid(b_grid, p_grid, c_grid, indexing="ij")
        full = t(pp, cc, bb)
        base = t(0.0, 0.0, b_grid)[:, None, None]
        return ExtensionTable(step_model, (b_dec, t_dec), b_grid, p_grid, c_grid,
                              np.maximum(full - base, 0.0))

    def _plane(self, decode_batch: float) -> np.ndarray:
        """The extension over (chunk tokens, context) at a decode batch (b)."""
        grid, b = self.decode_batch_grid, decode_batch
        j = int(np.clip(np.searchsorted(grid, b) - 1, 0, len(grid) - 2))
        w = float(np.clip((b - grid[j]) / (grid[j + 1] - grid[j]), 0, 1))
        return (1 - w) * self.extension_s[j] + w * self.extension_s[j + 1]

    def _chunk_index(self, chunk_tokens):
        """(cell, fraction) of chunk sizes on the chunk grid, clamped to its ends."""
        grid = self.chunk_tokens_grid
        x = np.clip(np.asarray(chunk_tokens, float), grid[0], grid[-1])
        i = np.clip(np.searchsorted(grid, x) - 1, 0, len(grid) - 2)
        return i, (x - grid[i]) / (grid[i + 1] - grid[i])

    def extension_at_chunk(self, chunk_tokens: float, context_tokens, decode_batch: float
                           ) -> np.ndarray:
        """`extension` for one chunk size over many contexts (same bilinear interpolation,
        reduced to one np.interp along the context grid)."""
        plane = self._plane(decode_batch)
        grid, ctx = self.chunk_tokens_grid, context_tokens
        x = float(np.clip(chunk_tokens, grid[0], grid[-1]))
        i = int(np.clip(np.searchsorted(grid, x) - 1, 0, len(grid) - 2))
        fx = (x - grid[i]) / (grid[i + 1] - grid[i])
        column = (1 - fx) * plane[i] + fx * plane[i + 1]
        return np.maximum(np.interp(np.asarray(ctx, float), self.context_tokens_grid, column),
                          0.0)

    def context_index(self, context_tokens) -> tuple[np.ndarray, np.ndarray]:
        """(cell, fraction) of contexts on the context grid, clamped to its ends."""
        grid = self.context_tokens_grid
        y = np.clip(np.asarray(context_tokens, float), grid[0], grid[-1])
        k = np.clip(np.searchsorted(grid, y) - 1, 0, len(grid) - 2)
        return k, (y - grid[k]) / (grid[k + 1] - grid[k])

    def extension_at_contexts(self, chunk_tokens, index, decode_batch: float) -> np.ndarray:
        """`extension` at contexts pre-indexed by `context_index` (fixed per request sample)."""
        plane = self._plane(decode_batch)
        k, fy = index
        i, fx = self._chunk_index(chunk_tokens)
        lo = plane[i, k] + fy * (plane[i, k + 1] - plane[i, k])
        hi = plane[i + 1, k] + fy * (plane[i + 1, k + 1] - plane[i + 1, k])
        return np.maximum(lo + fx * (hi - lo), 0.0)

    def extension(self, chunk_tokens, context_tokens, decode_batch: float) -> np.ndarray:
        """Step time a chunk of prefill tokens at its end-of-chunk context adds to a step of
        `decode_batch` decodes per rank."""
        plane = self._plane(decode_batch)
        i, fx = self._chunk_index(chunk_tokens)
        k, fy = self.context_index(context_tokens)
        v = ((1 - fx) * (1 - fy) * plane[i, k] + fx * (1 - fy) * plane[i + 1, k]
             + (1 - fx) * fy * plane[i, k + 1] + fx * fy * plane[i + 1, k + 1])
        return np.maximum(v, 0.0)
