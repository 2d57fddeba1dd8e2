"""The measured kernel tables, reduced to the roofline's inputs (`Samples`) per op class and chip.

Data: `data/calibration/ops/<chip>/*.parquet` (aiconfigurator-core 0.12.0 silicon tables, vLLM
0.24.0 kernels; the CDNA3 MoE table from AITER, model.fit.aiter_moe;
data/calibration/ops/README.md gives units and conventions). For every measured
shape the fastest kernel wins (the engine picks its best kernel). The attention module tables
(MLA, DSV4 CSA/HCA, MSA) are read by `model.fit.attention_modules`, the collective tables by
`model.fit.comm_fit`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cache

import numpy as np
import pandas as pd

from model import ROOT
from model.perf import roofline
from model.perf.kernels import MEASURED_CHIPS
from model.specs.hardware import Hardware, load_hardware
from model.specs.layers import Attention

OPS_DIR = ROOT / "data" / "calibration" / "ops"
# Tables of a chip measured in some op classes only -> the hardware spec their rows are
# reduced with: cdna3_304cu is the MI300X / MI325X die's MoE table from AITER's tuner
# (model.fit.aiter_moe); its chips read its curves through `kernel_tables` in hardware/*.yaml.
PARTIAL_TABLES = {"cdna3_304cu": "mi300x"}
CHIPS = MEASURED_CHIPS + tuple(PARTIAL_TABLES)
DATASET = ("aiconfigurator-core 0.12.0 silicon tables (vLLM 0.24.0 kernels) and AITER's tuned "
           "fused-MoE times (cdna3_304cu), data/calibration/ops")

# Table dtype names -> model.specs.dtypes names.
DTYPE = {"bfloat16": "bf16", "fp8": "fp8", "fp8_block": "fp8_block", "nvfp4": "nvfp4",
         "w4a16_mxfp4": "mxfp4", "int4_wo": "int4_group128", "w4a8_mxfp4_mxfp8": "mxfp4"}


def chip_spec(chip: str) -> Hardware:
    """The Hardware spec of a measured chip (hardware/*.yaml; `h100_sxm` etc. are aliases)."""
    return load_hardware(PARTIAL_TABLES.get(chip, chip))


def has_table(chip: str, name: str) -> bool:
    return (OPS_DIR / chip / f"{name}.parquet").exists()


@cache
def table(chip: str, name: str) -> pd.DataFrame:
    return pd.read_parquet(OPS_DIR / chip / f"{name}.parquet")


def best_kernel(df: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """The fastest kernel's latency per measured shape `keys`."""
    return df.groupby(keys, as_index=False)["latency"].min()


def shape_groups(df: pd.DataFrame, cols: list[str]) -> np.ndarray:
    """Group id per row (the shape group a K-fold holds out together)."""
    return df.groupby(cols, sort=True).ngroup().to_numpy()


def dtypes_in(chip: str, name: str, column: str) -> list[str]:
    """model.specs.dtypes names of the formats a table measures."""
    return sorted({DTYPE[v] for v in table(chip, name)[column].unique() if v in DTYPE})


def gemm_operands(dtype_name: str, hw: Hardware) -> tuple[float, float, float]:
    """(weight bytes per element, activation bytes per element, peak FLOP/s) of a GEMM whose
    weights are stored in `dtype_name` (8/4-bit rates quantize the activations too)."""
    d = roofline.lookup_dtype(dtype_name)
    rate, peak = roofline.compute_rate(dtype_name, hw)
    act = d.bytes if rate in ("fp8", "fp4", "int8") else roofline.ACT_BYTES
    return d.bytes, act, peak


@dataclass(frozen=True)
class Samples:
    """Rows of one op class on one chip, reduced to the roofline's inputs."""

    flops: np.ndarray
    hbm_bytes: np.ndarray
    rows: np.ndarray
    peak_flops_per_s: float
    bandwidth_bytes_per_s: float
    extra_s: np.ndarray  # predicted time of parts not fitted here (module projections)
    time_s: np.ndarray  # measured
    group: np.ndarray  # shape-group id for K-fold
    fit_module_overhead: bool = False
    kdim: np.ndarray | None = None  # GEMM reduction depth (fits half_k)
    tile: np.ndarray | float = 1.0  # GEMM n-tile quantization factor
    row_count: np.ndarray | None = None  # rows paying per_row_s (None: not fitted)

    def subset(self, mask) -> Samples:
        def pick(a):
            return a[mask] if isinstance(a, np.ndarray) else a

        return replace(self, flops=self.flops[mask], hbm_bytes=self.hbm_bytes[mask],
                       rows=self.rows[mask], extra_s=self.extra_s[mask],
                       time_s=self.time_s[mask], group=self.group[mask],
                       kdim=pick(self.kdim), tile=pick(self.tile),
                       row_count=pick(self.row_count))


def gemm_samples(chip: str, dtype_name: str) -> Samples:
    hw = chip_spec(chip)
    df = table(chip, "gemm")
    src = [k for k, v in DTYPE.items() if v == dtype_name]
    df = best_kernel(df[df.gemm_dtype.isin(src)], ["m", "n", "k"])
    m, n, k = (df[c].to_numpy(float) for c in ("m", "n", "k"))
    weight, act, peak = gemm_operands(dtype_name, hw)
    return Samples(2 * m * n * k, m * k * act + k * n * weight + m * n * roofline.ACT_BYTES, m,
                   peak, hw.hbm_bandwidth_bytes_per_s, np.zeros(len(df)),
                   df.latency.to_numpy() * 1e-3, shape_groups(df, ["n", "k"]), kdim=k,
                   tile=roofline.gemm_tile_factor(n), row_count=m)


MOE_KEYS = ["num_tokens", "hidden_size", "inter_size", "topk", "num_experts", "moe_tp_size",
            "moe_ep_size"]

# MXFP4 experts run two different kernels: weight-only (w4a16: Marlin on Hopper, gpt-oss's
# mxfp4 x bf16 path) and, on chips with FP4 tensor cores, the native block-scaled path (w4a8:
# FlashInfer TRT-LLM mxfp4 x mxfp8, what vLLM runs for DeepSeek V4 on Blackwell). They differ by
# 2-3x at the same shape (b200_sxm moe.parquet, DeepSeek-V4-Pro experts at 8192 tokens: 0.53 ms
# w4a8); one curve over both fits neither, so where the native kernel is measured it alone
# defines the format.
NATIVE_MOE = {"mxfp4": "w4a8_mxfp4_mxfp8"}
# A weight-only MXFP4 checkpoint (Kimi K3) runs the w4a16 kernels on every chip: its own curve,
# from the first kernel of this list measured on the chip, the one vLLM serves it with. On
# Blackwell FlashInfer TRT-LLM mxfp4 x bf16 (select_mxfp4_moe_backend's first choice; b200_sxm
# times it on gpt-oss shapes, 1.7-2.2x faster than the Marlin rows of Kimi-like shapes, so one
# curve over both misses both). On Hopper Marlin: 4-bit weights dequantized to BF16 in the
# kernel, BF16 tensor-core math (the InferenceX Kimi K3 H200 recipes run `--moe-backend marlin`,
# data/benchmarks/inferencex_agentx_deployments.yaml); h100_sxm / h200_sxm time it at Kimi K3's
# own expert shape (hidden 3584, inter 3072, 896 experts, top 16, EP 1-128), while the OAI
# Triton rows there are gpt-oss's path (quant method mxfp4), on other shapes.
WEIGHT_ONLY_MOE = {"mxfp4_w4a16": ("w4a16_mxfp4", ("flashinfer_trtllm_mxfp4_bf16", "marlin"))}
# Per-tensor fp8 experts run on every fp8 MoE kernel vLLM has: TritonExperts, AiterExperts and
# the FlashInfer CUTLASS / TRT-LLM experts each list both (kFp8StaticTensorSym,
# kFp8StaticTensorSym) and (kFp8Static128BlockSym, kFp8Dynamic128Sym) in their
# _supports_quant_scheme (vllm/model_executor/layers/fused_moe/), and one scale per tensor is
# less work than one per 128x128 block. So the fastest measured fp8 kernel of either scale layout
# defines the per-tensor curve. On Hopper the tables time per-tensor fp8 only through FlashInfer's
# CUTLASS MoE (ModelOpt checkpoints): 7-16% of HBM bandwidth at decode sizes, 3-6x slower than the
# Triton fp8 kernel at the same shapes and slower than the BF16 kernel that reads twice the bytes
# (h100_sxm / h200_sxm moe.parquet, Mixtral-8x7B experts at 8-256 tokens: 2.4-2.7 ms fp8, 0.38-0.57
# ms fp8_block, 0.66-0.95 ms bf16 on H200), and 2.5-4.5x slower than the same CUTLASS MoE with
# block scales. Served, the CUTLASS and Triton fp8 MoE are within 15% of each other (sglang PR
# 21872: H100, Qwen3 MoE FP8, CUDA graphs): the per-tensor rows time a kernel configuration an
# engine does not serve with.
SCALE_LAYOUTS_MOE = {"fp8": ("fp8_block",)}

# Routing distribution the MoE curves are fitted on. The tables time every shape under three
# token-to-expert distributions: balanced, power_law_1.01 and power_law_1.2. Served traffic is
# not balanced (a router on real or random-token prompts concentrates tokens on some experts),
# and a fused MoE layer waits for its most loaded expert: at prefill sizes (thousands of tokens)
# the power-law rows of the all-experts-local layers (moe_ep_size 1) are 1.1-1.5x slower than the
# balanced ones (h200_sxm / b200_sxm moe.parquet, DeepSeek-V3 shapes). power_law_1.01 is the
# milder of the two skews: its curve predicts the held-out power_law_1.2 rows within 1.5 points
# of its own error (kernel_report.md, "MoE by routing distribution"). With EP the table times one
# rank, which under skew is not the busiest one (its rows run 0.5-0.9x the balanced time): the
# lock-step straggler is not measured, so the EP rows of every distribution are fitted as they are.
MOE_DISTRIBUTION = "power_law_1.01"
MOE_DISTRIBUTIONS = ("balanced", "power_law_1.01", "power_law_1.2")


def moe_distribution(chip: str) -> str:
    """The routing distribution a chip's MoE curves are fitted on: MOE_DISTRIBUTION where the
    table times it, else the one it has (AITER's tuner routes uniformly random tokens)."""
    have = set(table(chip, "moe").distribution.unique())
    return MOE_DISTRIBUTION if MOE_DISTRIBUTION in have else sorted(have)[0]


def moe_distributions(chip: str) -> list[str]:
    """The routing distributions a chip's MoE table times."""
    have = set(table(chip, "moe").distribution.unique())
    return [d for d in MOE_DISTRIBUTIONS if d in have] or sorted(have)


def moe_rows(chip: str, dtype_name: str) -> pd.DataFrame:
    """The chip's MoE table rows that define `dtype_name`'s curve (all routing distributions)."""
    df = table(chip, "moe")
    if dtype_name in WEIGHT_ONLY_MOE:
        src, kernels_in_order = WEIGHT_ONLY_MOE[dtype_name]
        df = df[df.moe_dtype == src]
        for kernel in kernels_in_order:
            served = df.kernel_source.str.contains(kernel)
            if served.any():
                return df[served]
        return df
    df = df[df.moe_dtype.isin(moe_sources(chip, dtype_name))]
    if dtype_name in SCALE_LAYOUTS_MOE:  # only layer shapes timed in every layout: a shape timed
        # in one gives no bound from the others
        layouts = df.groupby(MOE_KEYS[1:]).moe_dtype.transform("nunique")
        df = df[layouts == df.moe_dtype.nunique()]
    return df


def moe_sources(chip: str, dtype_name: str) -> list[str]:
    """Table dtypes that define `dtype_name`'s MoE curve on `chip` (native kernel if measured;
    the other scale layouts a per-tensor format's kernels also run)."""
    src = [k for k, v in DTYPE.items() if v == dtype_name]
    native = NATIVE_MOE.get(dtype_name)
    if native and native in set(table(chip, "moe").moe_dtype.unique()):
        return [native]
    return src + list(SCALE_LAYOUTS_MOE.get(dtype_name, ()))


def moe_dtypes(chip: str) -> list[str]:
    """Formats with a MoE curve on `chip`: the measured ones plus the weight-only variants."""
    measured = set(table(chip, "moe").moe_dtype.unique())
    extra = [dt for dt, (src, _) in WEIGHT_ONLY_MOE.items() if src in measured]
    return dtypes_in(chip, "moe", "moe_dtype") + extra


def moe_samples(chip: str, dtype_name: str, distribution: str | None = None) -> Samples:
    """MoE rows of one dtype (`distribution`: routing distribution, default MOE_DISTRIBUTION)."""
    hw = chip_spec(chip)
    df = moe_rows(chip, dtype_name)
    df = best_kernel(df[df.distribution == (distribution or moe_distribution(chip))], MOE_KEYS)
    weight, act, peak = gemm_operands(dtype_name, hw)
    ep = df.moe_ep_size.to_numpy(float)
    flops, hbm_bytes, rows = roofline.moe_flops_bytes(
        df.num_tokens.to_numpy(float), df.hidden_size.to_numpy(float),
        df.inter_size.to_numpy(float), df.topk.to_numpy(float),
        df.num_experts.to_numpy(float) / ep, df.moe_tp_size.to_numpy(float), ep, weight, act)
    pairs = df.num_tokens.to_numpy(float) * df.topk.to_numpy(float)
    return Samples(flops, hbm_bytes, rows, peak, hw.hbm_bandwidth_bytes_per_s, np.zeros(len(df)),
                   df.latency.to_numpy() * 1e-3, shape_groups(df, MOE_KEYS[1:]), row_count=pairs)


def moe_group_keys(chip: str, dtype_name: str) -> dict:
    """distribution -> {group id: layer-shape tuple}: the group ids of moe_samples per
    distribution, mapped to the shape they stand for (ids differ between distributions)."""
    out = {}
    df = moe_rows(chip, dtype_name)
    for d in moe_distributions(chip):
        sub = best_kernel(df[df.distribution == d], MOE_KEYS)
        ids = shape_groups(sub, MOE_KEYS[1:])
        shapes = list(sub[MOE_KEYS[1:]].itertuples(index=False, name=None))
        out[d] = dict(zip(ids, shapes, strict=True))
    return out


def attention_rows(family: str, phase: str, configs: list, batch, new_tokens, context_tokens):
    """FLOPs, bytes, rows per sample, vectorized per distinct (Attention, kv dtype) config;
    `family` gqa takes each config's own kind (gqa or swa)."""
    flops, hbm_bytes, rows = (np.zeros(len(configs)) for _ in range(3))
    by_config: dict = {}
    for i, key in enumerate(configs):
        by_config.setdefault(key, []).append(i)
    for (att, kvd), idx in by_config.items():
        idx = np.asarray(idx)
        f, b, r = roofline.attention_flops_bytes(att.kind if family == "gqa" else family, phase,
                                                 batch[idx], new_tokens[idx],
                                                 context_tokens[idx], att,
                                                 roofline.lookup_dtype(kvd).bytes)
        flops[idx], hbm_bytes[idx] = f, b
        rows[idx] = np.broadcast_to(r, idx.shape)
    return flops, hbm_bytes, rows


def query_tokens(df: pd.DataFrame, phase: str,
                 step_is_context: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(batch, new tokens, context tokens) of an attention table's rows. Prefill rows add `isl`
    tokens to a cached prefix of `step`; decode rows add one token, and their `step` is the
    context length in the module tables (`step_is_context`, at least 1) and the cached tokens
    before it in the GQA tables (data/calibration/ops/README.md)."""
    b = df.batch_size.to_numpy(float)
    step = df.step.to_numpy(float)
    if phase == "prefill":
        new = df.isl.to_numpy(float)
        return b, new, new + step
    return b, np.ones(len(df)), np.maximum(step, 1.0) if step_is_context else step + 1.0


def gqa_samples(chip: str, phase: str, kv_dtype: str) -> Samples:
    hw = chip_spec(chip)
    name = "context_attention" if phase == "prefill" else "generation_attention"
    keys = ["batch_size", "isl", "num_heads", "num_key_value_heads", "head_dim", "kv_cache_dtype",
            "step", "window_size"]
    df = table(chip, name)
    df = best_kernel(df[df.kv_cache_dtype.map(DTYPE) == kv_dtype], keys)
    att_keys = [(Attention("swa" if w else "gqa", int(h), int(kvh), int(d), int(d), (),
                           window=int(w) or None), DTYPE[kvd])
                for h, kvh, d, w, kvd in zip(df.num_heads, df.num_key_value_heads, df.head_dim,
                                             df.window_size, df.kv_cache_dtype, strict=True)]
    b, new, ctx = query_tokens(df, phase, step_is_context=False)
    f, by, r = attention_rows("gqa", phase, att_keys, b, new, ctx)
    return Samples(f, by, r, hw.peak("bf16"), hw.hbm_bandwidth_bytes_per_s, np.zeros(len(df)),
                   df.latency.to_numpy() * 1e-3,
                   shape_groups(df, ["num_heads", "num_key_value_heads", "head_dim",
                                     "window_size"]),
                   row_count=b * new)


def kda_samples(chip: str, phase: str) -> Samples:
    """Kimi Delta Attention core (flashkda_fwd prefill; fastest recurrent decode kernel),
    short convolution excluded (a separate small kernel)."""
    hw = chip_spec(chip)
    df = table(chip, "kda")
    kernels_ = (["flashkda_fwd"] if phase == "prefill"
                else ["fused_kda_decode", "fused_recurrent_kda_packed_decode"])
    df = df[df.kernel_source.isin(kernels_) & (df.phase == ("context" if phase == "prefill"
                                                             else "generation"))]
    df = best_kernel(df, ["batch_size", "seq_len", "num_k_heads", "head_k_dim", "head_v_dim"])
    b = df.batch_size.to_numpy(float)
    new = df.seq_len.to_numpy(float) if phase == "prefill" else np.ones(len(df))
    configs = [(Attention("linear", int(h), int(h), int(dk), int(dv), (),
                          state_elements=int(h * dk * dv)), "bf16")
               for h, dk, dv in zip(df.num_k_heads, df.head_k_dim, df.head_v_dim, strict=True)]
    f, by, r = attention_rows("linear", phase, configs, b, new, new)
    return Samples(f, by, r, hw.peak("bf16"), hw.hbm_bandwidth_bytes_per_s, np.zeros(len(df)),
                   df.latency.to_numpy() * 1e-3, shape_groups(df, ["num_k_heads", "batch_size"]),
                   row_count=b * new)
