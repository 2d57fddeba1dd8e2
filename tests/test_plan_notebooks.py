"""The plan, pd_ratio, tco and parallelism notebooks, executed with small parameters."""

import pytest

from model.frontends.nbio import run_notebook
from model.perf.memory import GPU_MEMORY_UTILIZATION
from model.perf.params import weight_bytes
from model.plan.cost import AGENTX_POST_MIX, api_equivalent_usd_per_hour, cost_advantage
from model.specs.architecture import load_architecture
from model.specs.hardware import load_hardware
from model.specs.prices import api_price


def test_plan_notebook_headline_is_the_cli_contract(tmp_path):
    h = run_notebook("plan", {"arch": "qwen3-32b", "allow_beyond_window": True, "hardware": "h100-sxm", "gpus": 2,
                              "slo_p90_interactivity": 20.0, "pareto_points": 2}, tmp_path)
    for key in ("tpgs", "p90_interactivity_tok_s", "p90_ttft_s", "deployment", "tco_usd_per_hour",
                "usd_per_mtok", "api_equivalent_usd_per_hour", "cost_advantage",
                "launch_commands"):
        assert key in h
    assert h["p90_interactivity_tok_s"] >= 20.0 and h["tier"] == "full"
    # $/Mtok = TCO / (TPGS * GPUs * 3600) * 1e6
    assert h["usd_per_mtok"] == pytest.approx(h["tco_usd_per_hour"] / (h["tpgs"] * 2 * 3600) * 1e6)
    assert (tmp_path / "pareto.png").exists() and (tmp_path / "pareto.svg").exists()


def test_tco_notebook_reproduces_post_advantages(tmp_path):
    h = run_notebook("tco", {"hardware": ["h100-sxm", "gb300-nvl72"]}, tmp_path)
    # The post's cost table: 106x / 85x / 14.6x, recomputed within 5% from its TPGS and TCO.
    assert h["advantage_deepseek-v4-pro"] == pytest.approx(106, rel=0.05)
    assert h["advantage_minimax-m3"] == pytest.approx(85, rel=0.05)
    assert h["advantage_kimi-k3"] == pytest.approx(14.6, rel=0.05)
    assert h["max_rel_error"] < 0.05
    # the notebook and the library agree: DSV4, 83K TPGS x 12 GPUs at $27.72/h
    api = api_equivalent_usd_per_hour(api_price("claude-opus-5"), AGENTX_POST_MIX, 83_000 * 12)
    assert h["advantage_deepseek-v4-pro"] == pytest.approx(cost_advantage(api, 27.72))


