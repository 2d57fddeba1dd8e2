"""The KV hand-off from a prefill to a decode worker (disaggregated deployments).

With sticky sessions only the turn's new tokens move. The packed layout moves one contiguous
region per block; a per-tensor layout (one tensor per layer and attention kind, 92 for DeepSeek
V4) pads each tensor's blocks and posts one RDMA work request per (block, tensor): ~10% more bytes
with the FP4 indexer (seed post; papers/research/theory.md §13 T23).
"""

from __future__ import annotations

import numpy as np

from model.perf.kv import kv_bytes_per_token
from model.specs.errors import ServecastError

LAYOUTS = ("packed", "per_tensor")
PACKED_SAVING = 0.10  # bytes the packed layout saves over per-tensor padding
TRANSFER_DESCRIPTOR_S = 2e-6  # per (block, tensor) RDMA work request; NIXL-class engines ~1-3 us


def kv_transfer_bytes(new_tokens, kv_bytes_per_token: float, state_bytes: float = 0.0,
                      layout: str = "packed", padding_fraction: float = PACKED_SAVING):
    """Bytes moved from a prefill to a decode worker for one request.

    With sticky sessions the decode worker keeps the session's earlier context, so only the KV of
    the `new_tokens` prefilled this turn moves (plus fixed-size recurrent state, which is rewritten
    every turn). The per-tensor layout pads each tensor's blocks separately: `padding_fraction`
    more bytes (the post's ~10%)."""
    if layout not in LAYOUTS:
        raise ServecastError(f"kv layout {layout!r}: allowed {', '.join(LAYOUTS)}")
    payload = np.asarray(new_tokens, float) * kv_bytes_per_token + state_bytes
    return payload * (1.0 + padding_fraction) if layout == "per_tensor" else payload


def kv_transfer_time_s(new_tokens, kv_bytes_per_token: float, link_bytes_per_s: float,
                       gpus_sending: int = 1, state_bytes: float = 0.0, layout: str = "packed",
                       tensors_per_block: int = 1, block_tokens: int = 64,
                       descriptor_s: float = TRANSFER_DESCRIPTOR_S):
    """Time to hand one request's KV from prefill to decode.

    Each of the `gpus_sending` prefill GPUs ships its shard over its own NIC (`link_bytes_per_s`,
    per GPU per direction; scale-out unless both sides share a scale-up domain), plus one RDMA
    work request per (block, tensor): `tensors_per_block` is 1 for the packed layout and the
    number of per-layer KV tensors (e.g. 92 for DeepSeek V4) for the per-tensor layout."""
    if link_bytes_per_s <= 0:
        raise ServecastError(f"kv transfer: link bandwidth {link_bytes_per_s}: must be positive")
    tokens = np.asarray(new_tokens, float)
    data = kv_transfer_bytes(tokens, kv_bytes_per_token, state_bytes, layout)
    tensors = 1 if layout == "packed" else tensors_per_block
    senders = np.maximum(np.asarray(gpus_sending, float), 1.0)
    descriptors = np.ceil(tokens / block_tokens) * tensors / senders
    return data / (link_bytes_per_s * senders) + descriptors * descriptor_s


def handoff_bytes_per_token(step_model) -> float:
    """KV bytes per new token a prefill worker hands off: its architecture's at its KV dtype
    (a reference step model without one states `kv_bytes_per_token`)."""
    stated = getattr(step_model, "kv_bytes_per_token", None)
    if stated is not None:
        return float(stated)
    return float(kv_bytes_per_token(step_model.arch, step_model.kv_dtype))
