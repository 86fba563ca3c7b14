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
import math
import re
import socket
import sys
import threading
from datetime import datetime
from html import escape, unescape
from urllib.parse import urlsplit

import dash
from dash import Input, Output, State, dcc, html

import tracking
from dashboard import compare
from dashboard.reader import deep_dive as draw_deep_dive
from dashboard.reader import failed_runs, open_store, section_frame, shown, unmeasured_note
from dashboard.sections import all_sections, deep_dive_choices, deep_dive_defaults
from dashboard.sections.common import (RUN_ID_FIELD, TextBeside, emulation_note, mark_emulated, neighbour_note,
                                      real_model_note)
from dashboard.sections.readable import readable
from trials import groups
from trials.errors import one_line_errors
from trials.redaction import one_line, redact
from trials.redaction import shown as shown_value

PAGE_TITLE = "Which inference optimizations actually help?"
MUTED = {"color": "#555", "fontSize": "0.9em"}
WARNING = {"color": "#8a4b00", "background": "#fff4e0", "padding": "0.3em 0.6em", "fontSize": "0.9em"}


def fill_command(group: str) -> str:
    return f"python sweeps/full.py --groups {group}"


def bind_warning(host: str) -> str | None:
    """The line to print when ``--host`` lets other machines reach the dashboard, which has no login;
    None for a loopback address."""
    import ipaddress

    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:            # a host name: it may stand for any interface
        loopback = False
    if loopback:
        return None
    return (f"warning: --host {host} makes the dashboard reachable from other machines, and it has no "
            "login; the default 127.0.0.1 with an SSH tunnel keeps it private")