def test_pd_ratio_notebook(tmp_path):
    h = run_notebook("pd_ratio", {"arch": "qwen3-32b", "allow_beyond_window": True, "hardware": "h100-sxm", "gpus": 3,
                                  "slo_p90_interactivity": 20.0}, tmp_path)
    # 3 GPUs of single-GPU-or-larger workers: the joint optimum uses x + y instances within 3.
    assert h["joint_x"] >= 1 and h["joint_y"] >= 1
    # stage 1 -> stage 2 (papers/research/theory.md §7): prefill instances per decode instance = lam_D / lam_P
    assert h["rate_matched_p_per_d"] == pytest.approx(h["decode_max_rps"] / h["prefill_max_rps"])
    assert h["prefill_max_rps"] > 0 and h["decode_max_rps"] > 0
    assert h["p90_interactivity_tok_s"] >= 20.0

    # Stage 2 is a real sweep: every budget up to 4 x 3 GPUs, many P:D ratios, not one point.
    pair, sweep = h["sweep_pair"], h["sweep"]
    assert pair["max_gpus"] == 12
    assert len({round(r["p_per_d"], 9) for r in sweep}) > 3
    assert max(r["gpus"] for r in sweep) <= 12
    lam_p, lam_d = pair["prefill_rps"], pair["decode_rps"]
    assert pair["rate_matched_p_per_d"] == pytest.approx(lam_d / lam_p)
    for r in sweep:  # min(x lam_P, y lam_D) over whole GPUs, TPGS as the search counts it
        assert r["gpus"] == r["x"] * pair["prefill_gpus"] + r["y"] * pair["decode_gpus"]
        assert r["rate_rps"] == pytest.approx(min(r["x"] * lam_p, r["y"] * lam_d))
        assert r["tpgs"] == pytest.approx(r["rate_rps"] * h["tokens_per_request"] / r["gpus"])
        assert r["limit"] == ("prefill" if r["x"] * lam_p < r["y"] * lam_d else "decode")
    best = h["sweep_best"]
    assert best["tpgs"] == pytest.approx(max(r["tpgs"] for r in sweep))
    # no whole deployment beats the continuous optimum at the rate-matched ratio
    r_star = pair["rate_matched_p_per_d"]
    bound = lam_d * h["tokens_per_request"] / (r_star * pair["prefill_gpus"] + pair["decode_gpus"])
    assert best["tpgs"] <= bound * (1 + 1e-9)
    # The screening at the budget can only lose to the two-stage bound (finite prefix cache,
    # TTFT); the joint best is a deployment of its own plan pair at the budget, and its
    # screening TPGS one of those screened there.
    two_stage = {(r["x"], r["y"]): r["tpgs"] for r in h["at_budget"]}
    assert {(r["x"], r["y"]) for r in h["at_budget"]} == {
        (r["x"], r["y"]) for r in sweep if r["gpus"] == 3}
    for r in h["searched_at_budget"]:
        assert r["tpgs"] <= two_stage[(r["x"], r["y"])] * (1 + 1e-9)
        assert r["p90_interactivity_tok_s"] >= 20.0
    assert (h["joint_x"], h["joint_y"]) in two_stage
    assert h["screening_tpgs"] <= max(r["tpgs"] for r in h["searched_at_budget"]) * (1 + 1e-9)
    for name in ("pd_saturation", "pd_ratio", "pd_budgets"):
        assert (tmp_path / f"{name}.png").stat().st_size > 10_000


def test_parallelism_notebook(tmp_path):
    h = run_notebook("parallelism", {"arch": "qwen3-32b", "allow_beyond_window": True, "hardware": "h100-sxm", "gpus": 4,
                                     "slo_p90_interactivity": 20.0, "long_prompt_tokens": 16384},
                     tmp_path)
    # Dense 32B on 4 H100: PCP splits a cold 16K prompt's FLOPs 4 ways like TP does; they differ
    # only by TP's per-layer all-reduces vs PCP's KV all-gather and per-rank weight reads, each a
    # small part of a 16K prefill, so the two stay within ~20% of each other.
    assert 0.8 < h["pcp_speedup_vs_tp_cold"] < 1.5
    # DEP's KV advantage needs KV that TP duplicates and weights that EP shards. A dense GQA
    # model has neither: DP4 puts all the bf16 weights W on each H100, TP4 a quarter, and TP
    # shards the 8 KV heads 4 ways without copies. Capacity goes with the pool left under vLLM's
    # 90% cap (model.perf.memory), so DP4 / TP4 <= (0.9 H - W) / (0.9 H - W/4), H the sourced HBM
    # per GPU; activations and reserve, the same on both, only lower it. (H 85.5 GB and W
    # 65.5 GB give <= 0.19.)
    hbm = load_hardware("h100-sxm").hbm_bytes
    w = weight_bytes(load_architecture("qwen3-32b"))
    bound = (GPU_MEMORY_UTILIZATION * hbm - w) / (GPU_MEMORY_UTILIZATION * hbm - w / 4)
    assert 0 < h["dep_kv_capacity_ratio"] < bound < 0.25
    # PP (TP2-PP2) adds latency to a warm 2K turn relative to TP4
    assert h["pp_slowdown_warm"] > 1.0
    assert h["best_mixed_family"] is not None
