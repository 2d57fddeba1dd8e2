"""Physics laws of the step, memory and closed-loop models, as hypothesis property tests.

Each law holds for every architecture, chip, parallel plan, context and batch, whatever the
calibration says: a fitted efficiency or engine factor may make the model slow, never faster than
the chip, and no parameter may turn a physical monotonicity around. Inputs are drawn over real
architectures (data/architectures: dense GQA, MoE MLA, DeepSeek V4 CSA/HCA, MiniMax M3 MSA,
hybrid linear attention) and chips (hardware/*.yaml). The floors below are computed here from the
architecture's shapes and the chip's peaks, independently of the kernel model.
"""

from __future__ import annotations

from dataclasses import replace
from functools import cache

from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from model.perf.kv import (
    entry_bytes,
    entry_layout,
    kv_bytes_per_token,
    layer_kv_bytes,
    layer_kv_parts,
    sequence_kv,
)
from model.perf.memory import hbm_budget
from model.perf.parallel import ParallelPlan, normalize_plan, validate_plan
from model.perf.roofline import compute_rate
from model.perf.step import build_step_model
from model.perf.tiers import kv_bytes_per_token_per_gpu
from model.plan.plan_models import plan_models
from model.serve.closed_loop import closed_loop
from model.serve.estimate import Disagg, estimate, loop_factors
from model.specs.architecture import load_architecture
from model.specs.dtypes import dtype
from model.specs.errors import Infeasible
from model.specs.hardware import load_hardware
from model.specs.precision import with_precision
from model.specs.recipes import SPEC_OFF, recipe_settings

ARCHS = ("llama-3.1-70b", "deepseek-v3", "kimi-k3", "deepseek-v4-pro", "minimax-m3",
         "qwen3-next-80b-a3b", "nvidia/DeepSeek-R1-NVFP4")
CHIPS = ("h100-sxm", "h200-sxm", "b200", "b300", "gb200-nvl72", "gb300-nvl72", "mi300x",
         "mi355x")
PLANS = (ParallelPlan(tp=2), ParallelPlan(tp=4), ParallelPlan(tp=8), ParallelPlan(dp=2, ep=2),
         ParallelPlan(dp=8, ep=8), ParallelPlan(tp=8, ep=8), ParallelPlan(dp=16, ep=16),
         ParallelPlan(dp=32, ep=32), ParallelPlan(tp=4, dp=2, ep=8))
BACKENDS = ("vllm", "sglang", "trtllm")
SETTINGS = settings(max_examples=40, deadline=None)


@cache
def arch_of(name: str):
    return load_architecture(name)


@cache
def chip_of(name: str):
    return load_hardware(name)


@cache
def deployments() -> tuple[tuple[str, str, ParallelPlan], ...]:
    """Every (architecture, chip, plan) of the lists above whose weights fit and leave KV."""
    out = []
    for a in ARCHS:
        for c in CHIPS:
            for p in PLANS:
                try:
                    build_step_model(arch_of(a), chip_of(c), p)
                except Infeasible:
                    continue
                out.append((a, c, p))
    return tuple(out)


DEPLOYMENTS = st.deferred(lambda: st.sampled_from(deployments()))


def step_model(deployment, backend="vllm", hw=None):
    a, c, p = deployment
    return build_step_model(arch_of(a), hw or chip_of(c), p, backend=backend)


