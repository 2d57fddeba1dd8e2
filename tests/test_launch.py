"""Launch commands: vLLM and SGLang flags for a deployment."""

from model.disagg import Deployment, PhaseConfig
from model.launch import launch_commands, sglang_flags, vllm_parallel_flags
from model.parallel import ParallelPlan


def _lines(cmds):
    return [c for c in cmds if not c.startswith("#")]


def test_dep_aggregated_vllm_command():
    # DEP8 (attention DP 8, experts over EP 8) with the AgentX threshold and aligned prefill.
    dep = Deployment(mode="aggregated", arch="deepseek-v4-pro", concurrency=256,
                     replica=PhaseConfig("gb300-nvl72", ParallelPlan(dp=8, ep=8), 1),
                     long_prefill_token_threshold=512, prefill_schedule_interval=2)
    (line,) = _lines(launch_commands(dep)["vllm"])
    assert line.startswith("vllm serve deepseek-ai/DeepSeek-V4-Pro ")
    for flag in ("--tensor-parallel-size 1", "--data-parallel-size 8", "--enable-expert-parallel",
                 "--long-prefill-token-threshold 512", "--prefill-schedule-interval 2",
                 "--max-num-batched-tokens 8192"):
        assert flag in line
    assert "--pipeline-parallel-size" not in line


def test_context_parallel_flags():
    flags = vllm_parallel_flags(PhaseConfig("b300", ParallelPlan(tp=8, dcp=8, moe_tp=8), 1))
    assert flags == ["--tensor-parallel-size", "8", "--decode-context-parallel-size", "8"]
    flags = vllm_parallel_flags(PhaseConfig("b300", ParallelPlan(tp=1, pcp=8, ep=8), 1))
    assert "--prefill-context-parallel-size" in flags and "8" in flags
    # SGLang has no DCP flag: reported as a note rather than an invented flag.
    sg, notes = sglang_flags(PhaseConfig("b300", ParallelPlan(tp=8, dcp=8, moe_tp=8), 1))
    assert sg == ["--tp-size", "8"] and "dcp=8" in notes[0]


def test_disaggregated_commands_have_connector_roles():
    dep = Deployment(mode="disaggregated", arch="kimi-k3", concurrency=48,
                     prefill=PhaseConfig("gb300-nvl72", ParallelPlan(tp=4, dp=2, ep=8), 1),
                     decode=PhaseConfig("gb300-nvl72", ParallelPlan(tp=8, dcp=8, moe_tp=8), 1),
                     long_prefill_token_threshold=512)
    cmds = launch_commands(dep)
    pre, dec = _lines(cmds["vllm"])
    assert '"kv_role":"kv_producer"' in pre and '"kv_role":"kv_consumer"' in dec
    assert "--long-prefill-token-threshold 512" in pre
    assert "--long-prefill-token-threshold" not in dec  # decode workers do not prefill
    assert "--decode-context-parallel-size 8" in dec
    sg_pre, sg_dec = _lines(cmds["sglang"])
    assert "--disaggregation-mode prefill" in sg_pre and "--disaggregation-mode decode" in sg_dec
    assert "--dp-size 2 --enable-dp-attention" in sg_pre and "--tp-size 8" in sg_pre
