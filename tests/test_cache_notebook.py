"""notebooks/cache_hit.py runs end to end and records the cache headline numbers."""

from __future__ import annotations

import pytest

from model.frontends.nbio import run_notebook


@pytest.mark.slow
def test_cache_hit_notebook(tmp_path):
    head = run_notebook("cache_hit", {"curve_points": 5, "breakeven_archs": ["qwen3-30b-a3b"],
                                      "breakeven_chips": ["h200-sxm", "b200", "gb300-nvl72"]},
                        tmp_path)
    # AgentX sample, infinite cache: the derived CSV's inf_cache_hit_tokens (test_cache)
    assert head["hit_tokens"] == 174_189_120 and head["input_tokens"] == 183_341_009
    # sticky keeps the full 95.0% over 8 replicas with 5e5 tokens each; random falls below 70%
    rows = {(r["routing"], r["shared_pool"]): r for r in head["routing"]["rows"]}
    assert rows[("sticky", False)]["hit_rate"] > rows[("random", False)]["hit_rate"] + 0.25
    assert head["routing"]["sticky_minus_random"] > 0.25
    # an unbounded shared pool restores random routing to the single-cache ceiling
    assert rows[("random", True)]["hit_rate"] == pytest.approx(head["infinite_hit_rate"])
    # crossovers reported for the three chips on every tier
    chips = {r["hardware"] for r in head["reload_vs_recompute"]}
    assert chips == {"h200-sxm", "b200", "gb300-nvl72"}
    assert all(r["reload_wins_above_tokens"] is not None for r in head["reload_vs_recompute"])
    for name in ("hit_rate_vs_capacity", "hit_rate_by_tier", "routing"):
        assert (tmp_path / f"{name}.png").stat().st_size > 0
