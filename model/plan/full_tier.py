"""The full tier behind every number `plan` reports: the search around one deployment's
evaluation (model.plan.evaluate.evaluate_deployment, which `plan --deployment` and
`serve --deployment` share).

`plan` ranks candidates with the screening tier, then:
1. shortlists the best distinct deployments (plan(s), worker counts, threshold, cadence) whose
   screening P90 interactivity reaches the SLO less a margin (the tiers differ);
2. evaluates each with the full tier (model.serve.deployment.serve_deployment) and moves its
   sessions to the SLO's edge: the screening's P90 interactivity over the sessions, scaled by the
   full tier's over the screening's at the last point, predicts the edge; a bisection on whole
   sessions then closes in (`at_slo`); a fixed concurrency is evaluated as given;
3. chooses the highest full-tier TPGS meeting the SLO. A shortlisted deployment whose screening
   TPGS falls more than TPGS_MARGIN below the best full-tier TPGS found so far is skipped (the
   tiers' TPGS agree within ~10% on the measured AgentX runs).
Evaluations are memoized on (setup, deployment, load) in model.plan.evaluate: a search, its
Pareto points and a second plan of the same scenario reuse them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from model.plan.deployment import Deployment
from model.serve.deployment import DeploymentServing

SLO_MARGIN = 0.25  # shortlist deployments whose screening comes within this of the SLO
TPGS_MARGIN = 0.10  # skip one whose screening TPGS falls this far below the best full tier's
SHORTLIST = 2  # distinct deployments the full tier evaluates (and each mode's best)
RESERVE = 4  # more, evaluated in turn only while none of the shortlist meets the SLO
EVALUATIONS = 4  # full-tier evaluations per deployment on its way to the SLO's edge
EDGE_STEP = 1.25  # first step past a point when the screening predicts no move
EDGE_TOLERANCE = 0.05  # the SLO's edge is bracketed to this share of its sessions
DEPLOYMENT_KEYS = ("mode", "plan", "decode_plan", "replicas", "x", "y", "threshold", "interval")


# ---------------------------------------------------------------- evaluated points

@dataclass(frozen=True)
class FullTierPoint:
    """One deployment at one load, evaluated by the full tier."""

    deployment: Deployment
    serving: DeploymentServing

    @property
    def stable(self) -> bool:
        return bool(self.serving.result.stable)

    @property
    def tpgs(self) -> float:
        return float(self.serving.result.tpgs or 0.0) if self.stable else 0.0

    @property
    def p90_interactivity_tok_s(self) -> float:
        return float(self.serving.result.interactivity_tok_s["p90"]) if self.stable else 0.0

    @property
    def p90_ttft_s(self) -> float:
        return float(self.serving.result.ttft_s["p90"]) if self.stable else math.inf

    def meets(self, slo_p90_interactivity: float, slo_p90_ttft_s: float | None) -> bool:
        return (self.stable and self.p90_interactivity_tok_s >= slo_p90_interactivity
                and (slo_p90_ttft_s is None or self.p90_ttft_s <= slo_p90_ttft_s))


@dataclass(frozen=True)
class Slo:
    p90_interactivity_tok_s: float
    p90_ttft_s: float | None = None

    def met_by(self, point: FullTierPoint) -> bool:
        return point.meets(self.p90_interactivity_tok_s, self.p90_ttft_s)


def shortlist(candidates: pd.DataFrame, slo: Slo, count: int = SHORTLIST,
              margin: float = SLO_MARGIN, rank_by: str = "tpgs",
              reserve: int = RESERVE) -> tuple[list[pd.DataFrame], list[pd.DataFrame]]:
    """(the screening rows of the best `count` distinct deployments and of each mode's best;
    of the next `reserve` ones), best first, each frame that deployment's feasible rows by
    concurrency. A deployment ranks by its best `rank_by` among rows meeting the SLO (ties to
    the higher P90 interactivity); one that only comes within `margin` of the SLO, by its
    `rank_by` where its P90 interactivity is highest (the full tier may find it there)."""
    feasible = candidates[candidates["feasible"]]
    inter = feasible["p90_interactivity_tok_s"]
    meets = inter >= slo.p90_interactivity_tok_s
    near = inter >= slo.p90_interactivity_tok_s * (1.0 - margin)
    if slo.p90_ttft_s is not None:
        meets &= feasible["p90_ttft_s"] <= slo.p90_ttft_s
        near &= feasible["p90_ttft_s"] <= slo.p90_ttft_s * (1.0 + margin)
    keys = [feasible[k] for k in DEPLOYMENT_KEYS]
    rows = feasible.loc[meets, rank_by].groupby([k[meets] for k in keys]).idxmax()
    closest = feasible[near].groupby([k[near] for k in keys])["p90_interactivity_tok_s"].idxmax()
    rows = pd.concat([rows, closest[~closest.index.isin(rows.index)]])
    picked = feasible.loc[rows.to_numpy(),
                          list(dict.fromkeys([rank_by, "tpgs", "p90_interactivity_tok_s"]))]
    order = np.lexsort((-picked["p90_interactivity_tok_s"].to_numpy(),
                        -picked[rank_by].to_numpy()))
    ranked = _distinct([rows.index[i] for i in order], picked.iloc[order], count + reserve)
    primary = ranked[:count]
    for mode in dict.fromkeys(k[0] for k in ranked):  # each mode's best, too
        if all(k[0] != mode for k in primary):
            primary.append(next(k for k in ranked if k[0] == mode))
    frames = {k: feasible[_matches(feasible, k)].sort_values("concurrency")
              .drop_duplicates("concurrency") for k in ranked}
    return [frames[k] for k in primary], [frames[k] for k in ranked if k not in primary]


def _distinct(keys: list, points: pd.DataFrame, count: int) -> list:
    """The first `count` of `keys`, leaving out a deployment that only repeats a kept one: same
    mode and knobs, its ranking point (`points`, in the same order) within 1% of TPGS and 2% of
    P90 interactivity (plans that differ only where the screening cannot tell them apart)."""
    kept, seen = [], []
    for key, (_, row) in zip(keys, points.iterrows(), strict=True):
        point = (key[0], key[6], key[7], float(row["tpgs"]),
                 float(row["p90_interactivity_tok_s"]))
        if any(p[:3] == point[:3] and abs(point[3] / p[3] - 1.0) < 0.01
               and abs(point[4] / p[4] - 1.0) < 0.02 for p in seen):
            continue
        kept.append(key)
        seen.append(point)
        if len(kept) == count:
            break
    return kept


def _matches(frame: pd.DataFrame, key) -> np.ndarray:
    same = np.ones(len(frame), bool)
    for k, v in zip(DEPLOYMENT_KEYS, key, strict=True):
        same &= (frame[k] == v).to_numpy()
    return same


def start_concurrency(curve: pd.DataFrame, slo: Slo) -> tuple[int, bool]:
    """(the screening's highest-TPGS concurrency meeting the SLO, whether the SLO binds there:
    the next concurrency up misses it); without one, the highest-TPGS concurrency of those
    within the margin, bound."""
    ok = curve["p90_interactivity_tok_s"] >= slo.p90_interactivity_tok_s
    if slo.p90_ttft_s is not None:
        ok &= curve["p90_ttft_s"] <= slo.p90_ttft_s
    rows = curve[ok] if ok.any() else curve[curve["p90_interactivity_tok_s"] >= (
        1.0 - SLO_MARGIN) * slo.p90_interactivity_tok_s]
    rows = rows if not rows.empty else curve
    start = int(rows.loc[rows["tpgs"].idxmax(), "concurrency"])
    above = ok[curve["concurrency"] > start]
    return start, bool(len(above) and not above.iloc[0]) or not ok.any()


def predicted_edge(curve: pd.DataFrame, at: int, ratio: float, slo: Slo) -> int:
    """Sessions where the screening's P90 interactivity times `ratio` (full tier over screening
    at the last point) reaches the SLO, by log-linear interpolation along the curve (beyond its
    ends: one EDGE_STEP past `at`)."""
    conc = curve["concurrency"].to_numpy(float)
    inter = curve["p90_interactivity_tok_s"].to_numpy(float) * ratio
    target = slo.p90_interactivity_tok_s
    above = inter >= target
    if above.all() or not above.any():
        return int(round(at * EDGE_STEP)) if above.all() else max(int(at / EDGE_STEP), 1)
    i = int(np.flatnonzero(above)[-1])
    if i + 1 >= len(conc):
        return int(round(at * EDGE_STEP))
    lo, hi = np.log(conc[i]), np.log(conc[i + 1])
    f = (inter[i] - target) / max(inter[i] - inter[i + 1], 1e-12)
    return max(int(round(np.exp(lo + np.clip(f, 0.0, 1.0) * (hi - lo)))), 1)


def at_slo(evaluate, curve: pd.DataFrame, slo: Slo, fixed=None,
           evaluations: int = EVALUATIONS) -> list[FullTierPoint]:
    """Full-tier points of one deployment on its way to its highest TPGS meeting the SLO.
    `evaluate(concurrency)` gives a FullTierPoint; `curve` holds the screening's rows. From the
    screening's best concurrency: where the SLO binds, to the full tier's SLO edge (up or down);
    where the screening's TPGS peaks below the edge, one step up tells whether the full tier's
    peak lies higher. `fixed`: the concurrencies to evaluate, as given."""
    if fixed is not None:
        return [evaluate(int(c)) for c in fixed]
    start, bound = start_concurrency(curve, slo)
    points = {start: evaluate(start)}
    if slo.met_by(points[start]) and not bound:
        up = max(int(round(start * EDGE_STEP)), start + 1)
        points[up] = evaluate(up)
        if not (slo.met_by(points[up]) and points[up].tpgs > points[start].tpgs):
            return [points[c] for c in sorted(points)]
        start = up
    _edge_search(evaluate, curve, slo, points, start, evaluations)
    return [points[c] for c in sorted(points)]


def _edge_search(evaluate, curve: pd.DataFrame, slo: Slo, points: dict, at: int,
                 evaluations: int) -> None:
    """Adds points to `points` (concurrency -> FullTierPoint) closing in on the largest
    concurrency meeting the SLO from `at`: the screening's curve scaled to the full tier
    predicts the edge, then a geometric bisection on whole sessions."""
    good = [c for c, p in points.items() if slo.met_by(p)]
    bad = [c for c, p in points.items() if not slo.met_by(p)]
    lo, hi = (max(good) if good else None), (min(bad) if bad else None)
    while len(points) < evaluations:
        if lo is not None and hi is not None:
            if hi - lo <= max(1, int(EDGE_TOLERANCE * lo)):
                break
            nxt = min(max(int(round(math.sqrt(lo * hi))), lo + 1), hi - 1)
        else:
            screen = _screen_at(curve, at)
            ratio = points[at].p90_interactivity_tok_s / screen if screen > 0 else 1.0
            nxt = predicted_edge(curve, at, ratio, slo)
            if lo is not None and nxt <= lo * 1.02:  # the prediction stalls: step past it
                nxt = max(int(round(lo * EDGE_STEP)), lo + 1)
            elif hi is not None and nxt >= hi / 1.02:
                nxt = max(min(int(hi / EDGE_STEP), hi - 1), 1)
        if nxt in points or nxt < 1:
            break
        points[nxt] = evaluate(nxt)
        at = nxt
        if slo.met_by(points[nxt]):
            lo = nxt if lo is None else max(lo, nxt)
        else:
            hi = nxt if hi is None else min(hi, nxt)


def _screen_at(curve: pd.DataFrame, conc: int) -> float:
    c = curve["concurrency"].to_numpy(float)
    return float(np.interp(np.log(conc), np.log(c), curve["p90_interactivity_tok_s"]))


def at_peak(evaluate, curve: pd.DataFrame, metric: str,
            evaluations: int = EVALUATIONS) -> list[FullTierPoint]:
    """Full-tier points of one deployment climbing to its largest `metric` (no SLO): from the
    screening's peak concurrency, one EDGE_STEP each way, then on in the better direction
    while the full tier's `metric` grows."""
    start = int(curve.loc[curve[metric].idxmax(), "concurrency"])
    points = {start: evaluate(start)}

    def value(c: int) -> float:
        return getattr(points[c], metric)

    steps = [s for s in (max(int(round(start * EDGE_STEP)), start + 1),
                         max(int(start / EDGE_STEP), 1)) if s != start]
    for c in dict.fromkeys(steps):
        points[c] = evaluate(c)
    at = max(points, key=value)
    while at != start and len(points) < evaluations:
        nxt = max(int(round(at * EDGE_STEP)), at + 1) if at > start else max(
            int(at / EDGE_STEP), 1)
        if nxt in points:
            break
        points[nxt] = evaluate(nxt)
        if value(nxt) <= value(at):
            break
        start, at = at, nxt
    return [points[c] for c in sorted(points)]


def best_point(points: list[FullTierPoint], slo: Slo) -> FullTierPoint | None:
    """The highest TPGS meeting the SLO, ties to the higher P90 interactivity."""
    ok = [p for p in points if slo.met_by(p)]
    if not ok:
        return None
    return max(ok, key=lambda p: (p.tpgs, p.p90_interactivity_tok_s))


def full_tier_front(points: list[FullTierPoint]) -> list[FullTierPoint]:
    """The points no other point beats in both TPGS and P90 interactivity, by interactivity."""
    stable = sorted((p for p in points if p.stable),
                    key=lambda p: (-p.tpgs, -p.p90_interactivity_tok_s))
    front, reach = [], -math.inf
    for p in stable:
        if p.p90_interactivity_tok_s > reach:
            front.append(p)
            reach = p.p90_interactivity_tok_s
    return sorted(front, key=lambda p: p.p90_interactivity_tok_s)


