"""Altair house theme and reusable chart builders (tidy DataFrame in, chart out; no computation).

Importing this module registers and enables the `servecast` theme, so every notebook's figures
share one look. `save(chart, path_stem)` writes `<stem>.png` and `<stem>.svg` through vl-convert,
each atomically (temporary file + rename), so an interrupted batch never leaves half a figure.
"""

from __future__ import annotations

import math
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

import altair as alt
import pandas as pd

THEME = "servecast"
# Sans fonts in order of preference; DejaVu Sans is the one every Linux box (and CI) has.
FONT = "Helvetica Neue, Helvetica, Arial, DejaVu Sans, sans-serif"
# Okabe-Ito first (distinguishable with the common colour-vision deficiencies, prints well in
# grey), then four muted extras so charts with up to 12 series (KV breakdown by layer kind)
# never reuse a colour.
PALETTE = ["#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442",
           "#000000", "#999999", "#882255", "#44AA99", "#AA4499"]
INK = "#222222"
GRID = "#E6E6E6"
WIDTH, HEIGHT = 480, 300
PNG_SCALE = 2.0  # 2x pixels: sharp on retina screens and in blog posts


def _theme() -> dict:
    axis = {"labelFont": FONT, "titleFont": FONT, "labelFontSize": 12, "titleFontSize": 13,
            "titleFontWeight": "normal", "labelColor": INK, "titleColor": INK,
            "domainColor": "#888888", "tickColor": "#888888", "gridColor": GRID,
            "gridWidth": 0.8, "titlePadding": 8}
    return {
        "config": {
            "background": "white",
            "padding": 8,
            "font": FONT,
            "view": {"continuousWidth": WIDTH, "continuousHeight": HEIGHT, "stroke": None,
                     "discreteWidth": {"step": 44}, "discreteHeight": {"step": 28}},
            "title": {"font": FONT, "fontSize": 15, "fontWeight": 600, "color": INK,
                      "anchor": "start", "subtitleFontSize": 12, "subtitleColor": "#555555",
                      "offset": 10},
            "axis": axis,
            "axisX": {"grid": False},
            "axisY": {"grid": True, "domain": False, "ticks": False},
            "legend": {"labelFont": FONT, "titleFont": FONT, "labelFontSize": 12,
                       "titleFontSize": 12, "titleFontWeight": "normal", "labelColor": INK,
                       "titleColor": INK, "orient": "right", "symbolStrokeWidth": 2,
                       "symbolOpacity": 1, "labelLimit": 0},
            "header": {"labelFont": FONT, "titleFont": FONT, "labelFontSize": 12,
                       "titleFontSize": 13},
            "range": {"category": PALETTE, "ordinal": {"scheme": "blues"},
                      "ramp": {"scheme": "viridis"}},
            "line": {"strokeWidth": 2.2},
            "point": {"size": 55, "filled": True},
            "bar": {"binSpacing": 1},
            "text": {"font": FONT, "fontSize": 11, "color": INK},
        }
    }


def _register() -> None:
    themes = getattr(alt, "theme", None)
    if themes is not None and hasattr(themes, "register"):  # altair >= 5.5
        themes.register(THEME, enable=True)(_theme)
    else:  # pragma: no cover - older altair
        alt.themes.register(THEME, _theme)
        alt.themes.enable(THEME)


_register()


