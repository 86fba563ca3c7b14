"""Every chart of every group, as a user sees it: the real app on a real store, headless Chromium.

The store is the session's quick sweep (baseline, speculative, batching, quantization) with the
session's KV-cache and stacks trials copied in through the real tracking API, synthetic capacity runs
of both real models (``tests/test_capacity_charts.py``: every status, a search beside a grid), plus one injected
rerun of a baseline configuration in two more sweeps, the second twice as fast, both with tight intervals. For each
section the page must draw every chart the section declares (and its deep dive), each with plotted
points, a title and axis titles (numeric axes with their unit); every point's run id must be a run
of the store and a click must open it in the MLflow UI; a shift-click opens the trial's generated
texts; each deep-dive selector must redraw for another model, and typing in a deep dive's number
boxes must redraw it; the FAILED count must match the store;
and the compare view must show the injected difference, highlighted.
"""

from __future__ import annotations

import html as html_lib
import json
import math
import re
import shutil
import urllib.error
import urllib.request

import pytest

import tracking
from trials.config import TrialConfig
from trials.loop import TrialResult

from dashboard.sections.readable import LOG_SPAN  # noqa: E402
from test_capacity_charts import log_capacity_runs  # noqa: E402
from ui import RENDER_TIMEOUT_S, click_until, figure, hover_until, select_model, serve, table, text, wait  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402

MLFLOW_UI = "http://127.0.0.1:5999"
# A numeric axis names its unit (or says the number is a count, share, ratio or effect).
UNIT = re.compile(r"tok/s|req/s|requests/s|\(s\)|requests in flight|%|\bMB\b|MiB|GiB|\(x\)|tokens|nats|perplexity|batch size|\bk\b|multiplicative|share|\btrials\b", re.I)

LAYOUT_JS = """
const gd = document.querySelector('#' + arguments[0] + ' .js-plotly-plot');
if (!gd || !gd._fullLayout) return null;
const L = gd._fullLayout;
const axes = Object.keys(L).filter(k => /^[xy]axis\\d*$/.test(k) && L[k].visible !== false && L[k]._id)
  .map(k => ({name: k, type: L[k].type, title: (L[k].title && L[k].title.text) || ''}));
return JSON.stringify({title: (L.title && L.title.text) || '', axes: axes,
                       tables: gd.data.filter(t => t.type === 'table').length,
                       hovers: gd.data.map(t => t.hovertemplate || '')});
"""

# Per axis, the values the page plots on it (matched axes pooled): null where the axis cannot be
# logarithmic (text values, stacked bars, a point at 0 or below); a bar of height 0 draws nothing.
PLOTTED_JS = """
const gd = document.querySelector('#' + arguments[0] + ' .js-plotly-plot');
const L = gd._fullLayout, found = {};
const key = (ref) => ref[0] + 'axis' + ref.slice(1);
const root = (k) => (L[k] && L[k].matches) ? key(L[k].matches) : k;
const stacked = ['stack', 'relative'].includes(L.barmode);
for (const t of gd._fullData) {
  if (!['bar', 'scatter'].includes(t.type) || t.visible !== true) continue;
  const valueAxis = t.type === 'bar' && t.orientation === 'h' ? 'x' : 'y';
  for (const letter of ['x', 'y']) {
    const k = root(key(t[letter + 'axis'])), values = Array.from(t[letter] || []);
    let nums = values.some(v => typeof v === 'string') ? null
      : values.filter(v => typeof v === 'number' && isFinite(v));
    if (t.type === 'bar' && letter === valueAxis) nums = stacked || nums === null ? null : nums.filter(v => v !== 0);
    found[k] = (nums === null || nums.some(v => v <= 0) || found[k] === null) ? null : (found[k] || []).concat(nums);
  }
}
const out = {};
for (const k of Object.keys(L).filter(k => /^[xy]axis\\d*$/.test(k) && L[k]._id)) {
  const v = found[root(k)];
  out[k] = v && v.length ? {low: Math.min(...v), high: Math.max(...v), type: L[k].type} : null;
}
return JSON.stringify(out);
"""

