"""Closed form (model.serving) vs the discrete-event oracle (model.simulate) on named scenarios.

`python -m model.serving_agreement [names...]` prints the table scenario x metric x relative
difference (closed form / simulation - 1). The scenarios cover fixed-length profiles under
Poisson arrivals and closed loops with think time, AgentX synthetic sessions and the replayed
AgentX sample, each at several loads, threshold off and 512; tests/test_simulate.py asserts a
subset with shorter simulations.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import numpy as np

from model.parallel import ParallelPlan
from model.policy import EnginePolicy
from model.serving import AffineStepModel, serve
from model.simulate import simulate
from model.workload import ClosedLoop, Load, OpenLoop, load_workload, workload_from_dict

# reference step models (affine, so both sides see identical step times; research/theory.md
# §1.1): a fixed-length one with prefill attention cost, and the AgentX one of the notebook
SM_FIXED = AffineStepModel(a=0.012, b=3e-5, c=1e-4, d=1.5e-9, e=2e-10)
SM_AGENTX = AffineStepModel(a=0.008, b=3e-5, c=5e-5, d=1e-9, e=2e-10)


def fixed_with_think(isl: int, osl: int, think_mean_s: float, name: str | None = None):
    """Fixed-length requests looped by sessions with lognormal (sigma 1) think time between
    turns: every turn a fresh isl-token prompt (reset), osl output tokens."""
    sigma = 1.0
    mu = float(np.log(think_mean_s) - sigma**2 / 2)
    return workload_from_dict({
        "name": name or f"fixed-{isl}-{osl}-think{think_mean_s:g}",
        "description": "fixed lengths with think time (agreement scenarios)",
        "source": "constructed for model.serving_agreement", "date": "2026-11-29",
        "kind": "sessions", "hit_rate": 0.0,
        "turns_per_session": {"dist": {"kind": "fixed", "value": 1000}},
        "first_input_tokens": {"dist": {"kind": "fixed", "value": isl}},
        "context_growth_tokens": {"dist": {"kind": "fixed", "value": 0}},
        "reset_probability": 1.0,
        "output_tokens": {"dist": {"kind": "fixed", "value": osl}},
        "think_time_s": {"dist": {"kind": "lognormal", "mu": mu, "sigma": sigma}},
    })


class SessionSet:
    """A fixed population of synthetic sessions both sides see: the closed form its request mix,
    the simulator its sessions (seeded order, cycling). AgentX sessions differ so much from one
    another (a session's growth and gaps are drawn once for all its turns) that two draws of a
    few hundred sessions disagree by ~10% on context and gap means; comparing on one
    population separates the queueing approximations from that sampling noise."""

    def __init__(self, profile: str, sessions: int, seed: int = 0):
        from model.workload import RecordedWorkload

        self.name = f"{profile}-{sessions}sessions"
        self.specs = load_workload(profile).sessions(sessions, seed)
        self.sessions = RecordedWorkload.sessions.__get__(self)
        self.request_mix = RecordedWorkload.request_mix.__get__(self)
        self.hit_rate = self.request_mix().hit_rate

    def model_dump_json(self) -> str:
        return f"sessionset:{self.name}:{id(self)}"


@dataclass(frozen=True)
class Scenario:
    name: str
    workload: str  # profile name, "think:<isl>:<osl>:<Z>" or "agentx-sample"
    threshold: int
    load: Load
    sim_s: float
    step: str = "fixed"  # "fixed" | "agentx" (affine) | "dsv4-dep8" (calibrated, 8 ranks)
    seed: int = 1
    sessions: bool = True  # False: the simulator draws each turn independently (no correlation)
    interval: int = 1  # prefill_schedule_interval

    def build(self):
        if self.workload.startswith("think:"):
            _, isl, osl, z = self.workload.split(":")
            w = fixed_with_think(int(isl), int(osl), float(z))
        elif self.workload.startswith("population:"):
            _, profile, n = self.workload.split(":")
            w = _population(profile, int(n))
        elif self.workload == "agentx-sample":
            from model import ROOT
            from model.traces import load_trace
            from model.workload import RecordedWorkload

            w = RecordedWorkload(load_trace(ROOT / "data" / "traces" /
                                            "cc_traces_weka_042026_sample"), "agentx-sample")
        else:
            w = load_workload(self.workload)
        sm = {"agentx": SM_AGENTX, "dsv4-dep8": None}.get(self.step, SM_FIXED)
        if sm is None:
            sm = dsv4_dep8_b300()
        return sm, w, EnginePolicy(8192, 256, self.threshold, self.interval)


SCENARIOS = [
    Scenario("fixed-8k1k-poisson-0.5", "fixed-8k1k", 0, OpenLoop(0.5), 3000),
    Scenario("fixed-8k1k-poisson-1.0", "fixed-8k1k", 0, OpenLoop(1.0), 2000),
    Scenario("fixed-8k1k-poisson-1.0-t512", "fixed-8k1k", 512, OpenLoop(1.0), 2000),
    Scenario("fixed-8k1k-think10-n16", "think:8192:1024:10", 0, ClosedLoop(16), 2000),
    Scenario("fixed-8k1k-think10-n32", "think:8192:1024:10", 0, ClosedLoop(32), 2000),
    Scenario("fixed-8k1k-think10-n32-t512", "think:8192:1024:10", 512, ClosedLoop(32), 2000),
    Scenario("agentx-n16", "agentx", 0, ClosedLoop(16), 3000, "agentx"),
    Scenario("agentx-n16-t512", "agentx", 512, ClosedLoop(16), 3000, "agentx"),
    Scenario("agentx-n48", "agentx", 0, ClosedLoop(48), 2000, "agentx"),
    Scenario("agentx-n48-t512", "agentx", 512, ClosedLoop(48), 2000, "agentx"),
    Scenario("agentx-sample-n16-t512", "agentx-sample", 512, ClosedLoop(16, 10.0), 3000,
             "agentx"),
    Scenario("agentx-sample-n16", "agentx-sample", 0, ClosedLoop(16, 10.0), 3000, "agentx"),
    Scenario("agentx-sample-n32-t512", "agentx-sample", 512, ClosedLoop(32, 10.0), 3000,
             "agentx"),
]
# shared populations of 16 / 64 sessions; simulated time shrinks as the load grows
SCENARIOS += [
    Scenario(f"agentx-pop{pop}-n{n}" + (f"-t{t}" if t else ""), f"population:agentx:{pop}", t,
             ClosedLoop(n), sim_s, "agentx")
    for pop, n, sim_s in ((16, 16, 16000), (16, 48, 8000), (64, 16, 8000), (64, 48, 4000))
    for t in (0, 512)]
# independent turns: the rare cold prompts set the TTFT tail, so these run 4x longer
SCENARIOS += [Scenario(s.name + "-indep", s.workload, s.threshold, s.load, 4 * s.sim_s, s.step,
                       s.seed, False) for s in SCENARIOS if s.workload == "agentx"]
# the seed's threshold claim setting: DeepSeek V4 Pro DEP8 on B300 (calibrated step model, recipe
# MTP), eight lock-stepped ranks; the trace's heavy tail of cold prefills (up to 850K tokens)
# (one shared population of 64 sessions on both sides: AgentX sessions differ so much that two
# draws of a few dozen disagree by ~25% on TPGS at light load)
DEP_SCENARIOS = [Scenario(f"dsv4-dep8-pop64-n{n}-t{t}-iv{iv}", "population:agentx:64", t,
                          ClosedLoop(n), 4000, "dsv4-dep8", 3, True, iv)
                 for n in (32, 128) for t, iv in ((0, 1), (512, 1), (0, 8), (512, 8))]
SCENARIOS += DEP_SCENARIOS
BY_NAME = {s.name: s for s in SCENARIOS}


_POPULATIONS: dict = {}


def _population(profile: str, n: int) -> SessionSet:
    if (profile, n) not in _POPULATIONS:
        _POPULATIONS[profile, n] = SessionSet(profile, n)
    return _POPULATIONS[profile, n]


def dsv4_dep8_b300():
    """DeepSeek V4 Pro, DP8 + EP8 on B300, served per its recipe (data/deployments/)."""
    from model.plan import step_model

    return step_model("deepseek-v4-pro", "b300", ParallelPlan(dp=8, ep=8))


def agreement(scenario: Scenario | str, sim_s: float | None = None) -> dict[str, float]:
    """Relative differences closed form / simulation - 1 for TTFT and TPOT p50/p90/p99, TPGS."""
    sc = BY_NAME[scenario] if isinstance(scenario, str) else scenario
    sm, w, pol = sc.build()
    dp = int(getattr(getattr(sm, "plan", None), "dp", 1) or 1)
    sim = simulate(sm, w, pol, sc.load, duration_s=sim_s or sc.sim_s, seed=sc.seed,
                   sessions=sc.sessions, dp_ranks=dp).summary()
    cf = serve(sm, w, pol, sc.load)
    out = {}
    for metric in ("ttft_s", "tpot_s"):
        for q in ("p50", "p90", "p99"):
            out[f"{metric[:4]}_{q}"] = getattr(cf, metric)[q] / sim[metric][q] - 1.0
    # InferenceX's E2E normalized interactivity (1 / P90 of E2EL / OSL): TTFT and TPOT together
    out["e2e_p90"] = cf.e2e_interactivity_tok_s["p90"] / sim["e2e_interactivity_tok_s"]["p90"] - 1.0
    out["tpgs"] = cf.tpgs / sim["tpgs"] - 1.0
    return out


def _row(args) -> dict:
    sc, sim_scale = args
    return {"scenario": sc.name, **{k: round(100 * v, 1) for k, v in
                                    agreement(sc, sc.sim_s * sim_scale).items()}}


def table(names=None, sim_scale: float = 1.0, processes: int | None = None):
    """The agreement table; scenarios run in `processes` worker processes (default: one per
    CPU; each simulation is single-threaded)."""
    import os
    from concurrent.futures import ProcessPoolExecutor

    import pandas as pd

    todo = [(sc, sim_scale) for sc in SCENARIOS if not names or sc.name in names]
    workers = max(1, min(processes or os.cpu_count() or 1, len(todo)))
    if workers == 1:
        rows = [_row(t) for t in todo]
    else:
        with ProcessPoolExecutor(workers) as pool:
            rows = list(pool.map(_row, todo))
    return pd.DataFrame(rows).set_index("scenario")


def write_report(names=None) -> str:
    """Run the scenarios and write the closed form vs simulation table (percent differences)
    to data/calibration/serving_agreement.md; returns the markdown."""
    import datetime

    from model import ROOT
    from model.nbio import write_atomic

    df = table(names)
    head = "| scenario | " + " | ".join(df.columns) + " |"
    rule = "|---" * (len(df.columns) + 1) + "|"
    body = ["| " + " | ".join([str(i), *(f"{v:+.1f}" for v in row)]) + " |"
            for i, row in zip(df.index, df.to_numpy(), strict=True)]
    text = "\n".join([
        "# Closed form vs discrete-event simulation",
        "",
        f"Generated by `python -m model.serving_agreement --report` on "
        f"{datetime.date.today().isoformat()}: percent difference closed form / simulation - 1 "
        "(model.serving.serve vs model.simulate, same step model, policy and traffic).",
        "Scenario names: n = closed-loop sessions, t = long_prefill_token_threshold, iv = "
        "prefill_schedule_interval; dsv4-dep8 = DeepSeek V4 Pro DP8+EP8 on B300 (recipe, MTP). "
        "`e2e_p90`: InferenceX AgentX's E2E normalized interactivity at P90, 1 / P90 of "
        "E2EL / OSL (a rate: positive = the closed form is faster).",
        "",
        "Reading it: fixed-length rows test the queueing and batching formulas alone; `agentx-*` "
        "rows draw fresh synthetic sessions on each side, so a few dozen heavy-tailed sessions "
        "make the P90/P99 TTFT noisy and the closed form's independent request mix overstates "
        "TPGS (a simulated lane stuck in a long-context session keeps sending long contexts); "
        "`-indep` rows make the simulator draw turns independently too (a shuffled mix, 4x the "
        "simulated time; until 2026-12-02 the lanes replayed the mix in session order, context "
        "autocorrelation 0.95). Their TTFT tails still spread widely between seeds (3 seeds at "
        "16x: `agentx-n16-indep` P99 -20% to +114%). At 48 sessions they showed the closed "
        "form's 4,000-request mix overstating the prefill tail (E[S^2] 4.40 s^2 against 3.49 "
        "on 50,000 draws; a pure finite-source FCFS queue on its own service sample gives its "
        "wait to 4%), so its FCFS wait was too long (TTFT P50 / P90 +32 / +63%); with 20,000 "
        "draws (2026-12-02) they are +10 / +12%; `pop16`/`pop64` and "
        "`dsv4-dep8` rows share one population between both sides, which leaves the queueing "
        "approximations. DEP rows: eight lock-stepped ranks and cold prefills of up to 850K "
        "tokens. Their seed spread (5 seeds x 4000 s, measured 2026-12-02) is 11% on TPGS and "
        "up to 31% on P99 TTFT at 32 sessions, but 1-6% on every metric at 128 sessions, so the "
        "128-session misses are the closed form's. Without a threshold the mean step comes "
        "from model.lockstep (the slowest rank's chunk sets each step; run steps collect and "
        "mask the other ranks' short prompts): 88.5 / 66.8 ms at iv1 / iv8 against 86.1 / "
        "67.2 ms simulated (the mean-height picture before it: 99.1 / 53.0 ms). Its TPOT law "
        "takes the packed short prompts as a floor and the runs as shots by what each adds "
        "above the other ranks: mean TPOT 49.4 / 29.1 ms against 51.9 / 29.7 ms simulated; "
        "the iv8 P99 stays +31% (overlapping runs on several ranks). With the threshold, a "
        "prompt's own chunk masks the other ranks' chunks below its height (the step waits for "
        "the busiest rank): at 128 sessions TTFT P50 / P90 / P99 went from +14 / +25 / +29% "
        "(iv1) and -5 / +9 / +21% (iv8) to -10 / -12 / -7% and -11 / -2 / +7%; the experts, "
        "which see every rank's tokens (about 5% of a chunk's extension here), are masked with "
        "the rest. Threshold "
        "rows on one rank: the TTFT treats the other runs as self-excited (negative-binomial "
        "counts; open loop also a mean-field rate while the prompt is in flight), which a closed "
        "loop leaves out, so `fixed-8k1k-think10-n32-t512` (short prompts, long think) stays "
        "-12% / -18% at P50 / P99 (2026-12-02). Threshold-off TPOT tails: a decode window "
        "opens when its prompt's prefill ends, on the prompts queued behind it (FCFS backlog: "
        "the arrivals during its sojourn); with that term (2026-12-02) `agentx-pop64-n48` TPOT "
        "P90 / P99 went from -18% / -33% to -6% / -5%, `agentx-pop16-n48` from -25% / -46% to "
        "-12% / -15%, `agentx-n48` from -11% / -30% to -1% / -2%, and the mean TPOT of "
        "`agentx-pop16-n48` matches the simulated one to 0.1% (20% above the mean step). The "
        "replayed `agentx-sample-n16` moved from +4% / -4% to +14% / +13%. Seed-to-seed spread of the simulation (5 seeds, "
        "CV, measured 2026-12-02): about "
        "3% for fixed-length percentiles, 5-11% for the AgentX P99 TTFT, up to 33% for "
        "`agentx-pop16-n48` P90 TTFT and P99 TPOT, where no closed form can be pinned to 10%.",
        "",
        head, rule, *body, ""])
    write_atomic(ROOT / "data" / "calibration" / "serving_agreement.md", text)
    return text


if __name__ == "__main__":
    import pandas as pd

    pd.set_option("display.width", 200)
    pd.set_option("display.max_columns", 20)
    args = [a for a in sys.argv[1:] if a != "--report"]
    if "--report" in sys.argv[1:]:
        print(write_report(args or None))
    else:
        print(table(args or None))
