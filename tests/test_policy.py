"""EnginePolicy: vLLM V1 scheduler semantics (papers/research/theory.md §1.1, numeric cases §13)."""

from __future__ import annotations

import pytest

from model.serve.policy import EnginePolicy, default_threshold
from model.specs.errors import ServecastError


def test_chunk_steps_t21():
    # theory T21: n=32768; threshold 512 -> 64 steps; threshold off, budget 8192 with 256
    # decodes -> ceil(32768 / (8192 - 256)) = 5 steps
    assert EnginePolicy(8192, 256, 512).steps_alone(32768) == 64
    assert EnginePolicy(8192, 256, 0).steps_alone(32768, decode_seqs=256) == 5


def test_default_threshold_t20():
    # theory T20 (vllm/config/scheduler.py): int(0.04 * 131072) = 5242 with partial prefills > 1
    assert default_threshold(131072, max_num_partial_prefills=2) == 5242
    assert default_threshold(131072) == 0


def test_chunk_is_min_of_remaining_threshold_and_budget():
    # num_new = min(remaining, threshold if 0 < threshold < remaining, budget left)
    p = EnginePolicy(8192, 256, 512)
    assert p.chunk(100, 8000) == 100
    assert p.chunk(10_000, 8000) == 512
    assert p.chunk(10_000, 300) == 300
    assert EnginePolicy(8192, 256, 0).chunk(10_000, 8000) == 8000


def test_policy_validation_matches_vllm():
    # vLLM's SchedulerConfig requires max_num_batched_tokens >= max_num_seqs
    with pytest.raises(ServecastError, match="max_num_batched_tokens"):
        EnginePolicy(128, 256)
    with pytest.raises(ServecastError, match="long_prefill_token_threshold"):
        EnginePolicy(8192, 256, -1)
    with pytest.raises(ServecastError, match="prefill_schedule_interval"):
        EnginePolicy(8192, 256, 0, 0)
    assert EnginePolicy().with_threshold(512).long_prefill_token_threshold == 512
