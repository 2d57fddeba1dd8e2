"""The engine's batching policy (vLLM V1 scheduler knobs) and the per-step token accounting both
the closed-form serving model and the simulator apply (papers/research/theory.md §1.1).

Per step the scheduler serves running requests first (one token per decode, then in-flight
prefill chunks), then admits waiting ones, each prefill taking
`min(remaining, threshold if 0 < threshold < remaining, budget left)` tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from model.specs.defaults import (
    ATTENTION_BACKEND,
    ATTENTION_BACKENDS,
    DRAFT_ATTENTION_BACKEND,
    DRAFT_ATTENTION_BACKENDS,
    FRONTEND_RENDER_S_PER_PROMPT_TOKEN,
    FRONTEND_S_PER_PROMPT_TOKEN,
    FRONTENDS,
    KERNEL_LAUNCH,
    KERNEL_LAUNCH_MODES,
    MAX_NUM_BATCHED_TOKENS,
    MAX_NUM_SEQS,
)
from model.specs.errors import ServecastError


@dataclass(frozen=True)
class EnginePolicy:
    """`max_num_batched_tokens`: token budget per step shared by decodes and prefill chunks.
    `max_num_seqs`: running requests per step (per DP rank, as in vLLM).
    `long_prefill_token_threshold`: per-request prefill tokens per step; 0 = no cap (vLLM).
    `prefill_schedule_interval`: prefill only on steps whose counter is a multiple of it; the
    counter is shared across DP ranks, so prefill lands on the same steps everywhere (1 = off).
    `kernel_launch`: how a step's kernels are launched (model.specs.defaults.KERNEL_LAUNCH_MODES:
    CUDA graphs, --enforce-eager, or eager with CUDA_LAUNCH_BLOCKING=1).
    `attention_backend`: the attention kernels (model.specs.defaults.ATTENTION_BACKENDS: the
    chip's default, or vLLM's Triton unified attention); `draft_attention_backend`: the
    drafter's (DRAFT_ATTENTION_BACKENDS; `same` as the target's).
    `cpu_offload_gib`: weights per GPU the engine keeps in host memory and reads over the host
    link every step (vLLM --cpu-offload-gb, in GiB; model.perf.host_weights); 0 = none.
    `frontend_s_per_prompt_token`: seconds the API server in front of the engine spends per
    prompt token rendering and tokenizing each request's whole prompt before the engine sees
    it; 0, the default, is the engine alone, as the queue laws and the simulator agreement study
    it. A deployment sets its front end's (model.plan.evaluate, `frontend_rate_s_per_token`).
    """

    max_num_batched_tokens: int = MAX_NUM_BATCHED_TOKENS
    max_num_seqs: int = MAX_NUM_SEQS
    long_prefill_token_threshold: int = 0
    prefill_schedule_interval: int = 1
    kernel_launch: str = KERNEL_LAUNCH
    frontend_s_per_prompt_token: float = 0.0
    cpu_offload_gib: float = 0.0
    attention_backend: str = ATTENTION_BACKEND
    draft_attention_backend: str = DRAFT_ATTENTION_BACKEND

    def __post_init__(self) -> None:
        rate = self.frontend_s_per_prompt_token
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0.0 <= rate < 1.0:
            raise ServecastError(f"EnginePolicy: frontend_s_per_prompt_token: must be a number "
                                 f"of seconds in [0, 1), got {rate!r}")
        offload = self.cpu_offload_gib
        if isinstance(offload, bool) or not isinstance(offload, (int, float)) \
                or not 0.0 <= offload < float("inf"):
            raise ServecastError(f"EnginePolicy: cpu_offload_gib: must be a number of GiB >= 0, "
                                 f"got {offload!r}")
        if self.kernel_launch not in KERNEL_LAUNCH_MODES:
            raise ServecastError(f"EnginePolicy: kernel_launch: allowed "
                                 f"{', '.join(KERNEL_LAUNCH_MODES)}, got {self.kernel_launch!r}")
        if self.attention_backend not in ATTENTION_BACKENDS:
            raise ServecastError(f"EnginePolicy: attention_backend: allowed "
                                 f"{', '.join(ATTENTION_BACKENDS)}, got "
                                 f"{self.attention_backend!r}")
        if self.draft_attention_backend not in DRAFT_ATTENTION_BACKENDS:
            raise ServecastError(f"EnginePolicy: draft_attention_backend: allowed "
                                 f"{', '.join(DRAFT_ATTENTION_BACKENDS)}, got "
                                 f"{self.draft_attention_backend!r}")
        checks = (
            ("max_num_batched_tokens", self.max_num_batched_tokens, 1),
            ("max_num_seqs", self.max_num_seqs, 1),
            ("long_prefill_token_threshold", self.long_prefill_token_threshold, 0),
            ("prefill_schedule_interval", self.prefill_schedule_interval, 1),
        )
        for name, value, low in checks:
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ServecastError(f"EnginePolicy: {name}: must be an integer >= {low}, "
                                     f"got {value!r}")
        if self.max_num_batched_tokens < self.max_num_seqs:
            # vLLM's SchedulerConfig rejects this too: every running decode needs a token
            raise ServecastError("EnginePolicy: max_num_batched_tokens: must be >= max_num_seqs "
                                 f"({self.max_num_batched_tokens} < {self.max_num_seqs})")

    def frontend_s(self, prompt_tokens):
        """Seconds the front end holds each request of `prompt_tokens` (its whole prompt)
        before the engine sees it."""
        return self.frontend_s_per_prompt_token * prompt_tokens

    @property
    def chunk_cap(self) -> float:
        """Per-request prefill tokens per step (inf when the threshold is off)."""
        t = self.long_prefill_token_threshold
        return float(t) if t > 0 else float("inf")

    def prefill_budget(self, decode_seqs: float) -> float:
        """Tokens left for prefill in a step that also carries `decode_seqs` decodes."""
        return max(float(self.max_num_batched_tokens) - decode_seqs, 0.0)

    def chunk(self, remaining: float, budget_left: float) -> float:
        """vLLM's per-request prefill tokens this step."""
        return min(remaining, self.chunk_cap, budget_left)

    def steps_alone(self, prompt_tokens: float, decode_seqs: float = 0.0) -> int:
        """Steps a prompt needs when it is the only prefill (theory T21)."""
        per_step = min(self.chunk_cap, self.prefill_budget(decode_seqs))
        if per_step <= 0:
            raise ServecastError("EnginePolicy: max_num_batched_tokens: no budget left for "
                                 "prefill after the decodes")
        return int(-(-prompt_tokens // per_step))

    def with_threshold(self, threshold: int) -> EnginePolicy:
        return replace(self, long_prefill_token_threshold=threshold)

    def as_dict(self) -> dict:
        return {"max_num_batched_tokens": self.max_num_batched_tokens,
                "max_num_seqs": self.max_num_seqs,
                "long_prefill_token_threshold": self.long_prefill_token_threshold,
                "prefill_schedule_interval": self.prefill_schedule_interval,
                "kernel_launch": self.kernel_launch,
                "cpu_offload_gib": self.cpu_offload_gib,
                "attention_backend": self.attention_backend,
                "draft_attention_backend": self.draft_attention_backend}


def default_threshold(max_model_len: int, max_num_partial_prefills: int = 1) -> int:
    """vLLM's default threshold: 4% of max_model_len when partial prefills > 1, else off."""
    if max_num_partial_prefills > 1:
        return int(0.04 * max_model_len)
    return 0


def frontend_rate_s_per_token(frontend: str | None) -> float:
    """Seconds a front end spends per prompt token before the engine sees the request: the
    tokenization every front end does, plus the chat-template render of a Python front end
    (model.specs.defaults.FRONTEND_RENDER_S_PER_PROMPT_TOKEN); None: the tokenization alone."""
    if frontend is None:
        return FRONTEND_S_PER_PROMPT_TOKEN
    if frontend not in FRONTENDS:
        raise ServecastError(f"frontend: allowed {', '.join(FRONTENDS)}, got {frontend!r}")
    return FRONTEND_S_PER_PROMPT_TOKEN + FRONTEND_RENDER_S_PER_PROMPT_TOKEN[frontend]
