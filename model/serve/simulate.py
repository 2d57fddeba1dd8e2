"""Discrete-event oracle: the engine policy applied step by step (papers/research/theory.md §1.1).

Each engine step the scheduler (per DP rank) gives one token to every decoding request, then
prefill chunks to in-flight prefills in arrival order, then admits waiting requests while the
token budget, `max_num_seqs` and the KV pool allow; each prefill chunk is capped by
`long_prefill_token_threshold`, and prefill runs only on steps whose shared counter is a multiple
of `prefill_schedule_interval`. DP ranks step in lock-step: a step lasts as long as the slowest
rank's. Step durations come from the same `step_model.step_time_s` the closed form uses, so the
two differ only by the queueing approximations of the closed form (`model.serve.engine`).

Stretches of decode-only steps with no arrival, prefill or completion in between are advanced in
one jump (same result, far fewer Python iterations).
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass

import numpy as np

from model.perf.context_spread import with_longest_context
from model.serve.policy import EnginePolicy
from model.serve.request_mix import request_mix_for
from model.serve.siblings import subagent_chains
from model.serve.sim_lanes import Lane
from model.specs.errors import ServecastError
from model.specs.workload import ClosedLoop, Load, OpenLoop, TraceArrivals, Workload


@dataclass(frozen=True)
class SimResult:
    """Per-request outcomes of the measured window, plus per-step samples."""

    ttft_s: np.ndarray
    tpot_s: np.ndarray  # requests with at least 2 output tokens
    e2e_s: np.ndarray
    e2e_output_tokens: np.ndarray  # output tokens of the requests in e2e_s (same order)
    context_tokens: np.ndarray
    uncached_tokens: np.ndarray
    output_tokens: np.ndarray
    step_s: np.ndarray  # duration of every step in the window (one per step)
    step_decodes: np.ndarray
    step_prefill_tokens: np.ndarray
    duration_s: float
    gpus: int
    completed: int
    steps: int
    unfinished: int  # measured requests the drain did not finish

    def percentiles(self, values: np.ndarray, qs=(50, 90, 99)) -> dict[str, float]:
        if len(values) == 0:
            return {f"p{q}": float("nan") for q in qs}
        return {f"p{q}": float(np.percentile(values, q)) for q in qs}

    @property
    def total_tokens_per_s_per_gpu(self) -> float:
        """TPGS: input (cached included) + output tokens of completed requests per GPU-second."""
        tokens = self.context_tokens.sum() + self.output_tokens.sum()
        return float(tokens / self.duration_s / self.gpus)

    @property
    def output_tokens_per_s_per_gpu(self) -> float:
        return float(self.output_tokens.sum() / self.duration_s / self.gpus)

    def summary(self) -> dict:
        inter = 1.0 / self.tpot_s
        return {"ttft_s": self.percentiles(self.ttft_s), "tpot_s": self.percentiles(self.tpot_s),
                # interactivity percentiles follow the seed's convention: P90 = the rate 90% of
                # users get at least, i.e. 1 / P90 of TPOT
                "interactivity_tok_s": {k: 1.0 / v for k, v in
                                        self.percentiles(self.tpot_s).items()},
                "mean_interactivity_tok_s": float(inter.mean()) if len(inter) else float("nan"),
                # InferenceX AgentX's "E2E normalized interactivity": 1 / pXX of E2EL / OSL
                "e2e_interactivity_tok_s": {k: 1.0 / v for k, v in self.percentiles(
                    self.e2e_s / np.maximum(self.e2e_output_tokens, 1.0)).items()},
                "tpgs": self.total_tokens_per_s_per_gpu,
                "output_tokens_per_s_per_gpu": self.output_tokens_per_s_per_gpu,
                "completed": self.completed, "steps": self.steps,
                "mean_step_s": float(self.step_s.mean()) if len(self.step_s) else float("nan"),
                "unfinished": self.unfinished}


class _Rank:
    """One DP rank's scheduler state."""

    def __init__(self) -> None:
        self.waiting: deque[int] = deque()
        self.prefilling: list[int] = []  # admitted, prompt not finished, in admission order
        self.decoding: list[int] = []
        self.kv_used_tokens = 0.0


