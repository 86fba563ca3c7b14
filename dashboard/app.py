"""The dashboard: one page, one section per chart group, data read fresh from the tracking store.

    python dashboard/app.py                                   # ./mlflow.db or $MLFLOW_TRACKING_URI
    python dashboard/app.py --tracking-uri http://head:5000 --host 0.0.0.0 --port 8050

This file only lays things out. What a chart shows lives in its section module
(``dashboard/sections/<group>.py``), and data arrives only through ``tracking.runs_frame``, so a chart
leads to one query and from there to the trial that measured it. The layout is a function, so every
page load (and the "Reload data" button) queries the store again: a sweep that is still running
shows up without restarting the server. A section whose group has no finished runs says which
command fills it, and whether that group's trials exist yet.
"""

from __future__ import annotations

import argparse
import sys
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # runnable as a script from anywhere

import dash  # noqa: E402
from dash import Input, Output, State, dcc, html  # noqa: E402

import tracking  # noqa: E402
from dashboard.sections import SECTIONS  # noqa: E402
from trials import groups  # noqa: E402
from dashboard.reader import failed_runs, section_frame  # noqa: E402
from dashboard.sections.common import RUN_ID_FIELD, emulation_note, mark_emulated, real_model_note  # noqa: E402

PAGE_TITLE = "Which inference optimizations actually help?"
MUTED = {"color": "#555", "fontSize": "0.9em"}
WARNING = {"color": "#8a4b00", "background": "#fff4e0", "padding": "0.3em 0.6em", "fontSize": "0.9em"}


def fill_command(group: str) -> str:
    return f"python sweeps/full.py --groups {group}"


def empty_state(group: str, reason: str = "No finished runs yet.") -> html.Div:
    lines = [html.P(reason), html.P(["Fill it with: ", html.Code(fill_command(group))])]
    if not groups.get(group).implemented:
        lines.append(html.P(f"This group's trials are not implemented yet "
                            f"(trials/groups.py declares no search space for {group!r}).", style=MUTED))
    return html.Div(lines, id=f"{group}-empty", className="empty-state",
                    style={"border": "1px dashed #bbb", "padding": "0.5em 1em", "background": "#fafafa"})


def _no_finished(frame) -> bool:
    return frame.empty or ("status" in frame.columns and not (frame["status"] == "FINISHED").any())


def render_section(section, uri: str) -> html.Section:
    header = [html.H2(section.TITLE), html.P(section.BLURB, style=MUTED)]
    try:
        frame = section_frame(section, uri)
    except Exception as exc:  # one broken query must not take the whole page down
        body = [empty_state(section.GROUP, f"Could not read this group: {type(exc).__name__}: {exc}")]
    else:
        charts = section.figures(frame)
        if not charts:
            reason = ("No finished runs yet." if _no_finished(frame)
                      else "Finished runs exist but lack the columns this chart needs.")
            body = [empty_state(section.GROUP, reason)]
        else:
            note, real = emulation_note(frame), real_model_note(frame)
            failed, detail = failed_runs(section, uri)
            body = ([html.P(note, id=f"{section.GROUP}-emulated", style=WARNING)] if note else [])
            body += ([html.P(real, id=f"{section.GROUP}-real-models", style=MUTED)] if real else [])
            body += ([html.P(failed, id=f"{section.GROUP}-failed", title=detail, style=WARNING)] if failed else [])
            body += _graphs(charts)
            text = section.caption(frame) if hasattr(section, "caption") else ""
            if text:
                body.append(html.P(text, id=f"{section.GROUP}-caption", style=MUTED))
            body += deep_dive(section, frame)
    try:
        experiment = tracking.experiment_id(uri, section.GROUP) or ""
    except Exception:
        experiment = ""
    return html.Section(header + body, id=f"section-{section.GROUP}", style={"marginBottom": "2.5em"},
                        **{"data-experiment-id": experiment})


def _graphs(charts) -> list:
    """Every chart goes through here, so every chart marks its emulated-precision points."""
    return [dcc.Graph(id=cid, figure=mark_emulated(fig), config={"displaylogo": False})
            for cid, fig in charts]


def _deep_dive_models(section, frame) -> list[str]:
    if hasattr(section, "deep_dive_models"):
        return list(section.deep_dive_models(frame))
    return sorted(frame["model"].dropna().unique()) if "model" in frame.columns else []


def deep_dive(section, frame) -> list:
    """A section's per-model charts under a model selector (``{group}-model``), if it has them.

    A section opts in by defining ``deep_dive(frame, model) -> [(id, figure)]`` (and optionally
    ``DEEP_DIVE_TITLE`` and ``deep_dive_models(frame)``); the selector re-draws only these charts.
    """
    if not hasattr(section, "deep_dive"):
        return []
    choices = _deep_dive_models(section, frame)
    if not choices:
        return []
    group = section.GROUP
    controls = getattr(section, "DEEP_DIVE_CONTROLS", {})
    inputs = [html.Label([f"{label}: ", dcc.Input(id=f"{group}-{name}", type="number", value=default,
                                                  step=step, debounce=True, style={"width": "6em"})],
                         style={"marginLeft": "1.5em"})
              for name, (label, default, step) in controls.items()]
    defaults = {name: default for name, (_, default, _) in controls.items()}
    return [
        html.H3(getattr(section, "DEEP_DIVE_TITLE", "Per-model deep dive")),
        html.Div([html.Label(["Model: ", dcc.Dropdown(id=f"{group}-model", options=choices, value=choices[0],
                                                      clearable=False, style={"width": "20em"})]), *inputs],
                 style={"display": "flex", "alignItems": "center", "flexWrap": "wrap"}),
        html.Div(_graphs(section.deep_dive(frame, choices[0], **defaults)), id=f"{group}-deep-dive"),
    ]


