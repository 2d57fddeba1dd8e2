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
import numpy as np
import pandas as pd

THEME = "servecast"
# Sans fonts in order of preference; DejaVu Sans is the one every Linux box (and CI) has.
FONT = "Helvetica Neue, Helvetica, Arial, DejaVu Sans, sans-serif"
# Okabe-Ito first (distinguishable with the common colour-vision deficiencies, prints well in
# grey), then four muted extras (Tol) so charts with up to 12 series (KV breakdown by layer
# kind) never reuse a colour. Okabe-Ito's yellow comes last: it is faint as a line on white.
PALETTE = ["#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#000000",
           "#999999", "#882255", "#44AA99", "#AA4499", "#F0E442"]
# More series than that: a 20-colour scheme; beyond 20 no colour scale stays legible.
MANY_SERIES_SCHEME = "tableau20"
MAX_SERIES = 20
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


def _title(title: str | None, subtitle: str | Sequence[str] | None) -> alt.TitleParams | str:
    """Chart title; a subtitle given as a list is drawn one line per item."""
    if subtitle:
        subtitle = subtitle if isinstance(subtitle, str) else list(subtitle)
        return alt.TitleParams(text=title or "", subtitle=subtitle)
    return title or ""


def si(value: float, digits: int = 3) -> str:
    """A count for a title: 711,000 -> '711K', 2.91e6 -> '2.91M', 950 -> '950'."""
    value = float(value)
    for factor, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "K")):
        if abs(value) >= factor:
            return f"{value / factor:.{digits}g}{suffix}"
    return f"{value:.{digits}g}"


def titled(chart, title: str | None, subtitle: str | Sequence[str] | None = None):
    """Give a composed chart (`a | b`, `a & b`, a facet) one title and subtitle."""
    return chart.properties(title=_title(title, subtitle))


def _order(df: pd.DataFrame, column: str, order: Sequence[str] | None = None) -> list:
    return list(order) if order is not None else list(dict.fromkeys(df[column]))


def _color(color: str | None, df: pd.DataFrame, title: str | None = None,
           order: Sequence[str] | None = None):
    """A categorical colour per series, never reused: the house palette up to 12 series, a
    20-colour scheme up to 20; more is an error (facet or filter instead)."""
    if color is None:
        return alt.value(PALETTE[0])
    sort = _order(df, color, order)
    if len(sort) > MAX_SERIES:
        raise ValueError(f"{len(sort)} series in {color!r}: more than {MAX_SERIES} colours "
                         "cannot be told apart; facet the chart or filter the series")
    scale = alt.Scale(domain=sort, range=PALETTE[:len(sort)]) if len(sort) <= len(PALETTE) \
        else alt.Scale(domain=sort, scheme=MANY_SERIES_SCHEME)
    return alt.Color(f"{color}:N", title=_label(color) if title is None else title, sort=sort,
                     scale=scale)


def series_color(column: str | None, df: pd.DataFrame, title: str | None = None,
                 order: Sequence[str] | None = None):
    """The house colour encoding for hand-built charts (distinct colours, same legend rules)."""
    return _color(column, df, title, order)


# Units by column suffix (SI names, DESIGN.md conventions), longest match first.
UNITS = {"_tok_s": "tok/s", "_s": "s", "_ms": "ms", "_bytes": "bytes", "_gb": "GB",
         "_gib": "GiB", "_usd_per_mtok": "$/Mtok", "_usd_per_hour": "$/h", "_usd": "$",
         "_usd_per_gpu_hour": "$/GPU-h", "_flops_per_s": "FLOP/s", "_flop_per_s": "FLOP/s",
         "_flop_per_byte": "FLOP/byte", "_bytes_per_s": "B/s", "_per_s": "/s", "_w": "W",
         "_rps": "req/s", "_rps_per_gpu": "req/s per GPU",
         "_tokens_per_s_per_gpu": "tok/s per GPU", "_tokens": "tokens", "_gpus": "GPUs"}
# Whole names with a fixed title.
NAMES = {"tpgs": "TPGS (tok/s per GPU)", "gpus": "GPUs", "hit_rate": "hit rate"}
ACRONYMS = {"p90": "P90", "p50": "P50", "p99": "P99", "ttft": "TTFT", "tpot": "TPOT",
            "hbm": "HBM", "kv": "KV", "gpu": "GPU", "gpus": "GPUs", "tco": "TCO", "api": "API",
            "tpgs": "TPGS", "mfu": "MFU", "pd": "P/D", "ape": "APE", "nvme": "NVMe"}


