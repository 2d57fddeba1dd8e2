"""API list prices (USD per million tokens) and owned-cost inputs, from dated, sourced tables in
`data/prices/`: `api.yaml` (one entry per model and date) and `owned_cost.yaml`.

`api_price(model)` returns the latest entry; `api_price(model, on_date="2026-07-01")` the entry in
force on that date. Names are case-insensitive and `_`, `.`, `-`, spaces alike.
"""

from __future__ import annotations

import datetime
import functools
import re
from pathlib import Path
from typing import Annotated

from pydantic import Field, field_validator

from model import ROOT
from model.specs.errors import ServecastError, SpecError
from model.specs.specio import DATE, Source, Sourced, Strict, date_text, id_list, validated

PRICES_DIR = ROOT / "data" / "prices"
API_PRICES = PRICES_DIR / "api.yaml"
OWNED_COST = PRICES_DIR / "owned_cost.yaml"
_PRICE_KEYS = ("input_usd_per_mtok", "cached_input_usd_per_mtok", "cache_write_usd_per_mtok",
               "output_usd_per_mtok")
PRICE_RANGE = (0.0, 1000.0)  # USD per Mtok


class ApiPriceTier(Strict):
    """Prices that apply above a prompt length (long-context tariffs)."""

    above_input_tokens: int
    input_usd_per_mtok: float
    cached_input_usd_per_mtok: float
    cache_write_usd_per_mtok: float
    output_usd_per_mtok: float


class ApiPrice(Strict):
    """One model's list price from one date, USD per million tokens."""

    model: str
    vendor: str
    aliases: tuple[str, ...] = ()
    date: Annotated[str, Field(pattern=DATE)]
    source: str
    input_usd_per_mtok: float
    cached_input_usd_per_mtok: float
    cache_write_usd_per_mtok: float
    output_usd_per_mtok: float
    long_context: ApiPriceTier | None = None
    inferred: tuple[str, ...] = ()  # prices derived from vendor multipliers, not read off a page
    note: str | None = None

    _dates = field_validator("date", mode="before")(date_text)

    @field_validator("aliases", "inferred", mode="before")
    @classmethod
    def _list_to_tuple(cls, value: object) -> object:
        return tuple(value) if isinstance(value, list) else value

    def at_context(self, input_tokens: float) -> ApiPrice:
        """The prices billed for a request with `input_tokens` prompt tokens (long-context tier
        above its threshold)."""
        tier = self.long_context
        if tier is None or input_tokens <= tier.above_input_tokens:
            return self
        return self.model_copy(update={k: getattr(tier, k) for k in _PRICE_KEYS}
                               | {"long_context": None})


class ApiPriceFile(Strict):
    prices: list[ApiPrice]
    sources: dict[str, Source]


class CostParameter(Sourced):
    """One owned-cost input: default `value` and the range worth sweeping."""

    value: float
    low: float
    high: float


class OwnedCostFile(Strict):
    parameters: dict[str, CostParameter]
    sources: dict[str, Source]


def _normalize(name: str) -> str:
    return re.sub(r"[\s_.]+", "-", name.strip().lower())


def _date_key(date: str) -> tuple[int, ...]:
    parts = [int(p) for p in date.split("-")]
    return tuple(parts + [1] * (3 - len(parts)))  # "2026" sorts as 2026-01-01


def _calendar_date(text: str) -> bool:
    """YYYY, YYYY-MM or YYYY-MM-DD naming a day, month or year that exists (no 2026-13-45)."""
    year, month, day = _date_key(text)
    try:
        datetime.date(year, month, day)
    except ValueError:
        return False
    return True


def _check_sources(path: Path, key: str, cited: str | list[str], table: dict) -> None:
    for sid in id_list(cited):
        if sid not in table:
            raise SpecError(path, f"{key}.source", f"{sid!r} is not in the sources table; "
                            f"allowed: {', '.join(table)}")