class _Requests:
    """Growable per-request arrays: arrival, context, uncached, remaining prefill and output
    tokens, tokens generated, first-token and finish times (NaN until then), lane."""

    FIELDS = ("arrival_s", "context_tokens", "uncached_tokens", "remaining_tokens",
              "output_tokens", "generated_tokens", "first_token_s", "finish_s", "lane")
    UNSET = ("first_token_s", "finish_s")  # NaN until set

    def __init__(self, capacity: int = 1024) -> None:
        self.n, self._cap = 0, capacity
        self.arrival_s, self.context_tokens = np.zeros(capacity), np.zeros(capacity)
        self.uncached_tokens, self.remaining_tokens = np.zeros(capacity), np.zeros(capacity)
        self.output_tokens, self.generated_tokens = np.zeros(capacity), np.zeros(capacity)
        self.first_token_s, self.finish_s = np.full(capacity, np.nan), np.full(capacity, np.nan)
        self.lane = np.zeros(capacity)

    def _grow(self) -> None:
        cap = 2 * self._cap
        for f in self.FIELDS:
            arr = np.full(cap, np.nan) if f in self.UNSET else np.zeros(cap)
            arr[: self._cap] = getattr(self, f)
            setattr(self, f, arr)
        self._cap = cap

    def add(self, arrival_s, context_tokens, uncached_tokens, output_tokens, lane) -> int:
        if self.n == self._cap:
            self._grow()
        i = self.n
        self.arrival_s[i], self.context_tokens[i] = arrival_s, context_tokens
        self.uncached_tokens[i] = self.remaining_tokens[i] = uncached_tokens
        self.output_tokens[i], self.generated_tokens[i], self.lane[i] = output_tokens, 0.0, lane
        self.n += 1
        return i


def simulate(step_model, workload: Workload | None, policy: EnginePolicy, load: Load, *,
             duration_s: float = 600.0, warmup_s: float | None = None, seed: int = 0,
             hit_rate: float | None = None, dp_ranks: int = 1, max_steps: int = 2_000_000,
             sessions: bool = True) -> SimResult:
    """Run the policy on `load` for `duration_s` of simulated time; statistics cover requests
    that arrive between `warmup_s` (default 20% of the duration) and `duration_s`. The run goes
    on past `duration_s`, the load with it, until those requests finish (for at most a quarter
    of the duration more): cutting them off at the end would drop the longest waits (on
    agentx-n48-indep, seed 1, 29% of the TTFT P99). A run that reaches `max_steps` before
    `duration_s` is an error, not a shorter window.

    Closed loop: each lane plays synthetic sessions from `workload` back to back, starting at a
    random turn of its first session (AgentX warm start), that session drawn in proportion to
    its turns (`_first_sessions`: the stationary state); the gap before each turn is capped at
    `load.gap_cap_s`. Open loop: gamma inter-arrivals with the load's CV, requests drawn from the
    workload's request mix. Trace arrivals: replayed as recorded. Requests of lane/arrival i go to
    DP rank i mod dp_ranks (sticky by session). `sessions=False` makes each lane draw its next
    request independently from the request mix (the closed form's assumption), to separate the
    queueing approximation from the session correlation. Subagent runs fork into concurrent
    chains joined at the parent's next turn (model.serve.sim_lanes); a closed loop with
    `forked_runs=False` plays them as extra independent lanes with weighted gaps instead.
    """
    if duration_s <= 0:
        raise ServecastError(f"simulate: duration_s: must be > 0, got {duration_s}")
    warmup_s = 0.2 * duration_s if warmup_s is None else warmup_s
    rng = np.random.default_rng(seed)
    kv_tokens = _kv_capacity(step_model, workload, hit_rate, load) / dp_ranks
    sim = _Simulation(step_model, policy, load, dp_ranks, duration_s, kv_tokens)
    if isinstance(load, ClosedLoop):
        if workload is None:
            raise ServecastError("simulate: a closed loop needs a workload")
        pool = (_SessionPool(workload, seed, hit_rate, load.forked_runs) if sessions
                else _MixPool(workload, seed, hit_rate))
        sim.start_lanes(pool, rng)
    elif isinstance(load, OpenLoop):
        if workload is None:
            raise ServecastError("simulate: an open loop needs a workload")
        sim.start_open(workload.request_mix(20_000, seed, hit_rate), rng)
    elif isinstance(load, TraceArrivals):
        sim.start_trace()
    else:
        raise ServecastError(f"simulate: unknown load {type(load).__name__}")
    sim.run(max_steps, warmup_s)
    if sim.counter >= max_steps and sim.clock_s < duration_s:
        raise ServecastError(f"simulate: max_steps: {max_steps:,} steps reached at {sim.clock_s:,.0f} "
                             f"s of duration_s {duration_s:,.0f} s; raise max_steps or shorten "
                             "the run")
    return sim.result(warmup_s)


