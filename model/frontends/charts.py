"""Reusable chart builders: tidy DataFrame in, chart out, no computation (Pareto fronts, lines,
stacked and grouped bars, rooflines, P/D sweeps). The house look (theme, colours, axis titles,
log axes, `save`) is model.frontends.theme, whose notebook-facing names this module re-exports.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import altair as alt
import numpy as np
import pandas as pd

from model.frontends.theme import (
    HEIGHT,
    INK,
    MANY_SERIES_SCHEME,
    PALETTE,
    THEME,
    WIDTH,
    axis_title,
    color_encoding,
    label_angle,
    log_ticks,
    quantitative,
    save,
    scale_for,
    series_color,
    series_order,
    si,
    tick_format,
    title_params,
    titled,
)

__all__ = [  # the builders, and the theme's names notebooks reach through this module
    "MANY_SERIES_SCHEME", "PALETTE", "THEME", "bar_chart", "declutter", "line_chart", "log_ticks",
    "op_group", "pareto_chart", "pareto_front", "pd_sweep_chart", "roofline_chart", "save",
    "series_color", "si", "stacked_bar", "titled"]


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
    enc_x = quantitative(x, df, alt.X, title=x_title)
    enc_y = quantitative(y, df, alt.Y, log=log_y, title=y_title)
    tooltip = list(df.columns)
    colour = color_encoding(color, df, color_title)
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
    return alt.layer(*layers).properties(title=title_params(title, subtitle))


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
    enc = [quantitative(x, df, alt.X, log=log_x, zero=False, title=x_title, fmt=x_format),
           quantitative(y, df, alt.Y, log=log_y, zero=zero_y, title=y_title, fmt=y_format)]
    if strokedash:  # the same field as the colour shares its legend (same title and order)
        same = strokedash == color
        enc.append(alt.StrokeDash(  # one legend: the colours name the series
            f"{strokedash}:N", sort=series_order(df, strokedash, order if same else None),
            **({"legend": None} if same else {"title": axis_title(strokedash)})))
    chart = (alt.Chart(df).mark_line(point=points)
             .encode(*enc, color=color_encoding(color, df, color_title, order),
                     tooltip=list(df.columns)))
    lines = [("x", x_rule, x_rule_label)] if x_rule is not None else []
    lines += list(rules)
    if not lines:
        return chart.properties(title=title_params(title, subtitle))
    marks = [m for axis, value, text in lines
             for m in _rule_label(value, text, axis, x if axis == "x" else y)]
    return alt.layer(chart, *marks).properties(title=title_params(title, subtitle))


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
        cat = alt.Y(f"{x}:N", title=axis_title(x) if x_title is None else x_title, sort=cats,
                    axis=alt.Axis(labelLimit=360, grid=False, ticks=False))
        val = alt.X(f"{y}:Q", title=axis_title(y) if y_title is None else y_title, stack=stack,
                    axis=alt.Axis(grid=True, **value_axis))
    else:
        cat = alt.X(f"{x}:N", title=axis_title(x) if x_title is None else x_title, sort=cats,
                    axis=alt.Axis(labelAngle=label_angle(df[x])))
        val = alt.Y(f"{y}:Q", title=axis_title(y) if y_title is None else y_title, stack=stack,
                    axis=alt.Axis(**value_axis))
    sort = series_order(df, color, order)
    rank = {name: i for i, name in enumerate(sort)}
    data = df.assign(_stack_order=df[color].map(rank))
    bars = (alt.Chart(data).mark_bar().encode(cat, val, color_encoding(color, df, color_title, sort),
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
    return alt.layer(*layers).properties(title=title_params(title, subtitle))


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
    scale, axis_kw = scale_for(False), {}
    if log_y:
        positive = df[y][df[y] > 0]
        floor = max(t for t in log_ticks(float(positive.min()) / 10, float(positive.min()))
                    if t <= float(positive.min()) * 0.999)
        ticks = log_ticks(floor, float(positive.max()) * 1.5)
        scale = alt.Scale(type="log", domainMin=floor, domainMax=ticks[-1] * 1.0001
                          if ticks[-1] >= positive.max() else float(positive.max()) * 1.3,
                          nice=False)
        axis_kw = {"values": ticks, "format": tick_format(ticks)}
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
    y_name = axis_title(y) if y_title is None else y_title
    if horizontal:  # long category labels name themselves; the value axis carries the grid
        cat = alt.Y(f"{x}:N", title=None if x_title is None else x_title, sort=order,
                    axis=alt.Axis(labelLimit=360, grid=False, ticks=False))
        val = alt.X(f"{y}:Q", title=y_name, scale=scale, stack=None,
                    axis=alt.Axis(grid=True, **axis_kw))
        offset = alt.YOffset if grouped else None
    else:
        cat = alt.X(f"{x}:N", title=axis_title(x) if x_title is None else x_title, sort=order,
                    axis=alt.Axis(labelAngle=label_angle(df[x]), labelLimit=220))
        val = alt.Y(f"{y}:Q", title=y_name, scale=scale, stack=None, axis=alt.Axis(**axis_kw))
        offset = alt.XOffset if grouped else None
    enc = [cat, val]
    if offset is not None:
        enc.append(offset(f"{color}:N", sort=list(dict.fromkeys(df[color]))))
    base = alt.Chart(df).encode(*enc, color=color_encoding(color, df, color_title),
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
    chart = alt.layer(*layers).properties(title=title_params(title, subtitle))
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
    enc = {"color": color_encoding(label, df, color_title), "tooltip": list(df.columns)}
    if shape:
        enc["shape"] = alt.Shape(f"{shape}:N", title=axis_title(shape),
                                 scale=alt.Scale(range=["circle", "triangle-up", "square",
                                                        "diamond"]))
    if size:
        enc["size"] = alt.Size(f"{size}:Q", title=axis_title(size), scale=alt.Scale(range=[40, 400]),
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
    return alt.layer(*layers).properties(title=title_params(title, subtitle))


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
    enc_x = quantitative(x, everything, alt.X, log=True,
                          title="P:D ratio (prefill instances per decode instance)")
    enc_y = alt.Y(f"{y}:Q", title=axis_title(y), scale=alt.Scale(zero=True))
    order = list(dict.fromkeys(curve[color]))
    legend = "plan pair (prefill | decode)"
    colour = color_encoding(color, curve, legend, order)
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
        title=title_params(title, subtitle))


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