# Bars the page drew too small to see or point at: a nonzero value whose rectangle is under MIN_BAR_PX.
MIN_BAR_PX = 2
THIN_BARS_JS = """
const gd = document.querySelector('#' + arguments[0] + ' .js-plotly-plot');
const thin = [];
for (const el of gd.querySelectorAll('.barlayer .point')) {
  const d = el.__data__, r = el.getBoundingClientRect();
  const small = Math.min(r.width, r.height) < arguments[1];
  if (d && typeof d.s === 'number' && d.s !== 0 && small) thin.push([d.s, r.width, r.height]);
}
return thin;
"""


def _copy_runs(source: str, target: str, group: str) -> int:
    frame = tracking.runs_frame(source, group, status=None)
    for run_id in frame.get("run_id", []):
        data = tracking.read_trial_artifact(source, run_id)
        tracking.log_trial(target, TrialResult(TrialConfig.from_dict(data["config"]), data["status"], data["metrics"],
                                               data["tags"], data["raw"], data.get("error", "")),
                           sweep_id=frame.set_index("run_id").loc[run_id].get("tags.sweep_id") or "")
    return len(frame)


@pytest.fixture(scope="module")
def every_group(quick_sweep, kv_store, stacks_store, engines_store, serving_store, tmp_path_factory) -> tuple[str, float]:
    folder = tmp_path_factory.mktemp("every-group")
    shutil.copy(quick_sweep.uri[len("sqlite:///"):], folder / "mlflow.db")   # artifacts stay where they are
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    assert _copy_runs(kv_store, uri, "kv_cache") and _copy_runs(stacks_store, uri, "stacks")
    assert _copy_runs(engines_store, uri, "engines") and _copy_runs(serving_store[0], uri, "serving")
    _inject_a_fast_model(uri)
    assert all(log_capacity_runs(uri))
    base = tracking.runs_frame(uri, "baseline").sort_values("start_time").iloc[-1]
    data = tracking.read_trial_artifact(uri, base["run_id"])
    for sweep, speed in (("injected-1x", float(base["tok_per_s"])), ("injected-2x", 2 * float(base["tok_per_s"]))):
        tracking.log_trial(uri, TrialResult(TrialConfig.from_dict(data["config"]), "FINISHED",
                                            {**data["metrics"], "tok_per_s": speed, "tok_per_s_ci_low": speed * 0.999,
                                             "tok_per_s_ci_high": speed * 1.001}, data["tags"], data["raw"]),
                           sweep_id=sweep)
    return uri, speed


FAST_MODEL = "tiny-gqa"


def _inject_a_fast_model(uri: str) -> None:
    """The engines runs again as a model tens of times faster whose stacks span more than 10x, with
    the test's own tok/s (a zoo model beside real ones, as in the main job): the every-model chart
    must put it in its own panel, and its per-model chart must be logarithmic, whatever the session
    measured."""
    frame = tracking.runs_frame(uri, "engines").sort_values("stack")
    for i, run_id in enumerate(frame["run_id"]):
        data = tracking.read_trial_artifact(uri, run_id)
        config = {**data["config"], "model": FAST_MODEL}
        speed = 400.0 * 2 ** i
        metrics = {**data["metrics"], "tok_per_s": speed, "tok_per_s_ci_low": 0.99 * speed,
                   "tok_per_s_ci_high": 1.01 * speed, "log_tok_per_s_mean": math.log(speed)}
        tags = {k: v for k, v in data["tags"].items()
                if k not in ("config_hash", "subject_hash", "model", "weights_origin")}
        tracking.log_trial(uri, TrialResult(TrialConfig.from_dict(config), "FINISHED", metrics, tags, data["raw"]),
                           sweep_id="injected-fast-model")


