"""House theme and chart builders: every builder renders to a real PNG and SVG via vl-convert."""

from __future__ import annotations

import struct

import altair as alt
import pandas as pd
import pytest

from model.frontends import charts, theme

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def png_size(data: bytes) -> tuple[int, int]:
    """(width, height) from the IHDR chunk, which the PNG spec puts first at byte 16."""
    assert data[:8] == PNG_MAGIC
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


FRONTIER = pd.DataFrame({
    "p90_interactivity_tok_s": [20, 40, 60, 80, 30, 50, 70],
    "tpgs": [90e3, 70e3, 50e3, 20e3, 60e3, 65e3, 10e3],
    "hardware": ["gb300"] * 4 + ["b300"] * 3,
})
BUILDERS = {
    "pareto": lambda: charts.pareto_chart(FRONTIER, "p90_interactivity_tok_s", "tpgs",
                                          "hardware", title="Pareto", x_rule=50),
    "line": lambda: charts.line_chart(
        pd.DataFrame({"capacity_tokens": [1e5, 1e6, 1e7] * 2,
                      "hit_rate": [0.5, 0.8, 0.95, 0.4, 0.7, 0.9],
                      "policy": ["lru"] * 3 + ["interval"] * 3}),
        "capacity_tokens", "hit_rate", "policy", log_x=True, title="Hit rate"),
    "stacked_bar": lambda: charts.stacked_bar(
        pd.DataFrame({"arch": ["a", "a", "b", "b"], "kv_bytes": [1e9, 2e9, 3e9, 1e9],
                      "kind": ["full", "sliding", "full", "sliding"]}),
        "arch", "kv_bytes", "kind", title="KV"),
    "bar": lambda: charts.bar_chart(
        pd.DataFrame({"model": ["dsv4", "dsv4", "kimi", "kimi"],
                      "usd_per_hour": [27.72, 2926, 36.96, 538],
                      "source": ["TCO", "API"] * 2}),
        "model", "usd_per_hour", "source", log_y=True, title="Cost"),
    "bar_horizontal": lambda: charts.bar_chart(
        pd.DataFrame({"claim": ["workload.median_turns", "threshold.tpgs_gain"],
                      "ratio": [1.12, -0.66], "verdict": ["within", "outside"]}),
        "claim", "ratio", "verdict", horizontal=True, rule=1.0, title="Ratios"),
    "roofline": lambda: charts.roofline_chart(
        pd.DataFrame({"op": ["gemm", "attention"], "flop_per_byte": [300.0, 2.0],
                      "flops_per_s": [8e14, 5e12]}),
        "flop_per_byte", "flops_per_s", 9.89e14, 4.8e12, "op", title="Roofline"),
    "roofline_by_op": lambda: charts.roofline_chart(
        pd.DataFrame({"op": ["routed experts", "attention (over the KV cache)"] * 2,
                      "phase": ["decode", "decode", "prefill", "prefill"],
                      "flop_per_byte": [16.0, 228.0, 1500.0, 4000.0],
                      "flops_per_s": [6e13, 4e14, 4e14, 6e14], "share": [0.6, 0.1, 0.6, 0.2],
                      "text": ["60%", "10%", "60%", "20%"]}),
        "flop_per_byte", "flops_per_s", 1.98e15, 4.8e12, "op", shape="phase", size="share",
        text="text", title="Roofline by op"),
    "stacked_totals": lambda: charts.stacked_bar(
        pd.DataFrame({"arch": ["a", "a", "b"], "gb": [300.0, 40.0, 5.0],
                      "part": ["full", "index", "compressed"]}),
        "arch", "gb", "part", horizontal=True, totals=True, title="KV with totals"),
    "pd_sweep": lambda: charts.pd_sweep_chart(
        pd.DataFrame({"p_per_d": [0.5, 1.0, 2.0, 4.0], "tpgs": [50e3, 90e3, 120e3, 70e3],
                      "pair": "p | d"}),
        pd.DataFrame({"p_per_d": [1.0, 2.0], "tpgs": [90e3, 120e3], "pair": "p | d",
                      "label": ["1P1D", "2P1D"], "at_budget": [False, True]}),
        pd.DataFrame({"p_per_d": [2.0], "tpgs": [100e3], "pair": "p | d"}),
        pd.DataFrame({"pair": ["p | d"], "p_per_d": [2.2]}), title="P/D sweep"),
}


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_builder_renders_png_and_svg(tmp_path, name):
    paths = charts.save(BUILDERS[name](), tmp_path / name)
    png, svg = paths
    assert (png.name, svg.name) == (f"{name}.png", f"{name}.svg")
    data = png.read_bytes()
    width, height = png_size(data)
    # Continuous views are 480 x 300 px at 2x scale plus title and axes; discrete ones are 44 px
    # per bar (28 px per row when horizontal), so the smallest is > 250 x 250 pixels.
    assert width > 250 and height > 250
    assert width * height > 250_000
    assert len(data) > 10_000  # a real plot, not an empty canvas
    assert svg.read_text().lstrip().startswith("<svg")
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp files left


def test_theme_is_registered_and_enabled():
    assert alt.theme.active == charts.THEME
    config = alt.Chart(FRONTIER).mark_point().encode(x="tpgs").to_dict()["config"]
    assert config["range"]["category"][:2] == ["#0072B2", "#E69F00"]  # Okabe-Ito first colours


def test_save_accepts_a_suffix(tmp_path):
    paths = charts.save(BUILDERS["line"](), tmp_path / "fig.png")
    assert [p.name for p in paths] == ["fig.png", "fig.svg"]


