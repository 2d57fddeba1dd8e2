"""Closed-loop benchmark model: how C clients that each send their next request as soon as the
last one finished (`vllm bench serve --max-concurrency C`, InferenceMAX, aiconfigurator runs)
arrive at the engine, and what TTFT, TPOT and throughput that gives.

Inputs are the physics of a run (`model.serve.estimate` components: kernel, network and routed-expert
seconds of a wave prefill step, a single-prompt prefill step and a decode step, before engine
factors) and the named engine factors fitted by `model.fit.engine`. Everything here is a pure,
vectorized function of those: the fit evaluates it over all measured runs at once.

Arrivals, derived rather than fitted. A benchmark sends `rounds` requests per client (num_prompts
/ concurrency). The first round is a burst: all C prompts arrive at t = 0 and are prefilled in
budget-sized wave steps, prompt i's first token after ceil(i ISL / budget) of them. What the
later rounds look like depends on two facts of the run:
- the benchmark's request lengths: fixed (every request exactly ISL/OSL) or drawn from a range
  (InferenceMAX's `--random-range-ratio 0.8`: requests end hundreds of decode steps apart, so
  after the burst the clients come back spread out);
- the engine's scheduler: `mixed` (vLLM, TensorRT-LLM: chunked prefill batched with the running
  decodes) lets the first prompts of a wave decode while the later ones prefill, so a wave's
  requests finish at different steps and the clients drift apart; `prefill_first` (SGLang's
  default, no mixed chunk) runs every waiting prefill before the next decode step, so a wave of
  fixed-length requests decodes in lockstep, finishes together and comes back together.
So after the burst (`steady_sync`):

    scheduler, lengths:   fixed    varied
    mixed                   0        0          (and a disaggregated prefill pool)
    prefill-first           1        varied_wave_persistence (fitted: the effects compete)

and the share of synchronized arrivals is `sync = 1/rounds + (1 - 1/rounds) * steady`. Rounds
are the benchmark's (10 for InferenceMAX, a `vllm bench` JSON says it); where a run does not
say, the fitted `benchmark_rounds`.

Steps. decode: (kernels + moe_scale * routed experts) * decode_scale + network + step overhead;
prefill: (kernels + moe_prefill_scale * routed experts) * prefill_scale + network + overhead
(disaggregated deployments: the prefill workers' prefill-only steps scale by
`disagg_prefill_scale` instead, the decode workers' steps by `disagg_decode_scale` too).
- synchronized (weight `sync`): TTFT = mean wave steps to a prompt's last chunk x wave step;
  the early prompts decode through about half the wave's remaining prefill steps;
- staggered (1 - sync): a prompt is prefilled alone (aggregated: with the running decodes riding
  along) and each running sequence's prefill interrupts the decode once per OSL tokens; on a
  dedicated prefill pool (disaggregated) it waits in an M/D/1 queue at the pool's load.
Every request pays a fixed `request_overhead_s` before its first token. Admission settings of
the engine (`EngineConfig`, read by provenance in `model.fit.cases`) add their waits, derived from
the run's own rates and step times, not fitted: SGLang's `--scheduler-recv-interval N` ((N-1)/2
decode iterations), TensorRT-LLM's attention-DP balancing (staggered context requests wait
until every DP rank has one, at most `timeout_iters` iterations) and batch waiting (a prompt
waits for more prompts up to `batch_wait_timeout_iters`). Little's law closes the
loop, C = X (TTFT + (OSL-1) TPOT), with X at most what the KV pool (running sequences) and a
dedicated prefill pool (servers / prefill time) sustain; clients beyond that wait in TTFT.

Streaming. Engines that batch their streamed responses (TensorRT-LLM's and SGLang's
`stream_interval`: one response every N iterations, to spare the API server the per-token
detokenization) hand the client its first token only some decode steps after the prefill
produced it: the measured TTFT carries `first_token_steps` decode steps more, and the measured
TPOT, (end-to-end - TTFT) / (OSL - 1), as much less; the request itself takes no longer, so the
closed loop is unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from model.serve.queueing import md1_wait_s

# Scheduler of each engine's default configuration (see module docstring)
SCHEDULER = {"vllm": "mixed", "trtllm": "mixed", "sglang": "prefill_first"}
MAX_PREFILL_LOAD = 0.95  # utilization cap of the M/D/1 wait (the closed-loop bound takes over)


@dataclass(frozen=True)
class Protocol:
    """How the benchmark client loaded the engine.

    rounds: requests each client sends (num_prompts / concurrency); None: not recorded, use the
    fitted `benchmark_rounds`. range_ratio: request lengths drawn uniformly from
    [range_ratio * L, L] for the nominal ISL/OSL L (vLLM's `benchmark_serving` random sampler,
    `--random-range-ratio`); 1: fixed lengths."""

    rounds: float | None = None
    range_ratio: float = 1.0

    @property
    def fixed_lengths(self) -> bool:
        return self.range_ratio >= 1.0

    def mean_length(self, nominal: int) -> int:
        """Mean request length the sampler draws for a nominal length (the run's averages)."""
        lo = int(nominal * min(self.range_ratio, 1.0))
        return max(int(round((lo + nominal) / 2.0)), 1)


@dataclass(frozen=True)
class EngineConfig:
    """Engine settings of a run that change when a request is admitted (defaults: each engine's
    out-of-the-box behaviour; `model.fit.cases` reads the recipes' settings by provenance).

    recv_interval: the scheduler takes new requests from the API server once every N decode
    iterations (SGLang `--scheduler-recv-interval N`; a prefill iteration triggers the next
    receive), so an arriving request waits (N - 1) / 2 iterations on average.
    adp_timeout_iters: TensorRT-LLM attention-DP balancing (`attention_dp_config:
    enable_balance: true, timeout_iters: N`; 0: off): a rank's context requests wait until every
    DP rank has one, at most N iterations (PyExecutor._balance_adp_requests; the counter runs on
    every iteration that is not balanced, so sparse arrivals are released every N iterations).
    batch_wait_timeout_iters, batch_wait_tokens: TensorRT-LLM batch waiting
    (`batch_wait_timeout_iters`, `batch_wait_max_tokens_ratio` x max_num_tokens; 0: off): while
    decodes run, context requests wait until the step would carry batch_wait_tokens tokens, at
    most the timeout (PyExecutor._waiting_requests; the counter runs only while a context
    request waits).
    max_num_batched_tokens: the prefill token budget of one step (None: the caller's default)."""

    recv_interval: float = 1.0
    adp_timeout_iters: float = 0.0
    batch_wait_timeout_iters: float = 0.0
    batch_wait_tokens: float = 0.0
    max_num_batched_tokens: int | None = None


def steady_sync(prefill_first, fixed_lengths, disagg, varied_persistence=0.0):
    """Share of the rounds after the burst that stay synchronized: 1 for a prefill-first
    scheduler with fixed lengths, `varied_persistence` for one with varied lengths (the two
    effects compete), 0 on a mixed scheduler or a disaggregated prefill pool."""
    fixed = np.asarray(fixed_lengths, float)
    return np.asarray(prefill_first, float) * (fixed + (1.0 - fixed) * varied_persistence) * (
        1.0 - np.asarray(disagg, float))


def arrival_sync(rounds, prefill_first, fixed_lengths, disagg, varied_persistence=0.0):
    """Share of requests that arrive in a synchronized wave: the burst round (1/rounds) plus,
    where waves persist, the others."""
    burst = 1.0 / np.maximum(np.asarray(rounds, float), 1.0)
    return burst + (1.0 - burst) * steady_sync(prefill_first, fixed_lengths, disagg,
                                               varied_persistence)


def md1_wait(load, service_s, servers=1.0):
    """Mean M/D/1 queueing delay rho S / (2 (1 - rho)) of a server with utilization rho =
    load / servers (capped below 1; the closed-loop throughput bound takes over beyond)."""
    return md1_wait_s(np.asarray(load, float) / np.maximum(servers, 1.0), service_s,
                      MAX_PREFILL_LOAD)


def adp_balance_wait(dp, rate, t_iter, timeout_iters):
    """Mean wait of a context request under attention-DP balancing: with staggered arrivals at
    `rate` requests/s spread over `dp` ranks, a group is released once all ranks hold one
    ((dp - 1) / (2 rate) on average over the group's requests) or at the timeout (an arrival
    lands uniformly in a window of `timeout_iters` iterations: half of it on average)."""
    dp = np.asarray(dp, float)
    fill = (dp - 1.0) / (2.0 * np.maximum(np.asarray(rate, float), 1e-9))
    return np.where(dp > 1, np.minimum(fill, 0.5 * timeout_iters * np.asarray(t_iter, float)),
                    0.0)


def batch_wait(tokens_needed, new_tokens, rate, t_iter, timeout_iters):
    """Mean wait of a context request under batch waiting: the first request of a group waits
    L = min(time until the missing prompts arrive, timeout), the X L others that join it less
    (uniformly): L (n + 1) / (2 n) with n = 1 + X L."""
    rate = np.maximum(np.asarray(rate, float), 1e-9)
    prompts = np.ceil(np.maximum(np.asarray(tokens_needed, float), 0.0)
                      / np.maximum(np.asarray(new_tokens, float), 1.0))
    first = np.minimum(prompts / rate, np.asarray(timeout_iters, float) * np.asarray(t_iter, float))
    n = 1.0 + rate * first
    return np.where(np.asarray(timeout_iters, float) > 0, first * (n + 1.0) / (2.0 * n), 0.0)


def step_times(c: Mapping, f: Mapping):
    """(decode step, wave prefill step, single-prompt prefill step) seconds with engine factors."""
    ov = f["step_overhead_s"]
    t_dec = (c["k_dec"] + f["moe_scale"] * c["m_dec"]) * f["decode_scale"] + c["n_dec"] + ov
    t_dec = t_dec * (1.0 + c["disagg"] * (f["disagg_decode_scale"] - 1.0))
    pre = f["prefill_scale"] + c["disagg"] * (f["disagg_prefill_scale"] - f["prefill_scale"])
    mp = f["moe_prefill_scale"]
    t_wave = (c["k_wave"] + mp * c["m_wave"]) * pre + c["n_wave"] + ov
    t_one = (c["k_one"] + mp * c["m_one"]) * pre + c["n_one"] + ov
    return t_dec, t_wave, t_one


def rounds_of(c: Mapping, f: Mapping):
    """The run's benchmark rounds, the fitted default where the run does not record them."""
    r = np.asarray(c["rounds"], float)
    return np.where(np.isnan(r), f["benchmark_rounds"], r)


def loop_terms(c: Mapping, f: Mapping, sync=None) -> dict:
    """Every term of the closed loop for runs `c` (components, scalars or arrays) under engine
    factors `f` (factor name -> scalar or per-run array): the step times, the synchronized and
    staggered TTFT/TPOT, the share `sync` (derived unless given: 1 synchronized, 0 staggered),
    the prefill-pool queue, the first-token lag and the closed-loop results."""
    t_dec, t_wave, t_one = step_times(c, f)
    ov = f["step_overhead_s"]
    dis = c["disagg"]
    agg = 1.0 - dis
    first = c["prefill_first"]
    if sync is None:
        sync = arrival_sync(rounds_of(c, f), first, c["fixed_lengths"], dis,
                            f["varied_wave_persistence"])
    request = f["request_overhead_s"] + dis * (f["disagg_request_overhead_s"]
                                               - f["request_overhead_s"])
    osl1 = np.maximum(c["osl"] - 1.0, 1.0)
    ttft_sync = c["wave_steps_mean"] * t_wave + c["t_kv"]
    tpot_sync = t_dec + agg * 0.5 * np.maximum(c["wave_steps"] - 1.0, 0.0) * t_wave / osl1
    prefill_alone = c["chunks"] * t_one
    # mixed: the running decodes ride along in the chunk's step (and share its overhead);
    # prefill-first: the prefill step runs alone and stalls them
    riding = agg * (1.0 - first) * (t_dec - ov)
    ttft_spread = c["chunks"] * (t_one + riding) + c["t_kv"]
    # each rank's sequences prefill once per OSL tokens (DP ranks step together)
    stall = t_one - (1.0 - first) * ov
    tpot_spread = t_dec + agg * c["per_rank"] * c["chunks"] * stall / osl1
    tpot = (sync * tpot_sync + (1 - sync) * tpot_spread) / c["spec"]
    # a dedicated prefill pool: a busy server packs waiting prompts into wave steps, so it
    # completes at most servers * wave_prompts / t_wave prompts/s; staggered arrivals queue at
    # its load (M/D/1, one fixed-point step)
    capacity = np.where(dis > 0, c["prefill_servers"] * c["wave_prompts"] / t_wave, np.inf)
    x0 = c["running"] / (ttft_spread + request + (c["osl"] - 1.0) * tpot)
    queue = dis * md1_wait(x0 / capacity, prefill_alone, 1.0)
    # attention-DP balancing holds staggered context requests (a synchronized wave fills every
    # rank at once)
    adp = c.get("adp_timeout_iters", 0.0)
    balance = np.where(np.asarray(adp) > 0, adp_balance_wait(c.get("dp", 1.0), x0, t_dec, adp),
                       0.0)
    # TensorRT-LLM batch waiting: a prompt waits for more prompts (the step's own prompt and the
    # decode tokens already count)
    waited = batch_wait(c.get("batch_wait_tokens", 0.0) - c.get("new_tokens", 0.0)
                        - c["running"] / np.maximum(c.get("dp", 1.0), 1.0),
                        c.get("new_tokens", 1.0), x0, t_dec, c.get("batch_wait_iters", 0.0))
    # the scheduler picks new requests up once every recv_interval decode iterations
    admission = 0.5 * np.maximum(np.asarray(c.get("recv_interval", 1.0), float) - 1.0, 0.0) * t_dec
    prefill = sync * (ttft_sync - c["t_kv"]) + (1 - sync) * (ttft_spread - c["t_kv"])
    ttft = prefill + c["t_kv"] + (1 - sync) * (queue + balance + waited) + request + admission
    x = np.minimum(c["running"] / (ttft + (c["osl"] - 1.0) * tpot), capacity)
    waiting = np.maximum(c["concurrency"] / x - (c["osl"] - 1.0) * tpot - ttft, 0.0)
    # streamed responses: the first token reaches the client some decode steps late
    lag = np.minimum(f["first_token_steps"] * t_dec, 0.5 * (c["osl"] - 1.0) * tpot)
    return {"t_dec": t_dec, "t_wave": t_wave, "t_one": t_one, "sync": sync,
            "prefill": prefill, "kv_transfer": c["t_kv"], "request_overhead": request,
            "prefill_queue": (1 - sync) * queue, "adp_balance": (1 - sync) * balance,
            "admission": admission, "batch_wait": (1 - sync) * waited,
            "waiting": waiting, "first_token_lag": lag,
            "prefill_interference": tpot * c["spec"] - t_dec,
            "ttft": ttft + waiting + lag, "tpot": tpot - lag / osl1, "x": x}


def closed_loop(c: Mapping, f: Mapping, sync=None):
    """TTFT, TPOT (s) and completed requests/s of runs `c` under engine factors `f` (see
    `loop_terms`)."""
    t = loop_terms(c, f, sync)
    return t["ttft"], t["tpot"], t["x"]


def explain_terms(c: Mapping, f: Mapping) -> dict:
    """The seconds each modeled term contributes to TPOT and TTFT of one run (what
    `model.validate.check.explain_case` reports), from `loop_terms`."""
    t = {k: float(np.asarray(v)) for k, v in loop_terms(c, f).items()}
    dis = float(c["disagg"])
    scale = (1.0 + dis * (f["disagg_decode_scale"] - 1.0)) * f["decode_scale"]
    spec = float(c["spec"])
    tpot = {"decode_kernels": c["k_dec"] * scale / spec,
            "decode_experts": f["moe_scale"] * c["m_dec"] * scale / spec,
            "network": c["n_dec"] * (1.0 + dis * (f["disagg_decode_scale"] - 1.0)) / spec,
            "step_overhead": f["step_overhead_s"] / spec,
            "prefill_interference": t["prefill_interference"] / spec}
    ttft = {"prefill": t["prefill"], "kv_transfer": t["kv_transfer"],
            "request_overhead": t["request_overhead"], "first_token_stream": t["first_token_lag"],
            "queueing": t["prefill_queue"] + t["waiting"], "adp_balance": t["adp_balance"],
            "admission": t["admission"], "batch_wait": t["batch_wait"]}
    return {"sync": t["sync"], "tpot": {k: float(v) for k, v in tpot.items()},
            "ttft": {k: float(v) for k, v in ttft.items()}}