def _failed_configurations(uri: str, group: str) -> int:
    """From the store alone: configurations whose latest run FAILED and that never finished."""
    frame = tracking.runs_frame(uri, group, status=None)
    if frame.empty:
        return 0
    latest = frame.sort_values("start_time").drop_duplicates("tags.config_hash", keep="last")
    finished = set(frame.loc[frame["status"] == "FINISHED", "tags.config_hash"])
    return int(((latest["status"] == "FAILED") & ~latest["tags.config_hash"].isin(finished)).sum())


def _check_chart(driver, graph_id: str, run_ids: set[str]) -> None:
    from selenium.common.exceptions import TimeoutException

    from dashboard.sections.common import PROVENANCE_HOVER, RUN_ID_FIELD

    layout = json.loads(wait(driver).until(
        lambda d: d.execute_script(LAYOUT_JS, graph_id)))
    assert layout["title"].strip(), f"{graph_id}: no title"
    try:
        if layout["tables"]:
            assert all(table(driver, graph_id)["columns"]), graph_id      # waits for drawn cells
            return
        drawn = figure(driver, graph_id)                                   # waits for drawn points or lines
    except TimeoutException:
        pytest.fail(f"{graph_id}: nothing drawn within {RENDER_TIMEOUT_S} s")
    assert drawn["points_drawn"] or drawn["lines_drawn"], graph_id
    for axis in layout["axes"]:
        assert axis["title"].strip(), f"{graph_id}: {axis['name']} has no title"
        if axis["type"] in ("linear", "log"):
            assert UNIT.search(axis["title"]), f"{graph_id}: {axis['name']} {axis['title']!r} names no unit"
    # values spanning more than 10x: a logarithmic axis; every bar drawn can be seen and pointed at
    for name, span in json.loads(driver.execute_script(PLOTTED_JS, graph_id)).items():
        if span and span["high"] > LOG_SPAN * span["low"]:
            assert span["type"] == "log", \
                f"{graph_id}: {name} spans {span['low']:g} to {span['high']:g} on a linear axis"
    thin = driver.execute_script(THIN_BARS_JS, graph_id, MIN_BAR_PX)
    assert not thin, f"{graph_id}: bars under {MIN_BAR_PX} px (value, width, height): {thin}"
    linked = [t for t, h in zip(drawn["traces"], layout["hovers"]) if PROVENANCE_HOVER in h]
    for trace in linked:
        ids = {row[RUN_ID_FIELD] for row in trace["customdata"]}
        assert ids <= run_ids, f"{graph_id}: points name runs not in the store: {ids - run_ids}"


# The drawn points of traces whose hover carries the provenance (a roofline or a prediction line has
# none), easiest to point at first, by what is on screen, never by which values were measured: the
# largest rectangle (a bar of a small value may be a pixel tall), then, among equal markers, the one
# farthest from any other drawn point. ``_clickable`` then keeps the first whose hover is a run's (a
# point on a line of no run may be hovered as that line).
PROVENANCE_POINTS_JS = """
const gd = document.querySelector('#' + arguments[0] + ' .js-plotly-plot');
if (!gd || !gd._fullData) return [];
const every = Array.from(gd.querySelectorAll('.barlayer .point, .scatterlayer .point'));
const center = (el) => { const r = el.getBoundingClientRect(); return [r.x + r.width / 2, r.y + r.height / 2]; };
const all = every.map(center), found = [];
for (const el of every) {
  const trace = el.closest('.trace'), data = trace && trace.__data__ && trace.__data__[0] && trace.__data__[0].trace;
  if (!data || !(data.hovertemplate || '').includes(arguments[1]) || data.visible !== true) continue;
  const target = data.type === 'bar' ? (el.querySelector('path') || el) : el;
  const r = target.getBoundingClientRect();
  if (r.width < 3 || r.height < 3) continue;
  const [x, y] = center(el);
  const room = Math.min(...all.filter(([a, b]) => a !== x || b !== y).map(([a, b]) => Math.hypot(a - x, b - y)), 1e6);
  found.push([Math.round(Math.min(r.width, 40) * Math.min(r.height, 40)), room, target]);
}
found.sort((a, b) => b[0] - a[0] || b[1] - a[1]);
return found.slice(0, 12).map(f => f[2]);
"""

