"""Charts that stay readable when values span orders of magnitude: applied to every chart the page
draws (``dashboard.app._graphs``, the export), like the emulated-precision marks.

* ``log_where_wide``: an axis whose plotted values span more than ``LOG_SPAN`` (10x) is logarithmic;
  on a linear one the smallest bars and points are a pixel tall or sit in one pile at the edge, too
  small to see or to click. Zero-height bars draw nothing either way and do not count; a point at 0
  or below keeps the axis linear (a log axis cannot show it). Stacked bars keep theirs (their
  positions are sums).
* ``whiskers_within_reason``: an interval far wider than the values (two repeats on a busy machine
  can give a 95 % interval of billions of tok/s) would squeeze every point into one pixel: the axis
  then spans the values, and a note says that whiskers run past it.
* ``labels_that_fit``: a point's text label is drawn only where it collides with no other label or
  marker (above the point, else below, right or left of it); the others stay in the hover.
* ``magnitude_groups``: which models a chart of all of them should draw in separate panels, each
  panel holding models within 10x of each other (the zoo's thousands of tok/s beside real models' tens).

Positions are estimated from the layout (the figure's height and margins, the page's width), not
read from a browser: a label kept may still touch another by a few pixels, never by a whole label.
"""

from __future__ import annotations

import math
import re

import plotly.graph_objects as go

LOG_SPAN = 10.0
PAGE_WIDTH_PX = 1060                   # the page's column (app.py: maxWidth 1100 px, less its padding)
LEGEND_PX = 150
CHAR_PX, LINE_PX = 7.0, 15.0           # a label's glyph width and line height at plotly's 12 px font
POSITIONS = ("top center", "bottom center", "middle right", "middle left")
AXIS = re.compile(r"^[xy]axis\d*$")


def readable(figure: go.Figure) -> go.Figure:
    """``log_where_wide``, ``whiskers_within_reason``, then ``labels_that_fit`` (a label's room
    depends on the axis type and range)."""
    log_where_wide(figure)
    whiskers_within_reason(figure)
    labels_that_fit(figure)
    return figure


def _axis_key(trace, letter: str) -> str:
    ref = getattr(trace, f"{letter}axis", None) or letter
    return f"{letter}axis{ref[1:]}"


def _numbers(values) -> list[float] | None:
    """Finite numbers of ``values``; None when any is text (a category axis)."""
    out = []
    for v in values if values is not None else ():
        if isinstance(v, str):
            return None
        if v is not None and isinstance(v, (int, float)) and math.isfinite(v):
            out.append(float(v))
    return out


def plotted(figure: go.Figure) -> dict[str, list[float] | None]:
    """Per axis (``xaxis``, ``yaxis2``, ...): the values its traces plot there; None: not a numeric
    axis that may turn logarithmic (text values, stacked bars, a point at 0 or below)."""
    stacked = figure.layout.barmode in ("stack", "relative")
    found: dict[str, list[float] | None] = {}
    for trace in figure.data:
        if trace.type not in ("bar", "scatter") or trace.visible is False:
            continue
        value_axis = "x" if trace.type == "bar" and trace.orientation == "h" else "y"
        for letter in ("x", "y"):
            key = _axis_key(trace, letter)
            numbers = _numbers(getattr(trace, letter))
            if trace.type == "bar" and letter == value_axis:
                numbers = None if stacked or numbers is None else [v for v in numbers if v != 0]
            if numbers is None or any(v <= 0 for v in numbers) or found.get(key, []) is None:
                found[key] = None
            else:
                found[key] = found.get(key, []) + numbers
    return found


def _shared(figure: go.Figure, found: dict[str, list[float] | None]) -> dict[str, list[float] | None]:
    """``found`` with axes that match another (shared axes of subplots) holding the values of all:
    matched axes must have one type."""
    def root(key: str) -> str:
        matches = figure.layout[key].matches
        return f"{matches[0]}axis{matches[1:]}" if matches else key

    pooled: dict[str, list[float] | None] = {}
    for key, values in found.items():
        now = pooled.get(root(key), [])
        pooled[root(key)] = None if values is None or now is None else now + values
    return {key: pooled[root(key)] for key in found}


def log_where_wide(figure: go.Figure) -> go.Figure:
    """Every numeric axis whose positive values span more than ``LOG_SPAN``: logarithmic, its title
    saying so; annotations placed on it move to its log coordinates; a range cut at the top (wild
    whiskers) is kept, from just below the smallest value."""
    for key, values in _shared(figure, plotted(figure)).items():
        axis = figure.layout[key]
        if not values or axis.type in ("log", "category", "multicategory", "date"):
            continue
        low, high = min(values), max(values)
        if high / low <= LOG_SPAN:
            continue
        title = axis.title.text or ""
        axis.type = "log"
        if title and "log" not in title:
            axis.title.text = f"{title} (log scale)"
        if axis.range is not None:
            top = math.log10(max(float(axis.range[1]), high))
            axis.range = [math.log10(low) - 0.05 * (top - math.log10(low)), top]
        ref = key[0] + key[5:]
        for annotation in figure.layout.annotations:
            position = getattr(annotation, ref[0])
            if getattr(annotation, f"{ref[0]}ref") == ref and isinstance(position, (int, float)) and position > 0:
                setattr(annotation, ref[0], math.log10(position))
    return figure


