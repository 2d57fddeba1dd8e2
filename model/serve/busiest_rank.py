"""What a step of lock-stepped DP ranks costs when several ranks carry prefill: the busiest sets it.

Attention, dense layers and sends run per rank, so the rank with the most prefill sets the step;
the expert group sees every rank's tokens. `others_cost` prices the other ranks' share through
the experts, `shared_chunk_cost` the same for whole chunks (FCFS ranks, model.serve.lockstep),
`AdmittingStep` an admitting step of threshold-mode ranks each holding a Poisson number of
chunks, and `others_above` what the other ranks add above a rank's own chunk (a step lasts as
long as the tallest rank's pile, not the sum).
"""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING

import numpy as np

from model.serve.queueing import expected_max_occupancy
from model.specs.probability import poisson_cdf, poisson_pmf

if TYPE_CHECKING:
    from model.serve.rank_engine import PrefillRuns, RankEngine


def others_cost(eng: RankEngine, own_tokens, every_tokens, own_seqs, every_seqs,
                decode_batch: float) -> np.ndarray:
    """Seconds the other lock-stepped ranks' prefill adds to a step whose busiest rank holds
    `own_tokens` (`own_seqs` equal sequences) of the `every_tokens` (`every_seqs`) on all ranks:
    attention runs per rank, so the busiest sets it, but the expert group sees every rank's
    tokens."""
    c_d, b_all = eng.decode_context_tokens, eng.dp * decode_batch
    alone = np.asarray(eng.step_model.step_time_s(own_tokens, c_d, b_all, c_d, own_seqs,
                                                  prefill_ranks=1.0), float)
    shared = np.asarray(eng.step_model.step_time_s(
        every_tokens, c_d, b_all, c_d, every_seqs,
        prefill_ranks=np.asarray(every_seqs) / own_seqs), float)
    return np.maximum(shared - alone, 0.0)


def shared_chunk_cost(eng: RankEngine, chunk_tokens: float, decode_batch: float) -> np.ndarray:
    """Seconds j full chunks on j lock-stepped ranks add over one (j = 0..dp) through the expert
    group (DSV4 DEP8 on B300: ~42 ms per further 8K chunk, whatever the context)."""
    j = np.arange(1, eng.dp + 1, dtype=float)
    return np.r_[0.0, others_cost(eng, chunk_tokens, j * chunk_tokens, 1.0, j, decode_batch)]


