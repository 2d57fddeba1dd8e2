"""The `roofline` notebook, run with small parameters."""

from __future__ import annotations

import pytest

from model.frontends.nbio import run_notebook


def test_roofline_notebook_places_decode_left_and_prefill_right(tmp_path):
    head = run_notebook("roofline", {"arch": "meta-llama-3.1-8b", "hardware": "h100-sxm",
                                     "tp": 1, "dp": 1, "ep": 1, "decode_seqs": 16,
                                     "context_tokens": 2048, "prefill_tokens": 4096}, tmp_path)
    # H100 SXM bf16: 989.4e12 FLOP/s over 3.35e12 B/s = 295.3 FLOP/B (papers/research/theory.md §2, T01)
    assert head["ridge_flop_per_byte"] == pytest.approx(295.3, rel=0.01)
    # a 16-sequence decode step is all below the ridge; a 4096-token prefill almost all above
    assert head["decode_time_share_memory_bound"] == pytest.approx(1.0)
    assert head["decode_bottleneck"] == "hbm"
    assert head["prefill_time_share_memory_bound"] < 0.1
    assert head["prefill_bottleneck"] == "compute"
    assert 0.3 < head["prefill_mfu"] < 0.9
    # points are named by op: at batch 16 the decode step reads the MLP weights, 3 x 4096 x
    # 14336 x 32 layers = 5.6e9 bf16 params (11.3 GB), more than the attention projections
    # (1.3e9 params) or the KV (16 seqs x 2048 tokens x 131,072 B = 4.3 GB)
    assert head["decode_top_op"] == "dense MLP"
    assert head["prefill_top_op"] == "dense MLP"
    assert (tmp_path / "roofline.png").exists() and (tmp_path / "roofline.svg").exists()


def test_roofline_notebook_counts_weights_read_from_host_memory(tmp_path):
    # 4 GiB of Llama 3.1 8B's bf16 decoder layers in host memory (vLLM --cpu-offload-gb 4): every
    # step reads all of them back, dense layers having no experts to skip, over PCIe Gen5 x16 at
    # the 50 of 64 GB/s DMA rate (model.perf.host_weights): 4 x 2^30 / 50e9 = 85.9 ms, which
    # then outweighs the whole 16-sequence decode step on HBM
    head = run_notebook("roofline", {"arch": "meta-llama-3.1-8b", "hardware": "h100-sxm",
                                     "tp": 1, "dp": 1, "ep": 1, "decode_seqs": 16,
                                     "context_tokens": 2048, "prefill_tokens": 4096,
                                     "cpu_offload_gib": 4.0}, tmp_path)
    assert head["decode_host_link_ms"] == pytest.approx(4 * 2**30 / 50e9 * 1e3, rel=1e-6)
    assert head["decode_bottleneck"] == "host_link"