def _words(text: str) -> str:
    return " ".join(ACRONYMS.get(w, w) for w in text.split("_"))


def _label(column: str) -> str:
    """Axis title from a column name: `p90_interactivity_tok_s` -> `P90 interactivity (tok/s)`."""
    if column in NAMES:
        return NAMES[column]
    for suffix, unit in sorted(UNITS.items(), key=lambda kv: -len(kv[0])):
        if column == suffix[1:]:
            return unit
        if column.endswith(suffix) and len(column) > len(suffix):
            return f"{_words(column[: -len(suffix)])} ({unit})"
    return _words(column)


def _angle(labels: pd.Series) -> int:
    """Horizontal category labels when they are short, slanted when they would collide."""
    return 0 if max((len(str(v)) for v in labels), default=0) <= 6 else -30


def _scale(log: bool, zero: bool = True) -> alt.Scale:
    return alt.Scale(type="log") if log else alt.Scale(zero=zero)


def log_ticks(lo: float, hi: float) -> list[float]:
    """Tick values of a log axis over [lo, hi]: 1-2-5 steps over up to ~2.5 decades, decades
    over up to 7, every other decade beyond, so labels never crowd and gridlines stay sparse."""
    lo, hi = float(lo), float(hi)
    if not (lo > 0 and hi > lo):
        return [lo] if lo > 0 else []
    span = math.log10(hi / lo)
    steps = (1, 2, 5) if span <= 2.5 else (1,)
    stride = 2 if span > 7 else 1
    out = []
    first = math.floor(math.log10(lo)) if len(steps) > 1 else math.ceil(math.log10(lo) - 1e-9)
    for e in range(first, math.ceil(math.log10(hi)) + 1, stride):
        out += [m * 10.0**e for m in steps if lo * (1 - 1e-9) <= m * 10.0**e <= hi * (1 + 1e-9)]
    return out


def _tick_format(ticks: Sequence[float]) -> str:
    """SI prefixes (10k, 1M) for big values; plain numbers when any tick is below 1."""
    return "~g" if not ticks or min(ticks) < 1 else "~s"


def _log_encoding(values: pd.Series, pad: float = 1.25):
    """(scale, axis) of a log axis fitted to the data (no empty decades), ticks from
    `log_ticks`."""
    v = pd.to_numeric(values, errors="coerce")
    v = v[np.isfinite(v) & (v > 0)]
    if v.empty:
        return alt.Scale(type="log"), alt.Axis()
    lo, hi = float(v.min()) / pad, float(v.max()) * pad
    ticks = log_ticks(lo, hi)
    if len(ticks) < 2:  # under one 1-2-5 step: add the neighbouring steps
        ticks = log_ticks(lo / 2.5, hi * 2.5)
        lo, hi = min(lo, ticks[0]), max(hi, ticks[-1])
    return (alt.Scale(type="log", domain=[lo, hi], nice=False),
            alt.Axis(values=ticks, format=_tick_format(ticks)))


def _quantitative(column: str, df: pd.DataFrame, channel, *, log: bool = False,
                  zero: bool = True, title: str | None = None, fmt: str | None = None,
                  values: pd.Series | None = None, **kwargs):
    """An x or y encoding: log axes fitted to the data, linear ones from zero unless not."""
    title = _label(column) if title is None else title
    if log:
        scale, axis = _log_encoding(df[column] if values is None else values)
        if fmt:
            axis = alt.Axis(values=axis.values, format=fmt)
        return channel(f"{column}:Q", title=title, scale=scale, axis=axis, **kwargs)
    axis = alt.Axis(format=fmt) if fmt else alt.Axis()
    return channel(f"{column}:Q", title=title, scale=alt.Scale(zero=zero), axis=axis, **kwargs)


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


