# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% tags=["parameters"]
archs: list = ["deepseek-v4-pro", "deepseek-v3.2", "kimi-k3", "minimax-m3", "gpt-oss-120b",
               "qwen3-next-80b-a3b", "llama-3.1-70b"]  # slugs, HF ids or config paths
kv_dtype: str = ""  # empty: the default KV dtype of each model (fp8 for DeepSeek V4, else bf16)
block_size: int = 0  # paged KV block in tokens, 0 for no block padding
state_dtype: str = "fp32"  # dtype of recurrent state (KDA, GDN, Mamba, lightning)
max_context: int = 1_048_576  # largest context on the sweep, tokens
reference_context: int = 1_048_576  # context of the breakdown bars and headline GB figure
output_dir: str = "."  # where figures and headline.json go

# %% [markdown]
# # KV-cache and state footprint per sequence
#
# Bytes one sequence holds in the cache as its context grows, split by layer kind: full and
# latent attention grow with every token, sliding windows stop at their window, DeepSeek V4's
# CSA/HCA grow at 1/4 and 1/128, linear layers (KDA, GDN, Mamba) hold a fixed state.
# Formulas and byte layouts: `model/kv.py`.

# %%
# ruff: noqa: E402, B018  (notebook: imports after the parameters cell, cells end in a display)
from pathlib import Path

import numpy as np

from model import charts, nbio
from model.architecture import load_architecture
from model.kv import footprint_table, kv_bytes_per_token
from model.units import GB

contexts = np.unique(np.geomspace(1024, max_context, 12).round())
table = footprint_table(archs, contexts, kv_dtype or None, block_size or None, state_dtype)
totals = (table.groupby(["arch", "context_tokens"], as_index=False)["bytes"].sum()
          .assign(gb_per_sequence=lambda d: d["bytes"] / GB))
totals.pivot(index="context_tokens", columns="arch", values="gb_per_sequence").round(2)

# %%
growth = charts.line_chart(totals, "context_tokens", "gb_per_sequence", "arch", log_x=True,
                           log_y=True, title="KV + state bytes per sequence",
                           subtitle=f"KV dtype: {kv_dtype or 'model default'}")
charts.save(growth, Path(output_dir) / "kv_per_sequence")
growth

# %%
at_ref = footprint_table(archs, [reference_context], kv_dtype or None, block_size or None,
                         state_dtype).assign(gb=lambda d: d["bytes"] / GB)
breakdown = charts.stacked_bar(at_ref, "arch", "gb", "component",
                               title=f"Per-sequence footprint at {reference_context:,} tokens",
                               subtitle="by layer kind; state = fixed recurrent/compressor state")
charts.save(breakdown, Path(output_dir) / "kv_breakdown")
breakdown

# %%
headline = {}
for name in archs:
    arch = load_architecture(name)
    ref = at_ref[at_ref["arch"] == arch.name]
    headline[arch.name] = {
        "kv_bytes_per_token": kv_bytes_per_token(arch, kv_dtype or None),
        "gb_per_reference_sequence": float(ref["gb"].sum()),
        "state_bytes": float(ref.loc[ref["component"] == "state", "bytes"].sum()),
    }
nbio.write_headline(output_dir, {"reference_context": reference_context,
                                 "kv_dtype": kv_dtype or "default", "archs": headline})
headline
