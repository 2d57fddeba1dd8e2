"""notebooks/kv_footprint.py runs under papermill and records its headline numbers."""

from __future__ import annotations

import pytest

from model.frontends import nbio


@pytest.mark.slow
def test_kv_footprint_notebook(tmp_path):
    headline = nbio.run_notebook(
        "kv_footprint",
        {"archs": ["deepseek-v3", "gpt-oss-120b", "kimi-k3"], "kv_dtype": "bf16",
         "max_context_tokens": 131_072, "reference_context_tokens": 100_000},
        tmp_path)
    archs = headline["archs"]
    # DeepSeek V3: 70,272 B/token x 100,000 tokens = 7.0272 GB (61 x 576 x 2 B per token)
    assert archs["deepseek-v3"]["kv_bytes_per_token"] == 70_272
    assert archs["deepseek-v3"]["gb_per_reference_sequence"] == pytest.approx(7.0272)
    # gpt-oss-120b: 36,864 x 100,000 + 18 x 2,048 x 128 sliding-window bytes = 3.6911 GB
    assert archs["gpt-oss-120b"]["gb_per_reference_sequence"] == pytest.approx(3.691118592)
    # Kimi K3: 27,648 x 100,000 MLA + 449,372,160 B fixed KDA state (fp32) and conv (bf16)
    assert archs["kimi-k3"]["state_bytes"] == 449_372_160
    assert archs["kimi-k3"]["gb_per_reference_sequence"] == pytest.approx(3.21417216)
    for figure in ("kv_per_sequence", "kv_breakdown"):
        assert (tmp_path / f"{figure}.png").stat().st_size > 0
        assert (tmp_path / f"{figure}.svg").stat().st_size > 0
