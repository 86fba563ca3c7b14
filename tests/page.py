"""The dashboard's page as the app builds it, read in-process: what every chart plots, no browser.

Tests of what a section says (plotted values against the store, captions, FAILED counts, each
model's deep dive, the deep dive's number boxes) read the page here, through the app's own calls:
``open_store`` and ``RenderedSections`` (the components the server sends, every chart through
``_graphs``, so emulated points are marked) and ``RenderedSections.deep_dive`` (what a model
selector's callback returns). ``Page.figure`` returns what ``ui.figure`` reads from Chromium, in the
same shape, with the drawn counts taken from the data (a bar or marker per finite value, a line per
line trace with two finite points). Whether Chromium really draws every chart, and whether
selectors, number boxes, clicks and reloads work in a browser, is tested once per behaviour
(tests/test_every_chart.py, tests/test_dashboard.py).
"""

from __future__ import annotations

import json
import math

import plotly.io


def _walk(component):
    yield component
    children = getattr(component, "children", None)
    for child in children if isinstance(children, (list, tuple)) else [children]:
        if child is not None and not isinstance(child, (str, int, float)):
            yield from _walk(child)


def _text(component) -> str:
    children = getattr(component, "children", None)
    parts = children if isinstance(children, (list, tuple)) else [children]
    return "".join(str(p) if isinstance(p, (str, int, float)) else _text(p) for p in parts if p is not None)


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) or isinstance(v, str)


def read_figure(fig) -> dict:
    """A plotly figure as ``ui.figure`` returns one from the browser (plain JSON lists)."""
    data = json.loads(plotly.io.to_json(fig))
    traces, bars, points, lines = [], 0, 0, 0
    for t in data.get("data", []):
        kind, x, y = t.get("type", "scatter"), t.get("x"), t.get("y")
        traces.append({"name": t.get("name"), "type": kind, "mode": t.get("mode"), "x": x, "y": y,
                       "customdata": t.get("customdata"), "line": t.get("line")})
        if t.get("visible") is False or x is None or y is None:
            continue
        shown = [1 for a, b in zip(x, y) if _finite(a) and _finite(b)]
        if kind == "bar":
            bars += len(shown)
        elif kind == "scatter":
            mode = t.get("mode") or ("lines+markers" if len(x) < 20 else "lines")
            points += len(shown) if "markers" in mode else 0
            lines += 1 if "lines" in mode and len(shown) >= 2 else 0
    layout = data.get("layout", {})
    return {"traces": traces, "shapes": len(layout.get("shapes", [])),
            "annotations": [a.get("text") for a in layout.get("annotations", [])],
            "bars_drawn": bars, "points_drawn": bars + points, "lines_drawn": lines,
            "title": (layout.get("title") or {}).get("text", "")}


def read_table(fig) -> dict:
    """A plotly table as ``ui.table`` returns one: header, columns, title."""
    data = json.loads(plotly.io.to_json(fig))
    table = data["data"][0]
    return {"header": table["header"]["values"], "columns": table["cells"]["values"],
            "title": (data["layout"].get("title") or {}).get("text", "")}


class Page:
    """The page the app serves for ``uri``. ``select_model`` redraws a deep dive as its selector would."""

    def __init__(self, uri: str):
        from dashboard.app import RenderedSections, open_store
        from dashboard.sections import SECTIONS, deep_dive_defaults

        self.runs = open_store(uri)
        self._rendered = RenderedSections(self.runs)
        self.tree = self._rendered.children()
        self._sections = {s.GROUP: s for s in SECTIONS}
        self._defaults = {g: deep_dive_defaults(s) for g, s in self._sections.items()}
        self._deep: dict[str, list] = {}
        for group in self._sections:                    # each selector's starting value, as the page has it
            selector = self.element(f"{group}-model")
            if selector is not None:
                self.select_model(group, selector.value)

    def select_model(self, group: str, model: str, **controls) -> None:
        """The deep dive for ``model`` with the number boxes at their defaults, or at ``controls``."""
        chosen = {**self._defaults[group], **controls}
        self._deep[group] = self._rendered.deep_dive(self._sections[group], model, chosen)

    def _components(self):
        """Every component of the page: the sections, then each drawn deep dive."""
        for children in [self.tree, *self._deep.values()]:
            yield from _walk(_Holder(children))

    def element(self, element_id: str):
        return next((c for c in self._components() if getattr(c, "id", None) == element_id), None)

    def _graph(self, graph_id: str):
        graph = self.element(graph_id)
        assert graph is not None and hasattr(graph, "figure"), f"no chart {graph_id!r} on the page"
        return graph.figure

    def figure(self, graph_id: str) -> dict:
        return read_figure(self._graph(graph_id))

    def table(self, graph_id: str) -> dict:
        return read_table(self._graph(graph_id))

    def text(self, element_id: str) -> str:
        found = self.element(element_id)
        assert found is not None, f"no element {element_id!r} on the page"
        return _text(found)

    def graph_ids(self) -> list[str]:
        return [c.id for c in self._components() if hasattr(c, "figure")]


class _Holder:
    def __init__(self, children):
        self.children = children
