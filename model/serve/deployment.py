"""The full tier for a whole deployment: `serve_deployment` answers what serve() answers for one
replica (TTFT / TPOT / interactivity percentiles, TPGS, rates, hit rate, stable / reason), for R
aggregated replicas or for x prefill + y decode workers (model.serve.pools), under a load of the
whole deployment (closed-loop sessions or an open request rate).

Aggregated replicas: sessions stick to a replica, spread as evenly as they go: of R replicas,
N mod R serve floor(N / R) + 1 sessions and the rest floor(N / R) (none when N < R). serve() runs
once per distinct share; rates, TPGS and means combine exactly (rates add over replicas, means
weight by each part's request rate). A percentile of the mixture lies between the two parts'
percentiles, which differ by one session's load: it is taken as their request-weighted mean (an
approximation, named in the result's assumptions when the parts differ). The AgentX system idle
cap acts on the whole client: each replica's serve() applies it at the replica's own sessions,
which overstates it for R > 1 at a handful of sessions (named in the assumptions). An open rate
splits evenly over the replicas.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import partial

import numpy as np

from model.serve.engine import ServingResult, serve
from model.serve.policy import EnginePolicy
from model.serve.pools import Workers, serve_pools
from model.serve.request_mix import request_mix_for
from model.specs.defaults import FRONTEND_S_PER_PROMPT_TOKEN
from model.specs.errors import ServecastError
from model.specs.workload import ClosedLoop, Load, OpenLoop, Workload

QUANTILE_KEYS = ("p50", "p90", "p99")


@dataclass(frozen=True)
class DeploymentServing:
    """The full tier's answer for a deployment: `result` holds serve()'s fields for the whole
    deployment (requests_per_s and concurrency of all of it, TPGS over all its GPUs)."""

    result: ServingResult
    mode: str  # aggregated | disaggregated
    gpus: int
    assumptions: tuple[str, ...] = ()
    prefill_utilization: float | None = None  # disaggregated: a prefill rank's

    def with_e2e(self) -> DeploymentServing:
        """This answer with its E2E law run where the evaluation left it for later."""
        return replace(self, result=self.result.with_e2e())

    def as_dict(self) -> dict:
        return {**self.result.as_dict(), "mode": self.mode, "gpus": self.gpus,
                "assumptions": list(self.assumptions),
                "prefill_utilization": self.prefill_utilization}


@dataclass(frozen=True)
class CacheChoice:
    """The prefix cache the full tier applies: the cache model of each replica's (prefill
    worker's) pool under `policy` over `tiers` (default); `hit_rate` fixes the hit instead;
    `infinite` keeps the profile's own (an infinite per-session cache)."""

    policy: str = "lru"
    tiers: tuple[str, ...] = ("hbm", "host")
    hit_rate: float | None = None
    infinite: bool = False
    prefetch_reload: bool = False

    def serve_kwargs(self) -> dict:
        return {"hit_rate": self.hit_rate, "cache": False if self.infinite else None,
                "cache_policy": self.policy, "cache_tiers": tuple(self.tiers),
                "prefetch_reload": self.prefetch_reload}


def serve_deployment(workload: Workload, policy: EnginePolicy, load: Load, *,
                     replicas: Workers | None = None, prefill: Workers | None = None,
                     decode: Workers | None = None, link_bytes_per_s: float | None = None,
                     cache: CacheChoice = CacheChoice(), seed: int = 0,
                     e2e: bool = True) -> DeploymentServing:
    """The full tier for `replicas` aggregated workers, or `prefill` + `decode` workers joined
    by links of `link_bytes_per_s` per GPU, under `load` (the whole deployment's); without
    `e2e` the result leaves out the E2E normalized interactivity."""
    if replicas is not None and prefill is None and decode is None:
        served = _aggregated(workload, policy, load, replicas, cache, seed, e2e)
        return replace(served, assumptions=served.assumptions + _chains(workload, load, seed)
                       + _frontend(policy, served.result))
    if replicas is None and prefill is not None and decode is not None:
        if not link_bytes_per_s or link_bytes_per_s <= 0:
            raise ServecastError("disaggregated deployment: link_bytes_per_s: the KV hand-off "
                                 "link must be positive")
        result, sol = serve_pools(workload, policy, load, prefill, decode,
                                  float(link_bytes_per_s), seed=seed, e2e=e2e,
                                  **cache.serve_kwargs())
        notes = ("disaggregated: prefill ranks FCFS on whole-budget chunks, sessions sticky to "
                 "a rank; only the turn's new KV moves; decode steps with the disaggregated "
                 "engine factor",) + _chains(workload, load, seed) + _frontend(policy, result)
        return DeploymentServing(result, "disaggregated", prefill.gpus + decode.gpus, notes,
                                 None if sol is None else sol.state.utilization)
    raise ServecastError("serve_deployment: give `replicas` (aggregated) or `prefill` and "
                         "`decode` (disaggregated)")


def _frontend(policy: EnginePolicy, result: ServingResult) -> tuple[str, ...]:
    """The assumption the API server's time in front of the engines states."""
    if policy.frontend_s_per_prompt_token <= 0:
        return ()
    rendered = policy.frontend_s_per_prompt_token > FRONTEND_S_PER_PROMPT_TOKEN
    return (f"the API server renders and tokenizes each request's whole prompt before an "
            f"engine sees it, {policy.frontend_s_per_prompt_token * 1e6:.2f} us a token "
            f"({result.mean_frontend_s:.2f} s a request on average, in TTFT; HF tokenizers as "
            "timed in TensorRT-LLM's front end"
            + ("; a Python front end's template render as TensorRT-LLM states it)" if rendered
               else "; template rendering not counted)"),)


