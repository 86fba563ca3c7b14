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
from dash import Input, Output, dcc, html  # noqa: E402

import tracking  # noqa: E402
from dashboard.sections import SECTIONS  # noqa: E402

PAGE_TITLE = "Which inference optimizations actually help?"
MUTED = {"color": "#555", "fontSize": "0.9em"}


def fill_command(group: str) -> str:
    return f"python sweeps/full.py --groups {group}"


def _implemented_groups() -> set[str]:
    from sweeps.spaces import SPACES

    return set(SPACES)


def empty_state(group: str, reason: str = "No finished runs yet.") -> html.Div:
    lines = [html.P(reason), html.P(["Fill it with: ", html.Code(fill_command(group))])]
    if group not in _implemented_groups():
        lines.append(html.P(f"This group's trials are not implemented yet "
                            f"(sweeps/spaces.py has no search space for {group!r}).", style=MUTED))
    return html.Div(lines, id=f"{group}-empty", className="empty-state",
                    style={"border": "1px dashed #bbb", "padding": "0.5em 1em", "background": "#fafafa"})


def render_section(section, uri: str) -> html.Section:
    header = [html.H2(section.TITLE), html.P(section.BLURB, style=MUTED)]
    try:
        frame = tracking.runs_frame(uri, section.GROUP)
    except Exception as exc:  # one broken query must not take the whole page down
        body = [empty_state(section.GROUP, f"Could not read this group: {type(exc).__name__}: {exc}")]
    else:
        charts = section.figures(frame)
        if not charts:
            reason = ("No finished runs yet." if frame.empty
                      else "Finished runs exist but lack the columns this chart needs.")
            body = [empty_state(section.GROUP, reason)]
        else:
            body = [dcc.Graph(id=cid, figure=fig, config={"displaylogo": False}) for cid, fig in charts]
            text = section.caption(frame) if hasattr(section, "caption") else ""
            if text:
                body.append(html.P(text, id=f"{section.GROUP}-caption", style=MUTED))
    return html.Section(header + body, id=f"section-{section.GROUP}",
                        style={"marginBottom": "2.5em"})


def render_sections(uri: str) -> list:
    loaded = html.P(f"Store: {uri} · loaded {datetime.now():%Y-%m-%d %H:%M:%S}",
                    id="loaded-at", style=MUTED)
    return [loaded] + [render_section(section, uri) for section in SECTIONS]


def create_app(tracking_uri: str) -> dash.Dash:
    app = dash.Dash(__name__, title=PAGE_TITLE)

    def layout() -> html.Div:
        return html.Div([
            html.H1(PAGE_TITLE),
            html.P("Each chart group is one MLflow experiment; each bar, one configuration's most "
                   "recent finished run. Hover a bar to see where its number came from.", style=MUTED),
            html.Button("Reload data", id="reload", n_clicks=0),
            html.Div(render_sections(tracking_uri), id="sections"),
        ], style={"maxWidth": "1100px", "margin": "0 auto", "padding": "1em",
                  "fontFamily": "system-ui, sans-serif"})

    app.layout = layout

    @app.callback(Output("sections", "children"), Input("reload", "n_clicks"),
                  prevent_initial_call=True)
    def reload(_clicks):
        return render_sections(tracking_uri)

    return app


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python dashboard/app.py",
                                     description="Serve the dashboard of the sweeps' results.")
    parser.add_argument("--tracking-uri", default=None,
                        help="MLflow store (default: $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db "
                             "in the working directory)")
    parser.add_argument("--host", default="127.0.0.1", help="interface to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8050)
    parser.add_argument("--debug", action="store_true", help="Dash debug mode (reloader, dev tools)")
    args = parser.parse_args(argv)
    try:
        uri = tracking.resolve_uri(args.tracking_uri)
        tracking.check_reachable(uri)
    except tracking.TrackingError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"Dashboard of {uri} on http://{args.host}:{args.port}/", flush=True)
    create_app(uri).run(host=args.host, port=args.port, debug=args.debug)
    return 0


if __name__ == "__main__":
    sys.exit(main())
