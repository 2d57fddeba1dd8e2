"""`servecast cache` and `servecast reload` per the CLI contract (DESIGN.md)."""

from __future__ import annotations

import pytest


def test_cache_json_contract(cli):
    # Infinite-cache replay of the AgentX sample: 174,189,120 of 183,341,009 input tokens hit
    # (the derived CSV's inf_cache_hit_tokens over these 20 traces, test_cache).
    out = cli("cache", "data/traces/cc_traces_weka_042026_sample", "--json")
    assert out.code == 0, out.stderr
    d = out.json
    assert d["hit_tokens"] == 174_189_120 and d["input_tokens"] == 183_341_009
    assert d["hit_rate"] == pytest.approx(0.950083, abs=1e-6)


def test_cache_routing_and_errors(cli):
    out = cli("cache", "data/traces/mooncake_fast25_synthetic_trace.jsonl", "--replicas", "8",
              "--routing", "random", "--capacity-tokens", "1e6", "--json")
    assert out.code == 0, out.stderr
    d = out.json
    # below the 65.1% single-cache ceiling of this trace (research/workloads.md §3)
    assert d["replicas"] == 8 and d["routing"] == "random" and 0 < d["hit_rate"] < 0.651
    assert len(d["replica_input_tokens"]) == 8
    bad = cli("cache", "data/traces/azure_llm_2023_code.csv", "--json")
    assert bad.code == 2 and bad.stdout == ""
    assert bad.stderr.strip().startswith("servecast: error:") and "no hash_ids" in bad.stderr
    assert "Traceback" not in bad.stderr
    assert cli("cache", "data/traces/cc_traces_weka_042026_sample", "--policy", "fifo").code == 2
    for flag, value in (("--replicas", "0"), ("--replicas", "-2"), ("--interval-tokens", "-64")):
        bad = cli("cache", "data/traces/cc_traces_weka_042026_sample", flag, value)
        assert bad.code == 2 and flag in bad.stderr and "Traceback" not in bad.stderr


def test_reload_command(cli):
    out = cli("reload", "--arch", "deepseek-r1", "--hardware", "h200", "--tp", "8", "--json")
    assert out.code == 0, out.stderr
    d = out.json
    assert d["tier"] == "host" and d["reload_wins_above_tokens"] == 16.0
    assert d["reload_wins_everywhere"] and d["crossovers_tokens"] == []
