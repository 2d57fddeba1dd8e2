"""API price tables and owned-cost inputs: cited values, vendor pricing rules, dated history,
long-context tiers, name resolution, and one-line errors for malformed files."""

from __future__ import annotations

import json

import pytest
import yaml

from model.specs.errors import ServecastError, SpecError
from model.specs.hardware import list_hardware, load_hardware
from model.specs.prices import API_PRICES, api_price, list_api_prices, owned_cost_inputs


def test_opus_5_price_as_published():
    # Anthropic pricing page [S40]: Opus 5 $5 input, $6.25 5-min cache write, $0.50 cache read,
    # $25 output per Mtok (the vLLM AgentX post's comparison point).
    p = api_price("claude-opus-5")
    assert (p.input_usd_per_mtok, p.cache_write_usd_per_mtok, p.cached_input_usd_per_mtok,
            p.output_usd_per_mtok) == (5.0, 6.25, 0.5, 25.0)
    assert p.date == "2026-07-24" and p.source == "S40"


def test_every_vendor_in_the_brief_is_covered():
    vendors = {p.vendor for p in list_api_prices()}
    assert {"Anthropic", "OpenAI", "Google", "DeepSeek", "Moonshot", "MiniMax"} <= vendors
    for name in ("kimi-k3", "minimax-m3", "deepseek-v4-pro", "gpt-6-sol",
                 "gemini-3.1-pro-preview", "claude-sonnet-5.5", "claude-opus-4.5"):
        assert api_price(name).model == name


def test_price_ordering_and_anthropic_write_multiplier():
    for p in list_api_prices():
        # A cache hit never costs more than a miss; output never less than input.
        assert 0 < p.cached_input_usd_per_mtok < p.input_usd_per_mtok <= p.output_usd_per_mtok
        if p.vendor == "Anthropic":
            # Anthropic's 5-minute cache write is 1.25x the input price (papers/research/hardware.md 5.1).
            assert p.cache_write_usd_per_mtok == pytest.approx(1.25 * p.input_usd_per_mtok)


def test_dated_history_returns_the_price_in_force():
    # GPT-5.6 Terra: 2.50 / 15 at the 2026-06-26 preview, cut to 2.00 / 12 on 2026-07-30 [S41].
    assert api_price("gpt-5.6-terra", on_date="2026-07-01").input_usd_per_mtok == 2.50
    assert api_price("gpt-5.6-terra", on_date="2026-07-30").output_usd_per_mtok == 12.0
    assert api_price("gpt-5.6-terra").input_usd_per_mtok == 2.00
    with pytest.raises(ServecastError, match="first recorded price is from 2026-06-26"):
        api_price("gpt-5.6-terra", on_date="2026-05")


def test_long_context_tier():
    # MiniMax M3 [S45]: 0.30 / 1.20 up to 512K total input, 0.60 / 2.40 above.
    m3 = api_price("minimax-m3")
    assert m3.at_context(142_000).input_usd_per_mtok == 0.30
    above = m3.at_context(600_000)
    assert (above.input_usd_per_mtok, above.output_usd_per_mtok) == (0.60, 2.40)
    # GPT-6 Sol [S41]: above 272K input, 4 / 0.40 / 15.
    sol = api_price("gpt-6-sol").at_context(300_000)
    assert (sol.input_usd_per_mtok, sol.cached_input_usd_per_mtok,
            sol.output_usd_per_mtok) == (4.0, 0.40, 15.0)


@pytest.mark.parametrize("name, model", [("Claude Opus 5", "claude-opus-5"),
                                         ("opus_5", "claude-opus-5"),
                                         ("claude-opus-4-8", "claude-opus-4.5"),
                                         ("DEEPSEEK-FLASH", "deepseek-v4.1-flash")])
def test_names_resolve(name, model):
    assert api_price(name).model == model


def test_unknown_model_lists_the_allowed_ones():
    with pytest.raises(ServecastError, match="no API price for model 'opus-9'; allowed: .*kimi-k3"):
        api_price("opus-9")


BASE = yaml.safe_load(API_PRICES.read_text())


def _with(change) -> str:
    data = yaml.safe_load(API_PRICES.read_text())
    change(data)
    return yaml.safe_dump(data, sort_keys=False)


@pytest.mark.parametrize("text, key, problem", [
    (_with(lambda d: d["prices"][0].update(input_usd_per_mtok="4e0")),
     "prices.0.input_usd_per_mtok", "expected a number, got the text '4e0'"),
    (_with(lambda d: d["prices"][0].update(price=4)), "prices.0.price", "unknown key"),
    (_with(lambda d: d["prices"][0].update(cached_input_usd_per_mtok=9.0)),
     "prices[0] (claude-opus-5.5).cached_input_usd_per_mtok", "above the uncached input price"),
    (_with(lambda d: d["prices"][0].update(source="S99")),
     "prices[0] (claude-opus-5.5).source", "not in the sources table"),
])
def test_malformed_price_file(tmp_path, text, key, problem):
    path = tmp_path / "api.yaml"
    path.write_text(text)
    with pytest.raises(SpecError) as err:
        api_price("claude-opus-5", path=path)
    assert f"{path}: {key}: " in str(err.value) and problem in str(err.value)


def test_owned_cost_inputs_and_power_share_of_tco():
    inputs = owned_cost_inputs()
    # One public TCO calculator's defaults [S39]: $0.07/kWh, PUE 1.25, 5-year life.
    assert (inputs["electricity_usd_per_kwh"].value, inputs["pue"].value,
            inputs["amortization_years"].value) == (0.07, 1.25, 5)
    # papers/research/hardware.md 4.4: all-in kW x PUE x $/kWh is ~10% of the owned TCO (GB300: 2.12 x 1.25 x
    # 0.08 = $0.21 of $2.31); capex amortization dominates. At the default $0.07/kWh every sourced
    # TCO has a power share of 7-14% (highest on the cheaper AMD parts: MI325X 1.69 kW, $1.10/h).
    for name in list_hardware():
        hw = load_hardware(name)
        if hw.provenance["tco_usd_per_gpu_hour"].assumed:
            continue
        power = (hw.power_all_in_w / 1e3 * inputs["pue"].value
                 * inputs["electricity_usd_per_kwh"].value)
        assert 0.05 < power / hw.tco_usd_per_gpu_hour < 0.15, name


def test_cli_prices(capsys):
    from model.frontends.cli import main

    assert main(["prices", "opus-5", "--json"]) == 0
    price = json.loads(capsys.readouterr().out)
    assert price["model"] == "claude-opus-5" and price["output_usd_per_mtok"] == 25.0
    assert price["source_detail"]["kind"] == "vendor"
    assert main(["prices", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert "claude-opus-5" in {p["model"] for p in listed["prices"]} and "S40" in listed["sources"]
