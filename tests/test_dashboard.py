"""The dashboard as a user sees it: the real app in a subprocess, a real store, headless Chromium.

The populated test logs real trials of the tiny zoo into a sqlite store, starts
``python dashboard/app.py`` from another working directory, and reads the Plotly figure back out of
the page: what the browser plotted must be exactly what the store holds (latest run per model and
precision), with each bar traceable to its run. Logging a rerun while the server is up and pressing
"Reload data" must show the new number without a restart. Empty groups must name the command that
fills them.

The emulated-precision marks are checked without a browser: runs logged through the real tracking
API with hand-written tags (one bf16 run tagged ``precision_native`` False, as on an AVX2-only CPU),
the section rendered as the app renders it (``render_section``), its figure and note read back.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

import tracking
from dashboard.sections import SECTIONS
from trials.config import Stack, TrialConfig, Workload
from trials import groups
from trials.loop import TrialResult

from conftest import QUICK_SWEEP_GROUPS  # noqa: E402
import ui  # noqa: E402
from ui import APP, needs_browser, serve  # noqa: E402
from ui import figure as _figure, text as _text  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402


def _expected_bars(uri: str) -> dict[tuple[str, str], tuple[float, str]]:
    """(model, precision) -> (tok_per_s, config_hash) of the most recent finished run."""
    frame = tracking.runs_frame(uri, "baseline").sort_values("start_time")
    return {(row.model, row.precision): (row.tok_per_s, row["tags.config_hash"])
            for _, row in frame.iterrows()}


def _plotted_bars(figure: dict) -> dict[tuple[str, str], tuple[float, str]]:
    bars = {}
    for trace in figure["traces"]:
        assert trace["type"] == "bar"
        for model, y, custom in zip(trace["x"], trace["y"], trace["customdata"]):
            bars[(model, trace["name"])] = (y, custom[5])
    return bars


def _assert_hover_says_where_the_number_came_from(driver, uri: str) -> None:
    text = ui.hover_until(driver, ui.tallest("#baseline-throughput .barlayer .point path"), lambda d: d.execute_script(
        "const h = document.querySelector('#baseline-throughput .hoverlayer .hovertext');"
        "return h && h.textContent"))
    frame = tracking.runs_frame(uri, "baseline")
    for needle in ("ttft_s", "tpot_s", "peak memory", frame["tags.env.device_name"].iloc[0],
                   frame["tags.env.cpu_capability"].iloc[0], frame["tags.env.git_sha"].iloc[0][:12]):
        assert needle in text, (needle, text)
    assert any(h in text for h in frame["tags.config_hash"]), text


def _assert_empty_states(read_text, names) -> None:
    """``read_text(element id)``: the page's text of an element (the browser's, or tests/page.py's)."""
    for group in names:
        text = read_text(f"{group}-empty")
        assert f"python sweeps/full.py --groups {group}" in text
        assert ("not implemented yet" in text) == (not groups.get(group).implemented), text


def _trial(model: str, precision: str):
    from trials.run import run_trial

    return run_trial(TrialConfig(group="baseline", model=model, stack=Stack(precision=precision),
                                 workload=Workload("mixed", 1, 8), repeats=2))


@pytest.fixture(scope="module")
def baseline_store(tmp_path_factory, tiny_zoo) -> str:
    """Four baseline runs; tests that log reruns into it compare with the store as it is then."""
    uri = tracking.resolve_uri(f"sqlite:///{tmp_path_factory.mktemp('baseline')}/mlflow.db")
    tracking.prepare_store(uri)
    for model in ("tiny-gqa", "tiny-mha"):
        for precision in ("fp32", "bf16"):
            tracking.log_trial(uri, _trial(model, precision))
    return uri


