"""`servecast arch list|show` and `servecast kv`: architectures, sizes and KV footprints."""

from __future__ import annotations

from collections import Counter

import typer

from model.frontends.cli.output import JSON, emit
from model.specs.errors import ServecastError


def describe(name: str, weight_dtype: str | None = None) -> dict:
    """The `arch show` object (also used by notebooks and batch summaries)."""
    # the counting modules load sympy: imported when a command runs, not at start-up
    from model.perf.kv import kv_bytes_per_token, kv_bytes_per_token_by_kind, sequence_kv
    from model.perf.params import parameter_counts, weight_bytes, weight_bytes_by_dtype
    from model.specs.architecture import load_architecture

    arch = load_architecture(name, weight_dtype)
    counts = parameter_counts(arch)
    main = arch.main_layers
    experts = next((layer.mlp.experts for layer in main if layer.mlp.experts), None)
    return {
        "name": arch.name,
        "hf_id": arch.hf_id,
        "family": arch.family,
        "source": arch.source,
        "total_params": counts.total,
        "active_params": counts.active,
        "total_params_with_mtp": counts.total_with_mtp,
        "active_params_with_embedding": counts.active_with_embedding,
        "params_by_component": counts.by_component,
        "num_layers": len(main),
        "num_mtp_layers": len(arch.mtp_layers),
        "layer_kinds": dict(Counter(layer.attention.kind for layer in main)),
        "mlp_kinds": dict(Counter(layer.mlp.kind for layer in main)),
        "hidden_size": arch.hidden_size,
        "vocab_size": arch.vocab_size,
        "max_context": arch.max_context,
        "tie_word_embeddings": arch.tie_word_embeddings,
        "hyper_connections": arch.hyper_connections,
        "num_experts": experts.num_experts if experts else 0,
        "experts_top_k": experts.top_k if experts else 0,
        "weight_dtype": arch.weight_dtype,
        "expert_dtype": experts.dtype if experts else None,
        "weight_bytes": weight_bytes(arch),
        "weight_bytes_by_dtype": weight_bytes_by_dtype(arch),
        "default_kv_dtype": arch.default_kv_dtype,
        "kv_bytes_per_token": kv_bytes_per_token(arch),
        "kv_bytes_per_token_by_kind": kv_bytes_per_token_by_kind(arch),
        "kv_bytes_per_token_bf16": kv_bytes_per_token(arch, "bf16"),
        "kv_bytes_per_token_fp8": kv_bytes_per_token(arch, "fp8"),
        "state_bytes": sequence_kv(arch, 0).state_bytes,
    }


def kv_report(name: str, context: int, kv_dtype: str | None = None,
              block_size: int | None = None, state_dtype: str = "fp32",
              allow_beyond_window: bool = False) -> dict:
    from model.perf.kv import entry_layouts, kv_bytes_per_token, sequence_kv  # loads sympy
    from model.specs.architecture import load_architecture, within_window
    from model.specs.dtypes import dtype

    if context < 0:
        raise ServecastError(f"--context must be >= 0 tokens; got {context}")
    if block_size is not None and block_size <= 0:
        raise ServecastError(f"--block-size must be a positive number of tokens; got {block_size}")
    arch = load_architecture(name)
    if block_size is not None and arch.max_context and block_size > arch.max_context:
        raise ServecastError(f"--block-size {block_size:,}: a block holds at most the model's "
                             f"window; allowed: 1..{arch.max_context:,} tokens")
    beyond = within_window(arch, context, "--context", allow_beyond_window)
    fmt = dtype(kv_dtype).name if kv_dtype else arch.default_kv_dtype
    foot = sequence_kv(arch, context, fmt, block_size, state_dtype=dtype(state_dtype).name)
    return {
        "name": arch.name,
        "context_tokens": context,
        "kv_dtype": fmt,
        "block_size": block_size,
        "kv_bytes": foot.total_bytes,
        "by_layer_kind": foot.by_kind,
        "state_bytes": foot.state_bytes,
        "index_key_bytes": foot.indexer_bytes,
        "kv_bytes_per_token": kv_bytes_per_token(arch, fmt),
        "entry_layouts": entry_layouts(arch, fmt),
        "assumptions": [beyond] if beyond else [],
    }


def register(app: typer.Typer) -> None:
    arch_app = typer.Typer(no_args_is_help=True, rich_markup_mode=None,
                           help="Model architectures: list, show.")

    @arch_app.command("list")
    def list_cmd(as_json: bool = JSON) -> None:
        """Names of every architecture under data/architectures/."""
        from model.specs.architecture import list_architectures

        emit({"architectures": list_architectures()}, as_json)

    @arch_app.command("show")
    def show_cmd(arch: str = typer.Argument(..., help="slug, HF id, alias or config.json path"),
                 weight_dtype: str = typer.Option(None, "--weight-dtype",
                                                  help="override checkpoint precision"),
                 as_json: bool = JSON) -> None:
        """Parameters, layer kinds, weight bytes and KV bytes per token of one architecture."""
        emit(describe(arch, weight_dtype), as_json)

    app.add_typer(arch_app, name="arch")

    @app.command("kv")
    def kv_cmd(arch: str = typer.Argument(..., help="slug, HF id, alias or config.json path"),
               context: int = typer.Option(..., "--context", help="tokens in the cache"),
               kv_dtype: str = typer.Option(None, "--kv-dtype", help="bf16, fp8, ..."),
               block_size: int = typer.Option(None, "--block-size", help="paged block tokens"),
               state_dtype: str = typer.Option("fp32", "--state-dtype",
                                               help="recurrent state dtype (linear layers)"),
               allow_beyond_window: bool = typer.Option(
                   False, "--allow-beyond-window", help="size a context past the model's "
                   "window and say so in the output"),
               as_json: bool = JSON) -> None:
        """KV-cache and state bytes of one sequence at a context length, by layer kind."""
        emit(kv_report(arch, context, kv_dtype, block_size, state_dtype, allow_beyond_window),
             as_json)
