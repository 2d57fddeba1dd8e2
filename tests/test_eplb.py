"""Redundant experts (EPLB) and attention data parallelism written inside tp: the plans SGLang,
TensorRT-LLM and vLLM run at rack scale (model.perf.parallel, model.perf.expert_balance)."""

from __future__ import annotations

import json

import pytest

from model.frontends.cli import main
from model.perf.expert_balance import hot_rank_load_factor
from model.perf.parallel import (
    ParallelPlan,
    attention_dp_plan,
    decode_attention_split,
    enumerate_plans,
    experts_per_rank,
    validate_plan,
    weight_bytes_per_gpu,
)
from model.perf.step import build_step_model
from model.plan.deployment import parse_plan_label
from model.specs.architecture import load_architecture
from model.specs.dtypes import dtype
from model.specs.errors import Infeasible, ServecastError
from model.specs.hardware import load_hardware

R1 = load_architecture("deepseek-r1")  # 256 routed experts, 128 attention heads
NVL72 = load_hardware("gb200-nvl72")  # a 72-GPU scale-up domain


def test_ep72_with_32_redundant_experts_holds_4_per_rank():
    # DeepSeek-R1: 256 routed experts (HF config n_routed_experts); 256 + 32 = 288 = 72 x 4, the
    # 288-slot layout of the SGLang large-scale EP blog (lmsys.org/blog/2025-05-05-large-scale-ep)
    plan = ParallelPlan(dp=72, ep=72, redundant_experts=32)
    validate_plan(R1, NVL72, plan)
    assert experts_per_rank(256, plan) == 4
    assert plan.label() == "dp72-ep72-eplb32"


def test_ep72_without_redundancy_is_refused_naming_the_counts_that_divide():
    with pytest.raises(Infeasible, match=r"256 experts not divisible by ep=72 .*: 32, 104"):
        validate_plan(R1, NVL72, ParallelPlan(dp=72, ep=72))


def test_redundant_copies_count_in_the_weights():
    # each redundant expert of each of the 58 MoE layers (61 layers, first_k_dense_replace 3)
    # holds 3 x 7168 x 2048 fp8-block weights; 32 of them spread over 72 ranks
    per_expert = 3 * 7168 * 2048 * dtype("fp8_block").bytes
    extra = (weight_bytes_per_gpu(R1, ParallelPlan(dp=72, ep=72, redundant_experts=32))
             - weight_bytes_per_gpu(R1, ParallelPlan(dp=72, ep=72)))
    assert extra == pytest.approx(58 * 32 * per_expert / 72, rel=1e-9)


def test_hot_rank_reproduces_the_tensorrt_llm_measurements():
    # TensorRT-LLM examples/wide_ep/ep_load_balancer/README.md, DeepSeek-R1: hottest rank
    # (max - mean) / mean 1.56 at EP32 (8 experts per rank), 0.115 with 288 slots on EP36,
    # 1024 routed tokens per rank in both
    assert float(hot_rank_load_factor(32, 256, 0, 1024)) == pytest.approx(2.56, rel=2e-3)
    assert float(hot_rank_load_factor(36, 256, 32, 1024)) == pytest.approx(1.115, rel=1e-9)
    assert float(hot_rank_load_factor(1, 256, 0, 1024)) == 1.0


def test_redundant_experts_speed_up_a_compute_bound_moe_layer():
    # 32 prompts of 4096 tokens on EP32: each rank's grouped GEMMs are compute-bound, so the
    # busiest rank's share of the routed pairs sets the MoE time; EPLB lowers that share more
    # than its ninth expert per rank costs
    def moe_s(redundant):
        model = build_step_model(R1, NVL72, ParallelPlan(dp=32, ep=32,
                                                         redundant_experts=redundant),
                                 precision="fp8", check_fit=False)
        return float(model.step_parts(32 * 4096, 4096, 0, 0, 32)[2])

    pairs = 32 * 4096 * 8 / 32  # top-8 routing
    load_ratio = (float(hot_rank_load_factor(32, 256, 32, pairs))
                  / float(hot_rank_load_factor(32, 256, 0, pairs)))
    # the busiest rank's pairs fall to 43% of the unbalanced; the per-pair routing work every
    # rank pays on all pairs and the launch cost do not fall with them
    assert load_ratio == pytest.approx(0.4267, abs=1e-3)
    assert load_ratio < moe_s(32) / moe_s(0) < 0.7