class _Simulation:
    """The running simulation: clock, step counter, requests, ranks, pending arrivals (a heap
    of (time, sequence, request)), closed-loop lanes and the per-step record."""

    def __init__(self, step_model, policy: EnginePolicy, load: Load, dp: int,
                 duration_s: float, kv_capacity_tokens: float) -> None:
        self.step_model, self.policy, self.load, self.dp = step_model, policy, load, dp
        self.duration_s = duration_s
        self.stop_s = 1.25 * duration_s  # the drain's limit (an unstable queue never drains)
        self.kv_capacity_tokens = kv_capacity_tokens
        # MTP tokens per decode step
        self.tokens_per_step = float(getattr(step_model, "tokens_per_decode_step", 1.0) or 1.0)
        self.reqs = _Requests()
        self.ranks = [_Rank() for _ in range(dp)]
        self.events: list[tuple[float, int, int]] = []
        self.seq = 0
        self.lanes: list[Lane] = []
        self.chain_of: dict[int, int | None] = {}  # request -> its lane's fork chain
        self.pool = None
        self.clock_s, self.counter = 0.0, 0
        # per recorded step: end time, duration, steps it stands for, decodes, prefill tokens
        self.steps: tuple[list, ...] = ([], [], [], [], [])

    def _push(self, t: float, i: int) -> None:
        heapq.heappush(self.events, (t, self.seq, i))
        self.seq += 1

    def _send(self, t: float, context_tokens, uncached_tokens, output_tokens, lane) -> None:
        """A client sends a request at `t` (its TTFT counts from then); the engine sees it once
        the front end has rendered and tokenized its whole prompt."""
        i = self.reqs.add(t, context_tokens, uncached_tokens, output_tokens, lane)
        self._push(t + float(self.policy.frontend_s(context_tokens)), i)

    def _send_turn(self, t: float, lane: int, k: int, chain: int | None) -> None:
        """Lane `lane` sends request `k` of its session at `t`, a request of fork chain `chain`."""
        ctx, unc, out = self.lanes[lane].session[:3]
        self.chain_of[self.reqs.n] = chain
        self._send(t, ctx[k], unc[k], out[k], lane)

    def start_lanes(self, pool, rng) -> None:
        """One lane per session slot, each at a random turn of its first session, its first
        arrival staggered over one second."""
        self.pool = pool
        lanes = max(int(round(self.load.concurrency * pool.lanes_per_session)), 1)
        firsts = _first_sessions(pool, lanes, rng)
        for lane in range(lanes):
            sess = firsts[lane]
            start = int(rng.integers(0, len(sess[0])))  # warm start at a random turn
            self.lanes.append(Lane(sess, start, pool.chains))
            t0 = float(rng.uniform(0, 1.0))
            for k, chain, _ in self.lanes[lane].begin(start):
                self._send_turn(t0, lane, k, chain)

    def start_open(self, mix, rng) -> None:
        """Gamma inter-arrivals at the load's rate and CV, requests cycling through `mix`."""
        shape = 1.0 / self.load.interarrival_cv**2
        t, j = 0.0, 0
        while t < self.stop_s:
            t += rng.gamma(shape, 1.0 / (shape * self.load.rate_per_s))
            k = j % len(mix)
            self._send(t, mix.context_tokens[k], mix.uncached_tokens[k], mix.output_tokens[k], j)
            j += 1

    def start_trace(self) -> None:
        load = self.load
        for j, t in enumerate(load.arrival_s):
            if t >= self.stop_s:
                break
            self._send(float(t), load.context_tokens[j], load.uncached_tokens[j],
                       load.output_tokens[j], j)

    def run(self, max_steps: int, warmup_s: float) -> None:
        draining = None  # the measured requests still unfinished at duration_s
        reqs, ranks = self.reqs, self.ranks
        while self.counter < max_steps:
            if self.clock_s >= self.duration_s:
                if draining is None:
                    n = reqs.n
                    draining = np.flatnonzero((reqs.arrival_s[:n] >= warmup_s)
                                              & (reqs.arrival_s[:n] < self.duration_s)
                                              & np.isnan(reqs.finish_s[:n]))
                if self.clock_s >= self.stop_s or not np.isnan(reqs.finish_s[draining]).any():
                    break
            while self.events and self.events[0][0] <= self.clock_s:
                _, _, i = heapq.heappop(self.events)
                ranks[int(reqs.lane[i]) % self.dp].waiting.append(i)
            prefill_step = self.counter % self.policy.prefill_schedule_interval == 0
            if not prefill_step and not any(r.decoding for r in ranks):
                prefill_step = True  # nothing to protect: the saturation guard lets prefill run
            if not any(r.decoding or ((r.prefilling or r.waiting) and prefill_step)
                       for r in ranks):
                if not self._idle():
                    break
                continue
            plans = [self._compose(r, prefill_step) for r in ranks]
            n_jump, dt = self._jump(plans)
            self.clock_s += dt * n_jump
            self.counter += n_jump
            for record, value in zip(self.steps, (
                    self.clock_s, dt, n_jump, sum(len(dec) for dec, _ in plans),
                    sum(c for _, ch in plans for _, c in ch)), strict=True):
                record.append(value)
            for r, plan in zip(ranks, plans, strict=True):
                self._apply(r, plan, n_jump)

    def _idle(self) -> bool:
        """Nothing to step: wait for the next arrival (False: nothing will ever come). While
        nothing is in flight the replay shifts every pending timer so the idle interval lasts
        the load's idle cap (a uniform shift keeps the heap ordered)."""
        ranks = self.ranks
        if not self.events:
            if any(r.prefilling or r.waiting for r in ranks):
                self.counter += 1
                return True
            return False
        nxt = self.events[0][0]
        cap_s = getattr(self.load, "idle_cap_s", None)
        if self.lanes and cap_s is not None and nxt - self.clock_s > cap_s and not any(
                r.decoding or r.prefilling or r.waiting for r in ranks):
            shift = nxt - self.clock_s - cap_s
            self.events = [(e - shift, s_, j) for e, s_, j in self.events]
            for _, _, j in self.events:
                self.reqs.arrival_s[j] -= shift
            nxt -= shift
        self.clock_s = max(self.clock_s, nxt)
        return True

    def _compose(self, r: _Rank, prefill_step: bool) -> tuple[list, list]:
        """(decoding requests, [(request, chunk tokens)]) of one rank's next step: in-flight
        prefills first, then admissions while the budget, max_num_seqs and the KV pool allow."""
        reqs, cap = self.reqs, self.policy.chunk_cap
        dec = r.decoding
        budget = self.policy.max_num_batched_tokens - len(dec)
        chunks: list[tuple[int, float]] = []
        if prefill_step:
            for i in r.prefilling:
                if budget <= 0:
                    break
                c = min(reqs.remaining_tokens[i], cap, budget)
                chunks.append((i, c))
                budget -= c
            while (r.waiting and budget > 0
                   and len(r.decoding) + len(r.prefilling) < self.policy.max_num_seqs):
                i = r.waiting[0]
                need = reqs.context_tokens[i] + reqs.output_tokens[i]
                if r.kv_used_tokens + need > self.kv_capacity_tokens and (r.decoding or r.prefilling):
                    break  # KV pool full: wait for a request to finish (no preemption)
                r.waiting.popleft()
                r.prefilling.append(i)
                r.kv_used_tokens += need
                c = min(reqs.remaining_tokens[i], cap, budget)
                chunks.append((i, c))
                budget -= c
        return dec, chunks

    def _jump(self, plans) -> tuple[int, float]:
        """(steps, step duration): the slowest rank's step (DP lock-step); a decode-only
        stretch runs as one jump to the next completion, arrival or prefill slot, at its mean
        context (contexts grow by q per step)."""
        reqs, q, interval = self.reqs, self.tokens_per_step, self.policy.prefill_schedule_interval
        n_jump = 1
        if all(not chunks for _, chunks in plans):
            left = min(float(np.min(reqs.output_tokens[d] - reqs.generated_tokens[d])) for d in
                       (np.asarray(dec) for dec, _ in plans if dec))
            n_jump = max(int(np.ceil(left / q)), 1)
            if self.events:
                dt0 = _rank_times(self.step_model, reqs, plans, self.dp, 0.0)
                n_jump = min(n_jump, max(int(np.ceil((self.events[0][0] - self.clock_s) / dt0)), 1))
            if any(r.prefilling or r.waiting for r in self.ranks):
                n_jump = min(n_jump, (-self.counter) % interval or interval)
        dt = _rank_times(self.step_model, reqs, plans, self.dp, q * (n_jump - 1) / 2.0)
        if dt <= 0 or not np.isfinite(dt):
            raise ServecastError(f"simulate: step model returned a step time of {dt} s")
        if n_jump > 1:
            end = self.duration_s if self.clock_s < self.duration_s else self.stop_s
            n_jump = min(n_jump, max(int(np.ceil((end - self.clock_s) / dt)), 1))
        return n_jump, dt

    def _apply(self, r: _Rank, plan, n_jump: int) -> None:
        """One rank's step: decodes gain tokens, chunks prefill, finished requests leave (and
        their lanes send the next turn)."""
        reqs, (dec, chunks) = self.reqs, plan
        finished = []
        if dec:
            d = np.asarray(dec)
            reqs.generated_tokens[d] += n_jump * self.tokens_per_step
            fin = d[reqs.generated_tokens[d] >= reqs.output_tokens[d]]
            finished.extend(fin.tolist())
        for i, c in chunks:
            reqs.remaining_tokens[i] -= c
            if reqs.remaining_tokens[i] <= 0:
                r.prefilling.remove(i)
                reqs.first_token_s[i] = self.clock_s
                reqs.generated_tokens[i] = 1.0  # the last prefill chunk samples the first token
                if reqs.output_tokens[i] <= 1:
                    finished.append(i)
                else:
                    r.decoding.append(i)
        if finished:
            fin_set = set(finished)
            r.decoding = [i for i in r.decoding if i not in fin_set]
            for i in finished:
                reqs.finish_s[i] = self.clock_s
                r.kv_used_tokens -= reqs.context_tokens[i] + reqs.output_tokens[i]
                if self.lanes:
                    self._next_turn(i)

    def _next_turn(self, i: int) -> None:
        """The finished request's lane sends what follows it (model.serve.sim_lanes) after the
        capped gap; a new session's first turn is cold, later turns miss only their new tokens."""
        lane = int(self.reqs.lane[i])
        st = self.lanes[lane]
        todo = st.finished(self.chain_of.pop(i, None))
        if todo is None:
            st.session = self.pool.next()
            todo = st.begin(0)
        for k, chain, gap_of in todo:
            self._send_turn(self.clock_s + st.delay_s(gap_of, self.load.gap_cap_s), lane, k,
                            chain)

    def result(self, warmup_s: float) -> SimResult:
        reqs, duration_s = self.reqs, self.duration_s
        n = reqs.n
        arrival, finish = reqs.arrival_s[:n], reqs.finish_s[:n]
        measured = (arrival >= warmup_s) & (arrival < duration_s)
        sel = measured & np.isfinite(finish)
        window = max(min(self.clock_s, duration_s) - warmup_s, 1e-12)
        # throughput counts requests finishing inside the window (arrivals before warmup
        # included)
        done_in = (finish >= warmup_s) & (finish < duration_s)
        first = measured & np.isfinite(reqs.first_token_s[:n])
        ttft = reqs.first_token_s[:n][first] - arrival[first]
        multi = sel & (reqs.output_tokens[:n] > 1)
        tpot = (finish[multi] - reqs.first_token_s[:n][multi]) / (reqs.output_tokens[:n][multi] - 1)
        steps_t, steps_dt, steps_n, steps_dec, steps_pre = self.steps
        ends = np.asarray(steps_t)
        keep = (ends >= warmup_s) & (ends - np.asarray(steps_dt) * np.asarray(steps_n)
                                     < duration_s)
        reps = np.asarray(steps_n, int)[keep]
        step_s = np.repeat(np.asarray(steps_dt)[keep], reps)
        return SimResult(
            ttft_s=ttft, tpot_s=tpot, e2e_s=finish[sel] - arrival[sel],
            e2e_output_tokens=reqs.output_tokens[:n][sel].astype(float),
            context_tokens=reqs.context_tokens[:n][done_in], uncached_tokens=reqs.uncached_tokens[:n][done_in],
            output_tokens=reqs.output_tokens[:n][done_in], step_s=step_s,
            step_decodes=np.repeat(np.asarray(steps_dec, float)[keep], reps),
            step_prefill_tokens=np.repeat(np.asarray(steps_pre, float)[keep], reps),
            duration_s=window, gpus=int(getattr(self.step_model, "gpus", 1)),
            completed=int(sel.sum()), steps=self.counter,
            unfinished=int(np.count_nonzero(measured & ~np.isfinite(finish))))