def check_port_free(host: str, port: int) -> None:
    """``OSError`` (one line) when the dashboard could not listen on ``host:port``, before the store
    is read (seconds, at 10,000 runs) rather than after."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)   # as the server itself binds
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise OSError(f"cannot listen on {host}:{port} ({exc.strerror or exc}): is another dashboard "
                          f"running? Choose another with --port") from None


def empty_state(group: str, reason: str = "No finished runs yet.") -> html.Div:
    lines = [html.P(reason), html.P(["Fill it with: ", html.Code(fill_command(group))])]
    if not groups.get(group).implemented:
        lines.append(html.P(f"This group's trials are not implemented yet "
                            f"(trials/groups.py declares no search space for {group!r}).", style=MUTED))
    return html.Div(lines, id=f"{group}-empty", className="empty-state",
                    style={"border": "1px dashed #bbb", "padding": "0.5em 1em", "background": "#fafafa"})


def _no_finished(frame) -> bool:
    return frame.empty or ("status" in frame.columns and not (frame["status"] == "FINISHED").any())


def render_section(section, runs: tracking.RunsCache) -> html.Section:
    header = [html.H2(section.TITLE), html.P(section.BLURB, style=MUTED)]
    try:
        frame = section_frame(section, runs)
    except Exception as exc:  # one broken query must not take the whole page down
        body = [empty_state(section.GROUP, one_line(f"Could not read this group: {type(exc).__name__}: {exc}"))]
    else:
        charts = section.figures(frame)
        if not charts:
            reason = ("No finished runs yet." if _no_finished(frame)
                      else "Finished runs exist but lack the columns this chart needs.")
            body = [empty_state(section.GROUP, reason)]
        else:
            note, real = emulation_note(frame), real_model_note(frame)
            failed, detail = failed_runs(section, runs)
            body = ([html.P(note, id=f"{section.GROUP}-emulated", style=WARNING)] if note else [])
            if noisy := neighbour_note(frame):
                body.append(html.P(noisy, id=f"{section.GROUP}-noisy-neighbour", style=WARNING))
            body += ([html.P(real, id=f"{section.GROUP}-real-models", style=MUTED)] if real else [])
            body += ([html.P(failed, id=f"{section.GROUP}-failed", title=detail, style=WARNING)] if failed else [])
            if left_out := unmeasured_note(section, runs):
                body.append(html.P(left_out, id=f"{section.GROUP}-unmeasured", style=WARNING))
            body += _graphs(charts)
            text = section.caption(frame) if hasattr(section, "caption") else ""
            if text:
                body.append(html.P(text, id=f"{section.GROUP}-caption", style=MUTED))
            body += deep_dive(section, frame)
    experiment = runs.experiment_id(section.GROUP) or ""
    return html.Section(header + body, id=f"section-{section.GROUP}", style={"marginBottom": "2.5em"},
                        **{"data-experiment-id": experiment})


def _graphs(charts) -> list:
    """Every chart goes through here, so every chart marks its emulated-precision points and is made
    readable (``sections.readable``: log axes where values span over 10x, labels that fit); a section's
    text beside its charts (``TextBeside``) becomes lines and folds with copy buttons."""
    return [text_beside(cid, item) if isinstance(item, TextBeside) else
            dcc.Graph(id=cid, figure=readable(mark_emulated(item)), config={"displaylogo": False})
            for cid, item in charts]


def text_beside(cid: str, text: TextBeside) -> html.Div:
    """Lines, then each fold as html.Details whose blocks carry a copy button (dcc.Clipboard)."""
    folds = [html.Details([html.Summary(summary), *[
        html.Div([html.Div([label, dcc.Clipboard(content=unescape(block), title=f"copy: {label}",
                                                 style={"display": "inline-block", "marginLeft": "0.5em"})],
                           style=MUTED),
                  html.Pre(unescape(block), style={"whiteSpace": "pre-wrap", "margin": "0.2em 0 0.6em",
                                                   "background": "#f6f8fa", "padding": "0.4em"})])
        for label, block in blocks]], id=f"{cid}-fold-{i}") for i, (summary, blocks) in enumerate(text.folds)]
    return html.Div([html.Ul([html.Li(unescape(line)) for line in text.lines], style=MUTED), *folds], id=cid)


def deep_dive(section, frame) -> list:
    """A section's per-model charts under a model selector (``{group}-model``), if it has them.

    A section opts in by defining ``deep_dive(frame, model) -> [(id, figure or TextBeside)]`` (and optionally
    ``DEEP_DIVE_TITLE`` and ``deep_dive_models(frame)``); the selector re-draws only these charts.
    """
    if not hasattr(section, "deep_dive"):
        return []
    choices = deep_dive_choices(section, frame)
    if not choices:
        return []
    group = section.GROUP
    controls = getattr(section, "DEEP_DIVE_CONTROLS", {})
    inputs = [html.Label([f"{label}: ", dcc.Input(id=f"{group}-{name}", type="number", value=default,
                                                  step=step, debounce=True, style={"width": "6em"})],
                         style={"marginLeft": "1.5em"})
              for name, (label, default, step) in controls.items()]
    return [
        html.H3(getattr(section, "DEEP_DIVE_TITLE", "Per-model deep dive")),
        html.Div([html.Label(["Model: ", dcc.Dropdown(id=f"{group}-model", options=choices, value=choices[0],
                                                      clearable=False, style={"width": "20em"})]), *inputs],
                 style={"display": "flex", "alignItems": "center", "flexWrap": "wrap"}),
        html.Div(id=f"{group}-deep-dive"),      # drawn by its callback once the page is up: the charts
        # above it come first
    ]


def page_graphs(runs: tracking.RunsCache) -> dict[str, dict]:
    """Per section with charts: the ids of its charts, of its deep dive's charts (the first model, the
    controls at their defaults) and the deep dive's models, from the same section code the page runs
    (tests and benchmarks use it to know what the page must draw)."""
    out = {}
    for section in all_sections():
        frame = section_frame(section, runs)
        charts = [cid for cid, _ in section.figures(frame)]
        if not charts:
            continue
        models = deep_dive_choices(section, frame) if hasattr(section, "deep_dive") else []
        defaults = deep_dive_defaults(section)
        deep = [cid for cid, item in draw_deep_dive(section, runs, models[0], defaults)
                if not isinstance(item, TextBeside)] if models else []
        out[section.GROUP] = {"charts": charts, "deep_dive": deep, "models": list(models)}
    return out


def render_sections(runs: tracking.RunsCache) -> list:
    loaded = html.P(f"Store: {redact(runs.uri)} · {runs.count()} runs · read {datetime.now():%Y-%m-%d %H:%M:%S}",
                    id="loaded-at", style=MUTED)
    return [loaded] + [render_section(section, runs) for section in all_sections()]


DEFAULT_MLFLOW_UI = "http://127.0.0.1:5000"      # where `make mlflow-ui` serves the same store
REFRESH_S = 30.0                                  # how often the page checks the store for new runs
MAX_REFRESH_S = 86_400.0                          # a day; a browser fires a longer interval at once


def _port(text: str) -> int:
    """``--port``: 1 to 65535 (0, "any free port", would leave the printed address wrong)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{value} is not a port; use 1 to 65535")
    return value


