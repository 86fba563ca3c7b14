"""The dashboard as ONE self-contained HTML file: every section's charts and captions, opened offline.

    python dashboard/export.py --tracking-uri sqlite:///mlflow.db --out report.html

For a team without access to the store: the file holds plotly.js itself (no CDN, no server, no
network), each section's notes (emulated precisions, real models' weights), its charts (emulated
points marked as on the page), its caption, and every model's deep dive (with the deep-dive
controls at their defaults) under a fold per model. The dashboard's "Export as one HTML file"
button writes the same file. Data comes through the same section modules and ``tracking`` queries
as the page, so the file shows what the page shows at the moment it was written.
"""

from __future__ import annotations

import argparse
import html
import sys
from datetime import datetime
from pathlib import Path

import plotly.offline

import tracking
from dashboard.reader import deep_dive, failed_runs, open_store, section_frame, unmeasured_note
from dashboard.sections import all_sections, deep_dive_choices, deep_dive_defaults
from dashboard.sections.common import TextBeside, emulation_note, mark_emulated, neighbour_note, real_model_note
from dashboard.sections.readable import readable
from trials.errors import one_line_errors
from trials.redaction import one_line, redact

TITLE = "Which inference optimizations actually help?"
STYLE = """
body { max-width: 1100px; margin: 0 auto; padding: 1em; font-family: system-ui, sans-serif; }
.muted { color: #555; font-size: 0.9em; }
.warning { color: #8a4b00; background: #fff4e0; padding: 0.3em 0.6em; font-size: 0.9em; }
.empty { border: 1px dashed #bbb; padding: 0.5em 1em; background: #fafafa; }
section { margin-bottom: 2.5em; }
"""


def _figure(fig) -> str:
    if isinstance(fig, TextBeside):
        return _text_beside(fig)
    return readable(mark_emulated(fig)).to_html(full_html=False, include_plotlyjs=False,
                                      config={"displaylogo": False, "responsive": True})


def _text_beside(text: TextBeside) -> str:
    """A section's text beside its charts: its lines, then each fold as <details>. Texts from the
    frame come escaped, the section's own words not: unescaped, then escaped once."""
    def safe(value: str) -> str:
        return html.escape(html.unescape(value), quote=False)

    lines = "".join(f"<li>{safe(line)}</li>" for line in text.lines)
    folds = "".join(f"<details><summary>{safe(summary)}</summary>"
                    + "".join(f"<p class='muted'>{safe(label)}</p><pre>{safe(block)}</pre>" for label, block in blocks)
                    + "</details>" for summary, blocks in text.folds)
    return f"<ul class='muted'>{lines}</ul>{folds}"


def _section(section, runs: tracking.RunsCache) -> str:
    parts = [f"<h2>{html.escape(section.TITLE)}</h2>", f"<p class='muted'>{html.escape(section.BLURB)}</p>"]
    try:
        frame = section_frame(section, runs)
        charts = section.figures(frame)
    except Exception as exc:  # one broken group must not lose the others
        return "".join(parts) + f"<p class='empty'>Could not read this group: {html.escape(one_line(f'{type(exc).__name__}: {exc}'))}</p>"
    if not charts:
        parts.append(f"<p class='empty'>No finished runs yet. Fill it with: "
                     f"<code>python sweeps/full.py --groups {html.escape(section.GROUP)}</code></p>")
        return "".join(parts)
    failed, _ = failed_runs(section, runs)
    for note, kind in ((emulation_note(frame), "warning"), (neighbour_note(frame), "warning"),
                       (real_model_note(frame), "muted"), (failed, "warning"),
                       (unmeasured_note(section, runs), "warning")):
        if note:
            parts.append(f"<p class='{kind}'>{html.escape(note)}</p>")
    parts += [_figure(fig) for _, fig in charts]
    caption = section.caption(frame) if hasattr(section, "caption") else ""
    if caption:
        parts.append(f"<p class='muted'>{html.escape(caption)}</p>")
    if hasattr(section, "deep_dive"):
        models = deep_dive_choices(section, frame)
        defaults = deep_dive_defaults(section)
        if models:
            parts.append(f"<h3>{html.escape(getattr(section, 'DEEP_DIVE_TITLE', 'Per-model deep dive'))}</h3>")
        for i, model in enumerate(models):
            figures = "".join(_figure(fig) for _, fig in deep_dive(section, runs, model, defaults))
            setting = ", ".join(f"{k} {v}" for k, v in defaults.items())
            parts.append(f"<details{' open' if i == 0 else ''}><summary>{html.escape(str(model))}"
                         f"{html.escape(f' ({setting})' if setting else '')}</summary>{figures}</details>")
    return "".join(parts)


def export_html(runs: tracking.RunsCache | str) -> str:
    """The whole page as one HTML document, plotly.js inlined; ``runs``: the store read, or its URI."""
    runs = open_store(runs) if isinstance(runs, str) else runs
    uri = runs.uri
    body = "".join(f"<section id='section-{html.escape(s.GROUP)}'>{_section(s, runs)}</section>" for s in all_sections())
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(TITLE)}</title>"
            f"<style>{STYLE}</style><script type='text/javascript'>{plotly.offline.get_plotlyjs()}</script>"
            f"</head><body><h1>{html.escape(TITLE)}</h1>"
            f"<p class='muted'>Exported from {html.escape(redact(uri))} at {datetime.now():%Y-%m-%d %H:%M:%S}. Each chart "
            "group is one MLflow experiment; each bar, one configuration's most recent finished run; "
            "hover a bar to see where its number came from.</p>"
            f"{body}</body></html>")


@one_line_errors("llm-export")
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python dashboard/export.py",
                                     description="Write the dashboard as one self-contained HTML file "
                                                 "that opens offline (plotly.js inlined, no CDN).")
    parser.add_argument("--tracking-uri", default=None,
                        help="MLflow store (default: $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db here)")
    parser.add_argument("--out", default="report.html", help="the HTML file to write (default: report.html)")
    args = parser.parse_args(argv)
    try:
        uri = tracking.reachable_uri(args.tracking_uri, must_exist=True)
    except tracking.TrackingError as exc:
        print(f"error: {one_line(exc)}", file=sys.stderr)
        return 2
    out = Path(args.out)
    try:
        out.write_text(export_html(uri), encoding="utf-8")
    except OSError as exc:
        print(f"error: cannot write {out}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    print(f"wrote {out} ({out.stat().st_size / 1e6:.1f} MB) from {redact(uri)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