def _rank_times(step_model, reqs: _Requests, plans, dp: int, context_offset_tokens: float) -> float:
    """Step time of the lock-stepped ranks. Attention, dense layers and sends run per rank, so
    the busiest rank's prefill sets them (`prefill_ranks` = total / busiest); the expert group
    sees every rank's tokens (the replica totals)."""
    p_tok = np.array([float(sum(c for _, c in chunks)) for _, chunks in plans])
    total = float(p_tok.sum())
    n_dec = float(sum(len(dec) for dec, _ in plans))
    decs = [i for dec, _ in plans for i in dec]
    d_ctxs = reqs.context_tokens[decs] + reqs.generated_tokens[decs] + context_offset_tokens
    d_ctx = float(np.mean(d_ctxs)) if decs else 0.0
    step_model = with_longest_context(step_model, d_ctxs)  # kernels that wait for the longest
    if total <= 0:
        return float(step_model.step_time_s(0.0, 0.0, n_dec, d_ctx, 1.0))
    busy = int(np.argmax(p_tok))
    chunks = plans[busy][1]
    ids = np.fromiter((i for i, _ in chunks), int, len(chunks))
    cs = np.fromiter((c for _, c in chunks), float, len(chunks))
    done = reqs.context_tokens[ids] - reqs.remaining_tokens[ids]
    p_ctx = float(np.sum(cs * (done + cs)) / cs.sum())  # the busiest rank's end-of-chunk context
    ranks = total / p_tok[busy]
    return float(step_model.step_time_s(total, p_ctx, n_dec, d_ctx, ranks * len(chunks),
                                        prefill_ranks=ranks))


