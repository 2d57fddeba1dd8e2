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
`disagg_prefill_scale` instead, the decode workers' steps by `disagg_decode_scale` too); each
at least its kernels' physical floor + network + overhead.
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
loop, C = X (TTFT + (OSL-1) TPOT), with X at most what the KV pool (running sequences) and the
prefill servers (the DP ranks of an aggregated replica, a dedicated prefill pool) sustain:
servers x prompts per wave step / wave step, the asymptotic bound X <= 1 / D_max of the
operational laws; clients beyond that wait in TTFT.

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

from model.serve.mean_waits import md1_wait_s

# Scheduler of each engine's default configuration (see module docstring)
SCHEDULER = {"vllm": "mixed", "trtllm": "mixed", "sglang": "prefill_first"}
MAX_PREFILL_LOAD = 0.95  # utilization cap of the M/D/1 wait (the closed-loop bound takes over)


@dataclass(frozen=True)
class Protocol:
    """How the benchmark client loaded the engine.

    rounds: requests each client sends (num_prompts / concurrency); None: not recorded, use the
    fitted `benchmark_rounds`. range_ratio: request lengths drawn uniformly from
    [range_ratio * L, L] for the nominal ISL/OSL L (vLLM's `benchmark_serving` random sampler,
    `--random-range-ratio`); 1: fixed lengths. decode_context_share: mean context of a sequence
    in the running decode batch beyond the mean prompt, in mean outputs (0.5: fixed lengths)."""

    rounds: float | None = None
    range_ratio: float = 1.0
    decode_context_share: float = 0.5

    def running_context(self, isl: float, osl: float) -> float:
        """Mean context of a sequence in the running decode batch: isl + share x osl. With fixed
        lengths each sequence is on average halfway through its output (share 0.5). Where
        outputs vary, a sequence stays in the batch for as many steps as it has output tokens,
        so the batch holds sequences in proportion to their output length (length-biased
        sampling, renewal theory's inspection paradox): the mean context is the
        output-weighted mean of prompt + output / 2 over the dataset's samples, E[o (i + o/2)] /
        E[o] (E[i] + E[o^2] / (2 E[o]) where lengths are independent)."""
        return isl + self.decode_context_share * osl

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

    recv_interval_iters: the scheduler takes new requests from the API server once every N decode
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

    recv_interval_iters: float = 1.0
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


def adp_balance_wait_s(dp, rate_rps, iteration_s, timeout_iters):
    """Mean wait of a context request under attention-DP balancing: with staggered arrivals at
    `rate_rps` requests/s spread over `dp` ranks, a group is released once all ranks hold one
    ((dp - 1) / (2 rate) on average over the group's requests) or at the timeout (an arrival
    lands uniformly in a window of `timeout_iters` iterations: half of it on average)."""
    dp = np.asarray(dp, float)
    fill = (dp - 1.0) / (2.0 * np.maximum(np.asarray(rate_rps, float), 1e-9))
    return np.where(dp > 1, np.minimum(fill, 0.5 * timeout_iters * np.asarray(iteration_s, float)),
                    0.0)


def batch_wait_s(tokens_needed, new_tokens, rate_rps, iteration_s, timeout_iters):
    """Mean wait of a context request under batch waiting: the first request of a group waits
    L = min(time until the missing prompts arrive, timeout), the X L others that join it less
    (uniformly): L (n + 1) / (2 n) with n = 1 + X L (X: the arrival rate)."""
    rate = np.maximum(np.asarray(rate_rps, float), 1e-9)
    prompts = np.ceil(np.maximum(np.asarray(tokens_needed, float), 0.0)
                      / np.maximum(np.asarray(new_tokens, float), 1.0))
    timeout_s = np.asarray(timeout_iters, float) * np.asarray(iteration_s, float)
    first = np.minimum(prompts / rate, timeout_s)
    n = 1.0 + rate * first
    return np.where(np.asarray(timeout_iters, float) > 0, first * (n + 1.0) / (2.0 * n), 0.0)


