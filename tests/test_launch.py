"""Launch commands: vLLM and SGLang flags for a deployment."""

from model.perf.parallel import ParallelPlan
from model.plan.deployment import Deployment, PhaseConfig
from model.plan.launch import launch_commands, sglang_flags, vllm_parallel_flags


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


def test_serving_format_flags_follow_the_recipe():
    # MiniMax M3 on B300: InferenceX's b300-fp4-mtp AgentX recipe serves hf:nvidia/MiniMax-M3-NVFP4
    # with kv-cache-dtype fp8, attention-config {"indexer_kv_dtype":"fp8"} and three draft tokens
    # of the GQA EAGLE3 head (data/deployments/minimax-m3.yaml); on H200 the recipe's MXFP8
    # checkpoint, MiniMaxAI/MiniMax-M3-MXFP8 (InferenceX's h200-fp8-mtp recipe), not the BF16 one.
    from model.plan.report import serving_format
    from model.specs.hardware import load_hardware

    fmt = serving_format("minimax-m3", load_hardware("b300"),
                         "experts=nvfp4,indexer_cache=fp8", "fp8", (3, 2.83, "eagle3"))
    dep = Deployment(mode="aggregated", arch="minimax-m3", concurrency=24,
                     replica=PhaseConfig("b300", ParallelPlan(tp=2), 1), serving=fmt)
    (line,) = _lines(launch_commands(dep)["vllm"])
    assert line.startswith("vllm serve nvidia/MiniMax-M3-NVFP4 ")
    assert "--kv-cache-dtype fp8" in line
    assert """'{"indexer_kv_dtype":"fp8"}'""" in line
    assert """'{"method":"eagle3","num_speculative_tokens":3,"model":"Inferact/MiniMax-M3-EAGLE3-GQA"}'""" in line
    h200 = serving_format("minimax-m3", load_hardware("h200-sxm"), "mxfp8", "fp8",
                          (3, 2.83, "eagle3"))
    assert h200.checkpoint == "MiniMaxAI/MiniMax-M3-MXFP8" and h200.indexer_kv_dtype is None
    assert h200.quantization is None and h200.weights_note is None
    # the recipe's MX fallback on Hopper (Marlin W8A16 experts) serves that same checkpoint
    marlin = serving_format("minimax-m3", load_hardware("h200-sxm"), "experts=mxfp8_w8a16",
                            "fp8", (3, 2.83, "eagle3"))
    assert marlin.checkpoint == "MiniMaxAI/MiniMax-M3-MXFP8" and marlin.weights_note is None
    # DeepSeek V4 (vLLM blog 2026-04-24): fp8 KV, the FP4 indexer cache, MTP drafts from the
    # checkpoint (no draft model)
    v4 = serving_format("deepseek-v4-pro", load_hardware("b300"), None, "fp8", (3, 2.49, "mtp"))
    flags = v4.vllm_flags()
    assert flags[:2] == ["--attention-config", '{"use_fp4_indexer_cache":true}']
    assert '{"method":"mtp","num_speculative_tokens":3}' in flags
    # SGLang: a method without an equivalent is a note, never an invented flag
    kimi = serving_format("kimi-k3", load_hardware("gb300-nvl72"), None, "fp8", (7, 3.78, "dspark"))
    sg_flags, notes = kimi.sglang_flags()
    assert "--speculative-algorithm" not in sg_flags and any("dspark" in n for n in notes)


def test_launch_lines_serve_the_weights_the_plan_assumed():
    # MiniMax M3's own checkpoint is BF16 (config.json torch_dtype bfloat16, 852 GB): a plan that
    # assumed FP8 weights on 2 B300 must have the engine quantize them as it loads
    # (`--quantization fp8`, vLLM and SGLang); a format no flag gives is a stated note
    import shlex

    from model.plan.report import serving_format
    from model.specs.hardware import load_hardware

    fmt = serving_format("minimax-m3", load_hardware("b300"), "fp8", "fp8", (0, 0.0, "mtp"))
    dep = Deployment(mode="aggregated", arch="minimax-m3", concurrency=24,
                     replica=PhaseConfig("b300", ParallelPlan(tp=2), 1), serving=fmt)
    cmds = launch_commands(dep)
    for line in _lines(cmds["vllm"]) + _lines(cmds["sglang"]):
        argv = shlex.split(line)
        assert argv[argv.index("--quantization") + 1] == "fp8"
        assert "MiniMaxAI/MiniMax-M3" in argv
    nvfp4 = serving_format("llama-3.1-70b", load_hardware("b200"), "nvfp4", None, (0, 0.0, "mtp"))
    assert nvfp4.quantization is None and "nvfp4" in nvfp4.weights_note


def test_triton_attention_is_a_vllm_flag_and_an_sglang_note():
    # MiniMax M3 on 8 H200 as InferenceX's AgentX launcher serves it
    # (benchmarks/single_node/agentic/minimaxm3_fp8_h200_mtp.sh: --attention-backend TRITON_ATTN)
    dep = Deployment(mode="aggregated", arch="minimax-m3", concurrency=4,
                     replica=PhaseConfig("h200-sxm", ParallelPlan(tp=8, moe_tp=8), 1),
                     attention_backend="triton")
    (line,) = _lines(launch_commands(dep)["vllm"])
    assert "--attention-backend TRITON_ATTN" in line
    sglang = launch_commands(dep)["sglang"]
    assert any("TRITON_ATTN" in c and c.startswith("# note:") for c in sglang)
    assert not any("TRITON_ATTN" in c for c in _lines(sglang))
    default = Deployment(mode="aggregated", arch="minimax-m3", concurrency=4,
                         replica=PhaseConfig("h200-sxm", ParallelPlan(tp=8, moe_tp=8), 1))
    assert "--attention-backend" not in _lines(launch_commands(default)["vllm"])[0]
