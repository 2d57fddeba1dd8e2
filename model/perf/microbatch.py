"""A pipeline-parallel replica as lanes of microbatches, for the full tier's rank engine.

With pp stages the engine keeps pp microbatches in flight (vLLM's batch queue holds pp scheduled
batches). A running request sits in one of them and gets its next step only when that batch has
left the last stage, so each microbatch is a lane: its requests advance once per pass, and a pass
takes the step model's pipeline latency for that microbatch's batch. With proportional stage
times the pipeline's period is the longest pass (a flow shop), so the lanes lock-step like DP
ranks. A replica of dp ranks and pp stages is therefore dp * pp lock-stepped lanes whose step is
`MicrobatchSteps.step_time_s`; the screening tier prices the same period
(model.plan.screening._cadence_steps).

Assumption: a prompt's chunks do not overlap in the pipeline (the request is in flight until its
chunk leaves the last stage), so c chunks take c passes.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np


@dataclass(frozen=True, eq=False)
class MicrobatchSteps:
    """The step model of a pp > 1 plan seen by `dp * pp` lanes: the decode batch it is given
    is summed over all lanes, and one pass carries one microbatch (a pp-th of it). Other
    attributes are the step model's own."""

    step_model: object

    @property
    def microbatches(self) -> int:
        return int(self.step_model.plan.pp)

    def step_time_s(self, prefill_tokens=0.0, prefill_context=0.0, decode_seqs=0.0,
                    decode_context=0.0, prefill_seqs=1.0, prefill_ranks=None):
        """Seconds of the pass that carries the busiest lane's prefill. Chunks on `prefill_ranks`
        lanes spread over the pp microbatches: the busiest pass holds max(ranks / pp, 1) of
        them; with `prefill_ranks` None the tokens spread evenly over every lane."""
        pp = float(self.microbatches)
        p, seqs = np.asarray(prefill_tokens, float), np.asarray(prefill_seqs, float)
        if prefill_ranks is None:
            share, ranks = 1.0 / pp, None
        else:
            r = np.asarray(prefill_ranks, float)
            ranks = np.maximum(r / pp, 1.0)
            share = ranks / r
        return self.step_model.step_time_s(p * share, prefill_context,
                                           np.asarray(decode_seqs, float) / pp, decode_context,
                                           np.maximum(seqs * share, 1.0), ranks)

    def __getattr__(self, name: str):
        if name == "step_model":  # not yet set (copy, unpickle): no recursion
            raise AttributeError(name)
        return getattr(self.step_model, name)


@lru_cache(maxsize=64)
def microbatch_steps(step_model) -> MicrobatchSteps:
    """One view per step model (kept by identity), so the full tier's step tables, keyed by the
    model they read, are built once."""
    return MicrobatchSteps(step_model)


def pipeline_lanes(step_model) -> tuple[object, int]:
    """(the step model the rank engine reads, its lock-stepped lanes): dp * pp lanes of
    microbatches for a pp > 1 plan, else the model itself and its dp ranks."""
    plan = getattr(step_model, "plan", None)
    dp, pp = int(getattr(plan, "dp", 1) or 1), int(getattr(plan, "pp", 1) or 1)
    if pp == 1:
        return step_model, dp
    return microbatch_steps(step_model), dp * pp