@functools.lru_cache(maxsize=8)
def _api_table(path_text: str) -> dict[str, list[ApiPrice]]:
    """Normalized model name or alias -> that model's entries, oldest first."""
    path = Path(path_text)
    spec = validated(path, ApiPriceFile)
    by_model: dict[str, list[ApiPrice]] = {}
    for i, entry in enumerate(spec.prices):
        where = f"prices[{i}] ({entry.model})"
        _check_sources(path, where, entry.source, spec.sources)
        tiers = [entry] + ([entry.long_context] if entry.long_context else [])
        for tier in tiers:
            for key in _PRICE_KEYS:
                value = getattr(tier, key)
                if not PRICE_RANGE[0] <= value <= PRICE_RANGE[1]:
                    raise SpecError(path, f"{where}.{key}", f"{value:g} is out of range; allowed "
                                    f"{PRICE_RANGE[0]:g} to {PRICE_RANGE[1]:g} USD per Mtok")
            if tier.cached_input_usd_per_mtok > tier.input_usd_per_mtok:
                raise SpecError(path, f"{where}.cached_input_usd_per_mtok",
                                "above the uncached input price")
        for key in entry.inferred:
            owner = entry.long_context if key.startswith("long_context.") else entry
            if owner is None or key.removeprefix("long_context.") not in _PRICE_KEYS:
                raise SpecError(path, f"{where}.inferred", f"{key!r} names no price of this "
                                f"entry; allowed: {', '.join(_PRICE_KEYS)} (or long_context.*)")
        by_model.setdefault(entry.model, []).append(entry)

    index: dict[str, list[ApiPrice]] = {}
    for model, entries in by_model.items():
        entries.sort(key=lambda e: _date_key(e.date))
        labels = {model, *(a for e in entries for a in e.aliases)}
        for label in labels:
            key = _normalize(label)
            if key in index and index[key] is not entries:
                raise SpecError(path, "prices", f"name {label!r} is used by two models")
            index[key] = entries
    return index


def list_api_prices(path: Path | None = None) -> list[ApiPrice]:
    """The latest price of every model, by vendor then model."""
    table = _api_table(str(path or API_PRICES))
    latest = {id(entries): entries[-1] for entries in table.values()}
    return sorted(latest.values(), key=lambda p: (p.vendor, p.model))


def api_price(model_name: str, on_date: str | None = None, path: Path | None = None) -> ApiPrice:
    """A model's API price: the latest entry, or the one in force on `on_date` (YYYY[-MM[-DD]])."""
    table = _api_table(str(path or API_PRICES))
    entries = table.get(_normalize(model_name))
    if entries is None:
        names = ", ".join(p.model for p in list_api_prices(path))
        raise ServecastError(f"no API price for model {model_name!r}; allowed: {names}")
    if on_date is None:
        return entries[-1]
    if not re.match(DATE, on_date) or not _calendar_date(on_date):
        raise ServecastError(f"on_date {on_date!r}: allowed a calendar date YYYY, YYYY-MM or "
                             f"YYYY-MM-DD")
    in_force = [e for e in entries if _date_key(e.date) <= _date_key(on_date)]
    if not in_force:
        raise ServecastError(f"no API price for {entries[0].model} on {on_date}; the first "
                             f"recorded price is from {entries[0].date}")
    return in_force[-1]


@functools.lru_cache(maxsize=4)
def owned_cost_inputs(path: Path | None = None) -> dict[str, CostParameter]:
    """Sourced defaults and ranges for rebuilding an owner's TCO from parts (see owned_cost.yaml)."""
    path = path or OWNED_COST
    spec = validated(path, OwnedCostFile)
    for name, p in spec.parameters.items():
        _check_sources(path, f"parameters.{name}", p.source, spec.sources)
        if not (0 <= p.low <= p.value <= p.high):
            raise SpecError(path, f"parameters.{name}", f"need 0 <= low <= value <= high, got "
                            f"{p.low:g} <= {p.value:g} <= {p.high:g}")
    return dict(spec.parameters)


def price_sources(path: Path | None = None) -> dict[str, Source]:
    return dict(validated(path or API_PRICES, ApiPriceFile).sources)

