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
max_context_tokens: int = 1_048_576  # largest context on the sweep
reference_context_tokens: int = 1_048_576  # context of the breakdown bars and headline GB figure
output_dir: str = "."  # where figures and headline.json go

# %% [markdown]
# # KV-cache and state footprint per sequence
#
# Bytes one sequence holds in the cache as its context grows, split by layer kind: full and
# latent attention grow with every token, sliding windows stop at their window, DeepSeek V4's
# CSA/HCA grow at 1/4 and 1/128, linear layers (KDA, GDN, Mamba) hold a fixed state.
# Formulas and byte layouts: `model/perf/kv.py`.

# %%
# ruff: noqa: E402, B018  (notebook: imports after the parameters cell, cells end in a display)
from pathlib import Path

import numpy as np

from model.frontends import charts, nbio
from model.perf.kv import footprint_table, kv_bytes_per_token
from model.specs.architecture import load_architecture
from model.specs.units import GB

contexts = np.unique(np.geomspace(1024, max_context_tokens, 12).round())
table = footprint_table(archs, contexts, kv_dtype or None, block_size or None, state_dtype)
totals = (table.groupby(["arch", "context_tokens"], as_index=False)["bytes"].sum()
          .assign(gb_per_sequence=lambda d: d["bytes"] / GB))
totals.pivot(index="context_tokens", columns="arch", values="gb_per_sequence").round(2)

# %%
last = totals[totals.context_tokens == totals.context_tokens.max()].sort_values(
    "gb_per_sequence", ascending=False)
big, small = last.iloc[0], last.iloc[-1]
growth = charts.line_chart(
    totals, "context_tokens", "gb_per_sequence", "arch", log_x=True, log_y=True,
    order=list(last["arch"]), x_title="context (tokens)", y_title="KV + state per sequence (GB)",
    title=f"At {big.context_tokens:,.0f} tokens one {big.arch} sequence holds "
          f"{big.gb_per_sequence:,.0f} GB, {small.arch} {small.gb_per_sequence:,.1f} GB",
    subtitle=f"KV dtype: {kv_dtype or 'model default'}; legend in the order of the lines at "
             "the right edge; flat starts are fixed recurrent state")
charts.save(growth, Path(output_dir) / "kv_per_sequence")
growth

# %%
# Readable names for the stacked components (model/perf/kv.py: one per attention kind, plus the
# indexer keys and the fixed state), in stack order.
COMPONENTS = {"gqa": "full-attention KV (GQA)", "mla": "latent KV (MLA)",
              "dsa": "sparse-MLA KV (DSA)", "msa": "block-sparse KV (MSA)",
              "csa": "compressed KV, 1/4 (CSA)", "hca": "compressed KV, 1/128 (HCA)",
              "swa": "sliding-window KV", "index_keys": "indexer keys",
              "state": "fixed state (recurrent, compressor)"}
at_ref = footprint_table(archs, [reference_context_tokens], kv_dtype or None, block_size or None,
                         state_dtype).assign(gb=lambda d: d["bytes"] / GB)
parts = at_ref[at_ref.gb > 0].assign(
    part=lambda d: d["component"].map(COMPONENTS).fillna(d["component"]))
by_total = list(parts.groupby("arch").gb.sum().sort_values(ascending=False).index)
parts = parts.set_index("arch").loc[by_total].reset_index()
stack = [COMPONENTS[k] for k in COMPONENTS if COMPONENTS[k] in set(parts.part)] + sorted(
    set(parts.part) - set(COMPONENTS.values()))
absolute = charts.stacked_bar(parts, "arch", "gb", "part", horizontal=True, order=stack,
                              totals=True, value_format=",.1f", x_title="",
                              y_title="GB per sequence", color_title="cache part")
shares = charts.stacked_bar(parts, "arch", "gb", "part", horizontal=True, order=stack,
                            normalize=True, x_title="", y_title="share of the footprint",
                            color_title="cache part").properties(width=260)
top, bottom = by_total[0], by_total[-1]
ratio = parts[parts.arch == top].gb.sum() / parts[parts.arch == bottom].gb.sum()
breakdown = charts.titled(
    absolute | shares,
    f"At {reference_context_tokens:,} tokens {top} needs {ratio:,.0f}x the cache of {bottom} per "
    "sequence",
    f"by cache part (model/perf/kv.py); KV dtype: {kv_dtype or 'model default'}; right: the same "
    "bars as shares")
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
nbio.write_headline(output_dir, {"reference_context_tokens": reference_context_tokens,
                                 "kv_dtype": kv_dtype or "default", "archs": headline})
headline
