"""One DP rank of the engine over a request sample: what its steps cost and what each request asks.

`RankEngine` holds the step model, the engine policy, the request sample `serve` integrates over
(and the larger sample the FCFS wait law reads), and everything fixed by them: the decode steps
each request takes, the decode context, the step model tabulated once (`ExtensionTable`), each
request's lower-tier KV reload and its time in the front end. Every array runs over the request
sample. The closed loop's two
adjustments (gaps under the idle cap, the mean step a decoding request sees) give a new engine
(`with_gaps`, `with_seen_ratio`); nothing in one changes after it is built.

`prefill_runs` is where a prompt meets the step model: at a per-request chunk of r tokens, u
uncached tokens run in k = ceil(u / r) chunks, and its extension E is what those chunks add to
the steps they ride in (a full chunk at its mean end-of-chunk context, the last partial one at
the prompt's own context).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from model.perf.context_spread import with_decode_contexts
from model.perf.step_table import ExtensionTable, extension_table, lockstep_step_time_s
from model.serve.policy import EnginePolicy
from model.specs.workload import RequestMix

WINDOW_BINS = 20  # log-spaced bins of decode windows (and of threshold-mode prefill spans)


@dataclass(frozen=True)
class PrefillRuns:
    """Each request's prefill at one chunk size: its chunks, the step time they add in all, and
    its last partial chunk (tokens and extension; 0 when the prompt ends on a full chunk)."""

    chunks: np.ndarray
    extension_s: np.ndarray
    last_chunk_tokens: np.ndarray
    last_chunk_extension_s: np.ndarray

    @property
    def full_chunks(self) -> np.ndarray:
        return self.chunks - (self.last_chunk_tokens > 0)


@dataclass(frozen=True)
class RankEngine:
    """Per-rank expectations; build with `rank_engine`. `queue_sample` (None: the sample itself)
    is the FCFS wait law's sample: for session profiles the 16x draw the sample is thinned from
    (model.serve.request_mix), which holds 16x its rare cold prompts."""

    step_model: object
    sample: RequestMix
    queue_sample: RequestMix | None
    policy: EnginePolicy
    dp: int
    reload_s: np.ndarray  # per request: lower-tier KV reload, outside the queue
    mean_reload_s: float
    # per request: the front end's render and tokenization of its whole prompt. The engine sees
    # that time as part of the session's gap (a closed loop's gaps include it); TTFT counts it
    frontend_s: np.ndarray
    # the mean step a decoding sequence sees over the mean step: windows open where prefills
    # complete, so they sit in long steps more often than steps do (the closed loop's decode time)
    seen_ratio: float
    tokens_per_step: float  # speculative decoding (MTP): tokens per decode step per sequence
    decode_steps: np.ndarray  # per request: (output tokens - 1) / tokens_per_step
    mean_decode_steps: float
    decode_context_tokens: float  # output-weighted mean context of the decoding sequences
    # the fewest decodes a step holds: one sequence on the whole replica, 1 / dp per rank
    min_decode_batch: float
    table: ExtensionTable
    context_index: tuple[np.ndarray, np.ndarray]  # the sample's contexts on the table
    queue_context_index: tuple[np.ndarray, np.ndarray] | None
    # concurrent chains a subagent run plays on (model.serve.siblings); 1: independent lanes
    subagent_chains: int = 1

    @property
    def queue(self) -> RequestMix:
        """The FCFS wait law's sample."""
        return self.sample if self.queue_sample is None else self.queue_sample

    def with_gaps(self, gap_s: np.ndarray, queue_gap_s: np.ndarray | None) -> RankEngine:
        """The same engine with the sessions' gaps replaced (the idle cap's scaled gaps)."""
        queue = None if self.queue_sample is None else dataclasses.replace(
            self.queue_sample, gap_s=queue_gap_s)
        return dataclasses.replace(self, sample=dataclasses.replace(self.sample, gap_s=gap_s),
                                   queue_sample=queue)

    def with_seen_ratio(self, seen_ratio: float) -> RankEngine:
        return dataclasses.replace(self, seen_ratio=seen_ratio)

    def step_time_s(self, prefill_tokens, prefill_context, decode_batch, prefill_seqs=1.0):
        """Step time when one rank carries the prefill and every rank `decode_batch` decodes."""
        return lockstep_step_time_s(self.step_model, self.dp, self.decode_context_tokens,
                                    prefill_tokens, prefill_context, decode_batch, prefill_seqs)

    def decode_step_s(self, decode_batch: float) -> float:
        return float(np.interp(max(decode_batch, self.min_decode_batch), *self.table.decode_step_s))

    def prefill_runs(self, decode_batch: float, chunk_tokens: float) -> PrefillRuns:
        """Each request's chunks and extension at a per-request chunk of `chunk_tokens`."""
        return self._runs(self.sample, self.context_index, decode_batch, chunk_tokens)

    def queue_prefill_runs(self, decode_batch: float, chunk_tokens: float) -> PrefillRuns:
        """`prefill_runs` over the queue sample."""
        if self.queue_sample is None:
            return self.prefill_runs(decode_batch, chunk_tokens)
        return self._runs(self.queue_sample, self.queue_context_index, decode_batch,
                          chunk_tokens)

    def _runs(self, m: RequestMix, index, b: float, rate: float) -> PrefillRuns:
        kf = np.floor(m.uncached_tokens / rate)
        rem = m.uncached_tokens - kf * rate
        bb = max(b, self.min_decode_batch)
        # mean end-of-chunk context of the full chunks
        mid = (m.context_tokens - m.uncached_tokens) + rate * (kf + 1.0) / 2.0
        ext_full = np.where(kf > 0, self.table.extension_at_chunk(rate, mid, bb), 0.0)
        ext_rem = np.maximum(np.where(rem > 0, self.table.extension_at_contexts(
            np.maximum(rem, 1.0), index, bb), 0.0), 0.0)
        return PrefillRuns(kf + (rem > 0), kf * np.maximum(ext_full, 0.0) + ext_rem, rem,
                           ext_rem)

    def next_chunk_extension_s(self, room, decode_batch: float) -> np.ndarray:
        """Mean extension the next queued prompt adds when it fills `room` tokens of a step:
        E_j[ext(min(room, u_j)) at its context] over the sample (tabulated on a room grid)."""
        u = self.sample.uncached_tokens
        pick = np.linspace(0, len(u) - 1, min(len(u), 250)).astype(int)
        top = max(float(np.max(room)), 1.0)
        grid = np.r_[0.0, np.geomspace(1.0, top, 16)]
        p = np.minimum(grid[:, None], u[pick][None, :])
        ctx = (self.sample.context_tokens - u)[pick][None, :] + p
        e = self.table.extension(np.maximum(p, 1.0).ravel(), ctx.ravel(),
                                 max(decode_batch, self.min_decode_batch))
        e = np.where(p.ravel() > 0, e, 0.0).reshape(p.shape).mean(axis=1)
        return np.interp(room, grid, e)

    def merged_tail_extension_s(self, room: np.ndarray, decode_batch: float) -> np.ndarray:
        """Per prompt, the next prompt's mean extension in a predecessor's last step that this
        (one-chunk) prompt shares: E[next_chunk_extension_s(room - u) | room >= u] over the
        rooms (on a grid of u, interpolated)."""
        rooms = np.sort(room)[np.linspace(0, len(room) - 1, min(len(room), 256)).astype(int)]
        top = max(float(rooms[-1]), 1.0)
        u_grid = np.r_[0.0, np.geomspace(1.0, top, 40)]
        left = rooms[None, :] - u_grid[:, None]
        fits = left >= 0
        e = self.next_chunk_extension_s(np.maximum(left, 0.0).ravel(),
                                        decode_batch).reshape(left.shape)
        mean = (e * fits).sum(axis=1) / np.maximum(fits.sum(axis=1), 1)
        return np.interp(self.sample.uncached_tokens, u_grid, mean)

    def decode_time_s(self, mean_step_s: float) -> float:
        """Mean time a request decodes: its steps at the mean step its window sees."""
        return self.mean_decode_steps * mean_step_s * self.seen_ratio

    def admitted_time_s(self, prefill_s: float, extra_s: float, mean_step_s: float,
                        shared_steps_s: float = 0.0) -> float:
        """Mean time a request spends admitted: its prefill (`prefill_s` + `extra_s`, the first
        slot's offset, + `shared_steps_s`, the shared last steps), decode and reload."""
        return (prefill_s + extra_s + shared_steps_s + self.decode_time_s(mean_step_s)
                + self.mean_reload_s)