def test_pareto_front_keeps_only_non_dominated_points():
    # gb300: (20, 90K), (40, 70K), (60, 50K), (80, 20K) all trade off -> all kept.
    # b300: (30, 60K), (50, 65K), (70, 10K): (30, 60K) is dominated by (50, 65K).
    front = charts.pareto_front(FRONTIER, "p90_interactivity_tok_s", "tpgs", "hardware")
    kept = set(zip(front["hardware"], front["p90_interactivity_tok_s"], strict=True))
    assert kept == {("gb300", 20), ("gb300", 40), ("gb300", 60), ("gb300", 80),
                    ("b300", 50), ("b300", 70)}


@pytest.mark.parametrize(("column", "title"), [
    # DESIGN.md conventions: the unit is the suffix of every external name
    ("p90_interactivity_tok_s", "P90 interactivity (tok/s)"),
    ("hbm_bandwidth_bytes_per_s", "HBM bandwidth (B/s)"),
    ("tco_usd_per_gpu_hour", "TCO ($/GPU-h)"),
    ("usd_per_mtok", "$/Mtok"),
    ("tpgs", "TPGS (tok/s per GPU)"),
    ("max_rps_per_gpu", "max (req/s per GPU)"),
    ("decode_tokens_per_s_per_gpu", "decode (tok/s per GPU)"),
    ("context_tokens", "context (tokens)"),
])
def test_axis_titles_carry_the_unit_suffix(column, title):
    assert theme.axis_title(column) == title


def test_palette_has_twelve_distinct_colours_and_yellow_last():
    assert len(charts.PALETTE) == 12 == len({c.lower() for c in charts.PALETTE})
    assert charts.PALETTE[-1] == "#F0E442"  # Okabe-Ito yellow: faint as a line, used last


def _colour_scale(chart) -> dict:
    spec = chart.to_dict()
    layers = spec.get("layer", [spec])
    return next(layer["encoding"]["color"]["scale"] for layer in layers
                if "color" in layer.get("encoding", {}) and "field" in
                layer["encoding"]["color"])


@pytest.mark.parametrize("n", [9, 12])
def test_every_series_gets_its_own_colour(n):
    # The KV breakdown stacks up to 9 cache parts (model/perf/kv.py kinds + index keys + state);
    # up to 12 series take the house palette, each a different colour, in legend order.
    df = pd.DataFrame({"x": list(range(n)), "y": list(range(n)),
                       "s": [f"series {i}" for i in range(n)]})
    scale = _colour_scale(charts.line_chart(df, "x", "y", "s"))
    assert scale["domain"] == [f"series {i}" for i in range(n)]
    assert scale["range"] == charts.PALETTE[:n]
    assert len(set(scale["range"])) == n


def test_more_series_than_the_palette_switch_scheme_then_refuse():
    df = pd.DataFrame({"x": list(range(21)), "y": list(range(21)),
                       "s": [f"s{i:02d}" for i in range(21)]})
    scale = _colour_scale(charts.line_chart(df.head(13), "x", "y", "s"))
    assert scale["scheme"] == charts.MANY_SERIES_SCHEME and len(scale["domain"]) == 13
    with pytest.raises(ValueError, match="21 series"):
        charts.line_chart(df, "x", "y", "s")


def test_log_ticks_are_sparse_and_readable():
    # 30 .. 800 spans 1.4 decades: 1-2-5 steps; 1e3 .. 1e7: decades; 1e-2 .. 1e9: every other
    assert charts.log_ticks(30, 800) == [50, 100, 200, 500]
    assert charts.log_ticks(1e3, 1e7) == [1e3, 1e4, 1e5, 1e6, 1e7]
    assert charts.log_ticks(1e-2, 1e9)[:3] == pytest.approx([1e-2, 1, 100])


def test_log_axes_fit_the_data_not_whole_decades():
    # capacities 3e4 .. 3e7 (cache_hit defaults): the axis must not run 1e4 .. 1e8
    df = pd.DataFrame({"capacity_tokens": [3e4, 3e5, 3e6, 3e7], "hit_rate": [0.1, 0.5, 0.9, 0.95]})
    x = charts.line_chart(df, "capacity_tokens", "hit_rate", log_x=True).to_dict()["encoding"]["x"]
    lo, hi = x["scale"]["domain"]
    assert 2e4 < lo < 3e4 and 3e7 < hi < 4e7
    assert x["axis"]["values"] == [1e5, 1e6, 1e7]


@pytest.mark.parametrize(("op", "group"), [
    # model.perf.ops names: `<attention kind>/<ffn kind>:<module>` (see StepModel.op_table)
    ("mla/moe:attn_decode", "attention (over the KV cache)"),
    ("gqa/dense:attn_prefill", "attention (over the KV cache)"),
    ("mla/moe:experts", "routed experts"),
    ("mla/moe:mlp.gate", "router"),
    ("minimax/moe:block_sparse_moe.gate", "router"),
    ("mla/moe:mlp.shared_experts.up_proj", "shared experts"),
    ("gqa/dense:mlp.down_proj", "dense MLP"),
    ("mla/moe:self_attn.kv_b_proj", "attention projections (QKV, O)"),
    ("csa/moe:attn.indexer.wq_b", "sparse-attention indexer"),
    ("hca/moe:attn.compressor.wkv", "KV compressor"),
    ("lm_head", "LM head"),
])
def test_roofline_points_are_named_by_op(op, group):
    assert charts.op_group(op) == group


def test_si_counts_for_titles():
    assert [charts.si(v) for v in (711_000, 2.91e6, 950)] == ["711K", "2.91M", "950"]