def step_times_s(c: Mapping, f: Mapping):
    """(decode step, wave prefill step, single-prompt prefill step) seconds of runs `c` under
    engine factors `f`: (kernels + scaled routed experts) x phase scale + network + overhead,
    never less than the kernels' physical floor (`{kind}_floor_s`: FLOPs at peak, bytes at full
    HBM bandwidth) + network + overhead: a fitted factor below 1 makes an engine faster than the
    measured kernels, never faster than the chip."""
    ov = f["step_overhead_s"]

    def floored(kind, step_s):
        return np.maximum(step_s, c[f"{kind}_floor_s"] + c[f"{kind}_network_s"] + ov)

    t_dec = ((c["decode_kernel_s"] + f["moe_scale"] * c["decode_expert_s"]) * f["decode_scale"]
             + c["decode_network_s"] + ov)
    t_dec = floored("decode", t_dec * (1.0 + c["disagg"] * (f["disagg_decode_scale"] - 1.0)))
    pre = f["prefill_scale"] + c["disagg"] * (f["disagg_prefill_scale"] - f["prefill_scale"])
    mp = f["moe_prefill_scale"]
    t_wave = floored("wave", (c["wave_kernel_s"] + mp * c["wave_expert_s"]) * pre
                     + c["wave_network_s"] + ov)
    t_one = floored("one", (c["one_kernel_s"] + mp * c["one_expert_s"]) * pre
                    + c["one_network_s"] + ov)
    return t_dec, t_wave, t_one


def rounds_of(c: Mapping, f: Mapping):
    """The run's benchmark rounds, the fitted default where the run does not record them."""
    r = np.asarray(c["rounds"], float)
    return np.where(np.isnan(r), f["benchmark_rounds"], r)


def _admission_waits_s(c: Mapping, t_dec, rate_rps) -> dict:
    """The engine's admission waits of a staggered context request at the first-pass request
    rate (`EngineConfig`): attention-DP balancing, batch waiting (the step's own prompt and the
    decode tokens already count toward the batch) and the scheduler's receive interval."""
    adp = c.get("adp_timeout_iters", 0.0)
    balance = np.where(np.asarray(adp) > 0,
                       adp_balance_wait_s(c.get("dp", 1.0), rate_rps, t_dec, adp), 0.0)
    waited = batch_wait_s(c.get("batch_wait_tokens", 0.0) - c.get("new_tokens", 0.0)
                          - c["running_seqs"] / np.maximum(c.get("dp", 1.0), 1.0),
                          c.get("new_tokens", 1.0), rate_rps, t_dec,
                          c.get("batch_wait_iters", 0.0))
    recv = np.asarray(c.get("recv_interval_iters", 1.0), float)
    admission = 0.5 * np.maximum(recv - 1.0, 0.0) * t_dec
    return {"adp_balance_s": balance, "batch_wait_s": waited, "admission_s": admission}


