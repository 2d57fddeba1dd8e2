"""`servecast plan --deployment LABEL` reports what `servecast serve --deployment LABEL` reports
for it with the same engine settings: both run the full tier through
model.plan.evaluate.evaluate_deployment, here in separate processes (no shared memo), on an
aggregated TP replica, DEP8 with a threshold, a disaggregated deployment and a replica on vLLM's
Triton attention."""

import pytest

CASES = {
    # MiniMax M3 on 2 B300, TP2, 24 agentx-v1 sessions (the post's row shape)
    "tp2": (("--arch", "minimax-m3", "--hardware", "b300", "--deployment", "tp2",
             "--concurrency", "24"), ()),
    # DeepSeek V4 Pro DEP8 on 8 B300, 256 sessions, threshold 512, cadence 8, 16,384 tokens
    # (InferenceX's agentic recipe for this lane)
    "dep8": (("--arch", "deepseek-v4-pro", "--hardware", "b300", "--deployment", "dp8-ep8",
              "--concurrency", "256", "--max-num-batched-tokens", "16384"),
             ("--long-prefill-token-threshold", "512", "--prefill-schedule-interval", "8")),
    # DeepSeek V4 Pro, one DEP4 prefill worker and one DEP8 decode worker on 12 GB300
    "1p1d": (("--arch", "deepseek-v4-pro", "--hardware", "gb300-nvl72", "--deployment",
              "1P[dp4-ep4]1D[dp8-ep8]", "--concurrency", "256"), ()),
    # MiniMax M3 on 8 H200, TP8, 4 sessions on vLLM's Triton attention, its drafter on
    # FLASH_ATTN (InferenceX's AgentX launcher benchmarks/single_node/agentic/
    # minimaxm3_fp8_h200_mtp.sh)
    "triton": (("--arch", "minimax-m3", "--hardware", "h200", "--deployment", "tp8-moetp8",
                "--concurrency", "4", "--attention-backend", "triton",
                "--draft-attention-backend", "default"), ()),
}
FCFS = ("--long-prefill-token-threshold", "0", "--prefill-schedule-interval", "1")


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(CASES))
def test_plan_deployment_reports_what_serve_reports(cli, case):
    common, knobs = CASES[case]
    knobs = knobs or FCFS
    served = cli("serve", "--workload", "agentx-v1", *common, *knobs, "--json")
    planned = cli("plan", "--workload", "agentx-v1", *common, *knobs, "--json")
    assert served.code == 0 and planned.code == 0, (served.stderr, planned.stderr)
    s, p = served.json, planned.json
    # asked: TPGS within 5%, P90 interactivity within 10%; one function gives both exactly
    assert p["tpgs"] == pytest.approx(s["tpgs"], rel=1e-9)
    assert p["p90_interactivity_tok_s"] == pytest.approx(s["p90_interactivity_tok_s"], rel=1e-9)
    assert p["p90_ttft_s"] == pytest.approx(s["p90_ttft_s"], rel=1e-9)
    assert p["deployment"]["label"] == s["deployment"]["label"]
    assert p["tier"] == "full" and set(p["screening"]) >= {"tpgs", "p90_interactivity_tok_s"}
    for key in ("tco_usd_per_hour", "usd_per_mtok", "api_equivalent_usd_per_hour",
                "cost_advantage", "launch_commands"):
        assert key in p
    if "--attention-backend" in common:  # the setting reached the engines and their launch line
        assert p["deployment"]["engine"]["attention_backend"] == "triton"
        assert p["deployment"]["engine"]["draft_attention_backend"] == "default"
        assert "--attention-backend TRITON_ATTN" in p["launch_commands"]["vllm"][-1]


def test_bad_deployment_label_is_one_line(cli):
    out = cli("plan", "--arch", "qwen3-32b", "--hardware", "h100-sxm", "--deployment",
              "2x[tp3", "--json")
    err = out.stderr.strip().splitlines()
    assert out.code == 2 and len(err) == 1 and out.stdout == ""
    assert "--deployment '2x[tp3'" in err[0] and "1P[dp4-ep4]1D[dp8-ep8]" in err[0]
    out = cli("serve", "--arch", "qwen3-32b", "--hardware", "h100-sxm", "--deployment", "tp4",
              "--gpus", "6", "--concurrency", "4", "--json")
    assert out.code == 2 and "not a multiple" in out.stderr
