"""Step latency model (model.perf.step) on hand-built architectures, an H100-like test chip and
the shipped specs."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from test_ops import deepseek_v3_like, llama8b, toy_hw

from model.perf import roofline
from model.perf.engine_factors import EngineFactors
from model.perf.parallel import ParallelPlan
from model.perf.step import build_step_model, kernels_per_step
from model.specs.architecture import load_architecture
from model.specs.defaults import EAGER_LAUNCH_S, SYNC_ROUND_TRIP_S
from model.specs.errors import Infeasible, ServecastError
from model.specs.hardware import load_hardware

NO_OVERHEAD = EngineFactors(step_overhead_s=0.0)


class _Chip(SimpleNamespace):
    """A namespace chip hashed by identity."""

    __hash__ = object.__hash__


def chip(**over):
    """test_ops.toy_hw's chip, hashable: build_step_model memoizes on its arguments (a
    namespace double is wrapped in one hashed by identity)."""
    hw = toy_hw(**over)
    return _Chip(**vars(hw)) if isinstance(hw, SimpleNamespace) else hw


def test_decode_step_at_least_weight_read_time():
    # Llama-8B bf16 on 3.35e12 B/s: reading 16.06e9 B of weights takes >= 4.79 ms
    # (papers/research/theory.md §3.3: T_step >= N b_w / W_hbm at small batch)
    sm = build_step_model(llama8b(), chip(), ParallelPlan(), factors=NO_OVERHEAD)
    t = float(sm.step_time_s(0, 0, 1, 1024))
    assert t >= 16.06e9 / 3.35e12
    assert t < 2.0 * 16.06e9 / 3.35e12  # and within the kernel efficiencies of it


def test_tp_speeds_up_memory_bound_decode():
    sm1 = build_step_model(llama8b(), chip(), ParallelPlan(), factors=NO_OVERHEAD)
    sm4 = build_step_model(llama8b(), chip(), ParallelPlan(tp=4), factors=NO_OVERHEAD)
    t1, t4 = float(sm1.step_time_s(0, 0, 8, 2048)), float(sm4.step_time_s(0, 0, 8, 2048))
    # a quarter of the weights per GPU, plus all-reduces: between 1/4 and 1/2 of the TP1 time
    assert t1 / 4 < t4 < t1 / 2


def test_step_time_vectorized_matches_scalars():
    sm = build_step_model(llama8b(), chip(), ParallelPlan(), factors=NO_OVERHEAD)
    batch = np.array([1.0, 16.0, 128.0])
    vec = sm.step_time_s(0, 0, batch, 4096)
    one = [float(sm.step_time_s(0, 0, b, 4096)) for b in batch]
    assert vec == pytest.approx(one)
    assert np.all(np.diff(vec) > 0)  # more sequences, more KV to read
    assert float(sm.step_time_s(0, 0, 0, 0)) == 0.0


def test_prefill_is_compute_bound_and_decode_hbm_bound():
    sm = build_step_model(llama8b(), chip(), ParallelPlan(), factors=NO_OVERHEAD)
    pre = sm.breakdown(8192, 8192, 0, 0)
    dec = sm.breakdown(0, 0, 1, 1024)
    assert pre["bottleneck"] == "compute"
    assert dec["bottleneck"] == "hbm"
    # 8192-token prefill: 2 x 32 x 218.1e6 layer params x 8192 = 1.143e14 FLOPs, the LM head
    # only for the one finishing sequence (2 x 525.3e6), attention 2 x 32 layers x 32 heads x
    # (128+128) x 8192 queries x 8192 keys (ops.py counts the full context) = 3.518e13
    assert pre["flops_per_gpu"] == pytest.approx(2 * 8192 * 32 * 218.1e6 + 2 * 525.3e6
                                                 + 32 * 2 * 8192 * 32 * 256 * 8192, rel=0.01)
    # an 8192-token prefill at the 9.9e14 bf16 peak cannot beat 1.14e14 / 9.9e14 = 0.115 s
    assert pre["step_time_s"] > 1.14e14 / 9.9e14


def test_kv_capacity_hand_derived():
    # vLLM pool = 0.9 x 80 GB - 16.06 GB weights - 4 GB activations = 51.94 GB;
    # Llama-8B bf16 KV: 32 layers x 8 heads x 256 x 2 B = 131072 B/token -> 396,300 tokens
    sm = build_step_model(llama8b(), chip(), ParallelPlan())
    weights = sm.weight_bytes_per_gpu
    assert float(sm.kv_capacity_tokens(4096)) == pytest.approx((72e9 - weights - 4e9) / 131072,
                                                               rel=1e-6)


def test_mla_kv_duplicated_under_tp_and_split_by_dcp():
    hw = chip(hbm_bytes=141e9, hbm_bandwidth_bytes_per_s=4.8e12)
    tp8 = build_step_model(deepseek_v3_like(), hw, ParallelPlan(tp=8))
    dcp8 = build_step_model(deepseek_v3_like(), hw, ParallelPlan(tp=8, dcp=8))
    dep8 = build_step_model(deepseek_v3_like(), hw, ParallelPlan(dp=8, ep=8))
    # one 10K-token sequence: 61 layers x 576 x 2 B x 10000 = 702.7 MB on every TP rank
    assert float(tp8.kv_bytes_per_seq_per_gpu(10000)) == pytest.approx(61 * 576 * 2 * 10000)
    assert float(dcp8.kv_bytes_per_seq_per_gpu(10000)) == pytest.approx(61 * 576 * 2 * 10000 / 8)
    # DCP8 holds 8x the tokens of TP8 (same weights per GPU); DEP8 holds more than TP8 too
    assert float(dcp8.kv_capacity_tokens(10000)) == pytest.approx(
        8 * float(tp8.kv_capacity_tokens(10000)))
    assert float(dep8.kv_capacity_tokens(10000)) > float(tp8.kv_capacity_tokens(10000))


def test_weights_that_do_not_fit_are_infeasible():
    with pytest.raises(Infeasible, match="leaves no KV cache"):
        build_step_model(deepseek_v3_like(), chip(), ParallelPlan(tp=4))


def test_speculative_decoding_tokens_per_step():
    sm = build_step_model(llama8b(), chip(), ParallelPlan(), spec_tokens=3,
                          spec_acceptance=0.8)
    # 1 + 0.8 + 0.64 + 0.512 expected tokens per step
    assert sm.tokens_per_decode_step == pytest.approx(2.952)


def test_precision_override_halves_weight_bytes():
    bf16 = build_step_model(llama8b(), chip(), ParallelPlan())
    fp8 = build_step_model(llama8b(), chip(), ParallelPlan(), precision="fp8")
    # all projections go to 1 byte; embedding and LM head stay bf16 (2 x 525.3M x 2 B)
    heads = 2 * 128256 * 4096 * 2
    assert fp8.weight_bytes_per_gpu - heads == pytest.approx((bf16.weight_bytes_per_gpu - heads) / 2)


def test_dcp_leaves_linear_attention_to_tp():
    # Kimi K3's 69 KDA layers keep one recurrent state per sequence, sharded by heads over TP
    # (model.perf.parallel.kv_shard); DCP splits cached entries along the sequence and has nothing
    # to split there, so TP8 with DCP8 runs a KDA decode exactly as TP8 does, while the MLA
    # layers attend 1/8 of the context with all 96 heads (papers/research/theory.md §1.3): the same
    # FLOPs on 1/8 of the KV bytes, faster where the read dominates
    from model.plan.plan_models import step_model
    from model.specs.architecture import load_architecture
    from model.specs.hardware import load_hardware

    kimi, gb300 = load_architecture("kimi-k3"), load_hardware("gb300-nvl72")
    ops = {}
    for name, plan in (("tp8", ParallelPlan(tp=8, ep=8)),
                       ("dcp8", ParallelPlan(tp=8, ep=8, dcp=8))):
        rows = step_model(kimi, gb300, plan).breakdown(0, 0, 24, 142_000)["ops"]
        ops[name] = {o["op"]: float(o["time_s"]) for o in rows}
    assert ops["dcp8"]["linear/moe:attn_decode"] == pytest.approx(ops["tp8"]["linear/moe:attn_decode"])
    assert ops["dcp8"]["mla/moe:attn_decode"] < 0.8 * ops["tp8"]["mla/moe:attn_decode"]


def test_msa_index_keys_are_one_per_token_in_the_step_model_too():
    # MiniMax M3's side index-K cache holds one 128-wide key per token per sparse layer
    # (papers/research/architectures.md §3: TensorRT-LLM's [num_slots, 1, sparse_index_dim]; model.perf.kv):
    # at TP1 the step model's per-sequence KV equals model.perf.kv's footprint
    from model.perf.kv import sequence_kv
    from model.specs.architecture import load_architecture
    arch = load_architecture("minimax-m3")
    sm = build_step_model(arch, chip(hbm_bytes=2e12), ParallelPlan(), kv_dtype="bf16")
    ctx = 131072
    kv = sequence_kv(arch, ctx, "bf16")
    assert kv.indexer_bytes == pytest.approx(57 * 128 * 2 * ctx)
    assert float(sm.kv_bytes_per_seq_per_gpu(ctx)) == pytest.approx(kv.total_bytes, rel=1e-6)


def test_dcp_prefill_gather_costs_nothing_in_decode_steps():
    # the prefill-only KV gather launches only when a step prefills (model.perf.parallel
    # Collective.skip_empty): a decode-only DCP step is the same with or without it, a
    # prefill step at 100K context pays it on every MLA layer
    hw = chip(hbm_bytes=141e9, hbm_bandwidth_bytes_per_s=4.8e12)
    sm = build_step_model(deepseek_v3_like(), hw, ParallelPlan(tp=8, moe_tp=8, dcp=8))
    ops = {name: float(np.asarray(t)) * c for name, kind, c, t in
           sm._op_times(*(np.asarray(v, float) for v in (0.0, 0.0, 32.0, 50_000.0, 0.0)))}
    assert all(v == 0.0 for k, v in ops.items() if k.endswith("dcp_kv_all_gather"))
    pre = {name: float(np.asarray(t)) * c for name, kind, c, t in
           sm._op_times(*(np.asarray(v, float) for v in (4096.0, 100_000.0, 0.0, 0.0, 1.0)))}
    gathers = [v for k, v in pre.items() if k.endswith("dcp_kv_all_gather")]
    assert gathers and all(v > 0 for v in gathers)


def test_factors_passed_explicitly_are_the_ones_applied():
    # a decode-only step is (kernels + moe_scale x routed experts) x decode_scale + network +
    # step overhead (StepModel._combine), the parts from step_parts before any factor
    arch, plan = deepseek_v3_like(4), ParallelPlan(dp=8, ep=8)
    hw = chip(hbm_bytes=141e9)
    f = EngineFactors(step_overhead_s=0.003, decode_scale=0.9, moe_scale=1.3, prefill_scale=1.2)
    sm = build_step_model(arch, hw, plan, factors=f)
    assert sm.factors is f
    kernel, network, experts = (float(x) for x in sm.step_parts(0, 0, 64, 8192))
    assert float(sm.step_time_s(0, 0, 64, 8192)) == pytest.approx(
        (kernel + 1.3 * experts) * 0.9 + network + 0.003, rel=1e-12)


def test_build_step_model_is_memoized_on_all_its_arguments():
    arch, hw = llama8b(), chip()
    one = build_step_model(arch, hw, ParallelPlan(), factors=NO_OVERHEAD)
    # positional or keyword, the same inputs give the same object; other factors another one
    assert build_step_model(arch, hw, ParallelPlan(), None, None, "vllm", factors=NO_OVERHEAD) is one
    other = build_step_model(arch, hw, ParallelPlan(), factors=EngineFactors(decode_scale=2.0))
    assert other is not one and other.factors.decode_scale == 2.0


def test_eager_blocking_launches_add_to_the_cuda_graph_step():
    # Kimi K3 on H200 as the InferenceX AgentX recipe serves it (TP8 x DP4, EP32; kimik3/vllm/
    # h200-fp4/agentx/variants.yaml@bc9ce94e: --enforce-eager, CUDA_LAUNCH_BLOCKING=1), one
    # decoding sequence. Kernels per step from the op list (model.perf.step.KERNELS_PER_OP), by
    # layer of data/architectures/kimi-k3.json: 68 linear-attention MoE layers x 28 (14 GEMMs,
    # 2 attention, 6 fused-MoE, 2 norms, 2 TP all-reduces, EP dispatch and combine), 24 MLA MoE
    # layers x 26 (12 GEMMs and the same rest), the dense first layer 17 (11 GEMMs, 2 attention,
    # 2 norms, 2 all-reduces), lm_head and embedding: 1,904 + 624 + 17 + 2 = 2,547. Each blocking
    # launch costs the host's launch and the synchronous round trip (model.specs.defaults:
    # 10 us, Holistic Trace Analysis' 5-20 us; 5.8 us, NVIDIA's "Getting Started with CUDA
    # Graphs" 9.6 vs 3.8 us per kernel), added to the graph-replayed step with no overlap.
    arch, hw, plan = load_architecture("kimi-k3"), load_hardware("h200-sxm"), ParallelPlan(
        tp=8, dp=4, ep=32)
    graphs = build_step_model(arch, hw, plan, kv_dtype="bf16")
    blocking = build_step_model(arch, hw, plan, kv_dtype="bf16", kernel_launch="eager-blocking")
    eager = build_step_model(arch, hw, plan, kv_dtype="bf16", kernel_launch="eager")
    step = (0.0, 0.0, 1.0, 8192.0)
    times = graphs._op_times(*(np.asarray(v, float) for v in (*step, 1.0)))
    assert float(kernels_per_step(times)) == 2547
    t_graph = float(graphs.step_time_s(*step))
    assert build_step_model(arch, hw, plan, kv_dtype="bf16",
                            kernel_launch="cuda-graphs") is graphs  # the default
    assert float(blocking.step_time_s(*step)) == pytest.approx(
        t_graph + 2547 * (EAGER_LAUNCH_S + SYNC_ROUND_TRIP_S), rel=1e-12)
    # without blocking the host runs ahead: the step is the slower of GPU work and launches
    gpu = t_graph - graphs.factors.step_overhead_s
    assert float(eager.step_time_s(*step)) == pytest.approx(
        max(gpu, 2547 * EAGER_LAUNCH_S) + graphs.factors.step_overhead_s, rel=1e-12)


def test_triton_verify_steps_walk_each_context_in_one_program():
    # vLLM's Triton unified attention takes its 2D path for a speculative verify step (query
    # length 1 + drafts > 1): one program walks a sequence's whole context, 32 keys a tile
    # (vllm/v1/attention/ops/triton_unified_attention.py). The per-tile time is the A100
    # measurement (model.specs.defaults.TRITON_2D_TILE_S): 835.5 us over a 16,384-token context
    # (cadamcat/dual-radeon-vllm benchmarks/cuda-a100/52684-kv-depth/kv_depth3.jsonl).
    arch = load_architecture("minimax-m3")
    gqa = next(lay.attention for lay in arch.main_layers if lay.attention.kind == "gqa")
    walk = roofline.serial_walk_s("gqa", 1.0, 4.0, 16_384.0, gqa, tp=8)
    assert float(walk) == pytest.approx(835.5e-6, rel=1e-12)
    # one query per sequence and few sequences: the 3D path splits the context, no walk; above
    # 128 // (KV heads per rank) sequences the 2D path returns (MIN_LAUNCH_GRID_SIZE_2D = 128)
    assert float(roofline.serial_walk_s("gqa", 1.0, 1.0, 16_384.0, gqa, tp=8)) == 0.0
    assert float(roofline.serial_walk_s("gqa", 129.0, 1.0, 16_384.0, gqa, tp=8)) > 0.0
    # MiniMax M3 on 8 H200 as InferenceX's AgentX launcher serves it (--attention-backend
    # TRITON_ATTN, EAGLE3 with 3 drafts): one sequence at 100K tokens. The 3 GQA layers each
    # walk ceil(100,000 / 32) = 3,125 tiles; the 57 MSA layers run their own sparse kernels.
    hw, plan = load_hardware("h200-sxm"), ParallelPlan(tp=8, moe_tp=8)
    kw = {"precision": "experts=mxfp8_w8a16", "kv_dtype": "fp8", "spec_tokens": 3,
          "acceptance_length": 2.78, "spec_method": "eagle3"}
    chip = build_step_model(arch, hw, plan, **kw)
    # its drafter runs FLASH_ATTN (the launcher's speculative config)
    triton = build_step_model(arch, hw, plan, attention_backend="triton",
                              draft_attention_backend="default", **kw)
    step = (0.0, 0.0, 1.0, 100_000.0)
    ops = {o["op"]: o["time_s"] for o in triton.breakdown(*step)["ops"]}
    assert ops["gqa/dense:attn_decode"] == pytest.approx(3 * 3125 * 835.5e-6 / 512, rel=1e-9)
    # the walk replaces the chip's default kernel, which splits the context over programs; the
    # step's kernels take the engine's fitted decode scale (model.perf.engine_factors)
    default = {o["op"]: o["time_s"] for o in chip.breakdown(*step)["ops"]}
    added = float(triton.step_time_s(*step)) - float(chip.step_time_s(*step))
    assert default["gqa/dense:attn_decode"] < 0.1 * ops["gqa/dense:attn_decode"]
    assert added == pytest.approx((ops["gqa/dense:attn_decode"] - default["gqa/dense:attn_decode"])
                                  * chip.factors.decode_scale, rel=1e-9)
    with pytest.raises(ServecastError, match="attention_backend: allowed default, triton"):
        build_step_model(arch, hw, plan, attention_backend="flash", **kw)


def test_a_triton_step_waits_for_the_longest_decoding_context():
    # The 2D kernel ends with its longest program (model.perf.context_spread): over b contexts
    # drawn from an exponential law, E[longest] = mean x H_b, the harmonic number (the maximum
    # of b iid exponentials; e.g. David & Nagaraja, Order Statistics, 3rd ed., sec. 3.1).
    from model.perf.context_spread import longest_context_ratio, with_decode_contexts

    contexts = np.random.default_rng(0).exponential(100_000.0, 400_000)
    grid, ratio = longest_context_ratio(contexts, np.ones_like(contexts))
    for b in (1.0, 2.0, 4.0, 8.0, 16.0):
        assert ratio[grid.index(b)] == pytest.approx(sum(1 / k for k in range(1, int(b) + 1)),
                                                     rel=0.01)
    # equal contexts (a fixed-length benchmark) have no spread
    assert set(longest_context_ratio(np.full(100, 8192.0), np.ones(100))[1]) == {1.0}
    arch, hw = load_architecture("minimax-m3"), load_hardware("h200-sxm")
    kw = {"precision": "experts=mxfp8_w8a16", "kv_dtype": "fp8", "spec_tokens": 3,
          "acceptance_length": 2.78, "spec_method": "eagle3"}
    plan = ParallelPlan(tp=8, moe_tp=8)
    chip = build_step_model(arch, hw, plan, **kw)
    assert with_decode_contexts(chip, contexts, np.ones_like(contexts)) is chip  # nothing moves
    triton = build_step_model(arch, hw, plan, attention_backend="triton", **kw)
    spread = with_decode_contexts(triton, contexts, np.ones_like(contexts))
    assert with_decode_contexts(triton, contexts, np.ones_like(contexts)) is spread  # one object
    # 8 sequences at a 100K mean: the 3 GQA layers walk the expected longest context, H_8 x 100K
    ops = {o["op"]: o["time_s"] for o in spread.breakdown(0.0, 0.0, 8.0, 100_000.0)["ops"]}
    longest = ratio[grid.index(8.0)] * 100_000.0
    assert ops["gqa/dense:attn_decode"] == pytest.approx(
        3 * np.ceil(longest / 32) * 835.5e-6 / 512, rel=1e-9)


def test_a_triton_drafter_walks_once_per_step():
    # vLLM's EAGLE drafter takes each sequence's verified tokens in its first pass (more than
    # one query), so on Triton attention that pass walks the context too; its later passes take
    # one query each (the 3D path). The MI300X/MI325X AgentX launchers give the drafter
    # TRITON_ATTN, the H100/H200 ones FLASH_ATTN (minimaxm3_fp8_*_mtp.sh speculative configs).
    arch, hw = load_architecture("minimax-m3"), load_hardware("mi325x")
    kw = {"precision": "gemm=mxfp8_emulated,experts=bf16", "kv_dtype": "fp8",
          "spec_tokens": 3, "acceptance_length": 2.78, "spec_method": "eagle3",
          "attention_backend": "triton"}
    plan = ParallelPlan(tp=8, moe_tp=8)
    same = build_step_model(arch, hw, plan, **kw)  # the drafter follows the target (vLLM)
    flash = build_step_model(arch, hw, plan, draft_attention_backend="default", **kw)
    step = (0.0, 0.0, 1.0, 100_000.0)
    walked = {o["op"]: o["time_s"] for o in same.breakdown(*step)["ops"]}
    assert walked["draft:attn_walk"] == pytest.approx(3125 * 835.5e-6 / 512, rel=1e-9)
    assert "draft:attn_walk" not in {o["op"] for o in flash.breakdown(*step)["ops"]}
    with pytest.raises(ServecastError, match="draft_attention_backend: allowed same, default"):
        build_step_model(arch, hw, plan, draft_attention_backend="flash", **kw)
