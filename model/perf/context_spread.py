"""The longest of a batch's decoding contexts, for kernels that end with their longest sequence.

vLLM's Triton attention walks each sequence's context in one program on its 2D path
(`roofline.serial_walk_s`), so a decode step's attention lasts as long as the longest context in
the batch, not the mean one. For b sequences drawn from the decoding contexts (weights: the
decode steps each request spends at its context), E[longest] = sum_i x_i (F_i^b - F_(i-1)^b)
over the sorted contexts x_i and their cumulative weights F_i; b need not be whole. A step
model takes the ratio E[longest] / mean on a batch grid (`StepModel.decode_context_max_ratio`);
without one, every context equals the mean, as in a fixed-length benchmark. The simulator, which
knows each step's batch, gives the step its own longest over mean (`with_longest_context`).
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

import numpy as np

# batch sizes per rank the ratio is tabulated at (interpolated between, held past the last)
BATCH_GRID = (1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0, 24.0, 32.0, 48.0, 64.0, 96.0,
              128.0, 192.0, 256.0, 512.0)


def longest_context_ratio(contexts, weights) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(batch grid, E[longest of b contexts] / weighted mean context) of the contexts."""
    x = np.asarray(contexts, dtype=float)
    w = np.asarray(weights, dtype=float)
    keep = w > 0
    x, w = x[keep], w[keep]
    if len(x) == 0 or float(np.sum(w * x)) <= 0.0:
        return BATCH_GRID, tuple(1.0 for _ in BATCH_GRID)
    order = np.argsort(x)
    x, f = x[order], np.cumsum(w[order]) / np.sum(w)
    mean = float(np.sum(x * w[order]) / np.sum(w))
    prev = np.concatenate(([0.0], f[:-1]))
    ratios = [float(np.sum(x * (f ** b - prev ** b))) / mean for b in BATCH_GRID]
    return BATCH_GRID, tuple(round(r, 4) for r in ratios)


def with_decode_contexts(step_model, contexts, weights):
    """`step_model` with its decoding contexts' spread where its kernels feel the longest one
    (attention_backend triton); the same object otherwise, so nothing else moves."""
    if getattr(step_model, "attention_backend", "default") != "triton":
        return step_model
    return _with_ratio(step_model, longest_context_ratio(contexts, weights))


def with_longest_context(step_model, contexts):
    """`step_model` for one step of a batch at these decoding `contexts` (a simulator's step):
    its kernels that end with the longest sequence take that batch's own longest over mean."""
    if getattr(step_model, "attention_backend", "default") != "triton" or len(contexts) == 0:
        return step_model
    c = np.asarray(contexts, dtype=float)
    return _with_ratio(step_model, ((1.0,), (round(float(c.max() / c.mean()), 2),)))


@lru_cache(maxsize=1024)
def _with_ratio(step_model, ratio):
    # one object per (model, spread): step tables are kept per model object
    return replace(step_model, decode_context_max_ratio=ratio)