# Whether the point the pointer rests on is a run's (its trace's hover carries the provenance).
HOVERED_RUN_JS = """
const gd = document.querySelector('#' + arguments[0] + ' .js-plotly-plot');
const hovered = gd && gd._hoverdata && gd._hoverdata[0];
return Boolean(hovered && (gd._fullData[hovered.curveNumber].hovertemplate || '').includes(arguments[1]));
"""


def _clickable(driver, graph_id: str):
    """A finder for ``click_until``: the first candidate point that Plotly hovers as a run's; None
    when there is none."""
    from selenium.common.exceptions import TimeoutException

    from dashboard.sections.common import PROVENANCE_HOVER

    for k in range(len(driver.execute_script(PROVENANCE_POINTS_JS, graph_id, PROVENANCE_HOVER))):
        def find(d, k=k):
            found = d.execute_script(PROVENANCE_POINTS_JS, graph_id, PROVENANCE_HOVER)
            return found[k] if k < len(found) else None
        driver.execute_script("const gd = document.querySelector('#' + arguments[0] + ' .js-plotly-plot');"
                              "if (gd) Plotly.Fx.unhover(gd);", graph_id)
        try:
            hover_until(driver, find, lambda d: d.execute_script(HOVERED_RUN_JS, graph_id, PROVENANCE_HOVER), timeout=5)
            return find
        except TimeoutException:
            continue
    return None


def _click_first_point(driver, graph_id: str, shift: bool = False) -> str:
    from dashboard.sections.common import PROVENANCE_HOVER

    driver.execute_script("window.__opened = []; window.open = (u) => { window.__opened.push(u); return null; };")
    assert driver.execute_script(PROVENANCE_POINTS_JS, graph_id, PROVENANCE_HOVER), \
        f"{graph_id}: no point carries its run"
    find = _clickable(driver, graph_id)
    assert find is not None, f"{graph_id}: no point a pointer can rest on is hovered as a run's"
    from selenium.common.exceptions import TimeoutException

    try:
        return click_until(driver, find, lambda d: d.execute_script(
            "return window.__opened.length ? window.__opened[0] : null"), shift=shift)
    except TimeoutException:
        point = driver.execute_script(POINT_STATE_JS, find(driver))
        pytest.fail(f"{graph_id}: a click on its point opened nothing in {RENDER_TIMEOUT_S} s; the point: {point}")


POINT_STATE_JS = """
const el = arguments[0]; if (!el) return null;
const r = el.getBoundingClientRect();
const top = document.elementFromPoint(r.x + r.width / 2, r.y + r.height / 2);
return {rect: [r.x, r.y, r.width, r.height], on_top: top ? top.tagName + '.' + (top.getAttribute('class') || '') : null};
"""


