"""Serving formats (model.specs.precision): one format for every GEMM, or part=format schemes for the
checkpoints that quantize part of the model (NVIDIA's experts-only NVFP4 exports)."""

import pytest

from model.perf.params import weight_bytes
from model.specs.architecture import load_architecture
from model.specs.errors import ServecastError
from model.specs.precision import parse_precision, with_precision


def test_parse_precision_forms_and_errors():
    assert parse_precision(None) == {}
    assert parse_precision("fp8") == {"gemm": "fp8"}
    assert parse_precision("experts=nvfp4, indexer_cache=fp8") == {"experts": "nvfp4",
                                                                   "indexer_cache": "fp8"}
    with pytest.raises(ServecastError, match="parts: gemm, experts, indexer_cache"):
        parse_precision("expert=nvfp4")
    with pytest.raises(ServecastError):
        parse_precision("experts=fp5")


def test_minimax_m3_checkpoint_sizes():
    # Mapika/MiniMax-M3-NVFP4 model card (2026-06-12, the nvidia experts-only recipe family):
    # "~256 GB on disk (vs 854 GB BF16, 444 GB MXFP8)"; routed + shared experts NVFP4,
    # attention, MSA indexer, router, embeddings, lm_head BF16.
    a = load_architecture("minimax-m3")
    assert weight_bytes(a) / 1e9 == pytest.approx(854, rel=0.01)
    assert weight_bytes(with_precision(a, "mxfp8")) / 1e9 == pytest.approx(444, rel=0.01)
    fp4 = with_precision(a, "experts=nvfp4,indexer_cache=fp8")
    assert weight_bytes(fp4) / 1e9 == pytest.approx(256, rel=0.02)
    moe = fp4.main_layers[10]
    assert moe.mlp.experts.dtype == "nvfp4"
    dtypes = {p.name: p.dtype for p in moe.mlp.projections + moe.attention.projections}
    assert dtypes["block_sparse_moe.shared_experts.up_proj"] == "nvfp4"
    assert dtypes["block_sparse_moe.gate"] == dtypes["self_attn.q_proj"] == "bf16"
    assert moe.attention.indexer.cache_dtype == "fp8"  # from the checkpoint's bf16
    assert a.main_layers[10].attention.indexer.cache_dtype == "bf16"
    assert {p.dtype for p in fp4.main_layers[0].mlp.projections} == {"bf16"}  # dense layers