def rank_engine(step_model, sample: RequestMix, policy: EnginePolicy, dp: int,
                queue_sample: RequestMix | None = None,
                reload_s: np.ndarray | None = None, subagent_chains: int = 1) -> RankEngine:
    """The engine of one DP rank of `dp` lock-stepped ones over `sample` (float arrays, gaps
    already capped); `reload_s`: each request's lower-tier KV reload (None: none);
    `subagent_chains`: the concurrent chains a subagent run plays on."""
    q = float(getattr(step_model, "tokens_per_decode_step", 1.0) or 1.0)
    o = sample.output_tokens
    decode_steps = np.maximum(o - 1.0, 0.0)
    decode_steps = decode_steps / q
    w = decode_steps.sum()
    c = sample.context_tokens
    c_d = float(np.sum(decode_steps * (c + o / 2.0)) / w) if w > 0 else float(c.mean())
    step_model = with_decode_contexts(step_model, c + o / 2.0, decode_steps)
    table = extension_table(step_model, dp, c_d, policy.max_num_batched_tokens,
                            policy.max_num_seqs)
    reload = np.zeros(len(c)) if reload_s is None else reload_s
    return RankEngine(
        step_model, sample, queue_sample, policy, dp, reload, float(reload.mean()),
        policy.frontend_s(c), 1.0, q,
        decode_steps, float(decode_steps.mean()), c_d, 1.0 / dp, table,
        table.context_index(c),
        None if queue_sample is None else table.context_index(queue_sample.context_tokens),
        subagent_chains)


def window_bin_index(windows: np.ndarray, top: float) -> np.ndarray:
    """Log-spaced bin (WINDOW_BINS edges from 1 to `top` steps) of each window length."""
    edges = np.unique(np.round(np.geomspace(1, top, WINDOW_BINS + 1)))
    return np.clip(np.searchsorted(edges, windows, side="right") - 1, 0, len(edges) - 1)