def _refresh_seconds(text: str) -> float:
    """``--refresh-s``: 0 (only the Reload button), or 1 s to a day."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (value == 0 or 1 <= value <= MAX_REFRESH_S):        # also nan and inf
        raise argparse.ArgumentTypeError(f"{text!r} is not a refresh period; use 0 (only the Reload button) "
                                          f"or 1 to {MAX_REFRESH_S:.0f} seconds")
    return value


def _web_url(text: str) -> str:
    """``--mlflow-ui``: an http:// or https:// URL with a host, the only kinds the page may link to
    (never javascript:, data: or file:)."""
    parts = urlsplit(text)
    if parts.scheme.lower() not in ("http", "https") or not parts.netloc or text != text.strip():
        raise argparse.ArgumentTypeError(f"{shown_value(text)} is not an http:// or https:// URL")
    return text


class RenderedSections:
    """Every section drawn once per version of the store's tables: page loads in between (and other
    browsers) get the same components without building a figure again. Each model's deep dive (at
    the controls' defaults) is drawn too, in the background, so a model selector answers from memory;
    other control values are drawn on demand and kept until the store changes."""

    def __init__(self, runs: tracking.RunsCache):
        self.runs, self._lock = runs, threading.Lock()
        self._version, self._children = None, None
        self._deep_dives: dict[tuple, list] = {}

    def children(self) -> list:
        with self._lock:
            if self._version != self.runs.version:
                self._version, self._children = self.runs.version, render_sections(self.runs)
                self._deep_dives = {}
                threading.Thread(target=self._draw_deep_dives, args=(self._version,), daemon=True).start()
            return self._children

    def deep_dive(self, section, model, chosen: dict) -> list:
        key = (section.GROUP, model, tuple(sorted(chosen.items())))
        graphs = self._deep_dives.get(key)
        if graphs is None:
            graphs = _graphs(draw_deep_dive(section, self.runs, model, chosen))
            self._deep_dives[key] = graphs
        return graphs

    def _draw_deep_dives(self, version) -> None:
        for section in all_sections():
            if not hasattr(section, "deep_dive"):
                continue
            defaults = deep_dive_defaults(section)
            try:
                for model in deep_dive_choices(section, section_frame(section, self.runs)):
                    if self._version != version:          # the store changed: that drawing starts over
                        return
                    self.deep_dive(section, model, defaults)
            except Exception:  # the selector then draws on demand, and shows the error there
                continue


def live_line(uri: str) -> str:
    """The running sweep's line (``tracking.live``), empty when no sweep writes this store now."""
    return tracking.describe_live(tracking.read_live(uri))


def _refresh(runs: tracking.RunsCache, full: bool = False) -> None:
    try:
        runs.refresh(full=full)
    except Exception as exc:  # a store that went away: keep showing what the page has
        print(f"warning: could not read {redact(runs.uri)}: {type(exc).__name__}: {one_line(exc)}", file=sys.stderr, flush=True)


def deferred_line(uri: str) -> str:
    """What the store's latest sweep left to the next run (``sweeps.deferral``: its budget could not
    hold every trial), per group with its estimated minutes, and the command that runs it; empty when
    it deferred nothing."""
    try:
        records = tracking.sweep_records(uri)
    except Exception:        # a store that went away: the page shows what it has
        return ""
    deferred = (records[0].get("deferred") or {}) if records else {}
    if not isinstance(deferred, dict) or not deferred:
        return ""
    parts = [f"{group} {d.get('trials', 0)} (~{float(d.get('minutes', 0)):.0f} min)" for group, d in deferred.items()
             if isinstance(d, dict)]
    total = sum(int(d.get("trials", 0)) for d in deferred.values() if isinstance(d, dict))
    return (f"Sweep {records[0].get('sweep_id', '?')} deferred {total} trial(s) to the next run, its budget being "
            f"spent: {', '.join(parts)}. The same command again (make run for the main job) runs them, or a "
            "larger --budget; the charts below lack those points until then.")