@needs_browser
def test_baseline_chart_plots_the_store_reloads_follows_new_runs_and_opens_them(baseline_store, browser,
                                                                                tmp_path):
    """The chart is the store; Reload re-reads it; an open page picks up a new run on its own
    (``--refresh-s``); a click on a bar opens that bar's run in the MLflow UI."""
    with serve(baseline_store, tmp_path, "--refresh-s", "1") as url:
        browser.get(url)
        assert "inference optimizations" in browser.title
        figure = _figure(browser, "baseline-throughput")
        assert sorted(t["name"] for t in figure["traces"]) == ["bf16", "fp32"]
        for trace in figure["traces"]:
            assert sorted(trace["x"]) == ["tiny-gqa", "tiny-mha"]
        assert figure["bars_drawn"] == 4
        _same(_plotted_bars(figure), _expected_bars(baseline_store))
        _assert_hover_says_where_the_number_came_from(browser, baseline_store)
        caption = _text(browser, "baseline-caption")
        assert "median" in caption and "2 repeats" in caption and "batch 1" in caption
        _assert_empty_states(lambda i: _text(browser, i), [s.GROUP for s in SECTIONS if s.GROUP != "baseline"])

        tracking.log_trial(baseline_store, _trial("tiny-gqa", "fp32"))  # a rerun: it replaces the bar
        expected = _expected_bars(baseline_store)
        browser.find_element(By.ID, "reload").click()
        ui.wait(browser).until(
            lambda d: _same(_plotted_bars(_figure(d, "baseline-throughput")), expected, strict=False))
        browser.save_screenshot(str(tmp_path / "dashboard.png"))

        tracking.log_trial(baseline_store, _trial("tiny-mha", "fp32"))   # a sweep writes: no click
        expected = _expected_bars(baseline_store)
        ui.wait(browser).until(
            lambda d: _same(_plotted_bars(_figure(d, "baseline-throughput")), expected, strict=False))

        browser.execute_script("window.__opened = []; window.open = (u) => { window.__opened.push(u); return null; };")
        opened = ui.click_until(
            browser, ui.tallest("#baseline-throughput .barlayer .point path"),
            lambda d: d.execute_script("return window.__opened.length ? window.__opened : null"))
    prefix = f"http://127.0.0.1:5000/#/experiments/{tracking.experiment_id(baseline_store, 'baseline')}/runs/"
    assert len(opened) == 1 and opened[0].startswith(prefix), opened
    assert opened[0][len(prefix):] in set(tracking.runs_frame(baseline_store, "baseline")["run_id"])


def _same(plotted: dict, expected: dict, strict: bool = True) -> bool:
    """Same keys, same config hashes, tok/s equal to float precision."""
    same = plotted.keys() == expected.keys() and all(
        plotted[k][1] == expected[k][1] and plotted[k][0] == pytest.approx(expected[k][0], rel=1e-9)
        for k in expected)
    if strict:
        assert same, f"plotted {plotted} != store {expected}"
    return same


def test_empty_store_shows_every_empty_state(tmp_path):
    from page import Page

    uri = tracking.resolve_uri(f"sqlite:///{tmp_path}/mlflow.db")
    tracking.prepare_store(uri)
    page = Page(uri)
    _assert_empty_states(page.text, [s.GROUP for s in SECTIONS])
    assert page.graph_ids() == []