# ---- floors from first principles -----------------------------------------------------------
def prefill_floor_s(arch, hw, new_tokens, cached_tokens) -> float:
    """GPU-seconds of compute one new prompt token needs at the chip's peak: 2 FLOPs per
    active weight at that weight's own tensor rate (the LM head runs once per sequence, not per
    token) plus the causal attention core of the dense-attention layers at the bf16 rate
    (theory.md section 3.4: 2 N_act per token, attention 4 L n^2 D / 2; sparse, compressed and
    linear layers count 0, a floor below their true cost)."""
    s = 0.0
    attended = cached_tokens + (new_tokens + 1) / 2.0  # mean keys a causal query attends
    for layer in arch.main_layers:
        for lin in layer.attention.projections + layer.mlp.projections:
            s += 2.0 * lin.params / compute_rate(lin.dtype, hw)[1]
        ex = layer.mlp.experts
        if ex is not None:
            s += 2.0 * ex.top_k * ex.params_per_expert / compute_rate(ex.dtype, hw)[1]
        att = layer.attention
        if att.kind in ("gqa", "mla"):
            s += 2.0 * att.num_heads * (att.head_dim + att.v_head_dim) * attended / hw.peak("bf16")
    return s


def decode_floor_s(sm, decode_seqs, context_tokens) -> float:
    """Seconds one decode step needs at the chip's full HBM bandwidth on one GPU (theory.md
    section 3.3: T_step >= (B b_kv S + N b_w) / W_hbm): the GPU's share of every non-expert
    weight, of the experts the batch touches (at least top_k of them spread over ep, each
    1/moe_tp of an expert) and of the LM head, plus the KV of its sequences in the layers
    that read their whole context (gqa, mla)."""
    arch, p = sm.arch, sm.plan
    weights = arch.lm_head.params * dtype(arch.lm_head.dtype).bytes / p.tp
    kv = 0.0
    for layer in arch.main_layers:
        for lin in layer.attention.projections + layer.mlp.projections:
            weights += lin.params * dtype(lin.dtype).bytes / p.tp
        ex = layer.mlp.experts
        if ex is not None:
            weights += (ex.top_k / p.ep * ex.params_per_expert * dtype(ex.dtype).bytes
                        / p.moe_tp)
        att = layer.attention
        if att.kind == "gqa":
            kv += context_tokens * att.num_kv_heads * (att.head_dim + att.v_head_dim) \
                * dtype(sm.kv_dtype).bytes / min(p.tp, att.num_kv_heads)
        elif att.kind == "mla":
            kv += context_tokens * (att.kv_lora_rank + att.qk_rope_head_dim) \
                * dtype(sm.kv_dtype).bytes
    seqs_per_rank = decode_seqs / p.dp
    return (weights + seqs_per_rank * kv) / sm.hw.hbm_bandwidth_bytes_per_s


def within_window(deployment, tokens: int) -> int:
    window = arch_of(deployment[0]).max_context
    return min(tokens, window) if window else tokens


# ---- no phase beats its rooflines --------------------------------------------------------------
@SETTINGS
@given(deployment=DEPLOYMENTS, backend=st.sampled_from(BACKENDS),
       new=st.integers(1, 16384), cached=st.integers(0, 65536))
def test_a_prefill_step_never_beats_the_compute_roofline(deployment, backend, new, cached):
    # theory.md section 3.4: a prefill step of n tokens per DP rank takes at least their FLOPs
    # at the chip's peak, whatever the fitted kernel efficiencies and engine factors
    sm = step_model(deployment, backend)
    p = sm.plan
    t = float(sm.step_time_s(new * p.dp, cached + new, 0.0, 0.0, p.dp))
    floor = new * p.dp * prefill_floor_s(sm.arch, sm.hw, new, cached) / p.attention_gpus
    assert t >= floor


@SETTINGS
@given(deployment=DEPLOYMENTS, backend=st.sampled_from(BACKENDS),
       seqs=st.integers(1, 2048), context=st.integers(1, 131072))
def test_a_decode_step_never_beats_the_bandwidth_roofline(deployment, backend, seqs, context):
    # theory.md section 3.3: a decode step reads the GPU's weights and its sequences' KV at
    # most at the chip's HBM bandwidth, so decode tokens/s <= B / that time
    sm = step_model(deployment, backend)
    context = within_window(deployment, context)
    t = float(sm.step_time_s(0.0, 0.0, seqs, context))
    assert t >= decode_floor_s(sm, seqs, context)


