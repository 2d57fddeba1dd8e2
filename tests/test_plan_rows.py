"""The vLLM AgentX post's three deployments (seed 000), planned with documented deployment
recipes (data/deployments/) and the finite prefix cache (model.search_cache); no per-row factors.
Each test pins the error this model achieves today, so a change that moves it is seen."""

import pytest

from model.plan import POST_ROWS, plan
from model.recipes import load_recipes, recipe_for
from model.search_cache import tier_hits

ROW = {r["arch"]: r for r in POST_ROWS}


def test_recipes_are_sourced_and_match_the_checkpoints():
    for r in load_recipes():
        assert r.precision_source and r.kv_dtype_source and r.spec_source and r.date
        assert r.spec_tokens == 0  # no sourced acceptance rate on AgentX traffic anywhere
    # MiniMax M3: MXFP8 checkpoint (BF16's 852 GB cannot fit 2 x B300); FP8 GQA cache assumed.
    m3 = recipe_for("minimax-m3")
    assert (m3.precision, m3.kv_dtype) == ("mxfp8", "fp8")
    # DeepSeek V4: vLLM blog 2026-04-24 --kv-cache-dtype fp8 (+ fp4 indexer, the arch default)
    assert recipe_for("deepseek-v4-pro").kv_dtype == "fp8"
    assert recipe_for("qwen3-32b") is None


def test_hit_rate_answers_to_capacity_and_policy():
    from model.workload import load_workload

    w = load_workload("agentx")
    # Unlimited HBM: every session's prefix survives -> the profile's infinite-cache hit
    # (AgentX ~0.95, research/workloads.md; >96% in the post on input tokens).
    hbm, low, inf = tier_hits(w, {"hbm": 1e12}, [64.0])
    assert hbm[0] == pytest.approx(inf, abs=1e-9) and low[0] == 0 and 0.93 < inf < 0.97
    # 6M tokens of HBM (DeepSeek V4 on tp4-ep4, GB300) shared by more sessions hits less,
    # and a host tier behind it recovers most of the loss (Che closed form, model.cache_model).
    small = [tier_hits(w, {"hbm": 6e6}, [s])[0][0] for s in (16.0, 64.0, 256.0)]
    assert small[0] > small[1] > small[2]
    hbm2, low2, _ = tier_hits(w, {"hbm": 6e6, "host": 3.7e7}, [256.0])
    assert hbm2[0] == pytest.approx(small[2]) and hbm2[0] + low2[0] > small[2] + 0.3
    # second-hit admits a turn's growth only when seen again: it never beats LRU on append-only
    # sessions (model.cache_model docstring)
    lru = tier_hits(w, {"hbm": 6e6}, [64.0], "lru")[0][0]
    second = tier_hits(w, {"hbm": 6e6}, [64.0], "second-hit")[0][0]
    assert second < lru


# Pins: the error each row has with the step model and kernel calibration of 2026-11-29 11:25
# UTC (data/calibration/kernels.yaml was being refitted that morning and moved the DeepSeek row
# from -25% to -79%); +-0.10 absolute, so a calibration change that moves a row is seen.
# None of the three meets the 25%; the limiting term of each is asserted beside it.


@pytest.mark.slow
def test_minimax_m3_on_2_b300_row():
    # Post: 70K TPGS at P90 74.2 tok/s (24 lanes). Model: ~26K (-63%). Limit: KV capacity.
    # 2 x 270 GB usable, 90% cap, minus 441 GB of MXFP8 weights (221 GB per GPU under tp2-ep2)
    # leaves ~18 GB of pool per GPU: ~4 sessions of 142K tokens at 76 KB/token (FP8 K/V + BF16
    # index-K), so fewer than 4 sequences decode at once (the post's rate needs ~6: 140K tok/s
    # / 142K tokens = 1 turn/s x 444 tokens / 74 tok/s).
    r = plan("minimax-m3", "b300", 2, "agentx", 50.0)
    err = r.best["tpgs"] / ROW["minimax-m3"]["tpgs"] - 1
    assert err == pytest.approx(-0.63, abs=0.10)
    assert r.best["decode_batch"] < 4.5
    # BF16 K/V (137 KB/token): about half the sessions fit, lower throughput still
    bf16 = plan("minimax-m3", "b300", 2, "agentx", 50.0, kv_dtype="bf16")
    assert bf16.best["tpgs"] < r.best["tpgs"]


@pytest.mark.slow
def test_deepseek_v4_pro_on_12_gb300_row():
    # Post: 83K TPGS at P90 58.3 tok/s. Model: ~17K (-79%), disaggregated, limited by the decode
    # workers' rate at the SLO: the decode step is HBM-bound (routed-expert weight reads and the
    # CSA/HCA KV reads), ~20 ms already at a few tens of sequences per 4-8 GPUs.
    r = plan("deepseek-v4-pro", "gb300-nvl72", 12, "agentx", 50.0)
    err = r.best["tpgs"] / ROW["deepseek-v4-pro"]["tpgs"] - 1
    assert err == pytest.approx(-0.79, abs=0.10)
    assert r.best["limit"] == "decode_rate" and r.bottleneck == "hbm"


@pytest.mark.slow
def test_kimi_k3_on_16_gb300_row():
    # Post: 11.8K TPGS at P90 62.7 tok/s. Model: ~5.8K (-51%), 1 prefill (tp8) + 1 decode worker
    # (tp8-ep8-dcp4): the decode step is HBM-bound at ~16 ms for 2 sequences (93 layers of small
    # GEMMs and expert reads), so ~6 sequences decode at 50 tok/s per 8 GPUs.
    r = plan("kimi-k3", "gb300-nvl72", 16, "agentx", 50.0)
    err = r.best["tpgs"] / ROW["kimi-k3"]["tpgs"] - 1
    assert err == pytest.approx(-0.51, abs=0.10)
    assert r.bottleneck == "hbm" and "dcp" in r.deployment.label()