def create_app(tracking_uri: str, mlflow_ui: str = DEFAULT_MLFLOW_UI, refresh_s: float = REFRESH_S,
               runs: tracking.RunsCache | None = None) -> dash.Dash:
    """``runs``: the store already read (``open_store``); read here otherwise."""
    # Deep-dive selectors live inside re-rendered sections, so they are not always in the layout.
    app = dash.Dash(__name__, title=PAGE_TITLE, suppress_callback_exceptions=True)
    runs = runs or open_store(tracking_uri)
    sections = RenderedSections(runs)
    sections.children()         # drawn before the first visitor, who then waits only for the browser

    def layout() -> html.Div:
        _refresh(runs)          # only the runs that ended since the last read: cheap, and never stale
        running_now = live_line(runs.uri)
        deferred_now = deferred_line(runs.uri)
        return html.Div([
            html.H1(PAGE_TITLE),
            html.P(["Each chart group is one MLflow experiment; each bar, one configuration's most "
                    "recent finished run. Hover a bar to see where its number came from; shift-click it "
                    "for the trial's generated texts; click it to open its run in the MLflow UI at ", html.A(mlflow_ui, href=mlflow_ui, target="_blank"),
                    " (start it with ", html.Code("make mlflow-ui"), ", or give ", html.Code("--mlflow-ui URL"),
                    ")."], style=MUTED),
            html.Div(id="mlflow-ui", hidden=True,
                     **{"data-url": mlflow_ui, "data-run-field": str(RUN_ID_FIELD)}),
            html.Button("Reload data", id="reload", n_clicks=0,
                        title="read the whole store again (the page also picks up new runs on its own)"),
            dcc.Interval(id="refresh", interval=max(1, int(refresh_s * 1000)), disabled=refresh_s <= 0),
            html.P(running_now, id="live", style=WARNING, hidden=not running_now),
            html.P(deferred_now, id="deferred", style=MUTED, hidden=not deferred_now),
            dcc.Store(id="store-version", data=runs.version),
            html.Button("Export as one HTML file", id="export", n_clicks=0, style={"marginLeft": "0.5em"},
                        title="every chart and caption in one file that opens offline (dashboard/export.py)"),
            dcc.Download(id="export-download"),
            html.Div(sections.children(), id="sections"),
            compare_panel(),
        ], style={"maxWidth": "1100px", "margin": "0 auto", "padding": "1em",
                  "fontFamily": "system-ui, sans-serif"})

    app.layout = layout

    @app.callback(Output("live", "children"), Output("live", "hidden"), Input("refresh", "n_intervals"),
                  prevent_initial_call=True)
    def live(_ticks):
        """What the sweep writing this store runs now (``tracking.live``), on every refresh tick."""
        text = live_line(runs.uri)
        return text, not text

    @app.callback(Output("sections", "children"), Output("store-version", "data"),
                  Input("reload", "n_clicks"), Input("refresh", "n_intervals"), State("store-version", "data"),
                  prevent_initial_call=True)
    def reload(_clicks, _ticks, shown):
        """The button reads the whole store again; the interval reads only the runs that ended since,
        and redraws only when there were some, so a page left open follows a running sweep without
        flicker."""
        _refresh(runs, full=dash.ctx.triggered_id == "reload")
        if dash.ctx.triggered_id == "refresh" and runs.version == shown:
            return dash.no_update, dash.no_update
        return sections.children(), runs.version

    @app.callback(Output("export-download", "data"), Input("export", "n_clicks"), prevent_initial_call=True)
    def export(_clicks):
        from dashboard.export import export_html

        return {"content": export_html(runs), "filename": f"inference-report-{datetime.now():%Y%m%d-%H%M}.html"}

    for section in all_sections():
        if hasattr(section, "deep_dive"):
            _register_deep_dive(app, section, sections)
    _register_compare(app, runs)

    @app.server.route("/run/<run_id>")
    def run_texts(run_id: str):
        return run_texts_page(runs, run_id, mlflow_ui)
    return app