@SETTINGS
@given(deployment=DEPLOYMENTS, backend=st.sampled_from(BACKENDS),
       arrival=st.sampled_from(("benchmark", "synchronized", "staggered")),
       isl=st.integers(16, 16384), osl=st.integers(1, 4096), concurrency=st.integers(1, 1024))
@example(deployment=("nvidia/DeepSeek-R1-NVFP4", "gb300-nvl72", ParallelPlan(dp=2, ep=2)),
         backend="vllm", arrival="benchmark", isl=2048, osl=1, concurrency=256)
@example(deployment=("nvidia/DeepSeek-R1-NVFP4", "gb300-nvl72", ParallelPlan(dp=2, ep=2)),
         backend="vllm", arrival="staggered", isl=2048, osl=1, concurrency=256)
def test_the_closed_loop_never_outruns_the_prefill_compute_or_the_decode_bandwidth(
        deployment, backend, arrival, isl, osl, concurrency):
    # the example (DeepSeek-R1 NVFP4 on 2 GB300, ISL 2048, OSL 1, 256 clients) and every
    # other run: each completed request had its prompt prefilled (theory.md section 6, the
    # asymptotic bound X <= 1 / D_max with D_max the prefill compute per request), and its
    # output decoded by steps that each read the weights (section 3.3)
    a, c, plan = deployment
    isl = within_window(deployment, isl + osl) - osl
    assume(isl >= 1)
    hw = chip_of(c)
    out = estimate(arch_of(a), hw, plan, isl, osl, concurrency, backend=backend, arrival=arrival)
    assume(out["feasible"])
    sm = step_model(deployment, backend)
    gpus = sm.plan.attention_gpus
    prefill_gpu_s = out["requests_per_s"] * isl * prefill_floor_s(sm.arch, hw, isl, 0)
    assert prefill_gpu_s <= gpus
    if osl > 1:
        running = out["running_seqs"]
        steps_per_s = 1.0 / decode_floor_s(sm, running, isl + osl / 2.0)
        decoded = out["requests_per_s"] * (osl - 1)
        assert decoded <= running * sm.tokens_per_decode_step * steps_per_s * (1 + 1e-9)
    assert out["memory_bytes_per_gpu"] <= hw.hbm_bytes


@SETTINGS
@given(deployment=DEPLOYMENTS, backend=st.sampled_from(BACKENDS),
       isl=st.integers(64, 16384), osl=st.integers(2, 512), concurrency=st.integers(1, 512))
@example(deployment=("llama-3.1-70b", "h200-sxm", ParallelPlan(tp=2)), backend="trtllm",
         isl=4096, osl=2, concurrency=512)
def test_a_disaggregated_prefill_pool_never_outruns_its_compute(deployment, backend, isl, osl,
                                                                concurrency):
    # a dedicated prefill pool completes at most its GPUs' compute / prefill FLOPs per request
    # (theory.md sections 3.4 and 6), whatever its fitted prefill factor (TensorRT-LLM's
    # disaggregated prefill factor, data/calibration/engine.yaml, is below 1: the example)
    a, c, plan = deployment
    isl = within_window(deployment, isl + osl) - osl
    hw = chip_of(c)
    out = estimate(arch_of(a), hw, plan, isl, osl, concurrency, backend=backend,
                   disagg=Disagg(plan, plan, 1, None))
    assume(out["feasible"])
    prefill_gpu_s = out["requests_per_s"] * isl * prefill_floor_s(arch_of(a), hw, isl, 0)
    assert prefill_gpu_s <= plan.tp * plan.dp


@SETTINGS
@given(deployment=DEPLOYMENTS, backend=st.sampled_from(BACKENDS), new=st.integers(0, 8192),
       cached=st.integers(0, 32768), seqs=st.integers(0, 1024), context=st.integers(1, 65536))
