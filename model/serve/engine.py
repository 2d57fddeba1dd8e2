"""The serving closed form's full tier: `serve()`, from engine steps to what users see.

One replica runs the `EnginePolicy` (continuous batching, token budget, chunked prefill with a
per-request threshold, prefill cadence) on a `Workload` under a `Load`; `serve` returns TTFT,
TPOT and interactivity percentiles, InferenceX AgentX's E2E interactivity, and TPGS. Utilization
>= 1 returns `stable=False` with the reason, never inf or NaN.

Reading order, each module one step of the computation:

1. model.serve.request_mix: the request sample it integrates over (every 16th of a 16x draw).
2. model.serve.rank_engine: one DP rank over that sample: decode steps, each prompt's chunks
   and the step time they add (its `prefill_runs`; the step model tabulated in
   model.perf.step_table).
3. model.serve.step_balance: the decode batch and the mean step at one rate (Little's law
   against the step time), with model.serve.lockstep / busiest_rank for lock-stepped ranks.
4. model.serve.fcfs_prefill or model.serve.threshold_prefill: the prefill side at those steps
   (a queue on the whole budget, or prompts side by side behind a slot wait).
5. model.serve.rate_solver: the two built into one `SolvedRate`.
6. model.serve.load_rate: the rate a load sets (the closed loop's response-time law, the idle
   and admission caps).
7. model.serve.ttft_law, tpot_law, e2e_law: the distributions at the solved state.

The queueing formulas they use are in model.serve.queueing, finite_source and slot_queue.
Head-of-line blocking is the gap between the two TPOT tails: without a threshold a long cold
prefill rides whole-budget chunks through a run of steps that every decode in flight pays for;
with one it is spread thinly over many steps.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from typing import TYPE_CHECKING

import numpy as np

from model.perf.microbatch import pipeline_lanes
from model.serve.cache_effect import CacheEffect, deployment_cache
from model.serve.e2e_law import e2e_interactivity
from model.serve.load_rate import (
    admission_cap,
    closed_loop_state,
    open_loop_state,
    saturation_backlog_s,
)
from model.serve.policy import EnginePolicy
from model.serve.rank_engine import RankEngine, rank_engine
from model.serve.rate_solver import SolvedRate
from model.serve.request_mix import (
    MIX_SIZE,
    cache_hit_rate,
    live_sessions,
    request_mix_for,
    request_sample,
)
from model.serve.siblings import subagent_chains
from model.serve.tpot_law import (
    TpotLaw,
    decode_step_seen_s,
    mean_tpot_s,
    tpot_cdf,
    tpot_law,
    tpot_quantiles,
)
from model.serve.ttft_law import QUANTILES, ttft_law, ttft_quantiles
from model.specs.errors import ServecastError
from model.specs.workload import ClosedLoop, Load, TraceArrivals, Workload

if TYPE_CHECKING:  # sweeps return tables; serving itself starts without pandas
    import pandas as pd

# a closed loop's queue backlog below this share of its sessions' cycle (N / X) is the rate
# solver's tolerance (it stops within 2e-4 of the root), not sessions waiting at saturation
SATURATION_TOLERANCE = 0.01

__all__ = ["AffineStepModel", "MIX_SIZE", "ServingResult", "best_at_slo",
           "default_concurrencies", "request_mix_for", "serve", "sweep", "threshold_effect"]


@dataclass(frozen=True)
class AffineStepModel:
    """Reference step model for tests and explanations:
    t = a + b·P + e·P·c_p + c·B + d·B·c_d  (P prefill tokens at context c_p, B decodes at c_d).
    """

    a: float = 0.010
    b: float = 2e-5
    c: float = 1e-4
    d: float = 2e-10
    e: float = 0.0
    gpus: int = 1
    kv_tokens: float = float("inf")

    def step_time_s(self, prefill_tokens, prefill_context=0.0, decode_seqs=0.0,
                    decode_context=0.0, prefill_seqs=1.0, prefill_ranks=None):
        p = np.asarray(prefill_tokens, float)  # one rank: prefill_ranks changes nothing
        b = np.asarray(decode_seqs, float)
        t = (self.a + self.b * p + self.e * p * np.asarray(prefill_context, float)
             + self.c * b + self.d * b * np.asarray(decode_context, float))
        return np.where((p > 0) | (b > 0), t, 0.0)

    def kv_capacity_tokens(self, context):
        return np.full(np.shape(context), self.kv_tokens, float)


@dataclass(frozen=True)
class ServingResult:
    stable: bool
    reason: str
    ttft_s: dict[str, float | None]
    tpot_s: dict[str, float | None]
    interactivity_tok_s: dict[str, float | None]  # pXX = 1 / pXX of TPOT (XX% of users reach it)
    mean_ttft_s: float | None
    mean_tpot_s: float | None
    tpgs: float | None  # total tokens (input incl. cached + output) per GPU-second
    output_tokens_per_s_per_gpu: float | None
    requests_per_s: float | None  # replica
    concurrency: float | None  # sessions (closed loop) or mean requests in the system
    decode_batch_per_rank: float | None
    prefill_step_share: float | None  # share of step time spent on prefill
    hit_rate: float
    bounded_by: str  # "" | "max_num_seqs" | "kv_capacity"
    goodput_requests_per_s: float | None = None
    slo_attainment: float | None = None
    policy: dict = field(default_factory=dict)
    cache: dict | None = None  # the cache model behind hit_rate (None: profile / override)
    mean_reload_s: float = 0.0  # mean lower-tier KV reload each request waits (in TTFT)
    mean_frontend_s: float = 0.0  # mean time the front end holds a request (in TTFT)
    # InferenceX AgentX's E2E normalized interactivity: pXX = 1 / pXX of E2EL / OSL (TTFT counts)
    e2e_interactivity_tok_s: dict = field(default_factory=dict)
    # the E2E law left out (e2e=False), to run later on the same solved state: with_e2e()
    e2e_later: Callable[[], dict] | None = field(default=None, repr=False, compare=False)

    def as_dict(self) -> dict:
        out = asdict(replace(self, e2e_later=None))
        del out["e2e_later"]  # code, not a number
        return out

    def with_e2e(self) -> ServingResult:
        """This result with its E2E law run, where it was left out and kept for later."""
        if self.e2e_interactivity_tok_s or self.e2e_later is None:
            return self
        return replace(self, e2e_interactivity_tok_s=self.e2e_later(), e2e_later=None)


def _unstable(reason: str, hit: float, policy: EnginePolicy) -> ServingResult:
    none = {f"p{int(q * 100)}": None for q in QUANTILES}
    return ServingResult(False, reason, dict(none), dict(none), dict(none), None, None, None, None,
                         None, None, None, None, hit, "", None, None, policy.as_dict())


def serve(step_model, workload: Workload | None, policy: EnginePolicy, load: Load, *,
          hit_rate: float | None = None, slo_p90_interactivity: float | None = None,
          slo_ttft_s: float | None = None, dp_ranks: int | None = None, mix_size: int = MIX_SIZE,
          seed: int = 0, cache: CacheEffect | bool | None = None, cache_policy: str = "lru",
          cache_tiers: tuple[str, ...] = ("hbm", "host"), prefetch_reload: bool = False,
          e2e: bool = True) -> ServingResult:
    """Closed-form serving of `workload` under `load` on one replica (`step_model`).

    `load`: ClosedLoop(concurrency) sessions for the replica, OpenLoop(rate) or TraceArrivals.
    `hit_rate`: token-weighted prefix-cache hit (default: the profile's own, i.e. an infinite
    per-session cache; pass model.serve.cache_replay / model.serve.cache_model's number to plug
    in a finite cache). `dp_ranks`: lock-stepped attention ranks (default: step_model.plan.dp,
    else 1, times pp microbatch lanes for a pipeline-parallel plan, model.perf.microbatch); the
    load is spread evenly over them. SLO arguments add goodput (requests/s meeting
    both). `mix_size`, `seed`: the request sample (model.serve.request_mix).
    `cache`: the prefix cache (model.serve.cache_effect.CacheEffect). Default (None, no
    `hit_rate`): when `step_model` describes a deployment (arch, hw, plan) and the workload is
    a session profile, model.serve.cache_model gives the hit rate and the tier traffic of this
    replica's HBM pool plus `cache_tiers` under `cache_policy` at this load; lower-tier hits add
    their reload time to TTFT (less the gap before the request with `prefetch_reload`).
    `cache=False`: the profile's own hit (an infinite per-session cache). `e2e=False` leaves
    out the E2E normalized interactivity (`e2e_interactivity_tok_s` stays empty), a third of
    the laws' time, for callers that read only TTFT, TPOT and throughput; the result keeps
    the law to run later (`ServingResult.with_e2e`), for callers that need it for a few of
    many results.
    """
    lanes_model, dp = (step_model, int(dp_ranks)) if dp_ranks else pipeline_lanes(step_model)
    if isinstance(load, TraceArrivals):
        if hit_rate is not None:
            raise ServecastError("serve: hit_rate: a trace replay brings its own cache hits")
    elif workload is None:
        raise ServecastError("serve: workload: needed for closed and open loads")
    elif cache is None and hit_rate is None:
        cache = deployment_cache(step_model, workload, live_sessions(workload, load, seed),
                                 cache_policy, cache_tiers, prefetch_reload)
    eng = _engine(lanes_model, workload, _lane_policy(policy, dp_ranks, step_model), load, dp,
                  hit_rate, mix_size, seed, cache)
    try:
        return _solved(eng, load, dp, policy, cache, slo_p90_interactivity, slo_ttft_s, e2e)
    except (np.linalg.LinAlgError, FloatingPointError, ZeroDivisionError) as err:
        # a singular chain, a fixed point that will not settle or a root bracket that collapsed
        # (a load far past any step the tables hold): a stated result, no number
        return _unstable(f"unstable: the queue solver failed ({err})", eng.sample.hit_rate,
                         policy)


def _lane_policy(policy: EnginePolicy, dp_ranks: int | None, step_model) -> EnginePolicy:
    """The policy one lane runs: with pp microbatches in flight a DP rank's max_num_seqs
    running requests are shared by its pp lanes."""
    pp = int(getattr(getattr(step_model, "plan", None), "pp", 1) or 1)
    if dp_ranks or pp == 1:
        return policy
    return replace(policy, max_num_seqs=max(policy.max_num_seqs // pp, 1))


def _solved(eng: RankEngine, load: Load, dp: int, policy: EnginePolicy, cache,
            slo_p90_interactivity: float | None, slo_ttft_s: float | None,
            e2e: bool = True) -> ServingResult:
    """The solved state and its laws (see `serve`)."""
    hit = eng.sample.hit_rate
    # request chains per rank: subagents running beside their parent add chains to a session
    n_rank = (load.concurrency * eng.sample.lanes_per_session / dp
              if isinstance(load, ClosedLoop) else None)
    if n_rank is not None:
        x, st, eng = closed_loop_state(eng, load, n_rank)
        if x <= 0 or st.reason:
            return _unstable(st.reason or "no throughput", hit, policy)
    else:
        x = load.rate_per_s / dp
        st, eng = open_loop_state(eng, x, load.interarrival_cv ** 2)
        if st.reason:
            return _unstable(st.reason, hit, policy)
    x, st, admit_wait, bounded, reason = admission_cap(eng, load, x, st, n_rank)
    if reason:
        return _unstable(reason, hit, policy)
    if n_rank is not None and not bounded:
        backlog_s = saturation_backlog_s(eng, st, x, n_rank)
        if backlog_s > SATURATION_TOLERANCE * n_rank / x:
            admit_wait, bounded = backlog_s, "prefill_saturation"
    result = _laws(eng, st, x, n_rank, admit_wait, load, slo_p90_interactivity, slo_ttft_s,
                   e2e)
    if np.isnan([result["tpgs"], *result["ttft_s"].values(), *result["tpot_s"].values()]).any():
        return _unstable("unstable: the closed form gave NaN for TPGS or a percentile", hit,
                         policy)
    return ServingResult(**result, hit_rate=float(hit), bounded_by=bounded,
                         policy=policy.as_dict(), cache=cache.summary() if cache else None,
                         mean_reload_s=eng.mean_reload_s,
                         mean_frontend_s=float(eng.frontend_s.mean()))


def _engine(step_model, workload, policy: EnginePolicy, load: Load, dp: int,
            hit_rate: float | None, mix_size: int, seed: int, cache) -> RankEngine:
    """The rank engine over the request sample (and the FCFS wait law's), with the cache's hit
    rate and reload delays when there is a cache."""
    if isinstance(load, TraceArrivals):
        rm = qm = load.mix()
    else:
        if cache:
            if hit_rate is not None:
                raise ServecastError("serve: hit_rate: give either hit_rate or cache, not both")
            hit_rate = cache_hit_rate(cache, workload, mix_size, seed)
        rm = request_mix_for(workload, mix_size, seed, hit_rate)
        qm = request_mix_for(workload, mix_size, seed, hit_rate, queue=True)
    mix = request_sample(rm, load, policy)
    # a prefetch hides the reload behind the client's gap, which ends before the front end's
    client_gap_s = request_sample(rm, load).gap_s
    reload_s = cache.reload_s(mix.context_tokens, client_gap_s) if cache else None
    chains = 1
    if isinstance(load, ClosedLoop) and load.forked_runs and mix.wall_weight is not None:
        chains = subagent_chains(float(mix.wall_weight.min()))
    return rank_engine(step_model, mix, policy, dp,
                       None if qm is rm else request_sample(qm, load, policy), reload_s,
                       chains)


def _laws(eng: RankEngine, st: SolvedRate, rate_per_rank_rps: float,
          sessions_per_rank: float | None, admit_wait_s: float, load: Load,
          slo_p90_interactivity: float | None, slo_ttft_s: float | None,
          e2e: bool = True) -> dict:
    """The result's distributions and throughputs at the solved state (the E2E law with
    `e2e`)."""
    x, n_rank, admit_wait = rate_per_rank_rps, sessions_per_rank, admit_wait_s
    seen = decode_step_seen_s(eng, st, n_rank)
    ttft = ttft_law(st, admit_wait + st.prefill.extra_s)  # quantiles, backlog, SLO
    ttft_dist = ttft.distribution()
    ttft_q, ttft_mean = ttft_quantiles(ttft, ttft_dist)
    tpot = tpot_law(eng, st, x, n_rank, ttft_dist, seen)
    tpot_q = tpot_quantiles(tpot, st.mean_step_s)
    x_rep = x * eng.dp
    c, o = eng.sample.context_tokens, eng.sample.output_tokens
    gpus = int(getattr(eng.step_model, "gpus", 1))
    tpgs = x_rep * float(np.mean(c + o)) / gpus
    out_tps = x_rep * float(o.mean()) / gpus
    concurrency = (load.concurrency if isinstance(load, ClosedLoop)
                   else x_rep * (ttft_mean + eng.decode_time_s(st.mean_step_s)))
    names = [f"p{int(q * 100)}" for q in QUANTILES]
    e2e_later = partial(_e2e_quantiles, eng, ttft, tpot)
    q = eng.tokens_per_step
    good, attain = None, None
    if slo_p90_interactivity or slo_ttft_s:
        attain = _slo_attainment(ttft_dist, tpot, slo_p90_interactivity / q
                                 if slo_p90_interactivity else None, slo_ttft_s)
        good = x_rep * attain
    return dict(
        stable=True, reason="",
        ttft_s=dict(zip(names, map(float, ttft_q), strict=True)),
        tpot_s={n: float(v) / q for n, v in zip(names, tpot_q, strict=True)},
        interactivity_tok_s={n: q / float(v) for n, v in zip(names, tpot_q, strict=True)},
        mean_ttft_s=ttft_mean, mean_tpot_s=mean_tpot_s(tpot, st) / q, tpgs=float(tpgs),
        output_tokens_per_s_per_gpu=float(out_tps), requests_per_s=float(x_rep),
        concurrency=float(concurrency), decode_batch_per_rank=float(st.balance.decode_batch),
        prefill_step_share=float(st.balance.prefill_share), goodput_requests_per_s=good,
        slo_attainment=attain,
        e2e_interactivity_tok_s=e2e_later() if e2e else {},
        e2e_later=None if e2e else e2e_later)


def _e2e_quantiles(eng: RankEngine, ttft, tpot: TpotLaw) -> dict:
    """{pXX: E2E normalized interactivity, tok/s} of a solved state's laws."""
    names = [f"p{int(q * 100)}" for q in QUANTILES]
    return dict(zip(names, map(float, e2e_interactivity(eng, ttft, tpot)), strict=True))