# ------------------------------------------------------------------------------ whiskers

WILD_WHISKER = 3.0          # a whisker reaching past this many times the values' span is cut
CUT_NOTE = "whiskers cut at the chart's edge: an interval wider than the chart (few repeats, noisy timings)"


def _whiskers(figure: go.Figure) -> dict[str, list[float]]:
    """Per axis: where each error bar ends (value + its whisker, value - its whisker)."""
    ends: dict[str, list[float]] = {}
    for trace in figure.data:
        if trace.type not in ("bar", "scatter") or trace.visible is False:
            continue
        for letter in ("x", "y"):
            error, values = getattr(trace, f"error_{letter}", None), _numbers(getattr(trace, letter))
            if error is None or error.array is None or not values or len(values) != len(getattr(trace, letter)):
                continue
            minus = error.arrayminus if error.arrayminus is not None and not error.symmetric else error.array
            found = ends.setdefault(_axis_key(trace, letter), [])
            found += [v + float(e) for v, e in zip(values, error.array) if e is not None]
            found += [v - float(e) for v, e in zip(values, minus) if e is not None]
    return ends


def _bar_bases(figure: go.Figure) -> set[str]:
    """The axes bars grow along (a vertical bar's y axis): their range must hold the bars' base, 0."""
    return {_axis_key(t, "x" if t.orientation == "h" else "y") for t in figure.data
            if t.type == "bar" and t.visible is not False}


def whiskers_within_reason(figure: go.Figure) -> go.Figure:
    """Each axis without a range of its own whose whiskers reach past ``WILD_WHISKER`` times its
    values' span (in its scale): the range of its values, padded, and ``CUT_NOTE`` once. A linear axis
    that bars grow along keeps 0 in its range: a bar cut at its base would draw a difference as a ratio
    (and its shape would reach out of the chart, where a pointer meets other elements)."""
    values, bases = _axis_values(figure), _bar_bases(figure)
    for key in bases:
        if key in values and figure.layout[key].type != "log":
            values[key] = [*values[key], 0.0]
    cut = False
    for key, ends in _whiskers(figure).items():
        axis, found = figure.layout[key], values.get(key)
        if axis.type == "log":
            found = [v for v in found or () if v > 0]
        if not found or axis.range is not None or axis.type in ("category", "multicategory", "date"):
            continue
        scale = (lambda v: math.log10(v)) if axis.type == "log" else (lambda v: v)
        low, high = scale(min(found)), scale(max(found))
        span = high - low or (1.0 if axis.type == "log" else abs(high) or 1.0)
        reach = [scale(e) for e in ends if axis.type != "log" or e > 0]
        if reach and max(max(reach) - high, low - min(reach)) > WILD_WHISKER * span:
            floor = 0.0 if key in bases and axis.type != "log" and low >= 0 else low - 0.1 * span
            axis.range = [floor, high + 0.1 * span]        # bars of positive values stand on the axis
            cut = True
    title = figure.layout.title.text or ""
    if cut and CUT_NOTE not in title:
        note = f"<span style='color:#a33'>{CUT_NOTE}</span>"
        if title.endswith("</sup>"):            # one line of notes under the title, not two
            figure.update_layout(title_text=f"{title[:-len('</sup>')]} · {note}</sup>")
        else:
            figure.update_layout(title_text=f"{title}<br><sup>{note}</sup>",
                                 margin_t=max(figure.layout.margin.t or 0, 60) + 20)
    return figure


# ------------------------------------------------------------------------------ labels

class _Frame:
    """An axis's mapping from data to pixels of the plot area (y grows downwards), from the layout."""

    def __init__(self, axis, values: list[float], total_px: float, vertical: bool):
        self.log, self.total, self.vertical = axis.type == "log", total_px, vertical
        self.domain = tuple(axis.domain or (0, 1))
        if axis.range is not None:
            self.low, self.high = (float(v) for v in axis.range)
        else:
            scaled = [self._scale(v) for v in values if not self.log or v > 0] or [0.0, 1.0]
            low, high = min(scaled), max(scaled)
            pad = 0.06 * (high - low) if high > low else 1.0
            self.low, self.high = low - pad, high + pad

    def _scale(self, v: float) -> float:
        return math.log10(v) if self.log else v

    def _at(self, share: float) -> float:
        where = self.domain[0] + share * (self.domain[1] - self.domain[0])
        return self.total * (1 - where if self.vertical else where)

    def px(self, v: float) -> float | None:
        if self.log and v <= 0:
            return None
        return self._at((self._scale(v) - self.low) / (self.high - self.low))

    def extent(self) -> tuple[float, float]:
        return tuple(sorted((self._at(0.0), self._at(1.0))))