def test_no_kernel_curve_beats_the_chip(deployment, backend, new, cached, seqs, context):
    # every fitted kernel efficiency is a fraction of the chip's peak and bandwidth (theory.md
    # section 3): the kernels of any step take at least their physical floor
    assume(new > 0 or seqs > 0)
    sm = step_model(deployment, backend)
    dp = sm.plan.dp
    args = (new * dp, cached + new, seqs, within_window(deployment, context), dp)
    kernel, _, experts = sm.step_parts(*args)
    assert float(sm.kernel_floor_s(*args)) <= float(kernel + experts) * (1 + 1e-12)


# ---- more of the chip never slows a step ------------------------------------------------------
def faster_chip(hw, what: str, factor: float):
    """The chip with `factor` times its HBM bandwidth or every tensor rate."""
    if what == "bandwidth":
        return hw.model_copy(update={"hbm_bandwidth_bytes_per_s":
                                     hw.hbm_bandwidth_bytes_per_s * factor})
    return hw.model_copy(update={"peak_flops_per_s": {k: v * factor for k, v in
                                                      hw.peak_flops_per_s.items()}})


@SETTINGS
@given(deployment=DEPLOYMENTS, backend=st.sampled_from(BACKENDS),
       what=st.sampled_from(("bandwidth", "flops")), factor=st.floats(1.0, 4.0),
       new=st.integers(0, 8192), cached=st.integers(0, 32768), seqs=st.integers(0, 1024),
       context=st.integers(1, 65536))
def test_more_bandwidth_or_flops_never_slows_a_step(deployment, backend, what, factor, new,
                                                    cached, seqs, context):
    # theory.md section 3: every op time is max(FLOPs / peak, bytes / bandwidth) / efficiency,
    # each falling as the chip's peak or bandwidth grows; a mixed step of prefill and decode
    assume(new > 0 or seqs > 0)
    hw = chip_of(deployment[1])
    dp = deployment[2].dp
    args = (new * dp, cached + new, seqs, within_window(deployment, context), dp)
    slow = float(step_model(deployment, backend).step_time_s(*args))
    fast = float(step_model(deployment, backend, faster_chip(hw, what, factor)).step_time_s(*args))
    assert fast <= slow * (1 + 1e-12)


# ---- decode: TPOT never falls as the batch grows -----------------------------------------------
@SETTINGS
@given(deployment=DEPLOYMENTS, backend=st.sampled_from(BACKENDS), seqs=st.integers(1, 2048),
       more=st.integers(1, 2048), context=st.integers(1, 131072), drafts=st.sampled_from((0, 3)))
def test_tpot_never_falls_as_the_decode_batch_grows(deployment, backend, seqs, more, context,
                                                    drafts):
    # theory.md section 3.3: T_step = B b_kv S / W + max(2 B N_act / C, N b_w / W) grows with
    # B at a fixed context; tokens per step (speculative decoding) do not depend on B
    a, c, p = deployment
    sm = build_step_model(arch_of(a), chip_of(c), p, backend=backend, spec_tokens=drafts,
                          spec_acceptance=0.7, check_fit=False)
    context = within_window(deployment, context)
    small, large = (float(sm.step_time_s(0.0, 0.0, b, context)) for b in (seqs, seqs + more))
    assert large >= small


# ---- prefill: TTFT never falls as the uncached prompt grows -----------------------------------
@SETTINGS
@given(deployment=DEPLOYMENTS, backend=st.sampled_from(BACKENDS),
       arrival=st.sampled_from(("benchmark", "synchronized", "staggered")),
       prefix=st.integers(0, 8192), new=st.integers(1, 16384), more=st.integers(1, 16384),
       osl=st.integers(1, 1024), concurrency=st.integers(1, 256))
@example(deployment=("deepseek-v3", "b200", ParallelPlan(tp=8)), backend="vllm",
         arrival="benchmark", prefix=32, new=1, more=1, osl=1, concurrency=2)
