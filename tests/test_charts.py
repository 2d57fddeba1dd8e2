"""House theme and chart builders: every builder renders to a real PNG and SVG via vl-convert."""

from __future__ import annotations

import struct

import altair as alt
import pandas as pd
import pytest

from model import charts

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
    ("p90_interactivity_tok_s", "p90 interactivity (tok/s)"),
    ("hbm_bandwidth_bytes_per_s", "hbm bandwidth (B/s)"),
    ("tco_usd_per_gpu_hour", "tco ($/GPU-h)"),
    ("usd_per_mtok", "$/Mtok"),
    ("tpgs", "tpgs"),
])
def test_axis_titles_carry_the_unit_suffix(column, title):
    assert charts._label(column) == title
