"""Number formats in bits per element, block-scale overhead included, so 4-bit never rounds to
zero bytes. Each format also names the tensor-core rate class it runs at (hardware peak key).

Scale overheads (OCP MX spec v1.0; NVIDIA NVFP4 blog 2025-06; DeepSeek V3 fp8 block-128):
- fp8_block: e4m3 values, one fp32 scale per 128x128 weight block -> 8 + 32/16384 bits.
- mxfp8 / mxfp4: one 8-bit E8M0 scale per 32 elements -> 8.25 / 4.25 bits.
- mxfp4_w4a16: mxfp4 weights with BF16 activations (a weight-only checkpoint: compressed-tensors
  `input_activations: null`), so it computes at the BF16 rate (vLLM's default MXFP4 MoE backend on
  Blackwell is FlashInfer TRT-LLM mxfp4 x bf16, select_mxfp4_moe_backend; Marlin on Hopper).
- mxfp8_w8a16: mxfp8 weights with BF16 activations and math, as chips without MX tensor cores
  run an MXFP8 checkpoint's experts (vLLM's Marlin MXFP8 MoE on Hopper).
- mxfp8_emulated: mxfp8 weights that the engine dequantizes to BF16 on every call before a BF16
  GEMM, as vLLM's EmulationMxfp8LinearKernel does for dense layers on chips with no MXFP8 linear
  kernel (CDNA3: the ROCm kernel list has only the gfx950 `tl.dot_scaled` kernel before it; vLLM
  RFC #34331: on CDNA3 "vLLM emulates quantization by dequantizing weights on every forward
  pass"). Stored at 8.25 bits; each use streams 21 bytes per element: `dequant_mxfp8_to_bf16` is
  six pointwise kernels through an FP32 intermediate, 19 bytes per FP8 byte ("a 2.95 MB weight
  costs 56 MB of traffic", vLLM PR #56560), and the GEMM then reads the 2-byte BF16 copy.
- nvfp4: one fp8 E4M3 scale per 16 elements (+ a per-tensor fp32, negligible) -> 4.5 bits.
- int4_group128 / int4_group32: w4a16 with an fp16 scale per 128 / 32 elements -> 4.125 / 4.5 bits.
"""

from __future__ import annotations

from dataclasses import dataclass

from model.specs.errors import ServecastError


@dataclass(frozen=True)
class DType:
    name: str
    bits: float  # storage bits per element including amortized scales
    rate: str  # hardware peak-FLOP key this format computes at: fp32, bf16, fp8, fp4, int8
    streamed_bits: float = 0.0  # HBM bits moved per element each time a GEMM uses it (0: bits)

    @property
    def bytes(self) -> float:
        return self.bits / 8.0

    @property
    def streamed_bytes(self) -> float:
        """Bytes of HBM traffic per weight element per use: the stored bytes, or more where the
        engine converts the weight on every call (mxfp8_emulated)."""
        return (self.streamed_bits or self.bits) / 8.0


_DTYPES = {
    d.name: d
    for d in (
        DType("fp32", 32.0, "fp32"),
        DType("bf16", 16.0, "bf16"),
        DType("fp16", 16.0, "bf16"),
        DType("fp8", 8.0, "fp8"),
        DType("fp8_block", 8.0 + 32.0 / (128 * 128), "fp8"),
        DType("mxfp8", 8.0 + 8.0 / 32, "fp8"),
        DType("mxfp8_w8a16", 8.0 + 8.0 / 32, "bf16"),
        DType("mxfp8_emulated", 8.0 + 8.0 / 32, "bf16", streamed_bits=8.0 * (19.0 + 2.0)),
        DType("int8", 8.0, "int8"),
        DType("mxfp4", 4.0 + 8.0 / 32, "fp4"),
        DType("mxfp4_w4a16", 4.0 + 8.0 / 32, "bf16"),
        DType("nvfp4", 4.0 + 8.0 / 16, "fp4"),
        DType("int4_group128", 4.0 + 16.0 / 128, "bf16"),
        DType("int4_group32", 4.0 + 16.0 / 32, "bf16"),
    )
}
ALIASES = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16", "float32": "fp32",
           "float8_e4m3fn": "fp8", "e4m3": "fp8", "fp4": "nvfp4", "w4a16": "int4_group128", "w4a16_g32": "int4_group32"}


def dtype(name: str) -> DType:
    """Look up a format by name or alias; unknown names raise a one-line user error."""
    key = ALIASES.get(name.lower(), name.lower())
    if key not in _DTYPES:
        raise ServecastError(f"unknown dtype {name!r}; allowed: {', '.join(sorted(_DTYPES))}")
    return _DTYPES[key]


def names() -> list[str]:
    return sorted(_DTYPES)