def _rule_label(value: float, text: str, axis: str, field: str) -> list[alt.Chart]:
    """A dashed reference line with its meaning written beside it (SLO, ridge, 1.0)."""
    data = pd.DataFrame({field: [value], "text": [text]})
    rule = alt.Chart(data).mark_rule(strokeDash=[5, 4], color="#666666").encode(
        **{axis: f"{field}:Q"})
    if not text:
        return [rule]
    if axis == "x":
        mark = alt.Chart(data).mark_text(align="left", baseline="top", dx=4, fontSize=11,
                                         color="#444444").encode(
            x=f"{field}:Q", y=alt.value(2), text="text:N")
    else:
        mark = alt.Chart(data).mark_text(align="right", baseline="bottom", dy=-3, fontSize=11,
                                         color="#444444").encode(
            y=f"{field}:Q", x=alt.value(WIDTH - 4), text="text:N")
    return [rule, mark]


def pareto_chart(df: pd.DataFrame, x: str, y: str, color: str | None = None, *,
                 title: str | None = None, subtitle: str | Sequence[str] | None = None, log_y: bool = False,
                 front_only: bool = False, x_rule: float | None = None,
                 x_rule_label: str = "", highlight: pd.DataFrame | None = None,
                 highlight_label: str | None = None, x_title: str | None = None,
                 y_title: str | None = None, color_title: str | None = None) -> alt.Chart:
    """Throughput-vs-interactivity style scatter with the Pareto front drawn as a step line.

    All configurations are faint points; the non-dominated ones (larger `x` and larger `y` both
    better) are joined. `x_rule` draws a dashed vertical SLO line (`x_rule_label` beside it);
    `highlight` rows (e.g. the chosen deployment) get a ringed marker and `highlight_label`
    (a column) as text.
    """
    front = pareto_front(df, x, y, color)
    enc_x = _quantitative(x, df, alt.X, title=x_title)
    enc_y = _quantitative(y, df, alt.Y, log=log_y, title=y_title)
    tooltip = list(df.columns)
    colour = _color(color, df, color_title)
    layers = []
    if not front_only:
        layers.append(alt.Chart(df).mark_point(opacity=0.35, filled=True, size=30)
                      .encode(enc_x, enc_y, color=colour, tooltip=tooltip))
    line = alt.Chart(front).mark_line(interpolate="step-after", point=True)
    detail = [alt.Detail(f"{color}:N")] if color else []
    layers.append(line.encode(enc_x, enc_y, *detail, color=colour, tooltip=tooltip))
    if x_rule is not None:
        layers += _rule_label(x_rule, x_rule_label, "x", x)
    if highlight is not None and len(highlight):
        layers.append(alt.Chart(highlight).mark_point(size=260, filled=False, strokeWidth=2.5,
                                                      color=INK).encode(enc_x, enc_y))
        if highlight_label:
            layers.append(alt.Chart(highlight).mark_text(align="left", dx=12, dy=-10,
                                                         fontSize=11, fontWeight="bold")
                          .encode(enc_x, enc_y, text=f"{highlight_label}:N"))
    return alt.layer(*layers).properties(title=_title(title, subtitle))


def line_chart(df: pd.DataFrame, x: str, y: str, color: str | None = None, *,
               title: str | None = None, subtitle: str | Sequence[str] | None = None, log_x: bool = False,
               log_y: bool = False, points: bool = True,
               strokedash: str | None = None, x_title: str | None = None,
               y_title: str | None = None, color_title: str | None = None,
               x_format: str | None = None, y_format: str | None = None,
               zero_y: bool = True, order: Sequence[str] | None = None,
               x_rule: float | None = None, x_rule_label: str = "",
               rules: Sequence[tuple[str, float, str]] = ()) -> alt.Chart:
    """One line per `color` group (e.g. hit rate vs cache capacity, TPGS vs P/D ratio).

    Log axes are fitted to the data; `order` fixes the legend order (e.g. by the last value,
    so the legend reads top to bottom like the lines); `x_rule` draws a labelled dashed line,
    `rules` any number of them as (axis "x" or "y", value, label)."""
    enc = [_quantitative(x, df, alt.X, log=log_x, zero=False, title=x_title, fmt=x_format),
           _quantitative(y, df, alt.Y, log=log_y, zero=zero_y, title=y_title, fmt=y_format)]
    if strokedash:  # the same field as the colour shares its legend (same title and order)
        same = strokedash == color
        enc.append(alt.StrokeDash(  # one legend: the colours name the series
            f"{strokedash}:N", sort=_order(df, strokedash, order if same else None),
            **({"legend": None} if same else {"title": _label(strokedash)})))
    chart = (alt.Chart(df).mark_line(point=points)
             .encode(*enc, color=_color(color, df, color_title, order),
                     tooltip=list(df.columns)))
    lines = [("x", x_rule, x_rule_label)] if x_rule is not None else []
    lines += list(rules)
    if not lines:
        return chart.properties(title=_title(title, subtitle))
    marks = [m for axis, value, text in lines
             for m in _rule_label(value, text, axis, x if axis == "x" else y)]
    return alt.layer(chart, *marks).properties(title=_title(title, subtitle))