def _chains(workload: Workload, load: Load, seed: int) -> tuple[str, ...]:
    """The assumption a closed loop of sessions with subagents beside their parent states."""
    if not isinstance(load, ClosedLoop) or not isinstance(workload, Workload):
        return ()
    lanes = request_mix_for(workload, seed=seed).lanes_per_session
    if lanes <= 1.0:
        return ()
    return (f"each session is {lanes:.2f} request chains: its subagents run beside it, "
            f"{workload.subagent_wall_share:.1%} of their time lengthening the session "
            "(the workload's subagent_wall_share)",)


def _aggregated(workload, policy, load, replicas: Workers, cache: CacheChoice,
                seed: int, e2e: bool) -> DeploymentServing:
    r = replicas.count
    kwargs = {**cache.serve_kwargs(), "e2e": e2e}
    if isinstance(load, ClosedLoop):
        share, more = divmod(int(load.concurrency), r)
        parts = [(r - more, share), (more, share + 1)]
        parts = [(m, n) for m, n in parts if m > 0 and n > 0]
        results = [(m, serve(replicas.step_model, workload, policy,
                             replace(load, concurrency=n), seed=seed, **kwargs))
                   for m, n in parts]
    elif isinstance(load, OpenLoop):
        results = [(r, serve(replicas.step_model, workload, policy,
                             OpenLoop(load.rate_per_s / r, load.interarrival_cv), seed=seed,
                             **kwargs))]
    elif r == 1:
        results = [(1, serve(replicas.step_model, workload, policy, load, seed=seed,
                             **kwargs))]
    else:
        raise ServecastError(f"serve_deployment: a trace replay runs on one replica, not {r}")
    notes = []
    if len(results) > 1:
        notes.append(f"{results[0][0]} replica(s) of {share} sessions and {results[1][0]} of "
                     f"{share + 1}: percentiles are the two laws' request-weighted mean")
    if r > 1 and isinstance(load, ClosedLoop):
        notes.append("the system idle cap is applied per replica at its own sessions")
    return DeploymentServing(combine(results, r, load), "aggregated", replicas.gpus,
                             tuple(notes))


def combine(parts: list[tuple[int, ServingResult]], replicas: int, load: Load) -> ServingResult:
    """One result for `replicas` replicas of which `m` serve each part's load (m, result): rates
    and TPGS add up, means and percentiles weight by request rate (percentiles of TPOT-like
    quantities combine as times, then invert to interactivity)."""
    unstable = [res for _, res in parts if not res.stable]
    if unstable:
        return unstable[0]
    if len(parts) == 1:  # one load on every serving replica: serve()'s numbers as they are
        (m, res), = parts
        return replace(res, requests_per_s=m * res.requests_per_s,
                       concurrency=float(load.concurrency) if isinstance(load, ClosedLoop)
                       else m * res.concurrency, tpgs=m * res.tpgs / replicas,
                       output_tokens_per_s_per_gpu=m * res.output_tokens_per_s_per_gpu
                       / replicas, goodput_requests_per_s=None, slo_attainment=None)
    rates = np.array([m * res.requests_per_s for m, res in parts])
    w = rates / rates.sum()
    top = parts[-1][1]

    def mean(get) -> float:
        return float(sum(wi * get(res) for wi, (_, res) in zip(w, parts, strict=True)))

    def per_gpu(get) -> float:  # replicas serving nothing count with zero
        return float(sum(m * get(res) for m, res in parts)) / replicas

    def times(field: str) -> dict:
        return {k: mean(lambda res, k=k: getattr(res, field)[k]) for k in QUANTILE_KEYS}

    tpot = times("tpot_s")
    laters = tuple(res.e2e_later for _, res in parts)
    e2e_later = partial(_combined_e2e, tuple(w), laters) if all(laters) else None
    return replace(
        top, ttft_s=times("ttft_s"), tpot_s=tpot,
        interactivity_tok_s={k: 1.0 / v for k, v in tpot.items()},
        mean_ttft_s=mean(lambda res: res.mean_ttft_s),
        mean_tpot_s=mean(lambda res: res.mean_tpot_s),
        tpgs=per_gpu(lambda res: res.tpgs),
        output_tokens_per_s_per_gpu=per_gpu(lambda res: res.output_tokens_per_s_per_gpu),
        requests_per_s=float(rates.sum()),
        concurrency=float(load.concurrency) if isinstance(load, ClosedLoop)
        else float(sum(m * res.concurrency for m, res in parts)),
        decode_batch_per_rank=float(sum(m * res.decode_batch_per_rank for m, res in parts))
        / sum(m for m, _ in parts),
        prefill_step_share=mean(lambda res: res.prefill_step_share),
        hit_rate=mean(lambda res: res.hit_rate), mean_reload_s=mean(lambda res: res.mean_reload_s),
        mean_frontend_s=mean(lambda res: res.mean_frontend_s),
        e2e_interactivity_tok_s=_weighted_e2e(
            tuple(w), [res.e2e_interactivity_tok_s for _, res in parts]),
        e2e_later=e2e_later, goodput_requests_per_s=None, slo_attainment=None)


def _weighted_e2e(weights: tuple, parts: list[dict]) -> dict:
    """The parts' E2E normalized interactivity combined as `combine` does TPOT (per-token
    times weighted by request rate, inverted); {} unless every part has one."""
    if not all(parts):
        return {}
    return {k: 1.0 / sum(wi * (1.0 / p[k]) for wi, p in zip(weights, parts, strict=True))
            for k in QUANTILE_KEYS}


def _combined_e2e(weights: tuple, laters: tuple) -> dict:
    """`_weighted_e2e` of the parts' E2E laws left for later, run now."""
    return _weighted_e2e(weights, [later() for later in laters])