def _axis_values(figure: go.Figure) -> dict[str, list[float]]:
    """Per axis: every finite number its bars and scatters plot there (none on a category axis)."""
    values: dict[str, list[float]] = {}
    for trace in figure.data:
        if trace.type in ("bar", "scatter") and trace.visible is not False:
            for letter in ("x", "y"):
                values.setdefault(_axis_key(trace, letter), []).extend(_numbers(getattr(trace, letter)) or [])
    return values


def _frames(figure: go.Figure) -> dict[str, _Frame]:
    layout = figure.layout
    margin = layout.margin
    legend = LEGEND_PX if layout.showlegend is not False and len(figure.data) > 1 else 0
    width = (layout.width or PAGE_WIDTH_PX) - (margin.l or 80) - (margin.r or 80) - legend
    height = (layout.height or 450) - (margin.t or 100) - (margin.b or 80)
    return {key: _Frame(layout[key], found, width if key[0] == "x" else height, key[0] == "y")
            for key, found in _axis_values(figure).items()
            if found and layout[key].type not in ("category", "multicategory")}


def _overlaps(a, b) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def _label_box(x: float, y: float, text: str, radius: float, position: str) -> tuple[float, float, float, float]:
    """The pixels a label at plotly's ``position`` ("top center", "middle right", ...) covers."""
    lines = text.split("<br>")
    w, h = CHAR_PX * max(len(re.sub(r"<[^>]+>", "", line)) for line in lines), LINE_PX * len(lines)
    vertical, horizontal = position.split()
    gap = radius + 2
    side = gap if vertical == "middle" else 0
    left = {"center": x - w / 2, "right": x + side, "left": x - side - w}[horizontal]
    top = {"top": y - gap - h, "bottom": y + gap, "middle": y - h / 2}[vertical]
    return left, top, left + w, top + h


def labels_that_fit(figure: go.Figure) -> go.Figure:
    """On every scatter with text labels: each label at its own position, else the first of
    ``POSITIONS``, where it collides with no label kept before it and no other point's marker (a ring
    drawn around the point itself only pushes it out), inside its panel; where none fits, no label
    (its text stays in the hover)."""
    frames = _frames(figure)
    markers: list[tuple[float, float, float]] = []      # (x px, y px, radius) of every drawn marker
    placed = []                     # (trace, [(x px, y px) or None per point], its panel's box)
    for trace in figure.data:
        if trace.type != "scatter" or trace.visible is False:
            continue
        fx, fy = frames.get(_axis_key(trace, "x")), frames.get(_axis_key(trace, "y"))
        xs, ys = _numbers(trace.x), _numbers(trace.y)
        if fx is None or fy is None or xs is None or ys is None or len(xs) != len(trace.x) or len(ys) != len(trace.y):
            continue
        size = trace.marker.size if isinstance(trace.marker.size, (int, float)) else 6
        points = [(fx.px(x), fy.px(y)) for x, y in zip(xs, ys)]
        points = [None if px is None or py is None else (px, py) for px, py in points]
        if "markers" in (trace.mode or ""):
            markers += [(px, py, size / 2) for px, py in filter(None, points)]
        if "text" in (trace.mode or "") and trace.text is not None and not isinstance(trace.text, str):
            (left, right), (top, bottom) = fx.extent(), fy.extent()
            placed.append((trace, points, (left, top, right, bottom)))
    kept = []
    for trace, points, panel in placed:
        templates, positions = [], []
        own = trace.textposition if isinstance(trace.textposition, str) else POSITIONS[0]
        for point, text in zip(points, trace.text):
            where = None
            if point is not None and text:
                here = [m for m in markers if abs(m[0] - point[0]) < 1 and abs(m[1] - point[1]) < 1]
                others = [(x - r, y - r, x + r, y + r) for x, y, r in markers if (x, y, r) not in here]
                radius = max((r for _, _, r in here), default=3)
                for position in (own, *(p for p in POSITIONS if p != own)):
                    box = _label_box(*point, str(text), radius, position)
                    inside = panel[0] <= box[0] and box[2] <= panel[2] and panel[1] <= box[1] and box[3] <= panel[3]
                    if inside and not any(_overlaps(box, other) for other in kept + others):
                        where = position
                        kept.append(box)
                        break
            templates.append("%{text}" if where else "")
            positions.append(where or own)
        trace.texttemplate, trace.textposition = templates, positions
    return figure


# ------------------------------------------------------------------------------ facets

def magnitude_groups(values: dict[str, float]) -> list[list[str]]:
    """Names (models) grouped by the magnitude of their ``values`` (e.g. median tok/s), smallest
    first: a group holds names within ``LOG_SPAN`` of its smallest; one group when all are."""
    groups: list[list[str]] = []
    start = None
    for name, value in sorted(values.items(), key=lambda kv: kv[1]):
        if groups and start is not None and value <= LOG_SPAN * start:
            groups[-1].append(name)
        else:
            groups.append([name])
            start = value if value > 0 else None
    return groups
