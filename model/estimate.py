"""Closed-loop steady state of a benchmark run: C concurrent requests of ISL prompt tokens and OSL
output tokens, each client sending its next request as soon as the last one finished (how
`vllm bench serve --max-concurrency C` and the calibration runs load the engine).

Two steps: `agg_components` / `disagg_components` compute the physics of the run once (kernel,
network and routed-expert seconds of the three step kinds a run is made of: a wave prefill step,
a single-prompt prefill step, a decode step; how many sequences the KV pool holds; the KV
transfer), then `closed_loop` turns them into TTFT, TPOT and throughput with the engine factors
(`model.engine_fit`). The fit evaluates only `closed_loop`, vectorized over all measured runs.

Arrivals. With fixed ISL/OSL the clients of a benchmark drift into waves that arrive together;
`arrival="synchronized"` prefills a wave of prompts in budget-sized chunks (TTFT = the steps up
to a prompt's last chunk), `"staggered"` prefills each prompt alone, and `"benchmark"` (default)
mixes them with the fitted per-backend `arrival_sync`. TPOT is the decode step at the running
batch plus the prefill steps that interrupt it. Little's law closes the loop,
C = X (TTFT + (OSL-1) TPOT): clients beyond what the KV pool holds wait, and that wait is in TTFT.

Disaggregated: prefill workers (x their DP ranks) take the prompts, the KV crosses the network
to a decode worker, decode workers run batches of C/decode_workers sequences undisturbed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from model.errors import Infeasible, ServecastError
from model.parallel import ParallelPlan
from model.step import StepModel, build_step_model

MAX_NUM_BATCHED_TOKENS = 8192  # vLLM online-serving default on H100-class GPUs (and SGLang's chunk)


@dataclass(frozen=True)
class Disagg:
    """Disaggregated deployment: plans and worker counts of the prefill and decode pools."""

    prefill_plan: ParallelPlan
    decode_plan: ParallelPlan
    prefill_workers: int = 1
    decode_workers: int = 1


def _check_inputs(isl, osl, concurrency, prefix_tokens):
    if isl < 1 or osl < 1:
        raise ServecastError(f"--isl and --osl must be >= 1 (got {isl}, {osl})")
    if concurrency < 1:
        raise ServecastError(f"--concurrency must be >= 1 (got {concurrency})")
    if not 0 <= prefix_tokens < isl:
        raise ServecastError(f"--prefix must be in [0, isl) (got {prefix_tokens}, isl {isl})")


def _result(ttft, tpot, x, isl, osl, gpus, memory, extra=None) -> dict:
    out = {
        "feasible": True, "reason": None,
        "ttft_ms": float(ttft) * 1e3, "tpot_ms": float(tpot) * 1e3,
        "interactivity_tok_s": 1.0 / float(tpot),
        "requests_per_s": float(x),
        "output_tokens_per_s_per_gpu": float(x) * osl / gpus,
        "total_tokens_per_s_per_gpu": float(x) * (isl + osl) / gpus,
        "memory_bytes_per_gpu": float(memory), "gpus": gpus,
    }
    out.update(extra or {})
    return out


def infeasible(reason: str, **extra) -> dict:
    return {"feasible": False, "reason": reason, "ttft_ms": None, "tpot_ms": None,
            "output_tokens_per_s_per_gpu": None, "total_tokens_per_s_per_gpu": None,
            "memory_bytes_per_gpu": extra.pop("memory_bytes_per_gpu", None), **extra}


def _prefill_queue_steps(prompts, new_tokens, step_tokens):
    """Mean number of prefill steps until a prompt's last chunk ran, when `prompts` prompts of
    `new_tokens` arrive together and each step packs `step_tokens` prompt tokens (FCFS)."""
    n = max(int(round(prompts)), 1)
    i = np.arange(1, n + 1)
    return float(np.mean(np.ceil(i * new_tokens / step_tokens)))


def _kv_limit(sm: StepModel, isl: int, osl: int) -> float:
    """Sequences the KV pool holds at their mean occupancy (prompt + half the output): engines
    admit on the blocks a sequence holds now and grow it block by block."""
    if float(sm.kv_capacity_tokens(isl + osl)) < isl + osl:
        raise Infeasible(f"one sequence of {isl + osl} tokens needs more KV than the "
                         f"{sm.kv_pool_bytes_per_gpu / 1e9:.1f} GB pool per GPU under "
                         f"{sm.plan.label()}")
    mean_len = isl + osl / 2.0
    cap_tokens = float(sm.kv_capacity_tokens(mean_len))
    max_running = cap_tokens / mean_len
    if max_running < 1.0:
        raise Infeasible(f"one sequence of {isl + osl} tokens needs more KV than the "
                         f"{sm.kv_pool_bytes_per_gpu / 1e9:.1f} GB pool per GPU under "
                         f"{sm.plan.label()}")
    return max_running


# ---- components: the physics of one run, before engine factors ------------------------------------
def agg_components(sm: StepModel, isl: int, osl: int, concurrency: int, prefix_tokens: int = 0,
                   max_num_batched_tokens: int = MAX_NUM_BATCHED_TOKENS) -> dict:
    """Kernel/network seconds of the steps an aggregated run is made of (engine factors apply
    later in `closed_loop`), and the counts that combine them."""
    new = float(isl - prefix_tokens)
    p = sm.plan
    max_running = _kv_limit(sm, isl, osl)
    running = float(min(concurrency, np.floor(max_running)))
    per_rank = max(running / p.dp, 1.0)
    budget = float(max_num_batched_tokens)
    # synchronized wave: all running prompts arrive together, packed into budget-sized steps
    wave_tokens = min(budget, per_rank * new)
    # staggered: one prompt at a time (chunked), decodes riding along
    chunk = min(budget, new)
    # the three step kinds in one vectorized call: wave prefill, single prompt, decode
    (k_wave, k_one, k_dec), (n_wave, n_one, n_dec), (m_wave, m_one, m_dec) = sm.step_parts(
        [wave_tokens * p.dp, chunk * p.dp, 0.0], [isl, isl, 0.0],
        [0.0, 0.0, running / p.pp], [0.0, 0.0, isl + osl / 2.0],
        [max(wave_tokens / new, 1.0) * p.dp, p.dp, 1.0])
    return {"m_dec": float(m_dec), "m_wave": float(m_wave), "m_one": float(m_one),
            "k_dec": float(k_dec), "n_dec": float(n_dec), "k_wave": float(k_wave),
            "n_wave": float(n_wave), "wave_steps_mean": _prefill_queue_steps(per_rank, new,
                                                                            wave_tokens),
            "wave_steps": float(np.ceil(per_rank * new / wave_tokens)),
            "k_one": float(k_one), "n_one": float(n_one), "chunks": float(np.ceil(new / chunk)),
            "running": running, "concurrency": float(concurrency), "osl": float(osl),
            "per_rank": per_rank, "t_kv": 0.0, "disagg": 0.0,
            "spec": float(sm.tokens_per_decode_step), "max_running": max_running}


def disagg_components(pre: StepModel, dec: StepModel, d: Disagg, isl: int, osl: int,
                      concurrency: int, prefix_tokens: int = 0,
                      max_num_batched_tokens: int = MAX_NUM_BATCHED_TOKENS) -> dict:
    new = float(isl - prefix_tokens)
    cap = _kv_limit(dec, isl, osl)
    if float(pre.kv_capacity_tokens(isl)) < isl:
        raise Infeasible(f"prefill workers under {pre.plan.label()} cannot hold one prompt of "
                         f"{isl} tokens")
    per_worker = min(concurrency / d.decode_workers, np.floor(cap))
    running = per_worker * d.decode_workers
    servers = d.prefill_workers * pre.plan.dp
    per_server = max(running / servers, 1.0)
    budget = float(max_num_batched_tokens)
    wave_tokens = min(budget, per_server * new)
    chunk = min(budget, new)
    (k_wave, k_one), (n_wave, n_one), (m_wave, m_one) = pre.step_parts(
        [wave_tokens * pre.plan.dp, chunk * pre.plan.dp], isl, 0.0, 0.0,
        [max(wave_tokens / new, 1.0) * pre.plan.dp, pre.plan.dp])
    k_dec, n_dec, m_dec = dec.step_parts(0, 0, per_worker / dec.plan.pp, isl + osl / 2.0)
    kv_bytes = float(dec.kv_bytes_per_seq_per_gpu(isl)) * dec.plan.attention_gpus
    bw = getattr(pre.hw, "scale_out_bandwidth_bytes_per_s", 50e9) * pre.gpus
    return {"m_dec": float(m_dec), "m_wave": float(m_wave), "m_one": float(m_one),
            "k_dec": float(k_dec), "n_dec": float(n_dec), "k_wave": float(k_wave),
            "n_wave": float(n_wave),
            "wave_steps_mean": _prefill_queue_steps(per_server, new, wave_tokens),
            "wave_steps": float(np.ceil(per_server * new / wave_tokens)),
            "k_one": float(k_one), "n_one": float(n_one), "chunks": float(np.ceil(new / chunk)),
            "running": float(running), "concurrency": float(concurrency), "osl": float(osl),
            "per_rank": per_server, "t_kv": kv_bytes / bw, "disagg": 1.0,
            "spec": float(dec.tokens_per_decode_step), "max_running": cap * d.decode_workers}


def closed_loop(c: dict, overhead, prefill_scale, decode_scale, sync, request_overhead=0.0,
                moe_scale=1.0, disagg_decode_scale=1.0, disagg_sync=None,
                disagg_request_overhead=None):
    """TTFT, TPOT (s) and completed requests/s from components and engine factors.

    All inputs broadcast (components may be arrays over runs: this is what the fit evaluates).
    - decode step: (kernels + moe_scale * routed experts) * decode_scale + network + overhead;
    - prefill steps: the same with prefill_scale;
    - disaggregated decode workers: the decode step times `disagg_decode_scale` (their measured
      runs are faster than the aggregated fit implies: speculative decoding and worker counts
      the records do not carry are folded in here);
    - synchronized arrivals (weight `sync`): a wave of prompts is prefilled in budget-sized
      steps, a prompt's TTFT is the steps up to its last chunk, and the early ones decode through
      about half the wave's remaining prefill steps;
    - spread-out arrivals (1 - sync): a prompt is prefilled alone (aggregated: with the running
      decodes riding along), and each of the running sequences' prefills interrupts the decode
      once per OSL tokens;
    - every request pays a fixed `request_overhead` before its first token (API server,
      tokenization, scheduling admission, detokenization and streaming of the first token);
    - Little's law closes the loop: C = x (TTFT + (OSL-1) TPOT); clients beyond the KV limit
      wait, which adds to TTFT.
    """
    if disagg_sync is not None:  # disaggregated runs have their own request path and arrivals
        sync = sync + c["disagg"] * (disagg_sync - sync)
    if disagg_request_overhead is not None:
        request_overhead = request_overhead + c["disagg"] * (disagg_request_overhead
                                                             - request_overhead)
    t_dec = (c["k_dec"] + moe_scale * c["m_dec"]) * decode_scale + c["n_dec"] + overhead
    t_dec = t_dec * (1.0 + c["disagg"] * (disagg_decode_scale - 1.0))
    t_wave = (c["k_wave"] + moe_scale * c["m_wave"]) * prefill_scale + c["n_wave"] + overhead
    t_one = (c["k_one"] + moe_scale * c["m_one"]) * prefill_scale + c["n_one"] + overhead
    agg = 1.0 - c["disagg"]
    osl1 = np.maximum(c["osl"] - 1.0, 1.0)
    ttft_sync = c["wave_steps_mean"] * t_wave + c["t_kv"]
    tpot_sync = t_dec + agg * 0.5 * np.maximum(c["wave_steps"] - 1.0, 0.0) * t_wave / osl1
    ttft_spread = c["chunks"] * (t_one + agg * (t_dec - overhead)) + c["t_kv"]
    # each rank's sequences prefill once per OSL tokens (DP ranks step together)
    tpot_spread = t_dec + agg * c["per_rank"] * c["chunks"] * (t_one - overhead) / osl1
    ttft = sync * ttft_sync + (1 - sync) * ttft_spread + request_overhead
    tpot = (sync * tpot_sync + (1 - sync) * tpot_spread) / c["spec"]
    x = c["running"] / (ttft + (c["osl"] - 1.0) * tpot)
    ttft = np.maximum(c["concurrency"] / x - (c["osl"] - 1.0) * tpot, ttft)
    return ttft, tpot, x


def _run(comp: dict, factors, arrival: str):
    if arrival not in ("benchmark", "synchronized", "staggered"):
        raise ServecastError(f"unknown arrival {arrival!r}; allowed: benchmark, synchronized, "
                             f"staggered")
    fixed = {"synchronized": 1.0, "staggered": 0.0}.get(arrival)
    sync = factors.arrival_sync if fixed is None else fixed
    disagg_sync = factors.disagg_arrival_sync if fixed is None else fixed
    ttft, tpot, x = closed_loop(comp, factors.step_overhead_s, factors.prefill_scale,
                                factors.decode_scale, sync, factors.request_overhead_s,
                                factors.moe_scale, factors.disagg_decode_scale, disagg_sync,
                                factors.disagg_request_overhead_s)
    return float(ttft), float(tpot), float(x)


def aggregated(sm: StepModel, isl: int, osl: int, concurrency: int, prefix_tokens: int = 0,
               max_num_batched_tokens: int = MAX_NUM_BATCHED_TOKENS,
               arrival: str = "benchmark") -> dict:
    """Closed-loop steady state of one aggregated replica."""
    comp = agg_components(sm, isl, osl, concurrency, prefix_tokens, max_num_batched_tokens)
    ttft, tpot, x = _run(comp, sm.factors, arrival)
    memory = float(sm.memory_bytes_per_gpu(comp["running"], isl + osl))
    return _result(ttft, tpot, x, isl, osl, sm.gpus, memory,
                   {"kv_capacity_tokens": comp["max_running"] * (isl + osl),
                    "running_seqs": comp["running"], "mode": "aggregated", "arrival": arrival,
                    "plan": sm.plan.label(), "components": comp})


def disaggregated(pre: StepModel, dec: StepModel, d: Disagg, isl: int, osl: int,
                  concurrency: int, prefix_tokens: int = 0,
                  max_num_batched_tokens: int = MAX_NUM_BATCHED_TOKENS,
                  arrival: str = "benchmark") -> dict:
    """Prefill pool -> KV transfer -> decode pool, closed loop of `concurrency` clients."""
    comp = disagg_components(pre, dec, d, isl, osl, concurrency, prefix_tokens,
                             max_num_batched_tokens)
    ttft, tpot, x = _run(comp, dec.factors, arrival)
    gpus = pre.gpus * d.prefill_workers + dec.gpus * d.decode_workers
    memory = max(float(pre.memory_bytes_per_gpu(1, isl)),
                 float(dec.memory_bytes_per_gpu(comp["running"] / d.decode_workers, isl + osl)))
    return _result(ttft, tpot, x, isl, osl, gpus, memory,
                   {"mode": "disaggregated", "arrival": arrival,
                    "kv_transfer_ms": comp["t_kv"] * 1e3, "prefill_plan": pre.plan.label(),
                    "decode_plan": dec.plan.label(), "running_seqs": comp["running"],
                    "components": comp})


def estimate(arch, hw, plan: ParallelPlan, isl: int, osl: int, concurrency: int,
             precision: str | None = None, prefix_tokens: int = 0,
             disagg: Disagg | None = None, kv_dtype: str | None = None, backend: str = "vllm",
             breakdown: bool = False, max_num_batched_tokens: int = MAX_NUM_BATCHED_TOKENS,
             moe_precision: str | None = None, arrival: str = "benchmark",
             cross_domain_tp: bool = False, spec_tokens: int = 0,
             spec_acceptance: float = 0.0) -> dict:
    """The `servecast estimate` contract: ttft_ms, tpot_ms, output/total tokens per s per GPU,
    memory_bytes_per_gpu, feasible, reason (+ mode, plans, optional per-op breakdown)."""
    _check_inputs(isl, osl, concurrency, prefix_tokens)
    if spec_tokens < 0 or not 0.0 <= spec_acceptance <= 1.0:
        raise ServecastError(f"--spec-tokens must be >= 0 and --spec-acceptance in [0, 1] "
                             f"(got {spec_tokens}, {spec_acceptance})")
    try:
        if disagg is None:
            sm = build_step_model(arch, hw, plan, precision, kv_dtype, backend,
                                  moe_precision=moe_precision,
                                  cross_domain_tp=cross_domain_tp, spec_tokens=spec_tokens,
                                  spec_acceptance=spec_acceptance)
            out = aggregated(sm, isl, osl, concurrency, prefix_tokens, max_num_batched_tokens,
                             arrival)
            models = {"step": sm}
        else:
            pre = build_step_model(arch, hw, disagg.prefill_plan, precision, kv_dtype, backend,
                                   moe_precision=moe_precision,
                                  cross_domain_tp=cross_domain_tp, spec_tokens=spec_tokens,
                                  spec_acceptance=spec_acceptance)
            dec = build_step_model(arch, hw, disagg.decode_plan, precision, kv_dtype, backend,
                                   moe_precision=moe_precision,
                                  cross_domain_tp=cross_domain_tp, spec_tokens=spec_tokens,
                                  spec_acceptance=spec_acceptance)
            out = disaggregated(pre, dec, disagg, isl, osl, concurrency, prefix_tokens,
                                max_num_batched_tokens, arrival)
            models = {"prefill": pre, "decode": dec}
    except Infeasible as why:
        return infeasible(str(why))
    out["arch"] = getattr(arch, "name", "")
    out["hardware"] = getattr(hw, "name", "")
    out["backend"] = backend
    if breakdown:
        out["breakdown"] = {}
        for role, sm in models.items():
            run = out.get("running_seqs", concurrency / (disagg.decode_workers if disagg else 1))
            dec_b = sm.breakdown(0, 0, max(run, 1.0), isl + osl / 2.0)
            pre_b = sm.breakdown(min(isl - prefix_tokens, max_num_batched_tokens), isl, 0, 0)
            out["breakdown"][role] = {"decode_step": _trim(dec_b), "prefill_step": _trim(pre_b)}
        b = out["breakdown"].get("step") or out["breakdown"]["decode"]
        out["bottleneck"] = b["decode_step"]["bottleneck"]
    return out


def _trim(b: dict) -> dict:
    return {"step_time_ms": b["step_time_s"] * 1e3, "bottleneck": b["bottleneck"],
            "time_by_bound_ms": {k: v * 1e3 for k, v in b["time_by_bound_s"].items()},
            "flops_per_gpu": b["flops_per_gpu"],
            "weight_bytes_read_per_gpu": b["weight_bytes_read_per_gpu"],
            "kv_bytes_per_gpu": b["kv_bytes_per_gpu"],
            "ops": [{"op": r["op"], "kind": r["kind"], "time_ms": r["time_s"] * 1e3}
                    for r in b["ops"]]}