def test_every_chart_of_every_group(every_group, browser, tmp_path):
    from dashboard.app import open_store, page_graphs
    from dashboard.sections import SECTIONS

    uri, fast = every_group
    runs = open_store(uri)
    run_ids = set()
    for section in SECTIONS:
        run_ids |= set(runs.frame(section.GROUP, None).get("run_id", []))
    graphs = page_graphs(runs)
    assert set(graphs) == {s.GROUP for s in SECTIONS}, "every group has charts in this store"

    with serve(uri, tmp_path, "--mlflow-ui", MLFLOW_UI, "--refresh-s", "0") as url:
        browser.get(url)
        for section in SECTIONS:
            group, expected = section.GROUP, graphs[section.GROUP]
            for graph_id in expected["charts"] + expected["deep_dive"]:
                _check_chart(browser, graph_id, run_ids)
            assert browser.execute_script(       # and in its own section
                "return document.querySelector('#section-' + arguments[0] + ' #' + arguments[1] + ' .js-plotly-plot')"
                " !== null", group, expected["charts"][0])

            # the FAILED count, against the store
            failed = _failed_configurations(uri, group)
            notes = browser.find_elements(By.ID, f"{group}-failed")
            if failed:
                assert notes and notes[0].text.startswith(f"{failed} configuration(s) failed"), (group, failed)
            else:
                assert not notes, (group, notes[0].text)

            # a click opens the run in the MLflow UI (theory charts, e.g. KV bytes from the config, have no run)
            from dashboard.sections.common import PROVENANCE_HOVER

            first = next(g for g in expected["charts"] + expected["deep_dive"]
                         if browser.execute_script(PROVENANCE_POINTS_JS, g, PROVENANCE_HOVER))
            opened = _click_first_point(browser, first)
            experiment = runs.experiment_id(group)
            assert opened.startswith(f"{MLFLOW_UI}/#/experiments/{experiment}/runs/"), opened
            assert opened.rsplit("/", 1)[1] in run_ids

            # each deep-dive selector redraws for another model
            if len(expected["models"]) > 1:
                other = expected["models"][1]
                select_model(browser, group, other)
                wait(browser).until(lambda d: other in (d.execute_script(
                    LAYOUT_JS, expected["deep_dive"][0]) or ""))
                for graph_id in expected["deep_dive"]:
                    _check_chart(browser, graph_id, run_ids)
                if group == "engines":     # the injected fast model: a panel of its own, a log axis in its chart
                    overview = json.loads(browser.execute_script(LAYOUT_JS, expected["charts"][0]))
                    assert sum(a["name"].startswith("xaxis") for a in overview["axes"]) == 2, overview
                    mine = json.loads(browser.execute_script(LAYOUT_JS, expected["deep_dive"][0]))
                    assert other == FAST_MODEL and {a["name"]: a["type"] for a in mine["axes"]}["xaxis"] == "log"

            # the deep dive's number boxes (e.g. the stacks' quality budget) redraw it when typed in
            if controls := getattr(section, "DEEP_DIVE_CONTROLS", {}):
                shown = lambda d: [d.execute_script(LAYOUT_JS, g) for g in expected["deep_dive"]]  # noqa: E731
                before = shown(browser)
                for name in controls:
                    box = browser.find_element(By.ID, f"{group}-{name}")
                    box.clear()
                    box.send_keys("0", Keys.ENTER)
                wait(browser).until(lambda d: all(shown(d)) and shown(d) != before)

        # a shift-click opens the trial's generated texts, served by the dashboard
        opened = _click_first_point(browser, graphs["baseline"]["charts"][0], shift=True)
        assert re.fullmatch(r"run/[0-9a-f]{32}", opened), opened
        run_id = opened.split("/")[1]
        page = urllib.request.urlopen(url + opened, timeout=30).read().decode()
        texts = [o["text"] for o in tracking.read_trial_artifact(uri, run_id)["raw"]["outputs"]]
        assert texts and all(html_lib.escape(t) in page for t in texts)
        with pytest.raises(urllib.error.HTTPError, match="404"):
            urllib.request.urlopen(url + "run/not-a-run", timeout=30)

        # the compare view: the two newest sweeps (the injected ones) by default, the 2x highlighted
        from dashboard import compare

        compare_by = browser.find_element(By.ID, "compare-a")
        browser.execute_script("arguments[0].scrollIntoView()", compare_by)
        wait(browser).until(lambda d: "injected-2x" in text(d, "compare-b")
                                                       and "injected-1x" in text(d, "compare-a"))
        chart = figure(browser, "compare-baseline")
        bars = chart["traces"][0]
        assert max(bars["y"]) == pytest.approx(2.0, rel=0.02)
        colors = browser.execute_script(
            "return Array.from(document.querySelector('#compare-baseline .js-plotly-plot').data[0].marker.color)")
        assert colors[bars["y"].index(max(bars["y"]))] == compare.CHANGED