class _SessionPool:
    """Synthetic sessions handed to lanes in order (AgentX lanes recycle traces FIFO). Where
    subagents run beside their parent, each subagent run forks into `chains` concurrent chains
    (model.serve.sim_lanes); where the wall share rounds to one chain, a session is instead
    `lanes_per_session` request chains (as in model.serve.request_mix.request_sample), each gap
    weighted by its request's wall weight over the mean."""

    def __init__(self, workload: Workload, seed: int, hit_rate: float | None,
                 forked_runs: bool = True) -> None:
        self.workload, self.seed, self.k = workload, seed, 0
        self.buf: list = []
        self.wall_share = float(getattr(workload, "subagent_wall_share", 1.0))
        self.chains = subagent_chains(self.wall_share) if forked_runs else 1
        self.lanes_per_session = (1.0 if self.chains > 1 else
                                  request_mix_for(workload, seed=seed).lanes_per_session)
        self.scale = None
        if hit_rate is not None:
            own = workload.request_mix(20_000, seed).hit_rate
            self.scale = hit_rate / own if own > 0 else 0.0

    def next(self):
        if not self.buf:
            self.buf = self.workload.sessions(256, self.seed + 1000 * (self.k + 1))
            self.k += 1
        s = self.buf.pop()
        unc = s.uncached_tokens
        if self.scale is not None:
            cached = s.context_tokens - s.uncached_tokens
            unc = np.maximum(np.round(s.context_tokens - np.minimum(cached * self.scale,
                                                                    s.context_tokens)), 1.0)
        if self.chains > 1:  # forked runs: every gap is the session's own
            return (s.context_tokens, unc, s.output_tokens, s.gap_s, np.ones(len(unc)), s.run)
        weight = np.where(s.subagent, self.wall_share, 1.0)
        return (s.context_tokens, unc, s.output_tokens, s.gap_s,
                weight * self.lanes_per_session, None)