def loop_terms(c: Mapping, f: Mapping, sync=None) -> dict:
    """Every term of the closed loop for runs `c` (components, scalars or arrays) under engine
    factors `f` (factor name -> scalar or per-run array): the step times, the synchronized and
    staggered TTFT/TPOT, the share `sync` (derived unless given: 1 synchronized, 0 staggered),
    the prefill-pool queue, the admission waits, the first-token lag and the closed-loop
    results (`ttft_s`, `tpot_s`, `rate_rps`)."""
    t_dec, t_wave, t_one = step_times_s(c, f)
    ov = f["step_overhead_s"]
    dis = c["disagg"]
    agg = 1.0 - dis
    first = c["prefill_first"]
    osl = c["osl_tokens"]
    t_kv = c["kv_transfer_s"]
    if sync is None:
        sync = arrival_sync(rounds_of(c, f), first, c["fixed_lengths"], dis,
                            f["varied_wave_persistence"])
    request = f["request_overhead_s"] + dis * (f["disagg_request_overhead_s"]
                                               - f["request_overhead_s"])
    osl1 = np.maximum(osl - 1.0, 1.0)
    ttft_sync = c["wave_steps_mean"] * t_wave + t_kv
    tpot_sync = t_dec + agg * 0.5 * np.maximum(c["wave_steps"] - 1.0, 0.0) * t_wave / osl1
    prefill_alone = c["chunks"] * t_one
    # mixed: the running decodes ride along in the chunk's step (and share its overhead);
    # prefill-first: the prefill step runs alone and stalls them
    riding = agg * (1.0 - first) * (t_dec - ov)
    ttft_spread = c["chunks"] * (t_one + riding) + t_kv
    # each rank's sequences prefill once per OSL tokens (DP ranks step together)
    stall = t_one - (1.0 - first) * ov
    tpot_spread = t_dec + agg * c["seqs_per_server"] * c["chunks"] * stall / osl1
    tpot = (sync * tpot_sync + (1 - sync) * tpot_spread) / c["tokens_per_step"]
    # the prefill ceiling: a busy server packs waiting prompts into wave steps, so it completes
    # at most servers * wave_prompts / t_wave prompts/s (aggregated: the dp ranks, which also
    # decode); on a dedicated prefill pool staggered arrivals queue at its load (M/D/1, one
    # fixed-point step)
    capacity = c["prefill_servers"] * c["wave_prompts"] / t_wave
    x0 = c["running_seqs"] / (ttft_spread + request + (osl - 1.0) * tpot)
    queue = dis * md1_wait_s(x0 / capacity, prefill_alone, MAX_PREFILL_LOAD)
    # admission waits hold staggered context requests (a synchronized wave fills every rank
    # at once); the receive interval delays every request
    waits = _admission_waits_s(c, t_dec, x0)
    prefill = sync * (ttft_sync - t_kv) + (1 - sync) * (ttft_spread - t_kv)
    ttft = (prefill + t_kv + (1 - sync) * (queue + waits["adp_balance_s"] + waits["batch_wait_s"])
            + request + waits["admission_s"])
    x = np.minimum(c["running_seqs"] / (ttft + (osl - 1.0) * tpot), capacity)
    waiting = np.maximum(c["concurrency"] / x - (osl - 1.0) * tpot - ttft, 0.0)
    # streamed responses: the first token reaches the client some decode steps late
    lag = np.minimum(f["first_token_steps"] * t_dec, 0.5 * (osl - 1.0) * tpot)
    return {"decode_step_s": t_dec, "wave_step_s": t_wave, "one_step_s": t_one, "sync": sync,
            "prefill_s": prefill, "kv_transfer_s": t_kv, "request_overhead_s": request,
            "prefill_queue_s": (1 - sync) * queue,
            "adp_balance_s": (1 - sync) * waits["adp_balance_s"],
            "admission_s": waits["admission_s"], "batch_wait_s": (1 - sync) * waits["batch_wait_s"],
            "waiting_s": waiting, "first_token_lag_s": lag,
            "prefill_interference_s": tpot * c["tokens_per_step"] - t_dec,
            "ttft_s": ttft + waiting + lag, "tpot_s": tpot - lag / osl1, "rate_rps": x}


def closed_loop(c: Mapping, f: Mapping, sync=None):
    """(TTFT s, TPOT s, completed requests/s) of runs `c` under engine factors `f` (see
    `loop_terms`)."""
    t = loop_terms(c, f, sync)
    return t["ttft_s"], t["tpot_s"], t["rate_rps"]


def explain_terms(c: Mapping, f: Mapping) -> dict:
    """The seconds each modeled term contributes to TPOT and TTFT of one run (what
    `model.validate.check.explain_case` reports), from `loop_terms`: `sync`, `tpot_terms_s` and
    `ttft_terms_s` (term name -> seconds)."""
    t = {k: float(np.asarray(v)) for k, v in loop_terms(c, f).items()}
    dis = float(c["disagg"])
    worker = 1.0 + dis * (f["disagg_decode_scale"] - 1.0)
    scale = worker * f["decode_scale"]
    spec = float(c["tokens_per_step"])
    scaled = ((c["decode_kernel_s"] + f["moe_scale"] * c["decode_expert_s"]) * f["decode_scale"]
              + c["decode_network_s"] + f["step_overhead_s"]) * worker
    tpot = {"decode_kernels": c["decode_kernel_s"] * scale / spec,
            "decode_experts": f["moe_scale"] * c["decode_expert_s"] * scale / spec,
            "network": c["decode_network_s"] * worker / spec,
            "step_overhead": f["step_overhead_s"] / spec,
            # what the kernels' physical floor adds where the scaled step would beat it
            "kernel_floor": max(t["decode_step_s"] - scaled, 0.0) / spec,
            "prefill_interference": t["prefill_interference_s"] / spec}
    ttft = {"prefill": t["prefill_s"], "kv_transfer": t["kv_transfer_s"],
            "request_overhead": t["request_overhead_s"],
            "first_token_stream": t["first_token_lag_s"],
            "queueing": t["prefill_queue_s"] + t["waiting_s"], "adp_balance": t["adp_balance_s"],
            "admission": t["admission_s"], "batch_wait": t["batch_wait_s"]}
    return {"sync": t["sync"], "tpot_terms_s": {k: float(v) for k, v in tpot.items()},
            "ttft_terms_s": {k: float(v) for k, v in ttft.items()}}