def stacked_bar(df: pd.DataFrame, x: str, y: str, color: str, *, title: str | None = None,
                subtitle: str | Sequence[str] | None = None, horizontal: bool = False,
                order: Sequence[str] | None = None, normalize: bool = False,
                totals: bool = False, x_title: str | None = None, y_title: str | None = None,
                color_title: str | None = None, value_format: str = ".3~g",
                y_format: str | None = None) -> alt.Chart:
    """Stacked bars: `x` categories, `y` values stacked by `color` (KV breakdown, cost parts).

    `totals` writes each bar's sum at its end, so a bar too short to see still has a number;
    `order` fixes the stack (and legend) order of the `color` series; `y_format` formats the
    value axis (".0%" by default when normalized)."""
    stack = "normalize" if normalize else "zero"
    value_axis = {"format": y_format or (".0%" if normalize else None)}
    value_axis = {k: v for k, v in value_axis.items() if v}
    cats = list(dict.fromkeys(df[x]))
    if horizontal:
        cat = alt.Y(f"{x}:N", title=_label(x) if x_title is None else x_title, sort=cats,
                    axis=alt.Axis(labelLimit=360, grid=False, ticks=False))
        val = alt.X(f"{y}:Q", title=_label(y) if y_title is None else y_title, stack=stack,
                    axis=alt.Axis(grid=True, **value_axis))
    else:
        cat = alt.X(f"{x}:N", title=_label(x) if x_title is None else x_title, sort=cats,
                    axis=alt.Axis(labelAngle=_angle(df[x])))
        val = alt.Y(f"{y}:Q", title=_label(y) if y_title is None else y_title, stack=stack,
                    axis=alt.Axis(**value_axis))
    sort = _order(df, color, order)
    rank = {name: i for i, name in enumerate(sort)}
    data = df.assign(_stack_order=df[color].map(rank))
    bars = (alt.Chart(data).mark_bar().encode(cat, val, _color(color, df, color_title, sort),
                                              order=alt.Order("_stack_order:Q"),
                                              tooltip=list(df.columns)))
    layers = [bars]
    if totals and not normalize:
        sums = df.groupby(x, sort=False, as_index=False)[y].sum()
        place = ({"align": "left", "baseline": "middle", "dx": 4} if horizontal
                 else {"baseline": "bottom", "dy": -3})
        text = alt.Chart(sums).mark_text(fontSize=11, **place).encode(
            alt.Y(f"{x}:N", sort=cats) if horizontal else alt.X(f"{x}:N", sort=cats),
            alt.X(f"{y}:Q") if horizontal else alt.Y(f"{y}:Q"),
            text=alt.Text(f"{y}:Q", format=value_format))
        layers.append(text)
    return alt.layer(*layers).properties(title=_title(title, subtitle))