class _MixPool:
    """Independent requests from the workload's request mix, served to lanes in chunks."""

    CHUNK = 1000

    chains = 1  # independent requests: nothing forks

    def __init__(self, workload: Workload, seed: int, hit_rate: float | None) -> None:
        # drawn as the closed form draws its sample (model.serve.request_mix: every 16th request
        # of 16x as many, so from ~20,000 sessions, not ~1,250): the rare cold prompts that set
        # an FCFS wait come in sessions, and a pool from few sessions holds too few of them
        m = request_mix_for(workload, 50_000, seed + 7, hit_rate)
        # the mix lists each session's turns in order (context autocorrelation 0.95 at lag 1 on
        # AgentX): shuffled, or the lanes would replay sessions instead of independent turns
        order = np.random.default_rng(seed + 11).permutation(len(m.context_tokens))
        self.lanes_per_session = m.lanes_per_session
        weight = np.ones(len(order)) if m.wall_weight is None else m.wall_weight
        self.arrays = tuple(np.asarray(a)[order] for a in (
            m.context_tokens, m.uncached_tokens, m.output_tokens, m.gap_s,
            weight * m.lanes_per_session))
        self.pos = 0

    def next(self):
        n = len(self.arrays[0])
        idx = (self.pos + np.arange(self.CHUNK)) % n
        self.pos = (self.pos + self.CHUNK) % n
        return (*(a[idx] for a in self.arrays), None)


def _first_sessions(pool, n: int, rng) -> list:
    """The sessions the `n` lanes are in at time zero. A lane that has looped for a while is in
    a session with probability proportional to its turns (a random turn of a uniformly drawn
    session under-weights long sessions: lanes then leave their first session early and start
    more cold sessions than they would at steady state: on the 64-session AgentX population 40
    turns left on average instead of 90). Drawn from the pool's next max(4n, 256)
    sessions, with replacement, weights = turns."""
    cands = [pool.next() for _ in range(max(4 * n, 256))]
    turns = np.array([len(c[0]) for c in cands], float)
    pick = rng.choice(len(cands), size=n, p=turns / turns.sum())
    return [cands[i] for i in pick]


def _kv_capacity(step_model, workload, hit_rate, load) -> float:
    """KV pool per rank in tokens, evaluated at the workload's mean context."""
    fn = getattr(step_model, "kv_capacity_tokens", None)
    if fn is None:
        return float("inf")
    if isinstance(load, TraceArrivals):
        ctx = float(np.mean(load.context_tokens))
    elif workload is not None:
        ctx = float(np.mean(workload.request_mix(5_000, 0, hit_rate).context_tokens))
    else:
        ctx = 0.0
    return float(fn(ctx))