@example(deployment=("deepseek-v4-pro", "gb300-nvl72", ParallelPlan(tp=4)), backend="vllm",
         arrival="synchronized", prefix=2047, new=4097, more=1, osl=1, concurrency=2)
@example(deployment=("qwen3-next-80b-a3b", "mi300x", ParallelPlan(dp=8, ep=8)), backend="vllm",
         arrival="synchronized", prefix=5615, new=2731, more=326, osl=2, concurrency=76)
def test_ttft_never_falls_as_the_uncached_prompt_grows(deployment, backend, arrival, prefix, new,
                                                      more, osl, concurrency):
    # theory.md section 6 (TTFT in a mixed engine = W_q + N_steps T_step, N_steps = ceil(n /
    # c_eff)): more uncached tokens, the same cached prefix, output and clients: never sooner;
    # the example is a short chunk after a cached prefix on MLA (expanded prefill kernel)
    a, c, plan = deployment
    window = arch_of(a).max_context or 10**9
    assume(prefix + new + more + osl <= window)
    sm = step_model(deployment, backend)
    chunk = [float(sm.step_time_s(n * plan.dp, prefix + n, 0.0, 0.0, plan.dp))
             for n in (new, new + more)]
    assert chunk[1] >= chunk[0]  # one prefill step of the uncached tokens on every DP rank
    kw = dict(backend=backend, arrival=arrival, prefix_tokens=prefix)
    short, long = (estimate(arch_of(a), chip_of(c), plan, prefix + n, osl, concurrency, **kw)
                   for n in (new, new + more))
    assume(long["feasible"])
    assert short["feasible"]
    # a budget-capped wave step packs wave_tokens / new prompts, each read at its whole context
    # (model.serve.estimate): a longer prompt leaves fewer prompts, so fewer cached prefixes, in
    # each step, which really is cheaper; the law holds once the longer run's wave is priced at
    # the shorter run's prompt count (exact: the same closed loop, one field set changed)
    allowance = wave_prompt_allowance_ms(sm, short, long, prefix + new + more, arrival)
    assert long["ttft_ms"] + allowance >= short["ttft_ms"] * (1.0 - 1e-12)


def wave_prompt_allowance_ms(sm, short: dict, long: dict, isl: int, arrival: str) -> float:
    """TTFT the longer run gains when its wave steps carry the shorter run's prompts per step."""
    c = long["components"]
    prompts = max(short["components"]["wave_prompts"], c["wave_prompts"])
    dp = sm.plan.dp
    args = ([c["wave_prompts"] * c["new_tokens"] * dp], [isl], 0.0, 0.0,
            [max(prompts, 1.0) * dp])
    (kernel,), (network,), (expert,) = sm.step_parts(*args)
    (floor,) = sm.kernel_floor_s(*args)
    same = {**c, "wave_kernel_s": float(kernel), "wave_network_s": float(network),
            "wave_expert_s": float(expert), "wave_floor_s": float(floor)}
    sync = {"synchronized": 1.0, "staggered": 0.0}.get(arrival)
    factors = loop_factors(sm)
    priced = (float(closed_loop(x, factors, sync)[0]) for x in (same, c))
    return 1e3 * (next(priced) - next(priced))


# ---- memory -------------------------------------------------------------------------------------
SMALL_PLANS = (ParallelPlan(), ParallelPlan(tp=2), ParallelPlan(tp=4), ParallelPlan(dp=2, ep=2),
               ParallelPlan(dp=4, ep=4), ParallelPlan(tp=8), ParallelPlan(dp=8, ep=8),
               ParallelPlan(tp=2, dp=2, ep=4))


def doubled(plan: ParallelPlan, axis: str) -> ParallelPlan:
    """The plan with twice the GPUs along `axis`, the experts spread over them as before."""
    bigger = replace(plan, **{axis: getattr(plan, axis) * 2}, moe_tp=1)
    return replace(bigger, ep=bigger.attention_gpus if plan.ep > 1 else 1)