def bar_chart(df: pd.DataFrame, x: str, y: str, color: str | None = None, *,
              title: str | None = None, subtitle: str | Sequence[str] | None = None, log_y: bool = False,
              labels: bool = True, horizontal: bool = False,
              rule: float | None = None, rule_label: str = "", x_title: str | None = None,
              y_title: str | None = None, color_title: str | None = None,
              value_format: str | None = None, sort_values: bool = False,
              text: str | None = None) -> alt.LayerChart | alt.Chart:
    """Bars per `x` category, grouped side by side when `color` has several values per
    category (cost comparison, published vs predicted). `horizontal` suits many long labels;
    `rule` draws a dashed reference value (e.g. 1.0 for a ratio); `value_format` formats the
    value labels (d3 format, e.g. ".0%"); `text` labels the bars from a column instead;
    `sort_values` orders categories largest first."""
    order = list(dict.fromkeys(df.sort_values(y, ascending=False)[x] if sort_values else df[x]))
    # Bars on a log axis have no zero to grow from: start them at the 1-2-5 step below the
    # smallest bar, and tick in 1-2-5 steps so every bar end can be read.
    scale, axis_kw = _scale(False), {}
    if log_y:
        positive = df[y][df[y] > 0]
        floor = max(t for t in log_ticks(float(positive.min()) / 10, float(positive.min()))
                    if t <= float(positive.min()) * 0.999)
        ticks = log_ticks(floor, float(positive.max()) * 1.5)
        scale = alt.Scale(type="log", domainMin=floor, domainMax=ticks[-1] * 1.0001
                          if ticks[-1] >= positive.max() else float(positive.max()) * 1.3,
                          nice=False)
        axis_kw = {"values": ticks, "format": _tick_format(ticks)}
    if value_format and value_format.endswith("%") and not log_y:  # shares: the axis too
        axis_kw = {"format": ".0%"}
    if horizontal and labels and not log_y:
        # room at the bar ends for the value labels (they would run into the legend or the
        # category names)
        lo, hi = min(float(df[y].min()), 0.0), max(float(df[y].max()), 0.0)
        pad = 0.22 * (hi - lo)
        scale = alt.Scale(domain=[lo - pad if lo < 0 else 0.0, hi + pad if hi > 0 else 0.0],
                          nice=False)
    grouped = bool(color) and int(df.groupby(x)[color].nunique().max()) > 1
    y_name = _label(y) if y_title is None else y_title
    if horizontal:  # long category labels name themselves; the value axis carries the grid
        cat = alt.Y(f"{x}:N", title=None if x_title is None else x_title, sort=order,
                    axis=alt.Axis(labelLimit=360, grid=False, ticks=False))
        val = alt.X(f"{y}:Q", title=y_name, scale=scale, stack=None,
                    axis=alt.Axis(grid=True, **axis_kw))
        offset = alt.YOffset if grouped else None
    else:
        cat = alt.X(f"{x}:N", title=_label(x) if x_title is None else x_title, sort=order,
                    axis=alt.Axis(labelAngle=_angle(df[x]), labelLimit=220))
        val = alt.Y(f"{y}:Q", title=y_name, scale=scale, stack=None, axis=alt.Axis(**axis_kw))
        offset = alt.XOffset if grouped else None
    enc = [cat, val]
    if offset is not None:
        enc.append(offset(f"{color}:N", sort=list(dict.fromkeys(df[color]))))
    base = alt.Chart(df).encode(*enc, color=_color(color, df, color_title),
                                tooltip=list(df.columns))
    layers = [base.mark_bar()]
    if labels:
        place = ({"align": "left", "baseline": "middle", "dx": 3} if horizontal
                 else {"baseline": "bottom", "dy": -2})
        big = float(df[y].abs().max()) >= 1000  # SI prefixes for 83K; plain for 0.87, 58.3
        fmt = value_format or (".3~s" if big else ".3~g")
        label = alt.Text(f"{text}:N") if text else alt.Text(f"{y}:Q", format=fmt)
        # labels sit beyond each bar's end: right of positive bars, left of negative ones
        field = f"datum[{y!r}]"
        flip = ({"align": "right", "baseline": "middle", "dx": -3} if horizontal
                else {"baseline": "top", "dy": 2})
        layers.append(base.mark_text(fontSize=10, **place).encode(text=label)
                      .transform_filter(f"{field} >= 0"))
        layers.append(base.mark_text(fontSize=10, **flip).encode(text=label)
                      .transform_filter(f"{field} < 0"))
    if rule is not None:
        layers += _rule_label(rule, rule_label, "x" if horizontal else "y", y)
    chart = alt.layer(*layers).properties(title=_title(title, subtitle))
    if grouped:  # one band per bar: keep the whole chart under ~900 px along the categories
        bands = len(order) * int(df[color].nunique())
        step = alt.Step(max(14, min(44 if not horizontal else 28, 900 // max(bands, 1))))
        chart = chart.properties(**({"height": step} if horizontal else {"width": step}))
    return chart


def _decades(lo: float, hi: float) -> list[float]:
    return [10.0**e for e in range(math.ceil(math.log10(lo)), math.floor(math.log10(hi)) + 1)]


def roofline_chart(df: pd.DataFrame, intensity: str, performance: str,
                   peak_flops_per_s: float, bandwidth_bytes_per_s: float,
                   label: str | None = None, *, title: str | None = None,
                   subtitle: str | Sequence[str] | None = None, shape: str | None = None,
                   text: str | None = None, color_title: str | None = None,
                   size: str | None = None, y_title: str = "attained FLOP/s per GPU"
                   ) -> alt.Chart:
    """Log-log roofline: `min(peak, bandwidth * intensity)` plus one point per row of `df`.

    `intensity` is FLOP/byte, `performance` FLOP/s; the ridge point is `peak / bandwidth`,
    marked by a dashed line. Points are coloured by `label` (e.g. the op), shaped by `shape`
    (e.g. prefill / decode), sized by `size` (e.g. share of step time) and annotated with the
    `text` column.
    """
    values = df[intensity].astype(float)
    ridge = peak_flops_per_s / bandwidth_bytes_per_s
    lo = min(float(values.min()), ridge) / 4
    hi = max(float(values.max()), ridge) * 4
    grid = np.geomspace(max(lo, 1e-3), hi, 200)
    roof = pd.DataFrame({intensity: grid,
                         performance: np.minimum(peak_flops_per_s,
                                                 bandwidth_bytes_per_s * grid)})
    x = alt.X(f"{intensity}:Q", title="arithmetic intensity (FLOP/byte)",
              scale=alt.Scale(type="log", domain=[float(grid[0]), float(grid[-1])], nice=False),
              axis=alt.Axis(format="~g", values=_decades(grid[0], grid[-1])))
    y_lo = min(float(df[performance].min()), float(roof[performance].min())) / 2
    y_ticks = log_ticks(y_lo, peak_flops_per_s * 2)
    y = alt.Y(f"{performance}:Q", title=y_title,
              scale=alt.Scale(type="log", domain=[y_lo, peak_flops_per_s * 2], nice=False),
              axis=alt.Axis(format="~s", values=y_ticks))
    roof_line = alt.Chart(roof).mark_line(color="#555555", strokeWidth=2).encode(x, y)
    enc = {"color": _color(label, df, color_title), "tooltip": list(df.columns)}
    if shape:
        enc["shape"] = alt.Shape(f"{shape}:N", title=_label(shape),
                                 scale=alt.Scale(range=["circle", "triangle-up", "square",
                                                        "diamond"]))
    if size:
        enc["size"] = alt.Size(f"{size}:Q", title=_label(size), scale=alt.Scale(range=[40, 400]),
                               legend=None)
    points = alt.Chart(df).mark_point(filled=True, opacity=0.85, size=90).encode(x, y, **enc)
    ridge_df = pd.DataFrame({intensity: [ridge], "text": [f"ridge {ridge:,.0f} FLOP/B"]})
    ridge_rule = alt.Chart(ridge_df).mark_rule(strokeDash=[4, 4], color="#999999").encode(x)
    ridge_text = alt.Chart(ridge_df).mark_text(align="left", dx=4, baseline="bottom", fontSize=11,
                                               color="#555555").encode(
        x, y=alt.value(HEIGHT - 4), text="text:N")
    layers = [roof_line, ridge_rule, ridge_text, points]
    if text:
        layers.append(alt.Chart(df).mark_text(align="left", dx=9, dy=-7, fontSize=10)
                      .encode(x, y, text=f"{text}:N"))
    return alt.layer(*layers).properties(title=_title(title, subtitle))


def pd_sweep_chart(curve: pd.DataFrame, deployments: pd.DataFrame,
                   searched: pd.DataFrame | None = None, matched: pd.DataFrame | None = None, *,
                   x: str = "p_per_d", y: str = "tpgs", color: str = "pair",
                   label: str = "label", title: str | None = None,
                   subtitle: str | Sequence[str] | None = None) -> alt.LayerChart:
    """Stage 2 of the P/D method: TPGS against the P:D instance ratio (log axis).

    `curve`: the continuous two-stage TPGS per plan pair (`color`); `deployments`: the whole
    (x, y) deployments on it, with a `label` (e.g. "2P1D") and a boolean `at_budget` column
    (ringed and labelled: the ones the GPU budget allows); `searched`: the full search's TPGS at
    the same deployments (finite cache, TTFT and SLO checked), as hollow diamonds; `matched`:
    the rate-matched ratio per pair (`x` column), as dashed rules."""
    everything = pd.concat([curve[[x, y]], deployments[[x, y]]])
    enc_x = _quantitative(x, everything, alt.X, log=True,
                          title="P:D ratio (prefill instances per decode instance)")
    enc_y = alt.Y(f"{y}:Q", title=_label(y), scale=alt.Scale(zero=True))
    order = list(dict.fromkeys(curve[color]))
    legend = "plan pair (prefill | decode)"
    colour = _color(color, curve, legend, order)
    layers = [alt.Chart(curve).mark_line(strokeWidth=1.6, opacity=0.8)
              .encode(enc_x, enc_y, colour, detail=f"{color}:N")]
    if matched is not None and len(matched):
        layers.append(alt.Chart(matched).mark_rule(strokeDash=[5, 4], strokeWidth=1.4)
                      .encode(x=f"{x}:Q", color=colour))
    layers.append(alt.Chart(deployments).mark_point(filled=True, size=45, opacity=0.9)
                  .encode(enc_x, enc_y, colour, tooltip=list(deployments.columns)))
    at = deployments[deployments["at_budget"]] if "at_budget" in deployments else deployments
    if len(at):
        layers.append(alt.Chart(at).mark_point(size=230, filled=False, strokeWidth=2.2,
                                               color=INK).encode(enc_x, enc_y))
        layers.append(alt.Chart(at).mark_text(dy=-15, fontSize=11, fontWeight="bold")
                      .encode(enc_x, enc_y, text=f"{label}:N"))
    if searched is not None and len(searched):
        layers.append(alt.Chart(searched.assign(source="full search at the budget"))
                      .mark_point(shape="diamond", filled=False, size=160, strokeWidth=2)
                      .encode(enc_x, enc_y, color=colour,
                              opacity=alt.Opacity("source:N", title=None,
                                                  scale=alt.Scale(range=[1.0])),
                              tooltip=list(searched.columns)))
    return alt.layer(*layers).resolve_scale(color="shared").properties(
        title=_title(title, subtitle))


# Legend groups of model.perf.ops names (`<attention kind>/<ffn kind>:<module>`): exact module names
# first, then substrings, then prefixes.
OP_EXACT = {"attn_decode": "attention (over the KV cache)",
            "attn_prefill": "attention (over the KV cache)",
            "experts": "routed experts", "lm_head": "LM head", "norms": "norms"}
OP_ROUTER_ENDINGS = (".gate", ".router", "shared_expert_gate")
OP_CONTAINS = (("shared_expert", "shared experts"), ("index", "sparse-attention indexer"),
               ("compressor", "KV compressor"), ("linear_attn", "linear-attention projections"))
OP_PREFIX = (("mlp.", "dense MLP"), ("ffn.", "dense MLP"),
             ("self_attn.", "attention projections (QKV, O)"),
             ("attn.", "attention projections (QKV, O)"))


def op_group(op: str, kind: str = "") -> str:
    """The legend group of one op of `StepModel.op_table` (e.g. `mla/moe:mlp.gate` -> router),
    so a roofline names what each point is; unknown ops fall back to their kind."""
    module = op.split(":")[-1]
    if module in OP_EXACT:
        return OP_EXACT[module]
    if module.endswith(OP_ROUTER_ENDINGS):
        return "router"
    for needle, group in OP_CONTAINS:
        if needle in module:
            return group
    for prefix, group in OP_PREFIX:
        if module.startswith(prefix):
            return group
    return kind or module


def declutter(df: pd.DataFrame, x: str, y: str, text: str, priority: str,
              min_decades: float = 0.2) -> pd.Series:
    """Point labels of a log-log chart with the crowded ones blanked: by descending
    `priority`, a label is kept only if no kept label sits within `min_decades` on both axes,
    so coinciding points (e.g. two GEMMs at the same intensity) do not print over each other."""
    lx, ly = np.log10(df[x].astype(float)), np.log10(df[y].astype(float))
    kept: list = []
    out = pd.Series("", index=df.index, dtype=object)
    for i in df[priority].sort_values(ascending=False).index:
        if all(abs(lx[i] - lx[j]) > min_decades or abs(ly[i] - ly[j]) > min_decades
               for j in kept):
            kept.append(i)
            out[i] = df.at[i, text]
    return out
