"""The house look of every figure: the altair `servecast` theme, colours, axis titles from column
names, log axes, titles, and figure files.

Importing this module registers and enables the theme, so every notebook's figures share one
look. `save(chart, path_stem)` writes `<stem>.png` and `<stem>.svg` through vl-convert, each
atomically (temporary file + rename), so an interrupted batch never leaves half a figure. The
figure builders are in model.frontends.charts.
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
    import vl_convert  # heavy: only when a figure is written

    stem = Path(path_stem)
    if stem.suffix.lower() in {".png", ".svg"}:
        stem = stem.with_suffix("")
    spec = chart.to_dict()  # the enabled theme is merged in here
    png = stem.with_name(stem.name + ".png")
    svg = stem.with_name(stem.name + ".svg")
    _atomic_bytes(png, vl_convert.vegalite_to_png(spec, scale=PNG_SCALE))
    _atomic_bytes(svg, vl_convert.vegalite_to_svg(spec).encode())
    return [png, svg]


def title_params(title: str | None, subtitle: str | Sequence[str] | None) -> alt.TitleParams | str:
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
    return chart.properties(title=title_params(title, subtitle))


def series_order(df: pd.DataFrame, column: str, order: Sequence[str] | None = None) -> list:
    return list(order) if order is not None else list(dict.fromkeys(df[column]))


def color_encoding(color: str | None, df: pd.DataFrame, title: str | None = None,
           order: Sequence[str] | None = None):
    """A categorical colour per series, never reused: the house palette up to 12 series, a
    20-colour scheme up to 20; more is an error (facet or filter instead)."""
    if color is None:
        return alt.value(PALETTE[0])
    sort = series_order(df, color, order)
    if len(sort) > MAX_SERIES:
        raise ValueError(f"{len(sort)} series in {color!r}: more than {MAX_SERIES} colours "
                         "cannot be told apart; facet the chart or filter the series")
    scale = alt.Scale(domain=sort, range=PALETTE[:len(sort)]) if len(sort) <= len(PALETTE) \
        else alt.Scale(domain=sort, scheme=MANY_SERIES_SCHEME)
    return alt.Color(f"{color}:N", title=axis_title(color) if title is None else title, sort=sort,
                     scale=scale)


def series_color(column: str | None, df: pd.DataFrame, title: str | None = None,
                 order: Sequence[str] | None = None):
    """The house colour encoding for hand-built charts (distinct colours, same legend rules)."""
    return color_encoding(column, df, title, order)


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


def axis_title(column: str) -> str:
    """Axis title from a column name: `p90_interactivity_tok_s` -> `P90 interactivity (tok/s)`."""
    if column in NAMES:
        return NAMES[column]
    for suffix, unit in sorted(UNITS.items(), key=lambda kv: -len(kv[0])):
        if column == suffix[1:]:
            return unit
        if column.endswith(suffix) and len(column) > len(suffix):
            return f"{_words(column[: -len(suffix)])} ({unit})"
    return _words(column)


def label_angle(labels: pd.Series) -> int:
    """Horizontal category labels when they are short, slanted when they would collide."""
    return 0 if max((len(str(v)) for v in labels), default=0) <= 6 else -30


def scale_for(log: bool, zero: bool = True) -> alt.Scale:
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


def tick_format(ticks: Sequence[float]) -> str:
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
            alt.Axis(values=ticks, format=tick_format(ticks)))


def quantitative(column: str, df: pd.DataFrame, channel, *, log: bool = False,
                  zero: bool = True, title: str | None = None, fmt: str | None = None,
                  values: pd.Series | None = None, **kwargs):
    """An x or y encoding: log axes fitted to the data, linear ones from zero unless not."""
    title = axis_title(column) if title is None else title
    if log:
        scale, axis = _log_encoding(df[column] if values is None else values)
        if fmt:
            axis = alt.Axis(values=axis.values, format=fmt)
        return channel(f"{column}:Q", title=title, scale=scale, axis=axis, **kwargs)
    axis = alt.Axis(format=fmt) if fmt else alt.Axis()
    return channel(f"{column}:Q", title=title, scale=alt.Scale(zero=zero), axis=axis, **kwargs)