def render_sections(uri: str) -> list:
    loaded = html.P(f"Store: {uri} · loaded {datetime.now():%Y-%m-%d %H:%M:%S}",
                    id="loaded-at", style=MUTED)
    return [loaded] + [render_section(section, uri) for section in SECTIONS]


DEFAULT_MLFLOW_UI = "http://127.0.0.1:5000"      # where `make mlflow-ui` serves the same store
REFRESH_S = 30.0                                  # how often the page checks the store for new runs


def _signature(uri: str) -> str | None:
    try:
        return tracking.store_signature(uri)
    except Exception:  # a store that went away: keep showing what the page has
        return None


def create_app(tracking_uri: str, mlflow_ui: str = DEFAULT_MLFLOW_UI, refresh_s: float = REFRESH_S) -> dash.Dash:
    # Deep-dive selectors live inside re-rendered sections, so they are not always in the layout.
    app = dash.Dash(__name__, title=PAGE_TITLE, suppress_callback_exceptions=True)

    def layout() -> html.Div:
        return html.Div([
            html.H1(PAGE_TITLE),
            html.P(["Each chart group is one MLflow experiment; each bar, one configuration's most "
                    "recent finished run. Hover a bar to see where its number came from; click it to "
                    "open its run in the MLflow UI at ", html.A(mlflow_ui, href=mlflow_ui, target="_blank"),
                    " (start it with ", html.Code("make mlflow-ui"), ", or give ", html.Code("--mlflow-ui URL"),
                    ")."], style=MUTED),
            html.Div(id="mlflow-ui", hidden=True,
                     **{"data-url": mlflow_ui, "data-run-field": str(RUN_ID_FIELD)}),
            html.Button("Reload data", id="reload", n_clicks=0),
            dcc.Interval(id="refresh", interval=max(1, int(refresh_s * 1000)), disabled=refresh_s <= 0),
            dcc.Store(id="store-signature", data=_signature(tracking_uri)),
            html.Button("Export as one HTML file", id="export", n_clicks=0, style={"marginLeft": "0.5em"},
                        title="every chart and caption in one file that opens offline (dashboard/export.py)"),
            dcc.Download(id="export-download"),
            html.Div(render_sections(tracking_uri), id="sections"),
        ], style={"maxWidth": "1100px", "margin": "0 auto", "padding": "1em",
                  "fontFamily": "system-ui, sans-serif"})

    app.layout = layout

    @app.callback(Output("sections", "children"), Output("store-signature", "data"),
                  Input("reload", "n_clicks"), Input("refresh", "n_intervals"), State("store-signature", "data"),
                  prevent_initial_call=True)
    def reload(_clicks, _ticks, shown):
        """The button re-reads the store; the interval only when its signature changed (a new or
        newly finished run), so a page left open follows a running sweep without flicker."""
        now = _signature(tracking_uri)
        if dash.ctx.triggered_id == "refresh" and (now is None or now == shown):
            return dash.no_update, dash.no_update
        return render_sections(tracking_uri), now

    @app.callback(Output("export-download", "data"), Input("export", "n_clicks"), prevent_initial_call=True)
    def export(_clicks):
        from dashboard.export import export_html

        return {"content": export_html(tracking_uri), "filename": f"inference-report-{datetime.now():%Y%m%d-%H%M}.html"}

    for section in SECTIONS:
        if hasattr(section, "deep_dive"):
            _register_deep_dive(app, section, tracking_uri)
    return app


def _register_deep_dive(app: dash.Dash, section, uri: str) -> None:
    """The model selector, and any ``DEEP_DIVE_CONTROLS`` (numbers passed to ``deep_dive`` by name;
    an emptied box falls back to its default), re-draw the deep dive."""
    controls = getattr(section, "DEEP_DIVE_CONTROLS", {})

    @app.callback(Output(f"{section.GROUP}-deep-dive", "children"),
                  Input(f"{section.GROUP}-model", "value"),
                  *[Input(f"{section.GROUP}-{name}", "value") for name in controls],
                  prevent_initial_call=True)
    def redraw(model, *values):
        chosen = {name: default if value is None else value
                  for (name, (_, default, _)), value in zip(controls.items(), values)}
        return _graphs(section.deep_dive(section_frame(section, uri), model, **chosen))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python dashboard/app.py",
                                     description="Serve the dashboard of the sweeps' results.")
    parser.add_argument("--tracking-uri", default=None,
                        help="MLflow store (default: $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db "
                             "in the working directory)")
    parser.add_argument("--host", default="127.0.0.1", help="interface to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8050)
    parser.add_argument("--mlflow-ui", default=DEFAULT_MLFLOW_UI, metavar="URL",
                        help=f"the MLflow UI a click on a point opens its run in (default {DEFAULT_MLFLOW_UI}, "
                             "where `make mlflow-ui` serves ./mlflow.db)")
    parser.add_argument("--refresh-s", type=float, default=REFRESH_S, metavar="SECONDS",
                        help=f"check the store for new runs this often and redraw when there are "
                             f"(default {REFRESH_S:.0f}; 0: only the Reload button)")
    parser.add_argument("--debug", action="store_true", help="Dash debug mode (reloader, dev tools)")
    args = parser.parse_args(argv)
    try:
        uri = tracking.reachable_uri(args.tracking_uri)
    except tracking.TrackingError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"Dashboard of {uri} on http://{args.host}:{args.port}/", flush=True)
    create_app(uri, args.mlflow_ui, args.refresh_s).run(host=args.host, port=args.port, debug=args.debug)
    return 0


if __name__ == "__main__":
    sys.exit(main())