@SETTINGS
@given(arch=st.sampled_from(ARCHS), chip=st.sampled_from(CHIPS),
       plan=st.sampled_from(SMALL_PLANS), axis=st.sampled_from(("tp", "dp")),
       context=st.integers(1, 262144), kv_dtype=st.sampled_from((None, "fp8")))
def test_more_gpus_of_one_kind_never_shrink_the_kv_capacity(arch, chip, plan, axis, context,
                                                            kv_dtype):
    # theory.md section 5: capacity = (HBM util - W_rank - A_rank) / b_kv_rank per rank; more TP
    # shrinks the weights per GPU (and shards KV heads), more DP adds ranks with their own pool
    a, hw = arch_of(arch), chip_of(chip)
    small, big = normalize_plan(a, plan), normalize_plan(a, doubled(plan, axis))
    try:
        validate_plan(a, hw, small)
        validate_plan(a, hw, big)
        before = hbm_budget(a, hw, small, kv_dtype=kv_dtype)
    except Infeasible:
        assume(False)
    after = hbm_budget(a, hw, big, kv_dtype=kv_dtype)  # what fits on fewer GPUs fits on more
    assert after.kv_capacity_tokens(context) >= before.kv_capacity_tokens(context)
    # and the pool `estimate` admits on
    sms = [build_step_model(a, hw, p, kv_dtype=kv_dtype, check_fit=False) for p in (small, big)]
    caps = [float(sm.kv_capacity_tokens(context)) for sm in sms]
    assert caps[1] >= caps[0]


@SETTINGS
@given(arch=st.sampled_from(ARCHS), chip=st.sampled_from(CHIPS),
       plan=st.sampled_from(SMALL_PLANS + PLANS), context=st.integers(1, 262144),
       kv_dtype=st.sampled_from((None, "fp8")), allocator=st.sampled_from(("hybrid", "static")))
def test_a_feasible_memory_budget_never_exceeds_the_chip(arch, chip, plan, context, kv_dtype,
                                                         allocator):
    # `servecast memory`: weights + activations + runtime reserve + the KV of every sequence the
    # pool is said to hold fit in the chip's usable HBM (hardware/*.yaml; theory.md section 5)
    a, hw = arch_of(arch), chip_of(chip)
    try:
        b = hbm_budget(a, hw, plan, kv_dtype=kv_dtype, allocator=allocator)
    except Infeasible:
        assume(False)
    held = b.max_sequences(context) / b.dp * b.sequence_bytes(context)
    assert held <= b.kv_pool_bytes
    assert b.weight_bytes + b.activation_bytes + b.reserve_bytes + held <= hw.hbm_bytes


@settings(max_examples=12, deadline=None)
@given(arch=st.sampled_from(ARCHS), chip=st.sampled_from(CHIPS), gpus=st.sampled_from((4, 8, 16)),
       phase=st.sampled_from(("both", "prefill", "decode")), context=st.integers(1024, 131072))
def test_a_plan_called_feasible_never_holds_more_memory_than_the_chip(arch, chip, gpus, phase,
                                                                      context):
    # every plan `plan` keeps as a candidate: its served weights (speculative layers included),
    # activations and runtime reserve, and the KV tokens it counts on holding per GPU, fit the
    # chip's HBM (hardware/*.yaml)
    a, hw = arch_of(arch), chip_of(chip)
    precision, kv_dtype, spec = recipe_settings(a.name, None, None, True, hw)
    models, _ = plan_models(a, hw, (gpus,), (phase,), float(context), precision, kv_dtype,
                            8192, gpus, spec or SPEC_OFF)
    sized = with_precision(a, precision)
    for m in models:
        p = m.plan
        budget = hbm_budget(sized, hw, p, kv_dtype=kv_dtype)
        per_token = kv_bytes_per_token_per_gpu(sized, p, kv_dtype, context)
        # the tokens one GPU holds: DP ranks hold their own sequences, PCP ranks split each
        # sequence's blocks (vLLM kv_cache_interface: max_model_len / (dcp x pcp) per rank)
        kv = m.kv_tokens / (p.dp * p.pcp) * per_token
        used = m.step.weight_bytes_per_gpu + budget.activation_bytes + budget.reserve_bytes + kv
        assert used <= hw.hbm_bytes, p.label()


