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
    # below the 65.1% single-cache ceiling of this trace (papers/research/workloads.md §3)
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


def test_memory_serves_the_family_recipe(cli):
    # MiniMax M3 on the post's 2 B300: the recipe serves NVIDIA's experts-only NVFP4 export on
    # NVFP4 chips (data/deployments/minimax-m3.yaml, InferenceX b300-fp4-mtp): 253.8 GB of
    # weights (about 256 GB on disk, tests/test_precision.py) plus the EAGLE-3 draft, 127.0 GB
    # per GPU at TP2, the same weight bytes as plan's step model, leaving a KV pool of usable -
    # weights - activations - reserve (~129 GB per GPU). The MXFP8 checkpoint (H200's recipe)
    # weighs 221.0 GB per GPU.
    out = cli("memory", "--arch", "minimax-m3", "--hardware", "b300", "--tp", "2", "--ep", "2",
              "--json")
    assert out.code == 0, out.stderr
    d = out.json
    assert d["precision"] == "experts=nvfp4,indexer_cache=fp8" and d["kv_dtype"] == "fp8"
    assert d["weight_bytes"] / 1e9 == pytest.approx(127.0, abs=0.1)
    assert d["kv_pool_bytes"] == pytest.approx(
        d["usable_bytes"] - d["weight_bytes"] - d["activation_bytes"] - d["reserve_bytes"])
    mx = cli("memory", "--arch", "minimax-m3", "--hardware", "b300", "--tp", "2", "--ep", "2",
             "--precision", "mxfp8", "--json")
    assert mx.code == 0 and mx.json["weight_bytes"] / 1e9 == pytest.approx(221.0, abs=0.1)
    bf16 = cli("memory", "--arch", "minimax-m3", "--hardware", "b300", "--tp", "2", "--ep", "2",
               "--precision", "bf16", "--json")
    assert bf16.code == 2 and "exceed" in bf16.stderr and "Traceback" not in bf16.stderr