def test_the_search_offers_ep72_with_redundant_experts():
    labels = {p.label() for p in enumerate_plans(R1, NVL72, 72, "decode")}
    assert "dp72-ep72-eplb32" in labels


def test_labels_and_launch_flags_carry_the_redundant_experts():
    from model.plan.launch import vllm_parallel_flags

    plan = parse_plan_label("dp72-ep72-eplb32")
    assert plan == ParallelPlan(dp=72, ep=72, redundant_experts=32)

    class Phase:  # the one field vllm_parallel_flags reads
        pass

    phase = Phase()
    phase.plan = plan
    flags = vllm_parallel_flags(phase)
    # vLLM docs/serving/expert_parallel_deployment.md: --enable-eplb --eplb-config
    assert flags[flags.index("--eplb-config") + 1] == json.dumps({"num_redundant_experts": 32})


def test_tp48_with_attention_dp_is_accepted_with_whole_heads_per_rank():
    # SGLang `--tp 48 --enable-dp-attention --dp 48 --ep 48`: attention data-parallel on 48
    # ranks, each with all 128 heads of DeepSeek-R1 (num_attention_heads 128); EP48 over the
    # same GPUs needs 32 redundant experts (288 = 48 x 6)
    plan = attention_dp_plan(48, 48, 48, redundant_experts=32)
    assert plan == ParallelPlan(tp=1, dp=48, ep=48, moe_tp=1, redundant_experts=32)
    validate_plan(R1, NVL72, plan)
    att = R1.main_layers[0].attention
    heads_split, _ = decode_attention_split(att, plan)
    assert att.num_heads // heads_split == 128
    with pytest.raises(Infeasible, match="128 attention heads not divisible by tp=48"):
        validate_plan(R1, NVL72, ParallelPlan(tp=48, ep=48, moe_tp=1, redundant_experts=32))


def test_attention_dp_mappings_of_the_engines():
    # TensorRT-LLM enable_attention_dp: dp = tp; SGLang hybrid --tp 16 --dp 4: 4-way attention
    # TP inside each of 4 DP ranks; experts TP over all 16 GPUs without --ep
    assert attention_dp_plan(8, ep=8) == ParallelPlan(tp=1, dp=8, ep=8, moe_tp=1)
    assert attention_dp_plan(16, 4) == ParallelPlan(tp=4, dp=4, ep=1, moe_tp=16)
    with pytest.raises(ServecastError, match="dp 5 must divide tp 16"):
        attention_dp_plan(16, 5)


EST_R1 = ["estimate", "--arch", "deepseek-r1", "--hardware", "gb200-nvl72", "--isl", "1000",
          "--osl", "100", "--concurrency", "64", "--json"]


def test_cli_prices_tp48_attention_dp_with_redundant_experts(capsys):
    assert main(EST_R1 + ["--tp", "48", "--attention-dp", "--ep", "48",
                          "--redundant-experts", "32"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["feasible"] and out["plan"] == "dp48-ep48-eplb32" and out["gpus"] == 48


@pytest.mark.parametrize("extra, allowed", [
    (["--dp", "72", "--ep", "72", "--redundant-experts", "5"], "allowed: 32, 104, 176, 248"),
    (["--tp", "8", "--redundant-experts", "8"], "allowed with ep=1: 0"),
])
def test_cli_bad_redundant_experts_is_one_line_exit_2(capsys, extra, allowed):
    assert main(EST_R1 + extra) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and "--redundant-experts" in lines[0] and allowed in lines[0]
    assert captured.out == ""