# ---- KV bytes scale with context and with the dtype's width ------------------------------------
@SETTINGS
@given(arch=st.sampled_from(ARCHS), context=st.integers(0, 262144), more=st.integers(1, 262144),
       kv_dtype=st.sampled_from(("bf16", "fp8")), block=st.sampled_from((None, 16, 64)))
def test_kv_bytes_grow_with_context_at_the_per_token_rate(arch, context, more, kv_dtype, block):
    # theory.md section 3.5: b_kv bytes per token (2 bytes H K L for GQA, the latent for MLA;
    # windows hold at most the window, compressed layers one entry per `ratio` tokens): the
    # cache never shrinks as the context grows, except that a window layer frees the block its
    # window has left (vLLM's hybrid manager: ceil(w / B) or ceil(w / B) + 1 blocks)
    a = arch_of(arch)
    small, large = (sequence_kv(a, n, kv_dtype, block_size=block).total_bytes
                    for n in (context, context + more))
    freed = sum(block * entry_bytes(ly.attention, kv_dtype) for ly in a.main_layers
                if block and ly.attention.window)
    assert large >= small - freed
    # past every window it grows by the per-token bytes, within one compressed entry of
    # rounding per compressed layer
    if block is None and context >= max(ly.attention.window or 0 for ly in a.main_layers):
        compressed = [ly.attention for ly in a.main_layers if ly.attention.kind in ("csa", "hca")]
        rounding = sum(layer_kv_bytes(att, att.compress_ratio, kv_dtype)
                       - layer_kv_bytes(att, 0, kv_dtype) for att in compressed)
        grown = kv_bytes_per_token(a, kv_dtype) * more
        assert abs((large - small) - grown) <= rounding + 1e-9 * large


def test_gqa_kv_bytes_per_token_are_the_theory_formula():
    # theory.md section 3.5: MHA/GQA b_kv = 2 bytes H K L per token; Llama 3.1 70B (config.json:
    # 80 layers, 8 KV heads of 128): 2 x 2 x 8 x 128 x 80 = 327,680 B in bf16, half in fp8
    a = arch_of("llama-3.1-70b")
    att = a.main_layers[0].attention
    formula = 2 * att.num_kv_heads * att.head_dim * len(a.main_layers)
    assert formula == 163_840
    assert kv_bytes_per_token(a, "bf16") == 2 * formula
    assert kv_bytes_per_token(a, "fp8") == formula


@SETTINGS
@given(arch=st.sampled_from(ARCHS), context=st.integers(1, 262144))
def test_kv_bytes_scale_with_the_dtype_width(arch, context):
    # theory.md section 3.5: b_kv = 2 bytes H K L per token; a plain KV entry is elements x the
    # dtype's bytes (fp32 4, bf16 2, fp8 1), so its bytes double with each step of width; the
    # MLA / DeepSeek V4 fp8 layouts keep scales and the rope part wider, so they shrink by less
    # than half but still shrink
    a = arch_of(arch)
    for ly in a.main_layers:
        att = ly.attention
        parts = {d: layer_kv_parts(att, context, d)[0] for d in ("fp32", "bf16", "fp8")}
        if entry_layout(att) == "plain":
            assert parts["fp32"] == 2 * parts["bf16"] == 4 * parts["fp8"]
        else:
            assert parts["fp32"] >= parts["bf16"] >= parts["fp8"]
            assert parts["bf16"] <= 2 * parts["fp8"] or parts["fp8"] == 0
    totals = [sequence_kv(a, context, d).total_bytes for d in ("fp32", "bf16", "fp8")]
    assert totals[0] >= totals[1] >= totals[2]