def _atomic_bytes(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; figures are meant to be shared
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def save(chart: alt.TopLevelMixin, path_stem: str | Path) -> list[Path]:
    """Render `chart` to `<path_stem>.png` and `<path_stem>.svg`; return both paths.

    A suffix on `path_stem` (e.g. `fig.png`) is dropped, so either spelling works.
    """
    import vl_convert

    stem = Path(path_stem)
    if stem.suffix.lower() in {".png", ".svg"}:
        stem = stem.with_suffix("")
    spec = chart.to_dict()  # the enabled theme is merged in here
    png = stem.with_name(stem.name + ".png")
    svg = stem.with_name(stem.name + ".svg")
    _atomic_bytes(png, vl_convert.vegalite_to_png(spec, scale=PNG_SCALE))
    _atomic_bytes(svg, vl_convert.vegalite_to_svg(spec).encode())
    return [png, svg]


def _title(title: str | None, subtitle: str | None) -> alt.TitleParams | str:
    if subtitle:
        return alt.TitleParams(text=title or "", subtitle=subtitle)
    return title or ""


def _color(color: str | None, df: pd.DataFrame):
    if color is None:
        return alt.value(PALETTE[0])
    return alt.Color(f"{color}:N", title=_label(color), sort=list(dict.fromkeys(df[color])))


def _label(column: str) -> str:
    """Axis title from a column name: `p90_interactivity_tok_s` -> `p90 interactivity (tok/s)`."""
    units = {"_tok_s": "tok/s", "_s": "s", "_ms": "ms", "_bytes": "bytes", "_gb": "GB",
             "_gib": "GiB", "_usd_per_mtok": "$/Mtok", "_usd_per_hour": "$/h", "_usd": "$",
             "_usd_per_gpu_hour": "$/GPU-h",
             "_flops_per_s": "FLOP/s", "_bytes_per_s": "B/s", "_per_s": "/s", "_w": "W"}
    for suffix, unit in sorted(units.items(), key=lambda kv: -len(kv[0])):
        if column == suffix[1:]:
            return unit
        if column.endswith(suffix) and len(column) > len(suffix):
            return f"{column[: -len(suffix)].replace('_', ' ')} ({unit})"
    return column.replace("_", " ")


def _angle(labels: pd.Series) -> int:
    """Horizontal category labels when they are short, slanted when they would collide."""
    return 0 if max((len(str(v)) for v in labels), default=0) <= 6 else -30


def _scale(log: bool, zero: bool = True) -> alt.Scale:
    return alt.Scale(type="log") if log else alt.Scale(zero=zero)


def pareto_front(df: pd.DataFrame, x: str, y: str, group: str | None = None) -> pd.DataFrame:
    """Rows of `df` not dominated when both `x` and `y` are better larger (per `group`)."""
    parts = [df] if group is None else [g for _, g in df.groupby(group, sort=False)]
    keep = []
    for part in parts:
        ordered = part.sort_values([x, y], ascending=[False, False])
        best_y = -float("inf")
        for index, value in ordered[y].items():
            if value > best_y:
                keep.append(index)
                best_y = value
    return df.loc[keep].sort_values([*( [group] if group else []), x])


def pareto_chart(df: pd.DataFrame, x: str, y: str, color: str | None = None, *,
                 title: str | None = None, subtitle: str | None = None, log_y: bool = False,
                 front_only: bool = False, x_rule: float | None = None) -> alt.Chart:
    """Throughput-vs-interactivity style scatter with the Pareto front drawn as a step line.

    All configurations are faint points; the non-dominated ones (larger `x` and larger `y` both
    better) are joined. `x_rule` draws a dashed vertical SLO line.
    """
    front = pareto_front(df, x, y, color)
    enc_x = alt.X(f"{x}:Q", title=_label(x), scale=_scale(False))
    enc_y = alt.Y(f"{y}:Q", title=_label(y), scale=_scale(log_y))
    tooltip = list(df.columns)
    layers = []
    if not front_only:
        layers.append(alt.Chart(df).mark_point(opacity=0.35, filled=True, size=30)
                      .encode(enc_x, enc_y, color=_color(color, df), tooltip=tooltip))
    line = alt.Chart(front).mark_line(interpolate="step-after", point=True)
    detail = [alt.Detail(f"{color}:N")] if color else []
    layers.append(line.encode(enc_x, enc_y, *detail, color=_color(color, df), tooltip=tooltip))
    if x_rule is not None:
        rule = pd.DataFrame({x: [x_rule]})
        layers.append(alt.Chart(rule).mark_rule(strokeDash=[5, 4], color="#777777")
                      .encode(x=f"{x}:Q"))
    return alt.layer(*layers).properties(title=_title(title, subtitle))


def line_chart(df: pd.DataFrame, x: str, y: str, color: str | None = None, *,
               title: str | None = None, subtitle: str | None = None, log_x: bool = False,
               log_y: bool = False, points: bool = True,
               strokedash: str | None = None) -> alt.Chart:
    """One line per `color` group (e.g. hit rate vs cache capacity, TPGS vs P/D ratio)."""
    enc = [alt.X(f"{x}:Q", title=_label(x), scale=_scale(log_x, zero=False)),
           alt.Y(f"{y}:Q", title=_label(y), scale=_scale(log_y))]
    if strokedash:
        enc.append(alt.StrokeDash(f"{strokedash}:N", title=_label(strokedash)))
    return (alt.Chart(df).mark_line(point=points)
            .encode(*enc, color=_color(color, df), tooltip=list(df.columns))
            .properties(title=_title(title, subtitle)))


def stacked_bar(df: pd.DataFrame, x: str, y: str, color: str, *, title: str | None = None,
                subtitle: str | None = None, horizontal: bool = False,
                order: Sequence[str] | None = None, normalize: bool = False) -> alt.Chart:
    """Stacked bars: `x` categories, `y` values stacked by `color` (KV breakdown, cost parts)."""
    stack = "normalize" if normalize else "zero"
    cat = alt.X(f"{x}:N", title=_label(x), sort=list(dict.fromkeys(df[x])),
                axis=alt.Axis(labelAngle=_angle(df[x])))
    val = alt.Y(f"{y}:Q", title=_label(y), stack=stack)
    if horizontal:
        cat = alt.Y(f"{x}:N", title=_label(x), sort=list(dict.fromkeys(df[x])))
        val = alt.X(f"{y}:Q", title=_label(y), stack=stack)
    sort = list(order) if order is not None else list(dict.fromkeys(df[color]))
    colour = alt.Color(f"{color}:N", title=_label(color), sort=sort)
    rank = {name: i for i, name in enumerate(sort)}
    data = df.assign(_stack_order=df[color].map(rank))
    return (alt.Chart(data).mark_bar().encode(cat, val, colour,
                                              order=alt.Order("_stack_order:Q"),
                                              tooltip=list(df.columns))
            .properties(title=_title(title, subtitle)))


def bar_chart(df: pd.DataFrame, x: str, y: str, color: str | None = None, *,
              title: str | None = None, subtitle: str | None = None, log_y: bool = False,
              labels: bool = True, horizontal: bool = False,
              rule: float | None = None) -> alt.LayerChart | alt.Chart:
    """Bars per `x` category, grouped side by side when `color` has several values per
    category (cost comparison, published vs predicted). `horizontal` suits many long labels;
    `rule` draws a dashed reference value (e.g. 1.0 for a ratio)."""
    order = list(dict.fromkeys(df[x]))
    # Bars on a log axis have no zero to grow from: start them at the smallest decade shown.
    scale = _scale(False)
    if log_y:
        floor = 10.0 ** math.floor(math.log10(0.999 * float(df[y].min())))
        scale = alt.Scale(type="log", domainMin=floor)
    grouped = bool(color) and int(df.groupby(x)[color].nunique().max()) > 1
    if horizontal:  # long category labels name themselves; the value axis carries the grid
        cat = alt.Y(f"{x}:N", title=None, sort=order,
                    axis=alt.Axis(labelLimit=360, grid=False, ticks=False))
        val = alt.X(f"{y}:Q", title=_label(y), scale=scale, stack=None, axis=alt.Axis(grid=True))
        offset = alt.YOffset if grouped else None
    else:
        cat = alt.X(f"{x}:N", title=_label(x), sort=order,
                    axis=alt.Axis(labelAngle=_angle(df[x]), labelLimit=220))
        val = alt.Y(f"{y}:Q", title=_label(y), scale=scale, stack=None)
        offset = alt.XOffset if grouped else None
    enc = [cat, val]
    if offset is not None:
        enc.append(offset(f"{color}:N", sort=list(dict.fromkeys(df[color]))))
    base = alt.Chart(df).encode(*enc, color=_color(color, df), tooltip=list(df.columns))
    layers = [base.mark_bar()]
    if labels:
        place = ({"align": "left", "baseline": "middle", "dx": 3} if horizontal
                 else {"baseline": "bottom", "dy": -2})
        big = float(df[y].abs().max()) >= 1000  # SI prefixes for 83K; plain for 0.87, 58.3
        layers.append(base.mark_text(fontSize=10, **place)
                      .encode(text=alt.Text(f"{y}:Q", format=".3~s" if big else ".3~g")))
    if rule is not None:
        axis = "x" if horizontal else "y"
        layers.append(alt.Chart(pd.DataFrame({y: [rule]})).mark_rule(
            strokeDash=[5, 4], color="#555555").encode(**{axis: f"{y}:Q"}))
    return alt.layer(*layers).properties(title=_title(title, subtitle))


def _decades(lo: float, hi: float) -> list[float]:
    return [10.0**e for e in range(math.ceil(math.log10(lo)), math.floor(math.log10(hi)) + 1)]


def roofline_chart(df: pd.DataFrame, intensity: str, performance: str,
                   peak_flops_per_s: float, bandwidth_bytes_per_s: float,
                   label: str | None = None, *, title: str | None = None,
                   subtitle: str | None = None) -> alt.Chart:
    """Log-log roofline: `min(peak, bandwidth * intensity)` plus one point per row of `df`.

    `intensity` is FLOP/byte, `performance` FLOP/s; the ridge point is `peak / bandwidth`.
    """
    import numpy as np

    values = df[intensity].astype(float)
    lo = min(float(values.min()), peak_flops_per_s / bandwidth_bytes_per_s) / 4
    hi = max(float(values.max()), peak_flops_per_s / bandwidth_bytes_per_s) * 4
    grid = np.geomspace(max(lo, 1e-3), hi, 200)
    roof = pd.DataFrame({intensity: grid,
                         performance: np.minimum(peak_flops_per_s,
                                                 bandwidth_bytes_per_s * grid)})
    x = alt.X(f"{intensity}:Q", title="arithmetic intensity (FLOP/byte)",
              scale=alt.Scale(type="log", domain=[float(grid[0]), float(grid[-1])], nice=False),
              axis=alt.Axis(format="~g", values=_decades(grid[0], grid[-1])))
    y = alt.Y(f"{performance}:Q", title="attained (FLOP/s)",
              scale=alt.Scale(type="log"), axis=alt.Axis(format="~s", tickCount=6))
    roof_line = alt.Chart(roof).mark_line(color="#555555", strokeWidth=2).encode(x, y)
    points = alt.Chart(df).mark_point(size=70, filled=True).encode(
        x, y, color=_color(label, df), tooltip=list(df.columns))
    layers = [roof_line, points]
    if label:
        layers.append(alt.Chart(df).mark_text(align="left", dx=7, dy=-6, fontSize=10)
                      .encode(x, y, text=f"{label}:N"))
    return alt.layer(*layers).properties(title=_title(title, subtitle))