def _register_deep_dive(app: dash.Dash, section, sections: RenderedSections) -> None:
    """The model selector, and any ``DEEP_DIVE_CONTROLS`` (numbers passed to ``deep_dive`` by name;
    an emptied box falls back to its default), re-draw the deep dive."""
    controls = getattr(section, "DEEP_DIVE_CONTROLS", {})

    @app.callback(Output(f"{section.GROUP}-deep-dive", "children"),
                  Input(f"{section.GROUP}-model", "value"),
                  *[Input(f"{section.GROUP}-{name}", "value") for name in controls])
    def redraw(model, *values):
        chosen = {name: default if value is None else value
                  for (name, (_, default, _)), value in zip(controls.items(), values)}
        return sections.deep_dive(section, model, chosen)


RUN_ID = re.compile(r"[0-9a-f]{32}")


def run_texts_page(runs: tracking.RunsCache, run_id: str, mlflow_ui: str) -> tuple[str, int]:
    """(HTML, status) of one trial's generated texts, from its trial.json; every text escaped."""
    if not RUN_ID.fullmatch(run_id):
        return "<p>Not a run id.</p>", 404
    try:
        trial = tracking.read_trial_artifact(runs.uri, run_id)
    except tracking.TrackingError as exc:  # no artifact, a corrupt one, or a run of another store
        return f"<p>{escape(str(exc))}</p>", 404
    config = trial.get("config") if isinstance(trial.get("config"), dict) else {}
    raw = trial.get("raw") if isinstance(trial.get("raw"), dict) else {}
    outputs = [o for o in (raw.get("outputs") or []) if isinstance(o, dict)]
    rows = "".join(f"<tr><td><code>{escape(str(o.get('prompt_id', '?')))}</code></td>"
                   f"<td><pre style='white-space:pre-wrap;margin:0'>{escape(str(o.get('text', '')))}</pre></td></tr>"
                   for o in outputs)
    experiment = runs.experiment_id(str(config.get("group", ""))) or ""
    link = f"{mlflow_ui.rstrip('/')}/#/experiments/{experiment}/runs/{run_id}"
    title = f"{config.get('group', '?')} · {config.get('model', '?')} · run {run_id}"
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{escape(title)}</title></head>"
            "<body style='font-family:system-ui,sans-serif;max-width:1100px;margin:0 auto;padding:1em'>"
            f"<h1>{escape(title)}</h1><p>Status {escape(str(trial.get('status', '?')))} · config_hash "
            f"<code>{escape(str(trial.get('config_hash', '?')))}</code> · "
            f"<a href='{escape(link)}'>open the run in MLflow</a></p>"
            f"<h2>Generated texts ({len(outputs)}, first timed repeat)</h2>"
            f"<table border='1' cellpadding='4' style='border-collapse:collapse'>"
            f"<tr><th>prompt</th><th>generated</th></tr>{rows}</table></body></html>"), 200


def compare_panel() -> html.Section:
    """Two sweeps side by side (``dashboard/compare.py``), below the chart groups."""
    return html.Section([
        html.H2("Compare two sweeps"),
        html.P("Per chart group, each configuration that ran in both: B / A of the chosen metric, whiskers "
               "from the two runs' 95 % intervals over repeats; red where the intervals do not overlap "
               "(a change beyond the measured noise), grey where they do, light grey where a run has "
               "no interval.", style=MUTED),
        html.Div([
            dcc.RadioItems(id="compare-by", options=list(compare.BY), value="sweep", inline=True),
            dcc.RadioItems(id="compare-metric", value="tok_per_s", inline=True, style={"marginLeft": "2em"},
                           options=[{"label": f"{label} ({unit})", "value": name}
                                    for name, (label, unit, _) in compare.METRICS.items()]),
        ], style={"display": "flex", "flexWrap": "wrap"}),
        html.Label(["A: ", dcc.Dropdown(id="compare-a", clearable=False, style={"width": "48em"})]),
        html.Label(["B: ", dcc.Dropdown(id="compare-b", clearable=False, style={"width": "48em"})]),
        html.Div(id="compare-charts"),
    ], id="section-compare", style={"marginBottom": "2em"})


