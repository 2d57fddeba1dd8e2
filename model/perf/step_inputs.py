"""Checks of a step model's engine inputs: each one line naming the input and what it allows."""

from __future__ import annotations

import numpy as np

from model.specs.defaults import (
    ATTENTION_BACKENDS,
    DRAFT_ATTENTION_BACKENDS,
    KERNEL_LAUNCH_MODES,
)
from model.specs.errors import ServecastError

CHOICES = {"kernel_launch": KERNEL_LAUNCH_MODES, "attention_backend": ATTENTION_BACKENDS,
           "draft_attention_backend": DRAFT_ATTENTION_BACKENDS}


def check_attention_flags(attention_backend: str, draft_attention_backend: str) -> None:
    """The command line's --attention-backend and --draft-attention-backend, one error line
    naming the flag where a value is not allowed."""
    for flag, name, value in (("--attention-backend", "attention_backend", attention_backend),
                              ("--draft-attention-backend", "draft_attention_backend",
                               draft_attention_backend)):
        if value not in CHOICES[name]:
            raise ServecastError(f"{flag}: allowed {', '.join(CHOICES[name])}, got {value!r}")


def check_choices(**named: str) -> None:
    """Each named engine setting among its allowed values (CHOICES)."""
    for name, value in named.items():
        if value not in CHOICES[name]:
            raise ServecastError(f"{name}: allowed {', '.join(CHOICES[name])}, got {value!r}")


def offload_gib(value) -> float:
    """`cpu_offload_gib` as a number of GiB >= 0 (vLLM's --cpu-offload-gb takes GiB)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.number)) \
            or not 0.0 <= float(value) < np.inf:
        raise ServecastError(f"cpu_offload_gib: must be a number of GiB >= 0, got {value!r}")
    return float(value)


def check_speculation(spec_tokens: int, spec_acceptance: float, acceptance_length: float
                       ) -> None:
    """Speculative decoding inputs within what they can mean: drafts >= 0, a per-position
    acceptance in [0, 1], a mean acceptance length (tokens per verification step, the target's
    own included) 0 (unset) or at least 1."""
    if isinstance(spec_tokens, bool) or not isinstance(spec_tokens, (int, np.integer)) \
            or spec_tokens < 0:
        raise ServecastError(f"spec_tokens: must be an integer >= 0, got {spec_tokens!r}")
    if not 0.0 <= spec_acceptance <= 1.0:
        raise ServecastError(f"spec_acceptance: must be in [0, 1], got {spec_acceptance!r}")
    if acceptance_length and not 1.0 <= acceptance_length < np.inf:
        raise ServecastError(f"acceptance_length: must be 0 (unset) or a number >= 1 (above "
                             f"1 + drafts it counts as 1 + drafts), got {acceptance_length!r}")