class AdmittingStep:
    """Extension of an admitting step of lock-stepped ranks with a prefill threshold, each rank
    holding a Poisson number of chunks: the busiest rank's chunks together (their attention at
    their contexts, their matrix work as one block: a chunk alone at a light decode batch pays
    the weights' reads that several share), plus the other ranks' tokens in the expert group.
    On DSV4 Pro DEP8 on B300 at 6.5 decodes a rank, one 512-token chunk adds 51.7 ms and each
    of four 42.0 ms, so pricing each chunk alone overstates a pile of them."""

    def __init__(self, eng: RankEngine, runs: PrefillRuns, chunk_tokens: float,
                 decode_batch: float, free_tokens: float):
        tab, bb = eng.table, max(decode_batch, eng.min_decode_batch)
        low = float(tab.context_tokens_grid[0])  # a context too short for attention to count
        k, rem = runs.chunks, runs.last_chunk_tokens
        flat = (k - (rem > 0)) * float(tab.extension_at_chunk(chunk_tokens, low, bb)) + np.where(
            rem > 0, tab.extension(np.maximum(rem, 1.0), np.full(len(rem), low), bb), 0.0)
        chunks = max(float(k.sum()), 1e-12)
        self.attention_s = max(float(runs.extension_s.sum() - flat.sum()), 0.0) / chunks
        self.tokens_per_chunk = float(eng.sample.uncached_tokens.sum()) / chunks
        # chunks a rank's budget holds: a last partial chunk leaves its room to the next prompt
        self.room_chunks = free_tokens / max(self.tokens_per_chunk, 1.0)
        self.eng, self.decode_batch = eng, decode_batch
        self.short_context_tokens, self.decode_batch_floor = low, bb

    def extension_s(self, m: float, table: np.ndarray | None = None
                    ) -> tuple[float, np.ndarray]:
        """Mean admitting-step extension at `m` chunks per rank on average: a Poisson number of
        dp m in each step (whole counts, then averaged: a chunk alone costs more than its share
        of several, so a fraction of one would cost too much). Returns it with the counts table
        it read (`counts_table`, kept from `table` while that reaches far enough)."""
        mean = self.eng.dp * m
        table = self.counts_table(mean + 12.0 * np.sqrt(mean) + 12.0, table)
        return float(poisson_pmf(np.arange(len(table)), mean) @ table), table

    def at(self, top: np.ndarray, total: np.ndarray) -> np.ndarray:
        """Extension of admitting steps with `top` chunks on the busiest rank, `total` on all."""
        top = np.maximum(np.asarray(top, float), 0.0)
        total = np.maximum(np.asarray(total, float), top)
        tokens, low, bb = self.tokens_per_chunk, self.short_context_tokens, self.decode_batch_floor
        own, every = np.maximum(top * tokens, 1.0), np.maximum(total * tokens, 1.0)
        eng = self.eng
        # their matrix work as `top` sequences of `tokens` (as one sequence of top x tokens the
        # step model would add its attention over itself: 518 against 461 ms for 16 chunks)
        flat = (eng.step_time_s(own, low, bb, np.maximum(top, 1.0))
                - eng.step_time_s(0.0, 0.0, bb))
        others = others_cost(eng, own, every, np.maximum(top, 1.0), np.maximum(total, 1.0),
                             self.decode_batch)
        return np.where(top > 0, top * self.attention_s + flat + others, 0.0)

    def spread(self, chunks: np.ndarray) -> np.ndarray:
        """Extension of admitting steps holding `chunks` chunks over all ranks (a fraction: a
        mixture of the whole counts around it, as a window's steps hold), spread as sticky
        sessions spread them (uniformly)."""
        chunks = np.asarray(chunks, float)
        table = self.counts_table(float(chunks.max()) if chunks.size else 0.0)
        return np.interp(chunks, np.arange(len(table)), table)

    def counts_table(self, top: float, table: np.ndarray | None = None) -> np.ndarray:
        """`at` for 0, 1, 2, ... chunks in all (to at least `top`), the busiest rank taking no
        more than its budget (the rest waits for the next step); `table` while it reaches."""
        if table is not None and len(table) > top + 1:
            return table
        return _counts(self, max(2 * int(top) + 2, 64))


@lru_cache(maxsize=64)
def _counts(step: AdmittingStep, size: int) -> np.ndarray:
    n = np.arange(size, dtype=float)
    dp = step.eng.dp
    return step.at(np.minimum(expected_max_occupancy(n, dp), step.room_chunks),
                   np.minimum(n, dp * step.room_chunks))


def others_above(own_extension_s: np.ndarray, chunk_extension_s: float,
                 chunks_per_rank: float, dp: int) -> np.ndarray:
    """E[max(h + c N0, c M)] - h: what a lock-stepped step adds to a rank's own chunk of
    extension h when each rank packs a Poisson(m) number (`chunks_per_rank`) of chunks of
    extension c (N0 on its own rank, M the most on any of the other dp - 1): the step waits for
    the busiest."""
    h, c, m = own_extension_s, chunk_extension_s, chunks_per_rank
    n = np.arange(int(m + 12.0 * np.sqrt(m) + 12.0))
    p = poisson_pmf(n, m)
    q = np.diff(np.r_[0.0, poisson_cdf(n, m) ** (dp - 1)])  # pmf of the others' most
    cum_q, cum_jq = np.cumsum(q), np.cumsum(n * q)
    own = np.asarray(h, float)[:, None] + c * n[None, :]  # (h, N0)
    idx = np.clip(np.floor(own / max(c, 1e-300)).astype(int), -1, len(n) - 1)
    below = np.where(idx >= 0, cum_q[np.maximum(idx, 0)], 0.0)
    above_j = cum_jq[-1] - np.where(idx >= 0, cum_jq[np.maximum(idx, 0)], 0.0)
    step = own * below + c * above_j  # E over M of max(own, c M)
    return (step * p[None, :]).sum(axis=1) - np.asarray(h, float)
