"""The vLLM AgentX post's parallelism lessons, as they come out of the model (nothing here is
written into it): the post (seeds/000, papers/research/theory.md §1.0) reports that

- PP suits cold long prefills but adds latency to warm, prefix-heavy turns;
- DCP is not universal: it helps Kimi K3 (MLA + KDA) but not DeepSeek V4 (compressed sparse
  attention), where DEP is the default for mixed traffic;
- PCP beats TP on a 32K-token DeepSeek V4 prefill (2.65x).

Each check compares plans on the same GPUs, served as `servecast plan` serves them (the family
recipe: weights, KV dtype, speculative decoding; data/deployments/)."""

from __future__ import annotations

import pytest

from model.perf.parallel import ParallelPlan
from model.plan.lessons import best_by_family, decode_capacity_by_family, prefill_time_s
from model.plan.plan_models import step_model
from model.plan.planner import screen
from model.plan.traffic import traffic_for
from model.specs.workload import load_workload

GB300 = "gb300-nvl72"


@pytest.fixture(scope="module")
def agentx():
    return traffic_for(load_workload("agentx"))


def _best_decode(arch, traffic):
    table = decode_capacity_by_family(arch, GB300, 8, traffic.mean_context_tokens,
                                      traffic.mean_output_tokens, 50.0)
    return table.groupby("family")["decode_tokens_per_s_per_gpu"].max()


def test_dcp_helps_kimi_k3_decode_but_not_deepseek_v4(agentx):
    # Kimi K3's MLA latent is one KV head: under TP8 every rank holds the whole cache, so DCP's
    # sequence sharding multiplies KV capacity and divides KV reads; DeepSeek V4's CSA/HCA cache
    # is already compressed 4x/128x and top-k sparse, so DCP only adds its query gather and
    # output merge, and attention-DP (DEP) keeps each sequence on one rank instead.
    kimi = _best_decode("kimi-k3", agentx)
    dsv4 = _best_decode("deepseek-v4-pro", agentx)
    assert kimi.idxmax() == "DCP" and kimi["DCP"] > 1.1 * kimi["TP+EP"]
    assert dsv4.idxmax() == "DEP" and dsv4["DCP"] < 0.5 * dsv4["DEP"]


@pytest.mark.parametrize("arch", ["deepseek-v4-pro", "kimi-k3"])
def test_pp_is_slower_on_warm_turns_and_faster_on_cold_prefills(arch):
    # A warm AgentX turn (2K new tokens on a 100K cached prefix) is one chunk: PP cannot
    # pipeline it and each stage runs it on half the GPUs of TP8; a cold 32K prompt is four
    # 8K chunks that fill TP4-PP2's two stages.
    tp = step_model(arch, GB300, ParallelPlan(tp=8, moe_tp=8))
    pp = step_model(arch, GB300, ParallelPlan(tp=4, pp=2, moe_tp=4))
    assert prefill_time_s(pp, 2048, 100_000) > 1.2 * prefill_time_s(tp, 2048, 100_000)
    assert prefill_time_s(pp, 32_768) < prefill_time_s(tp, 32_768)


def test_pcp_beats_tp_on_a_32k_deepseek_v4_prefill():
    # Post: PCP8 2.65x faster than TP8 on 32K prompts. PCP splits the prompt's tokens over 8
    # ranks that each run the whole (EP-sharded) layer; TP8 splits each GEMM 8 ways, paying two
    # all-reduces per layer and wasting the replicated MQA KV heads.
    tp = prefill_time_s(step_model("deepseek-v4-pro", GB300, ParallelPlan(tp=8, moe_tp=8)),
                        32_768)
    pcp = prefill_time_s(step_model("deepseek-v4-pro", GB300, ParallelPlan(pcp=8, moe_tp=8)),
                         32_768)
    assert tp / pcp == pytest.approx(2.65, rel=0.25)


def test_dep_with_threshold_and_cadence_leads_mixed_deepseek_v4_traffic():
    # Post: DEP is the default for mixed (aggregated) DeepSeek V4 traffic, DCP's communication
    # too costly, with --long-prefill-token-threshold and --prefill-schedule-interval keeping
    # long cold prefills from stalling every lock-stepped rank (papers/research/theory.md 1.0: DCP
    # "only matched DEP"). The screening tier's ranking (the shortlist `plan` gives the full tier)
    # puts DEP's best within 5% of the best aggregated TPGS at the SLO (TP4-EP4 40.3K, DEP12
    # 39.9K, TP4 39.1K, DCP 38.4K, DP 36.7K, PP 31.9K: a pipeline's period is its slowest
    # microbatch's pass), DCP does not beat it, and DEP needs both knobs.
    c = screen("deepseek-v4-pro", GB300, 12, "agentx", 50.0, modes=("aggregated",))
    families = best_by_family(c, 50.0).set_index("family")["tpgs"]
    assert families["DEP"] >= 0.95 * families.max()
    assert families["DEP"] > families["DCP"]
    dep = c[c["plan"].str.startswith("dp12") & c["feasible"]
            & (c["p90_interactivity_tok_s"] >= 50.0)]
    best = dep.loc[dep["tpgs"].idxmax()]
    assert best["threshold"] > 0 and best["interval"] > 1