def test_unreachable_store_is_one_line_and_exit_2(tmp_path):
    done = subprocess.run([sys.executable, str(APP), "--tracking-uri", "sqlite:////nonexistent/dir/x.db"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "/nonexistent/dir" in lines[0]
    assert done.stdout == ""


def test_every_section_draws_nothing_from_an_empty_frame():
    import pandas as pd

    for section in SECTIONS:
        assert section.figures(pd.DataFrame()) == []


@pytest.mark.parametrize("change, message", [
    (dict(captions=lambda frame: ""), "misspelt hook 'caption'"),
    (dict(deepdive=lambda frame, model: []), "misspelt hook 'deep_dive'"),
    (dict(GROUP="batching"), "but the group declaring it is 'baseline'"),
    (dict(RUN_STATUS=3), "RUN_STATUS has the wrong type"),
    (dict(figures=None), "figures has the wrong type"),
])
def test_a_section_off_the_protocol_is_an_error_not_a_silent_hook(change, message):
    """What a typo in a new section module would do: fail when the page is built, naming it."""
    import types

    from dashboard.sections import SectionError, check_section
    from dashboard.sections import baseline

    module = types.ModuleType("dashboard.sections.mistyped")
    module.__dict__.update({k: v for k, v in vars(baseline).items() if not k.startswith("__")})
    module.__dict__.update(change)
    with pytest.raises(SectionError, match=message):
        check_section(module, "baseline")
    assert check_section(baseline, "baseline") is baseline


# ------------------------------------------------------------------------------ emulated precision

AVX2_CPU = {"env.device_name": "AMD EPYC 7B13", "env.cpu_model": "AMD EPYC 7B13",
            "env.cpu_capability": "AVX2", "env.bf16_native": "False", "env.fp16_native": "False",
            "env.bf16_matmul_ratio": "42.3", "env.fp16_matmul_ratio": "38.9",
            "env.git_sha": "0123456789abcdef"}


def _logged(uri: str, group: str, model: str, precision: str, native: str | None, batch: int = 1,
            tok_per_s: float = 100.0) -> None:
    """One finished run through the real tracking API; ``native`` None: a run from before the tags."""
    config = TrialConfig(group=group, model=model, workload=Workload("mixed", 1, 8), repeats=1,
                         stack=Stack(precision=precision, batch_size=batch))
    tags = {} if native is None else {**AVX2_CPU, "precision_native": native}
    metrics = {"tok_per_s": tok_per_s, "per_stream_tok_per_s": tok_per_s / batch,
               "peak_memory_bytes": 2.0 ** 20 * batch, "ttft_s": 0.01, "tpot_s": 0.001}
    tracking.log_trial(uri, TrialResult(config, "FINISHED", metrics=metrics, tags=tags))


def _render(uri: str, group: str):
    from dashboard import app

    section = next(s for s in SECTIONS if s.GROUP == group)
    return app.render_section(section, app.open_store(uri))


def _find(component, component_id: str):
    """The component with ``component_id`` anywhere under ``component``, or None."""
    if getattr(component, "id", None) == component_id:
        return component
    children = getattr(component, "children", None)
    for child in children if isinstance(children, (list, tuple)) else [children]:
        if child is not None and not isinstance(child, str):
            found = _find(child, component_id)
            if found is not None:
                return found
    return None


@pytest.fixture
def store(tmp_path) -> str:
    uri = tracking.resolve_uri(f"sqlite:///{tmp_path}/mlflow.db")
    tracking.prepare_store(uri)
    return uri


def test_emulated_bars_are_hatched_faded_and_named_on_hover(store):
    _logged(store, "baseline", "tiny-gqa", "fp32", "True", tok_per_s=100.0)
    _logged(store, "baseline", "tiny-gqa", "bf16", "False", tok_per_s=3.0)
    _logged(store, "baseline", "tiny-mha", "bf16", None, tok_per_s=50.0)      # an old run: no tags
    rendered = _render(store, "baseline")
    figure = _find(rendered, "baseline-throughput").figure
    bars = {(x, t.name): (t, i) for t in figure.data for i, x in enumerate(t.x)}

    trace, i = bars[("tiny-gqa", "bf16")]
    assert trace.marker.pattern.shape[i] == "/" and trace.marker.opacity[i] < 1
    device = trace.customdata[i][3]
    assert "AMD EPYC 7B13" in device and "AVX2" in device and "bf16 EMULATED" in device
    assert "~42x fp32" in device
    assert "%{customdata[3]}" in trace.hovertemplate
    for key in (("tiny-mha", "bf16"), ("tiny-gqa", "fp32")):           # untagged and native: plain
        trace, i = bars[key]
        assert "EMULATED" not in trace.customdata[i][3]
        assert trace.marker.pattern.shape in (None, ()) or trace.marker.pattern.shape[i] == ""
        assert trace.marker.opacity is None or trace.marker.opacity[i] == 1
    assert "AVX2" in bars[("tiny-gqa", "fp32")][0].customdata[bars[("tiny-gqa", "fp32")][1]][3]
    assert sorted(t.name for t in figure.data) == ["bf16", "fp32"]   # series keep their names

    note = _find(rendered, "baseline-emulated").children
    assert note.startswith("bf16 on AMD EPYC 7B13 (AVX2) is emulated (~42x slower matmuls than fp32)")


def test_emulated_points_are_crossed_and_faded(store):
    for batch in (1, 2):
        _logged(store, "batching", "tiny-gqa", "fp32", "True", batch=batch)
        _logged(store, "batching", "tiny-gqa", "bf16", "False", batch=batch, tok_per_s=4.0)
    figure = _find(_render(store, "batching"), "batching-throughput").figure
    traces = {t.name: t for t in figure.data}
    emulated, native = traces["tiny-gqa bf16"], traces["tiny-gqa fp32"]
    assert list(emulated.marker.symbol) == ["circle-x", "circle-x"]
    assert list(emulated.marker.opacity) == [0.5, 0.5]
    assert native.marker.symbol is None and native.marker.opacity is None


def test_runs_without_hardware_tags_render_unmarked(store):
    _logged(store, "baseline", "tiny-gqa", "bf16", None)
    rendered = _render(store, "baseline")
    assert _find(rendered, "baseline-emulated") is None
    trace = _find(rendered, "baseline-throughput").figure.data[0]
    assert trace.marker.pattern.shape is None and trace.marker.opacity is None


def test_export_is_one_offline_html_file_with_every_chart(quick_sweep, browser, tmp_path):
    """``dashboard/export.py`` writes one file: plotly.js inlined (nothing fetched), every section, and
    every chart drawn when Chromium opens it from disk."""
    import re

    from dashboard.export import main

    out = tmp_path / "report.html"
    assert main(["--tracking-uri", quick_sweep.uri, "--out", str(out)]) == 0
    text = out.read_text()
    assert not re.search(r"<script[^>]*\bsrc=", text) and not re.search(r"<link[^>]*\bhref=", text)
    for section in SECTIONS:
        assert f"section-{section.GROUP}" in text and section.TITLE in text
    expected = text.count('class="plotly-graph-div"')
    assert expected >= 2 * len(QUICK_SWEEP_GROUPS)
    browser.get(out.as_uri())
    drawn = "return Array.from(document.querySelectorAll('.js-plotly-plot')).filter(g => g._fullLayout).length"
    ui.wait(browser).until(lambda d: d.execute_script(drawn) == expected)
    assert browser.execute_script("return document.querySelectorAll('.js-plotly-plot .main-svg').length") >= expected


def test_export_of_an_unreachable_store_is_one_line(tmp_path, capsys):
    from dashboard.export import main

    assert main(["--tracking-uri", "http://127.0.0.1:9", "--out", str(tmp_path / "r.html")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and not (tmp_path / "r.html").exists()


def test_failed_configurations_are_counted_with_their_reasons():
    """A configuration whose latest run failed and that never finished is one count, with its reason;
    one that failed and then finished is not."""
    import pandas as pd

    from dashboard.sections.common import failed_note

    failed = pd.DataFrame({"tags.config_hash": ["a", "a", "b", "c"], "start_time": [1, 2, 3, 4],
                           "model": ["m1", "m1", "m2", "m3"], "stack": ["gptq", "gptq", "nf4", "fp32+b64"],
                           "tags.error": ["x", "needs gptq", "needs gptq", "oom: 9 GiB > 8 GiB\ntrace"]})
    line, detail = failed_note(failed, finished_hashes={"b"})
    assert line.startswith("2 configuration(s) failed (not on the charts")
    assert "1 x needs gptq" in line and "1 x oom: 9 GiB > 8 GiB" in line and "trace" not in line
    assert detail.splitlines() == ["m1 gptq: needs gptq", "m3 fp32+b64: oom: 9 GiB > 8 GiB"]
    assert failed_note(failed, {"a", "b", "c"}) == ("", "")
    assert "out-of-memory ones marked on the charts" in failed_note(failed, set(), drawn=True)[0]




def test_error_bars_are_the_logged_95_interval_else_the_spread():
    import pandas as pd

    from dashboard.sections.common import spread_error_bars

    part = pd.DataFrame({"tok_per_s": [10.0, 20.0, 30.0],
                         "tok_per_s_ci_low": [8.0, float("nan"), float("nan")],
                         "tok_per_s_ci_high": [13.0, float("nan"), float("nan")],
                         "tok_per_s_min": [9.0, 18.0, float("nan")], "tok_per_s_max": [11.0, 21.0, float("nan")]})
    bars = spread_error_bars(part, "tok_per_s", [10.0, 20.0, 30.0])
    assert bars["array"] == [3.0, 1.0, 0.0] and bars["arrayminus"] == [2.0, 2.0, 0.0]
    assert spread_error_bars(part[["tok_per_s"]], "tok_per_s", [10.0, 20.0, 30.0]) is None


def test_axes_turn_logarithmic_past_10x_and_labels_that_collide_go_to_the_hover():
    """The page's readability pass (``dashboard.sections.readable``), on figures with chosen values;
    that Chromium draws what it says is checked on every chart of a real store (tests/test_every_chart.py)."""
    import plotly.graph_objects as go

    from dashboard.sections.readable import magnitude_groups, readable

    wide = readable(go.Figure(go.Scatter(x=[10, 20, 3000], y=[1, 2, 3], mode="markers+text",
                                         text=["a", "b", "c"]), layout=dict(xaxis_title="tok/s")))
    assert wide.layout.xaxis.type == "log" and wide.layout.xaxis.title.text == "tok/s (log scale)"
    assert wide.layout.yaxis.type is None                           # 3x: linear
    with_zero = readable(go.Figure(go.Scatter(x=[0, 20, 3000], y=[1, 2, 3], mode="markers")))
    assert with_zero.layout.xaxis.type is None                      # a point at 0: a log axis would drop it
    bars = readable(go.Figure(go.Bar(x=["a", "b", "c"], y=[0, 1, 500])))
    assert bars.layout.yaxis.type == "log"                          # a 0 bar draws nothing either way
    crowded = readable(go.Figure(go.Scatter(x=[1.0, 1.001, 1.002, 2.0], y=[1.0, 1.0, 1.0, 1.5], mode="markers+text",
                                            text=["first label", "second label", "third label", "apart"])))
    shown = [t == "%{text}" for t in crowded.data[0].texttemplate]
    assert shown[0] and shown[3] and not all(shown[:3]) and crowded.data[0].text[1] == "second label"
    assert magnitude_groups({"smol": 30.0, "gemma": 12.0, "zoo-a": 900.0, "zoo-b": 3500.0}) == \
        [["gemma", "smol"], ["zoo-a", "zoo-b"]]
    # a wild whisker is cut at the chart's edge, but a bar keeps its base: a range of 450-550 would draw
    # bars from below the chart (a browser test once pointed at a bar's middle there, under the next section)
    wild = readable(go.Figure(go.Bar(x=["a", "b"], y=[450.0, 550.0], error_y=dict(array=[10.0, 40_000.0]))))
    low, high = wild.layout.yaxis.range
    assert low == 0 < 550 < high < 1000 and "whiskers cut" in wild.layout.title.text
    assert not wild.layout.annotations                              # said once, under the title