def _compare_frames(runs: tracking.RunsCache) -> dict:
    return {section.GROUP: shown(runs.frame(section.GROUP, "FINISHED")) for section in all_sections()}


def _register_compare(app: dash.Dash, runs: tracking.RunsCache) -> None:
    @app.callback(Output("compare-a", "options"), Output("compare-b", "options"),
                  Output("compare-a", "value"), Output("compare-b", "value"),
                  Input("compare-by", "value"), Input("store-version", "data"),
                  State("compare-a", "value"), State("compare-b", "value"))
    def choices(by, _version, a, b):
        """Every sweep (commit, machine) with finished runs, newest first; B defaults to the newest
        and A to the one before it."""
        options = [{"label": s["label"], "value": s["value"]} for s in compare.sides(_compare_frames(runs), by)]
        values = [o["value"] for o in options]
        if dash.ctx.triggered_id == "compare-by" or a not in values or b not in values:
            b = values[0] if values else None
            a = values[1] if len(values) > 1 else b
        return options, options, a, b

    @app.callback(Output("compare-charts", "children"),
                  Input("compare-a", "value"), Input("compare-b", "value"), Input("compare-metric", "value"),
                  State("compare-by", "value"))
    def draw(a, b, metric, by):
        if not a or not b:
            return html.P("No finished runs to compare yet.", style=MUTED)
        if a == b:
            return html.P("Choose two different sweeps.", style=MUTED)
        out = []
        for group, frame in _compare_frames(runs).items():
            table = compare.compare(frame, by, a, b, metric)
            if table.empty:
                out.append(html.P(f"{group}: no configuration ran in both.", id=f"compare-{group}-none", style=MUTED))
            else:
                out.append(dcc.Graph(id=f"compare-{group}", figure=compare.figure(table, group, metric, a, b),
                                     config={"displaylogo": False}))
        return out


@one_line_errors("llm-dashboard")
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python dashboard/app.py",
                                     description="Serve the dashboard of the sweeps' results.")
    parser.add_argument("--tracking-uri", default=None,
                        help="MLflow store (default: $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db "
                             "in the working directory)")
    parser.add_argument("--host", default="127.0.0.1", help="interface to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=_port, default=8050, help="port to listen on, 1 to 65535 (default 8050)")
    parser.add_argument("--mlflow-ui", type=_web_url, default=DEFAULT_MLFLOW_UI, metavar="URL",
                        help=f"the MLflow UI a click on a point opens its run in (default {DEFAULT_MLFLOW_UI}, "
                             "where `make mlflow-ui` serves ./mlflow.db)")
    parser.add_argument("--refresh-s", type=_refresh_seconds, default=REFRESH_S, metavar="SECONDS",
                        help=f"check the store for new runs this often and redraw when there are "
                             f"(default {REFRESH_S:.0f}; 0: only the Reload button)")
    parser.add_argument("--debug", action="store_true", help="Dash debug mode (reloader, dev tools)")
    args = parser.parse_args(argv)
    if warning := bind_warning(args.host):
        print(warning, file=sys.stderr)
    try:
        uri = tracking.reachable_uri(args.tracking_uri, must_exist=True)
        check_port_free(args.host, args.port)
    except (tracking.TrackingError, OSError) as exc:
        print(f"error: {one_line(exc)}", file=sys.stderr)
        return 2
    print(f"Reading {redact(uri)} ...", flush=True)
    runs = open_store(uri)
    print(f"Read {runs.count()} runs in {runs.last_read_s:.1f} s. Dashboard on http://{args.host}:{args.port}/",
          flush=True)
    create_app(uri, args.mlflow_ui, args.refresh_s, runs=runs).run(host=args.host, port=args.port, debug=args.debug)
    return 0


if __name__ == "__main__":
    sys.exit(main())
