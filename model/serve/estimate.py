"""Closed-loop steady state of a benchmark run: C concurrent requests of ISL prompt tokens and OSL
output tokens, each client sending its next request as soon as the last one finished (how
`vllm bench serve --max-concurrency C` and the calibration runs load the engine).

Two steps: `agg_components` / `disagg_components` compute the physics of the run once (kernel,
network and routed-expert seconds of the three step kinds a run is made of: a wave prefill step,
a single-prompt prefill step, a decode step; how many sequences the KV pool holds; the KV
transfer; the benchmark protocol and the engine's scheduler kind), then
`model.serve.closed_loop.closed_loop` turns them into TTFT, TPOT and throughput with the engine
factors (`model.perf.engine_factors`, fitted by `model.fit.engine`, which evaluates only
`closed_loop`, vectorized over all runs).

Arrivals: `arrival="benchmark"` (default) derives how synchronized the clients are from the
protocol (rounds, fixed or drawn lengths) and the scheduler (see `model.serve.closed_loop`);
`"synchronized"` and `"staggered"` force either extreme. `engine` (`EngineConfig`) carries the
engine settings that delay admission (scheduler receive interval, attention-DP balancing, batch
waiting) and the prefill token budget; default: the engines' out-of-the-box behaviour.

Disaggregated: prefill workers (x their DP ranks) take the prompts, the KV crosses the network
to a decode worker, decode workers run batches of C/decode_workers sequences undisturbed. A
worker count given as None (a record that does not carry it) is inferred as the minimum the run
implies: decode workers = ceil(C / sequences one decode worker's KV pool holds), prefill workers
the fewest that keep up with those decode workers (`infer_decode_workers`,
`infer_prefill_workers`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from model.perf.engine_factors import load_loop_factors
from model.perf.parallel import ParallelPlan
from model.perf.step import StepModel, build_step_model
from model.perf.step_inputs import check_attention_flags
from model.serve.closed_loop import SCHEDULER, EngineConfig, Protocol, closed_loop
from model.specs.defaults import (
    ATTENTION_BACKEND,
    DRAFT_ATTENTION_BACKEND,
    MAX_NUM_BATCHED_TOKENS,
)
from model.specs.dtypes import dtype
from model.specs.errors import Infeasible, ServecastError

__all__ = ["Disagg", "EngineConfig", "Protocol", "closed_loop", "estimate", "aggregated",
           "disaggregated", "agg_components", "disagg_components", "infer_decode_workers",
           "infer_prefill_workers"]



@dataclass(frozen=True)
class Disagg:
    """Disaggregated deployment: plans and worker counts of the prefill and decode pools (None:
    not known: inferred by `infer_decode_workers`, `infer_prefill_workers`)."""

    prefill_plan: ParallelPlan
    decode_plan: ParallelPlan
    prefill_workers: int | None = 1
    decode_workers: int | None = 1


def infer_decode_workers(d: Disagg, concurrency: int, decode_capacity_seqs: float) -> int:
    """Decode workers of a deployment, the minimum the run implies where the record leaves them
    out: C clients all hold a running sequence in steady state, so the decode pool holds at
    least C sequences: max(1, ceil(C / floor(sequences one decode worker's KV pool holds)))."""
    if d.decode_workers is not None:
        return d.decode_workers
    return max(1, int(np.ceil(concurrency / max(np.floor(decode_capacity_seqs), 1.0))))


def infer_prefill_workers(d: Disagg, rate_rps: float, prefill_s: float,
                          ranks: int) -> int:
    """Prefill workers of a deployment, where the record leaves them out: the fewest that keep up
    with the decode pool (a pool sized below that would make every other number of the run
    meaningless): max(1, ceil(rate * prefill seconds per request / DP ranks per worker)), the
    rate being what the decode workers complete at their decode step and the prefill seconds
    those of a busy server (full budget-sized steps), both at kernel level."""
    if d.prefill_workers is not None:
        return d.prefill_workers
    return max(1, int(np.ceil(rate_rps * prefill_s / max(ranks, 1))))


ARRIVALS = ("benchmark", "synchronized", "staggered")


def _check_inputs(isl, osl, concurrency, prefix_tokens, arrival: str, kv_dtype: str | None):
    """Bad names and lengths are one error line before any plan is sized, so an infeasible
    plan never hides them."""
    if arrival not in ARRIVALS:
        raise ServecastError(f"unknown arrival {arrival!r}; allowed: {', '.join(ARRIVALS)}")
    if kv_dtype is not None:
        dtype(kv_dtype)  # one line naming the allowed dtypes
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


def _protocol_parts(protocol: Protocol | None, backend: str,
                    engine: EngineConfig | None = None, dp: int = 1, new: float = 0.0) -> dict:
    """Benchmark-protocol and engine-admission components of a run (`model.serve.closed_loop`):
    attention-DP balancing needs dp > 1; batch waiting is a TP-only feature."""
    p = protocol or Protocol()
    e = engine or EngineConfig()
    return {"rounds": float("nan") if p.rounds is None else float(p.rounds),
            "fixed_lengths": 1.0 if p.fixed_lengths else 0.0,
            "prefill_first": 1.0 if SCHEDULER.get(backend) == "prefill_first" else 0.0,
            "recv_interval_iters": float(e.recv_interval_iters), "dp": float(dp), "new_tokens": float(new),
            "adp_timeout_iters": float(e.adp_timeout_iters) if dp > 1 else 0.0,
            "batch_wait_iters": float(e.batch_wait_timeout_iters) if dp == 1 else 0.0,
            "batch_wait_tokens": float(e.batch_wait_tokens) if dp == 1 else 0.0}


def _prefill_queue_steps(prompts, new_tokens, step_tokens):
    """Mean number of prefill steps until a prompt's last chunk ran, when `prompts` prompts of
    `new_tokens` arrive together and each step packs `step_tokens` prompt tokens (FCFS)."""
    n = max(int(round(prompts)), 1)
    i = np.arange(1, n + 1)
    return float(np.mean(np.ceil(i * new_tokens / step_tokens)))


def _running_context(protocol: Protocol | None, isl: int, osl: int) -> float:
    """Mean context of the running decode batch (Protocol.running_context; fixed lengths:
    prompt + half the output)."""
    return (protocol or Protocol()).running_context(isl, osl)


def _kv_limit(sm: StepModel, isl: int, osl: int, protocol: Protocol | None = None) -> float:
    """Sequences the KV pool holds at their mean occupancy (the running batch's mean context):
    engines admit on the blocks a sequence holds now and grow it block by block."""
    if float(sm.kv_capacity_tokens(isl + osl)) < isl + osl:
        raise Infeasible(f"one sequence of {isl + osl} tokens needs more KV than the "
                         f"{sm.kv_pool_bytes_per_gpu / 1e9:.1f} GB pool per GPU under "
                         f"{sm.plan.label()}")
    mean_len = _running_context(protocol, isl, osl)
    cap_tokens = float(sm.kv_capacity_tokens(mean_len))
    max_running = cap_tokens / mean_len
    if max_running < 1.0:
        raise Infeasible(f"one sequence of {isl + osl} tokens needs more KV than the "
                         f"{sm.kv_pool_bytes_per_gpu / 1e9:.1f} GB pool per GPU under "
                         f"{sm.plan.label()}")
    return max_running


# ---- components: the physics of one run, before engine factors ------------------------------------
def _components(steps: dict, new: float, wave_tokens: float, chunk: float, per_server: float,
                counts: dict) -> dict:
    """The components dict `closed_loop` reads: `steps` maps each step kind (decode, wave, one)
    to its (kernel, network, routed-expert, kernel-floor) seconds; a wave packs `wave_tokens` of the
    `per_server` prompts of `new` tokens into each step, a lone prompt runs in chunks of
    `chunk`; `counts`: the run's other quantities (sequences, servers, flags)."""
    out = {f"{kind}_{part}_s": float(value) for kind, parts in steps.items()
           for part, value in zip(("kernel", "network", "expert", "floor"), parts, strict=True)}
    return {**out, "wave_steps_mean": _prefill_queue_steps(per_server, new, wave_tokens),
            "wave_steps": float(np.ceil(per_server * new / wave_tokens)),
            "chunks": float(np.ceil(new / chunk)), "seqs_per_server": per_server,
            "wave_prompts": wave_tokens / new, **counts}


def agg_components(sm: StepModel, isl: int, osl: int, concurrency: int, prefix_tokens: int = 0,
                   max_num_batched_tokens: int = MAX_NUM_BATCHED_TOKENS,
                   protocol: Protocol | None = None, engine: EngineConfig | None = None) -> dict:
    """Kernel/network seconds of the steps an aggregated run is made of (engine factors apply
    later in `closed_loop`), and the counts that combine them."""
    new = float(isl - prefix_tokens)
    p = sm.plan
    max_running = _kv_limit(sm, isl, osl, protocol)
    running = float(min(concurrency, np.floor(max_running)))
    per_rank = max(running / p.dp, 1.0)
    budget = float(max_num_batched_tokens)
    # synchronized wave: all running prompts arrive together, packed into budget-sized steps
    wave_tokens = min(budget, per_rank * new)
    # staggered: one prompt at a time (chunked), decodes riding along
    chunk = min(budget, new)
    # the three step kinds in one vectorized call: wave prefill, single prompt, decode
    args = ([wave_tokens * p.dp, chunk * p.dp, 0.0], [isl, isl, 0.0],
            [0.0, 0.0, running / p.pp], [0.0, 0.0, _running_context(protocol, isl, osl)],
            [max(wave_tokens / new, 1.0) * p.dp, p.dp, 1.0])
    parts = (*sm.step_parts(*args), sm.kernel_floor_s(*args))
    steps = {kind: tuple(part[i] for part in parts)
             for i, kind in enumerate(("wave", "one", "decode"))}
    return _components(steps, new, wave_tokens, chunk, per_rank, {
        "running_seqs": running, "concurrency": float(concurrency), "osl_tokens": float(osl),
        "kv_transfer_s": 0.0, "disagg": 0.0, "prefill_servers": float(p.dp),
        "tokens_per_step": float(sm.tokens_per_decode_step), "max_running_seqs": max_running,
        **_protocol_parts(protocol, sm.backend, engine, p.dp, new)})


def disagg_components(pre: StepModel, dec: StepModel, d: Disagg, isl: int, osl: int,
                      concurrency: int, prefix_tokens: int = 0,
                      max_num_batched_tokens: int = MAX_NUM_BATCHED_TOKENS,
                      protocol: Protocol | None = None, engine: EngineConfig | None = None) -> dict:
    """The same for a disaggregated run: prefill steps on a prefill worker, decode steps on a
    decode worker, the KV transfer between them, and the worker counts (inferred where None)."""
    new = float(isl - prefix_tokens)
    cap = _kv_limit(dec, isl, osl, protocol)
    if float(pre.kv_capacity_tokens(isl)) < isl:
        raise Infeasible(f"prefill workers under {pre.plan.label()} cannot hold one prompt of "
                         f"{isl} tokens")
    decode_workers = infer_decode_workers(d, concurrency, cap)
    per_worker = min(concurrency / decode_workers, np.floor(cap))
    running = per_worker * decode_workers
    budget = float(max_num_batched_tokens)
    chunk = min(budget, new)
    dp = pre.plan.dp
    decode_args = (0, 0, per_worker / dec.plan.pp, _running_context(protocol, isl, osl))
    decode = (*dec.step_parts(*decode_args), dec.kernel_floor_s(*decode_args))
    # a single prompt, and a full step of budget tokens (what a busy prefill server runs)
    one_args = ([chunk * dp, budget * dp], isl, 0.0, 0.0, [dp, max(budget / new, 1.0) * dp])
    (k_one, k_full), (n_one, n_full), (m_one, m_full) = pre.step_parts(*one_args)
    f_one = pre.kernel_floor_s(*one_args)[0]
    rate = running / (max(osl - 1, 1) * float(decode[0] + decode[1] + decode[2])
                      / dec.tokens_per_decode_step)
    prefill_workers = infer_prefill_workers(
        d, rate, float(k_full + n_full + m_full) * new / budget, dp)
    servers = prefill_workers * dp
    per_server = max(running / servers, 1.0)
    wave_tokens = min(budget, per_server * new)
    wave_args = ([wave_tokens * dp], isl, 0.0, 0.0, [max(wave_tokens / new, 1.0) * dp])
    (k_wave,), (n_wave,), (m_wave,) = pre.step_parts(*wave_args)
    (f_wave,) = pre.kernel_floor_s(*wave_args)
    kv_bytes = float(dec.kv_bytes_per_seq_per_gpu(isl)) * dec.plan.attention_gpus
    bw = pre.hw.scale_out_bandwidth_bytes_per_s * pre.gpus
    steps = {"decode": decode, "wave": (k_wave, n_wave, m_wave, f_wave),
             "one": (k_one, n_one, m_one, f_one)}
    return _components(steps, new, wave_tokens, chunk, per_server, {
        "running_seqs": float(running), "concurrency": float(concurrency),
        "osl_tokens": float(osl), "kv_transfer_s": kv_bytes / bw, "disagg": 1.0,
        "prefill_servers": float(servers), "tokens_per_step": float(dec.tokens_per_decode_step),
        "max_running_seqs": cap * decode_workers, "prefill_workers": float(prefill_workers),
        "decode_workers": float(decode_workers),
        # the transferred requests join the decode batch without context phase: no
        # attention-DP balancing there, and the prefill workers have no decodes to balance
        **_protocol_parts(protocol, dec.backend, engine and EngineConfig(
            engine.recv_interval_iters), 1, new)})


def loop_factors(sm: StepModel):
    """Closed-loop factors of the step model's backend: the step overhead and the decode,
    prefill and routed-expert decode scales from the factors the step model was built with
    (`build_step_model(..., factors=...)`), the rest from data/calibration/engine.yaml."""
    f = load_loop_factors(sm.backend)
    own = sm.factors
    return {**f, "step_overhead_s": own.step_overhead_s, "prefill_scale": own.prefill_scale,
            "decode_scale": own.decode_scale, "moe_scale": own.moe_scale}


def _run(comp: dict, sm: StepModel, arrival: str):
    if arrival not in ARRIVALS:
        raise ServecastError(f"unknown arrival {arrival!r}; allowed: {', '.join(ARRIVALS)}")
    sync = {"synchronized": 1.0, "staggered": 0.0}.get(arrival)
    ttft, tpot, x = closed_loop(comp, loop_factors(sm), sync)
    return float(ttft), float(tpot), float(x)


def aggregated(sm: StepModel, isl: int, osl: int, concurrency: int, prefix_tokens: int = 0,
               max_num_batched_tokens: int = MAX_NUM_BATCHED_TOKENS,
               arrival: str = "benchmark", protocol: Protocol | None = None,
               engine: EngineConfig | None = None) -> dict:
    """Closed-loop steady state of one aggregated replica."""
    comp = agg_components(sm, isl, osl, concurrency, prefix_tokens, max_num_batched_tokens,
                          protocol, engine)
    ttft, tpot, x = _run(comp, sm, arrival)
    # at the occupancy admission counts (`_kv_limit`: the running batch's mean context), which the
    # running sequences fill at most; at their full length they would overstate the pool
    memory = float(sm.memory_bytes_per_gpu(comp["running_seqs"],
                                           _running_context(protocol, isl, osl)))
    return _result(ttft, tpot, x, isl, osl, sm.gpus, memory,
                   {"kv_capacity_tokens": comp["max_running_seqs"] * (isl + osl),
                    "running_seqs": comp["running_seqs"], "mode": "aggregated", "arrival": arrival,
                    "plan": sm.plan.label(), "components": comp})


def disaggregated(pre: StepModel, dec: StepModel, d: Disagg, isl: int, osl: int,
                  concurrency: int, prefix_tokens: int = 0,
                  max_num_batched_tokens: int = MAX_NUM_BATCHED_TOKENS,
                  arrival: str = "benchmark", protocol: Protocol | None = None,
                  engine: EngineConfig | None = None) -> dict:
    """Prefill pool -> KV transfer -> decode pool, closed loop of `concurrency` clients."""
    comp = disagg_components(pre, dec, d, isl, osl, concurrency, prefix_tokens,
                             max_num_batched_tokens, protocol, engine)
    ttft, tpot, x = _run(comp, dec, arrival)
    n_pre, n_dec = int(comp["prefill_workers"]), int(comp["decode_workers"])
    gpus = pre.gpus * n_pre + dec.gpus * n_dec
    memory = max(float(pre.memory_bytes_per_gpu(1, isl)),
                 float(dec.memory_bytes_per_gpu(comp["running_seqs"] / n_dec,
                                                _running_context(protocol, isl, osl))))
    return _result(ttft, tpot, x, isl, osl, gpus, memory,
                   {"mode": "disaggregated", "arrival": arrival,
                    "kv_transfer_ms": comp["kv_transfer_s"] * 1e3, "prefill_plan": pre.plan.label(),
                    "decode_plan": dec.plan.label(), "running_seqs": comp["running_seqs"],
                    "prefill_workers": n_pre, "decode_workers": n_dec,
                    "workers_inferred": d.prefill_workers is None or d.decode_workers is None,
                    "components": comp})


def estimate(arch, hw, plan: ParallelPlan, isl: int, osl: int, concurrency: int,
             precision: str | None = None, prefix_tokens: int = 0,
             disagg: Disagg | None = None, kv_dtype: str | None = None, backend: str = "vllm",
             breakdown: bool = False, max_num_batched_tokens: int = MAX_NUM_BATCHED_TOKENS,
             moe_precision: str | None = None, arrival: str = "benchmark",
             cross_domain_tp: bool = False, spec_tokens: int = 0,
             spec_acceptance: float = 0.0, protocol: Protocol | None = None,
             engine: EngineConfig | None = None, cpu_offload_gib: float = 0.0,
             attention_backend: str = ATTENTION_BACKEND,
             draft_attention_backend: str = DRAFT_ATTENTION_BACKEND) -> dict:
    """The `servecast estimate` contract: ttft_ms, tpot_ms, output/total tokens per s per GPU,
    memory_bytes_per_gpu, feasible, reason (+ mode, plans, optional per-op breakdown).
    `protocol`: the benchmark's rounds and length distribution (default: fixed lengths, the
    fitted number of rounds); `engine`: admission settings (`EngineConfig`; its
    max_num_batched_tokens, when set, replaces the argument); `cpu_offload_gib`: weights per GPU
    every engine keeps in host memory (vLLM --cpu-offload-gb, model.perf.host_weights);
    `attention_backend` / `draft_attention_backend`: the target's and the drafter's attention
    kernels (model.specs.defaults.ATTENTION_BACKENDS, DRAFT_ATTENTION_BACKENDS)."""
    _check_inputs(isl, osl, concurrency, prefix_tokens, arrival, kv_dtype)
    if engine is not None and engine.max_num_batched_tokens:
        max_num_batched_tokens = int(engine.max_num_batched_tokens)
    if spec_tokens < 0 or not 0.0 <= spec_acceptance <= 1.0:
        raise ServecastError(f"--spec-tokens must be >= 0 and --spec-acceptance in [0, 1] "
                             f"(got {spec_tokens}, {spec_acceptance})")
    check_attention_flags(attention_backend, draft_attention_backend)
    kw = dict(moe_precision=moe_precision, cross_domain_tp=cross_domain_tp,
              spec_tokens=spec_tokens, spec_acceptance=spec_acceptance,
              max_num_batched_tokens=max_num_batched_tokens, cpu_offload_gib=cpu_offload_gib,
              attention_backend=attention_backend,
              draft_attention_backend=draft_attention_backend)
    try:
        if disagg is None:
            sm = build_step_model(arch, hw, plan, precision, kv_dtype, backend, **kw)
            out = aggregated(sm, isl, osl, concurrency, prefix_tokens, max_num_batched_tokens,
                             arrival, protocol, engine)
            models = {"step": sm}
            per_decoder = out["running_seqs"]
        else:
            pre = build_step_model(arch, hw, disagg.prefill_plan, precision, kv_dtype, backend,
                                   **kw)
            dec = build_step_model(arch, hw, disagg.decode_plan, precision, kv_dtype, backend,
                                   **kw)
            out = disaggregated(pre, dec, disagg, isl, osl, concurrency, prefix_tokens,
                                max_num_batched_tokens, arrival, protocol, engine)
            models = {"prefill": pre, "decode": dec}
            per_decoder = out["running_seqs"] / out["decode_workers"]
    except Infeasible as why:
        return infeasible(str(why))
    out["arch"] = getattr(arch, "name", "")
    out["hardware"] = getattr(hw, "name", "")
    out["backend"] = backend
    if breakdown:
        out["breakdown"] = {}
        for role, sm in models.items():
            dec_b = sm.breakdown(0, 0, max(per_decoder, 1.0),
                                 _running_context(protocol, isl, osl))
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