def _slo_attainment(ttft_dist, tpot: TpotLaw, slo_steps_per_s: float | None,
                    slo_ttft_s: float | None) -> float:
    """Share of requests meeting both SLOs: P90 interactivity (as decode steps per second) and
    TTFT, taken as independent."""
    ok = 1.0
    if slo_steps_per_s and tpot.bins:
        ok *= float(tpot_cdf(tpot, np.array([1.0 / slo_steps_per_s]))[0])
    if slo_ttft_s:
        grid, pmf = ttft_dist
        ok *= float(np.sum(pmf[grid <= slo_ttft_s]))
    return ok


# ------------------------------------------------------------------ sweeps and the seed's claim

def sweep(step_model, workload: Workload, policy: EnginePolicy, concurrencies, *,
          hit_rate: float | None = None, dp_ranks: int | None = None, mix_size: int = MIX_SIZE,
          seed: int = 0, cache: CacheEffect | bool | None = None, cache_policy: str = "lru",
          cache_tiers: tuple[str, ...] = ("hbm", "host"), prefetch_reload: bool = False
          ) -> pd.DataFrame:
    """Closed-loop serving at each concurrency: one row per point (unstable rows kept, no E2E
    law: the rows carry none); the keywords are serve's."""
    import pandas as pd

    rows = []
    for n in concurrencies:
        r = serve(step_model, workload, policy, ClosedLoop(int(n)), hit_rate=hit_rate,
                  dp_ranks=dp_ranks, mix_size=mix_size, seed=seed, cache=cache,
                  cache_policy=cache_policy, cache_tiers=cache_tiers,
                  prefetch_reload=prefetch_reload, e2e=False)
        rows.append({"concurrency": int(n), "stable": r.stable, "reason": r.reason,
                     "tpgs": r.tpgs, "p90_interactivity_tok_s": r.interactivity_tok_s["p90"],
                     "p50_interactivity_tok_s": r.interactivity_tok_s["p50"],
                     "p90_ttft_s": r.ttft_s["p90"], "p50_ttft_s": r.ttft_s["p50"],
                     "mean_tpot_s": r.mean_tpot_s, "requests_per_s": r.requests_per_s,
                     "decode_batch_per_rank": r.decode_batch_per_rank,
                     "prefill_step_share": r.prefill_step_share, "bounded_by": r.bounded_by})
    return pd.DataFrame(rows)


