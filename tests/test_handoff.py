"""The KV hand-off from prefill to decode workers (model.serve.handoff)."""

import pytest

from model.serve.handoff import kv_transfer_bytes, kv_transfer_time_s
from model.specs.errors import ServecastError


def test_kv_transfer_time_packed_vs_per_tensor():
    # DeepSeek V3 MLA KV 70,272 B/token (papers/research/theory.md T32), 3,520 new tokens -> 247.36 MB.
    # Over 4 prefill GPUs x 50 GB/s: 247.36e6/200e9 = 1.2368 ms, + ceil(3520/64)=55 blocks of
    # descriptors over 4 senders x 2 us = 27.5 us (packed: one tensor per block).
    packed = kv_transfer_time_s(3520, 70_272, 50e9, gpus_sending=4)
    assert packed == pytest.approx(247.357e6 / 200e9 + 55 / 4 * 2e-6, rel=1e-4)
    # Per-tensor layout (92 tensors per block for DeepSeek V4): +10% bytes, 92x the descriptors.
    per_tensor = kv_transfer_time_s(3520, 70_272, 50e9, gpus_sending=4, layout="per_tensor",
                                    tensors_per_block=92)
    assert per_tensor == pytest.approx(1.1 * 247.357e6 / 200e9 + 55 * 92 / 4 * 2e-6, rel=1e-4)
    assert kv_transfer_bytes(1000, 100.0, state_bytes=5000) == pytest.approx(105_000)
    with pytest.raises(ServecastError):
        kv_transfer_bytes(1, 1.0, layout="paged")
