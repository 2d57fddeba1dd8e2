"""`servecast hardware list|show` (validated accelerator specs) and `servecast prices` (API list
prices, USD per million tokens)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

from model.frontends.cli.output import JSON, emit

if TYPE_CHECKING:
    from model.specs.hardware import Hardware

# the spec modules load pydantic and yaml: each command imports what it reads, so `--help`
# starts without them


def describe(hw: Hardware) -> dict:
    """The `hardware show` object: every value in SI under a unit-suffixed key, plus provenance."""
    spec = hw.model_dump(mode="json")
    spec["ridge_flop_per_byte"] = hw.ridge_flop_per_byte
    return spec


def _summary_row(hw: Hardware) -> dict:
    peaks = hw.peak_flops_per_s
    return {
        "name": hw.name, "vendor": hw.vendor, "status": hw.status,
        "bf16_pflops": peaks["bf16"] / 1e15, "fp8_pflops": peaks["fp8"] / 1e15,
        "fp4_pflops": peaks["fp4"] / 1e15 if "fp4" in peaks else None,
        "hbm_gb": hw.hbm_bytes / 1e9, "hbm_tb_s": hw.hbm_bandwidth_bytes_per_s / 1e12,
        "scale_up_gpus": hw.scale_up_domain_gpus,
        "tco_usd_per_gpu_hour": hw.tco_usd_per_gpu_hour,
    }


def _table(rows: list[dict]) -> str:
    headers = list(rows[0])
    cells = [[_cell(row[h]) for h in headers] for row in rows]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join(lines)


def _cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def register(app: typer.Typer) -> None:
    group = typer.Typer(no_args_is_help=True, rich_markup_mode=None,
                        help="Accelerator specs (hardware/*.yaml).")
    app.add_typer(group, name="hardware")

    @group.command("list")
    def hardware_list(as_json: bool = JSON) -> None:
        """List the systems; with --json: {"hardware": [names], "systems": [summaries]}."""
        from model.specs.hardware import list_hardware, load_hardware

        names = list_hardware()
        rows = [_summary_row(load_hardware(name)) for name in names]
        if as_json:
            emit({"hardware": names, "systems": rows}, True)
        else:
            print(_table(rows))

    @group.command("show")
    def hardware_show(name: str = typer.Argument(..., help="name, alias or path to a .yaml"),
                      as_json: bool = JSON) -> None:
        """Show one validated spec (SI units, unit-suffixed keys) with its sources."""
        from model.specs.hardware import load_hardware

        emit(describe(load_hardware(name)), as_json)

    @app.command("prices")
    def prices(model: str = typer.Argument(None, help="model name; omit to list all"),
               on_date: str = typer.Option(None, "--on-date",
                                           help="price in force on YYYY[-MM[-DD]]"),
               as_json: bool = JSON) -> None:
        """API list prices, USD per million tokens (latest, or in force on --on-date)."""
        from model.specs.prices import api_price, list_api_prices, price_sources

        sources = price_sources()
        if model is None:
            rows = [p.model_dump(mode="json") for p in list_api_prices()]
            if as_json:
                emit({"prices": rows, "sources": sources}, True)
            else:
                keep = ("model", "vendor", "date", "input_usd_per_mtok",
                        "cached_input_usd_per_mtok", "cache_write_usd_per_mtok",
                        "output_usd_per_mtok")
                print(_table([{k: r[k] for k in keep} for r in rows]))
            return
        price = api_price(model, on_date=on_date)
        emit({**price.model_dump(mode="json"), "source_detail": sources[price.source]}, as_json)