def best_at_slo(frame: pd.DataFrame, slo_p90_interactivity: float) -> dict | None:
    """The highest-TPGS stable row whose P90 interactivity meets the SLO."""
    ok = frame[frame.stable & (frame.p90_interactivity_tok_s >= slo_p90_interactivity)]
    if ok.empty:
        return None
    return ok.loc[ok.tpgs.idxmax()].to_dict()


def default_concurrencies(max_concurrency: int = 1024) -> list[int]:
    grid = sorted({int(round(v)) for v in np.geomspace(1, max_concurrency, 25)})
    return grid


def threshold_effect(step_model, workload: Workload, policy: EnginePolicy | None = None,
                     threshold: int = 512, slo_p90_interactivity: float = 50.0,
                     concurrencies=None, at_concurrency: int | None = None, *,
                     hit_rate: float | None = None, dp_ranks: int | None = None,
                     mix_size: int = MIX_SIZE, seed: int = 0,
                     cache: CacheEffect | bool | None = None, cache_policy: str = "lru",
                     cache_tiers: tuple[str, ...] = ("hbm", "host"),
                     prefetch_reload: bool = False) -> dict:
    """The seed's scheduling claim: `long_prefill_token_threshold` = threshold vs 0 (off).

    Both policies are swept over closed-loop concurrency; for each, the best TPGS whose P90
    interactivity meets the SLO (the seed's "TPGS @ P90 > 50 tok/s"). Reports the TPGS gain at
    the SLO and the P90 interactivity ratio on / off at the load the threshold-on engine serves
    best under the SLO (`p90_interactivity_ratio`; same sessions, same GPUs), and at the load
    the threshold-off engine picks (`p90_interactivity_ratio_at_off`); with `at_concurrency`,
    also both ratios at that fixed load. The keywords are serve's.
    """
    policy = policy or EnginePolicy()
    concurrencies = list(concurrencies or default_concurrencies())
    if at_concurrency is not None and at_concurrency not in concurrencies:
        concurrencies = sorted(concurrencies + [int(at_concurrency)])
    options = dict(hit_rate=hit_rate, dp_ranks=dp_ranks, mix_size=mix_size, seed=seed,
                   cache=cache, cache_policy=cache_policy, cache_tiers=cache_tiers,
                   prefetch_reload=prefetch_reload)
    off = sweep(step_model, workload, policy.with_threshold(0), concurrencies, **options)
    on = sweep(step_model, workload, policy.with_threshold(threshold), concurrencies, **options)
    best_off = best_at_slo(off, slo_p90_interactivity)
    best_on = best_at_slo(on, slo_p90_interactivity)
    out = {"threshold": threshold, "slo_p90_interactivity_tok_s": slo_p90_interactivity,
           "off": best_off, "on": best_on, "tpgs_gain": None, "p90_interactivity_ratio": None,
           "sweep_off": off, "sweep_on": on}
    if best_off and best_on:
        out["tpgs_gain"] = best_on["tpgs"] / best_off["tpgs"] - 1.0
        same = on[on.concurrency == best_off["concurrency"]].iloc[0]
        if same.stable:
            out["p90_interactivity_ratio_at_off"] = (same.p90_interactivity_tok_s
                                                     / best_off["p90_interactivity_tok_s"])
        base = off[off.concurrency == best_on["concurrency"]].iloc[0]
        if base.stable and base.p90_interactivity_tok_s:
            out["p90_interactivity_ratio"] = (best_on["p90_interactivity_tok_s"]
                                              / base.p90_interactivity_tok_s)
    both = off.stable.to_numpy() & on.stable.to_numpy()
    if both.any():  # "up to": the largest gain over the loads both policies sustain
        ratio = on.tpgs.to_numpy(float)[both] / off.tpgs.to_numpy(float)[both]
        i = int(np.argmax(ratio))
        out["tpgs_gain_max"] = float(ratio[i] - 1.0)
        out["tpgs_gain_max_concurrency"] = int(off.concurrency.to_numpy()[both][i])
    if at_concurrency is not None:
        out.update(_ratios_at(off, on, at_concurrency))
    return out


def _ratios_at(off: pd.DataFrame, on: pd.DataFrame, concurrency: int) -> dict:
    """TPGS, P90 interactivity and P90 TTFT ratios on / off at one concurrency (both stable)."""
    a = off[off.concurrency == concurrency].iloc[0]
    b = on[on.concurrency == concurrency].iloc[0]
    if not (a.stable and b.stable):
        return {}
    return {"tpgs_ratio_at_concurrency": b.tpgs / a.tpgs,
            "p90_interactivity_ratio_at_concurrency": (b.p90_interactivity_tok_s
                                                       / a.p90_interactivity_tok_s),
            "p90_ttft_ratio_at_concurrency": b.p90_ttft_s / a.p90_ttft_s}
