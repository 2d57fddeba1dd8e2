"""Mean engine step of lock-stepped DP ranks with the prefill threshold off (FCFS on the budget).

Every rank waits for the slowest in each step. Per admitting step (every
`prefill_schedule_interval`-th), a rank either holds one full-budget chunk of a long prompt
(a run) or packs the short last pieces of the prompts that reached it since it was last free.
Three things set the mean step, and the simpler picture (each rank's mean chunk height,
independent ranks) misses all three:

- a step lasts as long as its busiest rank, so with unequal heights (a cold 8K chunk at long
  context against a warm 2K turn) the slowest of several busy ranks is what counts;
- steps holding a run are long, so they collect more of the other ranks' arrivals, and those
  pieces land in the next run step, where the run masks them. The running ranks' own arrivals
  wait for a quiet step;
- for the same reason runs cluster: a run that starts while another holds the slots overlaps
  it, and costs little more than it. The number of ranks on a run chunk is a birth-death chain
  whose births grow with the slot's length, not a binomial.

On DeepSeek V4 Pro DEP8 on B300 under the 64-session AgentX population at 128 sessions and
prefill_schedule_interval 1 (model.validate.agreement, 8,000 s runs, seeds 1-3) the chain gives
P(no rank on a run chunk) 0.953 against 0.947 simulated, and a mean step of 70.6 ms at the
simulated rate against 69.5-74.6 ms; independent ranks give 88.5 ms.

`LockstepSlots.law` evaluates the picture at one rate and mean step (`SlotLaw`); everything the
closed form reads off it (the mean step, the first slot a prompt meets, the TPOT law's clusters
and chain) takes that law. The law's grid (`SlotGrid`) is kept from one evaluation to the next
while it reaches: a grid that moved with every step time would make the fixed point jitter.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property, lru_cache

import numpy as np

from model.serve.queueing import arrivals_kept
from model.specs.probability import binom_pmf

GRID = 4096


def _binned(values: np.ndarray, weights: np.ndarray | None, dy: float) -> np.ndarray:
    """Mass of `values` (weighted) on the grid k·dy, the top bin holding everything beyond."""
    return np.bincount(np.minimum(np.round(values / dy).astype(int), GRID - 1), weights,
                       minlength=GRID)[:GRID]


def _cdf(values: np.ndarray, weights: np.ndarray | None, dy: float) -> np.ndarray:
    pmf = _binned(values, weights, dy)
    return np.cumsum(pmf) / max(float(pmf.sum()), 1e-300)


def _mean(cdf: np.ndarray, dy: float) -> float:
    return float(np.sum(1.0 - cdf) * dy)


class LockstepSlots:
    """Per-rank admitting-slot picture of one request sample: `full_chunks` per request (each of
    extension `full_extension_s`) and a last piece of extension `last_extension_s` (0 when the
    prompt ends on a full chunk) of `last_tokens`, at a chunk of `chunk_tokens`; `shared_s`:
    what j run chunks on j ranks add over the tallest (j = 0..dp)."""

    def __init__(self, full_chunks: np.ndarray, full_extension_s: np.ndarray,
                 last_extension_s: np.ndarray, decode_step_s: float, interval: int, dp: int,
                 shared_s: np.ndarray | None = None, last_tokens: np.ndarray | None = None,
                 chunk_tokens: float = 0.0):
        # the whole sample: an evenly strided subsample of a session-ordered sample is biased
        # (4,000 of 5,242 AgentX turns put 5% more run chunks in and the step 8% higher)
        self.full_chunks = np.asarray(full_chunks, float)
        self.full_extension_s = np.asarray(full_extension_s, float)
        self.last_extension_s = np.asarray(last_extension_s, float)
        self.decode_step_s, self.interval, self.dp = decode_step_s, interval, dp
        # what j run chunks on j ranks add over the tallest (the expert group sees them all)
        self.shared_s = np.zeros(dp + 1) if shared_s is None else np.asarray(shared_s, float)
        self.mean_full_chunks = float(self.full_chunks.mean())
        self.run_w = self.full_chunks / max(float(self.full_chunks.sum()), 1e-300)
        self.last_mean_s = float(self.last_extension_s.mean())
        self.last_square_mean_s2 = float(np.mean(self.last_extension_s**2))
        self.top_s = max(float(self.full_extension_s.max()), float(self.last_extension_s.max()), 1e-12)
        self.merge = None if last_tokens is None or chunk_tokens <= 0 else _MergeLaw(
            self.full_chunks, np.asarray(last_tokens, float), chunk_tokens)

    def _grid(self, y_max: float, kept: SlotGrid | None) -> SlotGrid:
        """The grid `kept` while it reaches y_max, else one 1.5 y_max wide."""
        if kept is not None and kept.dy * GRID >= y_max:
            return kept
        dy = 1.5 * y_max / GRID
        return SlotGrid(dy, _cdf(self.full_extension_s, self.run_w, dy), self._piece_transform(dy))

    def _piece_transform(self, dy: float) -> np.ndarray:
        return np.fft.rfft(_binned(self.last_extension_s, None, dy) / len(self.last_extension_s), 2 * GRID) - 1.0

    @staticmethod
    def _packed_cdf(mu: float, piece: np.ndarray) -> np.ndarray:
        """cdf of the extension of a Poisson(mu) number of last pieces packed into one step
        (`piece`: their transform less one, on the slot's grid)."""
        pmf = np.fft.irfft(np.exp(mu * piece), 2 * GRID)[:GRID]
        pmf = np.maximum(pmf, 0.0)
        return np.minimum(np.cumsum(pmf) / max(float(pmf.sum()), 1e-300), 1.0)

    def mean_step(self, x: float, t: float) -> float:
        """The mean step implied by a mean step `t` at x requests/s per rank (one map of the
        fixed point in the step time), on a fresh grid."""
        return self.law(x, t).mean_step_s

    def others_above_own(self, sl: SlotLaw) -> float:
        """Mean extension a slot adds above a running rank's own chunk (the other ranks' runs
        and pieces it does not mask, and the expert group's share of theirs): J taken as a
        running rank sees it (size-biased)."""
        j = np.arange(1, self.dp + 1)
        w = sl.pi[1:] * j
        seen = float(np.sum(w * sl.run_slot_s[1:])) / max(float(w.sum()), 1e-300)
        own = float(np.sum(self.run_w * self.full_extension_s))
        return max(seen - own, 0.0)

    def first_step(self, sl: SlotLaw, levels: int, phases: int, gaps=None,
                   points: int = 64):
        """The admitting slot a prompt arriving at a free rank takes first: (offsets past its
        own step's td, weights, whether the arrival fell in a run's cycle, the own slot's
        extension). A cycle is interval - 1 decode steps and an admitting slot whose extension
        follows J, the other ranks on a run chunk (own rank free: pi_j (dp - j)), at `levels`
        quantiles; arrivals land in cycles time-weighted. One in the decode steps takes this
        cycle's slot; one in the slot itself waits it out and takes the next cycle's, still a
        run unless every run in it ends and none starts. In a closed loop, arrivals thin over a
        cluster of runs: every step stretches, so the sessions decoding anywhere crawl and only
        those already idle arrive, ever fewer as it lasts (E[min(gap, C)] / C over a cluster of
        C seconds). Prompts of up to 2K tokens that find their rank idle, DSV4 DEP8 (simulated,
        seed 1): P(a run holds the slot at arrival) 0.37 at 128 sessions, cadence 1, 0.70 at
        256, cadence 8; then the own slot holds a run too in 0.83 / 0.95 of cases."""
        x = sl.rate_per_rank_rps
        dp, iv, td = self.dp, self.interval, self.decode_step_s
        grid = np.arange(GRID) * sl.dy
        lv = (np.arange(levels) + 0.5) / levels
        ph = (np.arange(phases) + 0.5) / phases
        runs = self.full_chunks >= 1
        j = np.arange(dp + 1)
        length, ends = self._slot_lengths(sl)
        no_birth = np.exp(-(dp - j) * x * float(runs.mean()) * length)
        goes_on = np.r_[1.0 - no_birth[0], 1.0 - ends[1:] ** j[1:] * no_birth[1:]]
        offs, wts, on, own_h = [], [], [], []
        for n in range(dp):
            if n == 0:
                heights = np.zeros(levels)
            else:
                heights = np.interp(lv, self._run_slot_cdf(sl, n), grid) + self.shared_s[n]
            for h in heights:
                cycle = iv * td + h
                w = sl.pi[n] * (dp - n) * cycle / levels
                in_decodes = (iv - 1) * td / cycle
                nxt = h if n > 0 else float(sl.run_slot_s[1])  # a quiet slot's successor: a run
                waited = ph * (td + h) + (iv - 1) * td
                for o, share, oh in ((ph * (iv - 1) * td + h, in_decodes, h),
                                     (waited + nxt, (1 - in_decodes) * goes_on[n], nxt),
                                     (waited, (1 - in_decodes) * (1 - goes_on[n]), 0.0)):
                    offs.append(o)
                    wts.append(np.full(phases, w * share / phases))
                    on.append(np.full(phases, n > 0))
                    own_h.append(np.full(phases, oh))
        w, on = np.concatenate(wts), np.concatenate(on)
        w = w * np.where(on, self._kept_in_clusters(sl, gaps), 1.0)
        return _compressed(np.concatenate(offs), w / max(float(w.sum()), 1e-300), on,
                           np.concatenate(own_h), points)

    def _slot_lengths(self, sl: SlotLaw) -> tuple[np.ndarray, np.ndarray]:
        """(length of a cycle of interval steps by J = 0..dp, the probability a running chunk
        is its run's last): a busy rank's own arrivals queue behind its run."""
        runs = self.full_chunks >= 1
        length = self.interval * self.decode_step_s + np.r_[_mean(sl.f_quiet, sl.dy), sl.run_slot_s[1:]]
        own = np.maximum(1.0 - sl.rate_per_rank_rps * self.mean_full_chunks * length, 1e-3)
        per_run = float(self.full_chunks[runs].mean()) if runs.any() else 1.0
        return length, np.minimum(own / per_run, 1.0)

    def _run_slot_cdf(self, sl: SlotLaw, n: int) -> np.ndarray:
        """cdf of a slot's extension with n ranks on a run chunk: the tallest of their chunks
        and of the other ranks' packed pieces (before the expert group's share)."""
        return sl.f_run ** n * sl.f_pieces ** ((self.dp - n) / max(self.dp - 1, 1))

    def _kept_in_clusters(self, sl: SlotLaw, gaps) -> float:
        """Closed loop: the share of arrivals that still come during a cluster of runs (every
        step stretches, so the sessions decoding crawl and only those already idle arrive,
        ever fewer as it lasts: E[min(gap, C)] / C over a cluster of C seconds, the rest at
        the decode pace); 1 in an open loop (`gaps` None)."""
        runs = self.full_chunks >= 1
        if gaps is None or not runs.any():
            return 1.0
        cycle = self.interval * self.decode_step_s + float(sl.run_slot_s[1])
        c = np.maximum(self.full_chunks[runs] * sl.stretch * cycle, 1e-12)  # cluster seconds
        idle = arrivals_kept(gaps, c)
        pace = self.interval * self.decode_step_s / cycle
        return float(np.sum(c * (idle + (1.0 - idle) * pace))) / max(float(c.sum()), 1e-300)

    def window_chain(self, sl: SlotLaw, gaps=None) -> SlotChain:
        """J, the ranks on a run chunk, as a Markov chain in admitting slots, for the TPOT law
        at the law's mean step. Each busy rank's chunk is its run's last with probability own / (mean
        chunks a run), each free rank starts a run with probability 1 - exp(-x P(run) length)
        over the slot; a slot with J = j adds the tallest of j run chunks and the others'
        pieces (the expert group's share on top). A window opens where a prompt completes: one
        that reached a free rank, in the next slot (arrivals time-weighted over the slots,
        thinned over a cluster of runs in a closed loop as in `first_step`), one queued behind
        a run, as the run ends. The chain forgets which run holds a rank: every slot draws its
        heights afresh and runs end geometrically, so it keeps J's mean reversion but not a
        long cold run's persistence (model.serve.tpot_law uses it with the shot law)."""
        x, dp = sl.rate_per_rank_rps, self.dp
        j = np.arange(dp + 1)
        runs = self.full_chunks >= 1
        length, ends = self._slot_lengths(sl)
        starts = 1.0 - np.exp(-x * float(runs.mean()) * length)
        trans = np.zeros((dp + 1, dp + 1))
        for a in j:
            freed = binom_pmf(np.arange(a + 1), a, ends[a])
            born = binom_pmf(np.arange(dp - a + 1), dp - a, starts[a])
            np.add.at(trans[a], a - np.arange(a + 1)[:, None] + np.arange(dp - a + 1)[None, :],
                      freed[:, None] * born[None, :])
        vals, vecs = np.linalg.eig(trans.T)
        pi = np.abs(np.real(vecs[:, np.argmin(np.abs(vals - 1.0))]))
        pi = pi / pi.sum()
        grid = np.arange(GRID) * sl.dy
        pmfs = np.zeros((dp + 1, GRID))
        pmfs[0] = np.diff(np.r_[0.0, sl.f_quiet])
        for n in j[1:]:
            pmfs[n] = np.diff(np.r_[0.0, np.interp(grid - self.shared_s[n], grid,
                                                   self._run_slot_cdf(sl, n), left=0.0)])
        arrive = pi * length * np.where(j > 0, self._kept_in_clusters(sl, gaps), 1.0)
        at_free = float(np.sum(arrive * (dp - j))) / max(float(arrive.sum()) * dp, 1e-300)
        free = (arrive @ trans) * (dp - j)  # completes in the next slot, at a free rank
        behind = pi * j * ends  # completes as the run it queued behind ends
        opens = (at_free * free / max(float(free.sum()), 1e-300)
                 + (1.0 - at_free) * behind / max(float(behind.sum()), 1e-300))
        return SlotChain(trans, pmfs, sl.dy, opens / max(float(opens.sum()), 1e-300))

    def run_shots(self, sl: SlotLaw):
        """For the TPOT law at the law's mean step: (quiet floor per admitting slot, chunks per
        cluster, each cluster's extension per chunk, share of requests that open a cluster).
        The shots are clusters of overlapping runs, not runs: a run that starts while another
        holds the slots adds little (the step takes the taller chunk), but it lengthens the
        stretch of long steps. A cluster is one run (its chunk above the other ranks' packed
        pieces, E[(h - M)+] = integral_0^h P(M <= y) dy) lasting its chunks times the mean
        busy period of J per run, at the rate clusters open; the heights are scaled so the
        clusters' mean is the slots' (independent shots of each run's excess over the others
        would keep the clustering's mean but not its bursts)."""
        pi, starts = sl.pi, sl.pi[:-1] * sl.births
        # the quiet slots' pieces under every slot, but never above the mean slot (near
        # saturation the rare quiet slots pile up every piece)
        mean_slot = (sl.mean_step_s - self.decode_step_s) * self.interval
        floor = min(_mean(sl.f_quiet, sl.dy), mean_slot)
        busy = 1.0 - pi[0]
        opens = float(starts[0] / max(float(starts.sum()), 1e-300))  # runs that open one
        # Poisson clusters overlap where the chain's busy periods cannot: at the rate whose
        # covered share is the busy share (depth -ln pi0, a Boolean model), each cluster adding
        # what it holds above the other clusters covering the slot (the step takes the taller)
        depth = -np.log(max(float(pi[0]), 1e-300))
        f_above = sl.f_pieces * np.exp(-depth * (1.0 - sl.f_run))
        above = np.r_[0.0, np.cumsum(f_above) * sl.dy]
        runs = self.full_chunks >= 1
        h_eff = np.interp(self.full_extension_s[runs] / sl.dy, np.arange(GRID + 1), above)
        extra = mean_slot - floor  # the clusters' share of the mean slot
        per_slot = depth * float(np.sum(self.full_chunks[runs] * h_eff)) / max(
            float(self.full_chunks[runs].sum()), 1e-300)
        scale = extra / per_slot if per_slot > 0 else 0.0
        boolean = depth / busy if busy > 0 else 1.0
        return (floor, self.full_chunks[runs] * sl.stretch, h_eff * scale,
                float(runs.mean()) * opens * boolean)

    def law(self, x: float, t: float, grid: SlotGrid | None = None) -> SlotLaw:
        """The slot picture at x requests/s per rank and mean step `t`, on `grid` while it
        reaches (None: a fresh one)."""
        dp, iv, td = self.dp, self.interval, self.decode_step_s
        p = min(x * self.mean_full_chunks * t * iv, 0.999)  # a rank holds a run chunk in a slot
        per_slot = x * t * iv  # last pieces reaching a rank per slot, on average
        width = per_slot / max((1.0 - p) ** dp, 1e-3)
        y_max = 1.05 * max(self.top_s, width * self.last_mean_s
                           + 10.0 * np.sqrt(width * self.last_square_mean_s2) + self.top_s)
        grid = self._grid(y_max, grid)
        dy, f_run, piece = grid.dy, grid.f_run, grid.piece
        # a slot where j ranks hold a run chunk lasts as long as the tallest of them and of the
        # pieces the other ranks packed from the arrivals during it
        j = np.arange(dp + 1)
        x_run, mu_run = np.zeros(dp + 1), np.zeros(dp + 1)
        for n in j[1:]:
            x_run[n] = _mean(f_run ** n, dy)
            for _ in range(3):  # a run slot draws arrivals over its own length
                mu_run[n] = x * (iv * td + x_run[n])
                x_run[n] = _mean(f_run ** n * self._packed_cdf(mu_run[n], piece) ** (dp - n),
                                 dy) + self.shared_s[n]
        # J, the ranks on a run chunk, is a birth-death chain in slots: each of the dp - J free
        # ranks starts runs at the rate run chunks reach it over the slot's length, each busy
        # rank freeing after its chunks (a stationary law insensitive to how many). Run slots are
        # ~20x longer than quiet ones, so runs that start during a run overlap it: they
        # cluster, where independent ranks (a binomial J) spread them. DSV4 DEP8, 128 sessions,
        # cadence 1: P(J = 0..3) 0.953 / 0.035 / 0.010 / 0.002, simulated 0.947 / 0.042 /
        # 0.010 / 0.001 (binomial 0.936 / 0.062 / 0.002 / 0)
        rate = x * self.mean_full_chunks  # run chunks reaching a rank per second
        x_quiet, pi, own = 0.0, None, None
        for _ in range(4):
            length = iv * td + np.r_[x_quiet, x_run[1:]]
            if self.merge is not None and own is not None:
                # the queue behind a run fills more full slots than its prompts' own counts:
                # each run slot (as a running rank sees J, with its own extension) queues
                # x slot-length arrivals
                seen = pi[1:] * j[1:]
                run_slot = float(np.sum(seen * length[1:] / own)) / max(float(seen.sum()),
                                                                          1e-300)
                rate = x * (self.mean_full_chunks + self.merge.extra(x * run_slot))
            births = (dp - j[:-1]) * rate * length[:-1]
            # a running rank's own arrivals queue behind its run and extend it (M/G/1 busy
            # period, mean run / (1 - its load in the slot)): one rank conserves work exactly
            own = np.maximum(1.0 - rate * length[1:], 1e-3)
            pi = np.r_[1.0, np.cumprod(births / ((j[:-1] + 1) * own))]
            pi = pi / pi.sum()
            # pieces: a free rank packs its arrivals in the next slot (masked in a run slot); a
            # busy rank's wait behind its run and come out as it frees, into a quiet slot only
            # if it was the last one running (else masked), so the rare quiet slots near
            # saturation do not collect every piece
            frees = pi[1:] * j[1:] * own  # per-rank death flux from J = 1..dp
            last = float(frees[0] / max(float(frees.sum()), 1e-300))
            queued = x * float(np.sum(pi[1:] * j[1:] * length[1:])) / dp
            mu_quiet = x * length[0] + last * queued / max(pi[0], 1e-12)
            x_quiet = _mean(self._packed_cdf(mu_quiet, piece) ** dp, dy)
        f_quiet = self._packed_cdf(mu_quiet, piece) ** dp
        ext = float(pi[0] * x_quiet + np.sum(pi[1:] * x_run[1:]))
        return SlotLaw(td + ext / iv, f_quiet, dy, pi, births, x_run,
                       self._packed_cdf(mu_run[1], piece) ** (dp - 1), f_run, x, grid)


def _compressed(offsets, weights, in_run, own, points: int):
    """The first-slot mixture on at most `points` points per kind (a quiet or a run cycle at
    arrival, and whether the own slot holds a run): equal-weight groups of the sorted offsets,
    each at its weighted means (the TTFT law pairs every request with every point)."""
    out = ([], [], [], [])
    for run in (False, True):
        for held in (False, True):
            sel = (in_run == run) & ((own > 0) == held) & (weights > 0)
            if not sel.any():
                continue
            order = np.argsort(offsets[sel])
            o, w, h = offsets[sel][order], weights[sel][order], own[sel][order]
            group = np.minimum((np.cumsum(w) - 0.5 * w) / w.sum() * points, points - 1).astype(int)
            mass = np.bincount(group, w, points)
            keep = mass > 0
            out[0].append(np.bincount(group, w * o, points)[keep] / mass[keep])
            out[1].append(mass[keep])
            out[2].append(np.full(int(keep.sum()), run))
            out[3].append(np.bincount(group, w * h, points)[keep] / mass[keep])
    return tuple(np.concatenate(a) for a in out)


class _MergeLaw:
    """Full slots the queue behind a run adds. A rank serves its queue `chunk` tokens a slot, so
    what waits behind a run (its last piece, then the prompts that reached the rank meanwhile)
    fills floor(tokens / chunk) full slots before a partial one, where counting each prompt's
    chunks on its own (its floor) leaves the pieces to one packed slot: a prompt that starts in
    the room another left needs one slot more. Non-final chunk slots per request beyond that
    count, DSV4 DEP8 under the 64-session AgentX population (simulator, seed 1): +0.037 at 256
    sessions, cadence 8 (this law: +0.042), +0.019 at 128 (+0.019), +0.012 at 128, cadence 1
    (+0.014)."""

    BINS = 1 << 12  # token grid: chunk / 32 a bin, up to 128 chunks queued

    def __init__(self, full: np.ndarray, last_tokens: np.ndarray, chunk: float):
        runs = full >= 1
        self.counts, n = np.unique(full[runs], return_counts=True)
        self.share = n / len(full)  # runs of each length per request
        dz = chunk / 32.0

        def transform(tokens):
            idx = np.minimum(np.round(tokens / dz).astype(int), self.BINS - 1)
            return np.fft.rfft(np.bincount(idx, minlength=self.BINS) / len(tokens),
                               2 * self.BINS)

        self.piece = transform(last_tokens) - 1.0
        run_last = transform(last_tokens[runs] if runs.any() else last_tokens)
        full_at = np.arange(1, self.BINS // 32) * 32 - 1  # P(tokens >= n chunk) = sf[.]
        # sum_j sf[full_at_j] = J - sum_i pmf[i] #{j: full_at_j >= i}: one inner product with
        # each row's pmf, taken on the transforms (Parseval for the real FFT of length 2 BINS)
        below = np.zeros(2 * self.BINS)
        below[:self.BINS] = len(full_at) - np.searchsorted(full_at, np.arange(self.BINS))
        fold = np.full(self.BINS + 1, 2.0)
        fold[[0, -1]] = 1.0
        self.slots = float(len(full_at))
        # `extra` takes each row's inner product with the dual: fold the run's last piece in
        self.weighted = run_last * fold * np.conj(np.fft.rfft(below)) / (2 * self.BINS)
        # run lengths are whole chunks: the transform at length f is the one-chunk factor to
        # the f-th power, a product per length where an exponential per length costs 3x more
        whole = self.counts.size > 0 and bool(np.all(self.counts == np.round(self.counts)))
        self.power_rows = self.counts.astype(int) - 1 if whole else None
        # `extra`, remembered per law: the rate solver asks again at the rates it has tried
        self.extra = lru_cache(maxsize=1024)(self._extra)

    def _extra(self, arrivals_per_chunk: float) -> float:
        """Full slots per request beyond the per-prompt count when `arrivals_per_chunk` prompts
        reach a rank per slot of a run (a run of f chunks queues Poisson(f that) of them)."""
        # one transform per run length, all lengths at once (rows)
        if self.power_rows is None:
            rows = np.exp(arrivals_per_chunk * self.counts[:, None] * self.piece)
        else:
            one = np.exp(arrivals_per_chunk * self.piece)
            top = int(self.power_rows[-1]) + 1
            rows = np.cumprod(np.broadcast_to(one, (top, one.size)), axis=0)[self.power_rows]
        held = (rows @ self.weighted).real
        return float(np.sum(self.share * (self.slots - held)))


@dataclass(frozen=True)
class SlotChain:
    """J in admitting slots: transition matrix, per-state pmf of the slot's extension on the
    grid k·dy, and the law of J in the slot where a decode window opens."""

    trans: np.ndarray
    pmfs: np.ndarray
    dy: float
    opens: np.ndarray

    @cached_property
    def _tallest(self) -> tuple[float, float, float]:
        """(mean, variance, top) of the tallest state's slot extension."""
        grid = np.arange(self.pmfs.shape[-1]) * self.dy
        mean = self.pmfs @ grid
        return (float(mean.max()), float(np.maximum(self.pmfs @ grid**2 - mean**2, 0.0).max()),
                float(grid[np.flatnonzero(self.pmfs.max(axis=0) > 1e-12).max()]))

    def span(self, slots: float) -> float:
        """A span holding the extension summed over `slots` slots (10 sd past the tallest
        state's mean, plus one tallest slot)."""
        mean, var, top = self._tallest
        m = max(slots, 1.0)
        return m * mean + 10.0 * np.sqrt(m * var) + top

    def sum_pmf(self, slots: float, dz: float, n: int) -> np.ndarray:
        """pmf on the grid k·dz (n points) of the extension summed over `slots` admitting slots
        (whole counts either side, mixed), from the state where the window opens: opens'
        (P D(theta))^m 1, D the states' transforms. The transforms are n-point: the grid
        reaches past `span(slots)`, 10 sd beyond the sum's mean, so the mass a circular sum
        wraps is below float noise and no zero padding is needed."""
        pos = np.arange(self.pmfs.shape[-1]) * self.dy / dz
        lo = np.minimum(np.floor(pos).astype(int), n - 1)
        up = np.minimum(lo + 1, n - 1)
        frac = pos - np.floor(pos)
        binned = np.stack([np.bincount(lo, p * (1.0 - frac), n)
                           + np.bincount(up, p * frac, n) for p in self.pmfs])
        phi = np.fft.rfft(binned, axis=1)  # (states, frequencies)
        step = self.trans[None, :, :] * phi.T[:, None, :]  # P D(theta): column b scaled by phi_b
        whole = int(np.floor(slots))
        rest = slots - whole
        row = _row_times_power(self.opens.astype(complex), step, whole)  # opens' (P D)^m
        cf = (1.0 - rest) * row.sum(axis=1)
        if rest > 0:
            cf = cf + rest * np.matmul(row[:, None, :], step)[:, 0, :].sum(axis=1)
        out = np.maximum(np.fft.irfft(cf, n), 0.0)
        return out / max(out.sum(), 1e-300)


def _row_times_power(row: np.ndarray, step: np.ndarray, m: int) -> np.ndarray:
    """row' step^m for every frequency (step: (frequencies, states, states)), by squaring:
    the row meets each power of two it needs, so only the squarings are matrix products."""
    out = np.broadcast_to(row, step.shape[:2]).copy()
    power = step
    while m:
        if m & 1:
            out = np.matmul(out[:, None, :], power)[:, 0, :]
        m >>= 1
        if m:
            power = np.matmul(power, power)
    return out


@dataclass(frozen=True)
class SlotGrid:
    """The slot picture's grid k·dy: the run chunks' height cdf (chunk weighted) on it and the
    transform of one last piece (less one)."""

    dy: float
    f_run: np.ndarray
    piece: np.ndarray


@dataclass(frozen=True)
class SlotLaw:
    """One evaluation of the slot picture: the mean step; the quiet slots' extension cdf on the
    grid k·dy; the law of J (ranks on a run chunk) and its births per slot (in mean chunks per
    run: run starts x mean chunks) from J = 0..dp-1; the mean slot extension given J; the
    cdf of what the other ranks pack beside a lone run; the run chunks' height cdf (chunk
    weighted); the rate (requests/s per rank) and the grid it was evaluated at."""

    mean_step_s: float
    f_quiet: np.ndarray
    dy: float
    pi: np.ndarray
    births: np.ndarray
    run_slot_s: np.ndarray
    f_pieces: np.ndarray
    f_run: np.ndarray
    rate_per_rank_rps: float
    grid: SlotGrid

    @property
    def stretch(self) -> float:
        """A cluster of runs over one run: the chain's mean busy period over the mean run."""
        return (1.0 - float(self.pi[0])) / max(float(self.pi[0] * self.births[0]), 1e-300)
