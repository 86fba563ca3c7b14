"""Every chart of every group, as a user sees it: the real app on a real store, headless Chromium.

The store is the session's quick sweep (baseline, speculative, batching, quantization) with the
session's KV-cache and stacks trials copied in through the real tracking API, plus one injected
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
import re
import shutil
import urllib.error
import urllib.request

import pytest

import tracking
from trials.config import TrialConfig
from trials.loop import TrialResult

from ui import RENDER_TIMEOUT_S, click_until, figure, select_model, serve, table, text, wait  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402

MLFLOW_UI = "http://127.0.0.1:5999"
# A numeric axis names its unit (or says the number is a count, share, ratio or effect).
UNIT = re.compile(r"tok/s|req/s|requests/s|\(s\)|requests in flight|%|\bMB\b|MiB|GiB|\(x\)|tokens|nats|perplexity|batch size|\bk\b|multiplicative|share", re.I)

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
    base = tracking.runs_frame(uri, "baseline").sort_values("start_time").iloc[-1]
    data = tracking.read_trial_artifact(uri, base["run_id"])
    for sweep, speed in (("injected-1x", float(base["tok_per_s"])), ("injected-2x", 2 * float(base["tok_per_s"]))):
        tracking.log_trial(uri, TrialResult(TrialConfig.from_dict(data["config"]), "FINISHED",
                                            {**data["metrics"], "tok_per_s": speed, "tok_per_s_ci_low": speed * 0.999,
                                             "tok_per_s_ci_high": speed * 1.001}, data["tags"], data["raw"]),
                           sweep_id=sweep)
    return uri, speed


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
    linked = [t for t, h in zip(drawn["traces"], layout["hovers"]) if PROVENANCE_HOVER in h]
    for trace in linked:
        ids = {row[RUN_ID_FIELD] for row in trace["customdata"]}
        assert ids <= run_ids, f"{graph_id}: points name runs not in the store: {ids - run_ids}"


# A drawn point of the first trace whose hover carries the provenance (a roofline or a prediction line
# has none): its trace's element in its subplot's layer, in plotly's drawing order; of a bar trace, the
# tallest bar (a measured value may draw a bar 1 px tall, too short to point at).
PROVENANCE_POINT_JS = """
const gd = document.querySelector('#' + arguments[0] + ' .js-plotly-plot');
const want = gd._fullData.find(t => (t.hovertemplate || '').includes(arguments[1]) && t.visible === true
                                    && ['bar', 'scatter'].includes(t.type));
if (!want) return null;
const layer = want.type === 'bar' ? '.barlayer' : '.scatterlayer';
const same = gd._fullData.filter(t => t.type === want.type && t.xaxis === want.xaxis && t.yaxis === want.yaxis
                                      && t.visible === true);
const subplot = gd.querySelector('.subplot.' + want.xaxis + (want.yaxis === 'y' ? 'y' : want.yaxis));
const traces = subplot.querySelectorAll(layer + ' .trace');
const trace = traces[same.indexOf(want)];
if (!trace) return null;
if (want.type !== 'bar') return trace.querySelector('.point');
let best = null, most = -1;
for (const el of trace.querySelectorAll('.point path')) {
  const h = el.getBoundingClientRect().height;
  if (h > most) { best = el; most = h; }
}
return best;
"""


def _click_first_point(driver, graph_id: str, shift: bool = False) -> str:
    from dashboard.sections.common import PROVENANCE_HOVER

    driver.execute_script("window.__opened = []; window.open = (u) => { window.__opened.push(u); return null; };")
    assert driver.execute_script(PROVENANCE_POINT_JS, graph_id, PROVENANCE_HOVER) is not None, \
        f"{graph_id}: no point carries its run"
    from selenium.common.exceptions import TimeoutException

    try:
        return click_until(
            driver, lambda d: d.execute_script(PROVENANCE_POINT_JS, graph_id, PROVENANCE_HOVER),
            lambda d: d.execute_script("return window.__opened.length ? window.__opened[0] : null"), shift=shift)
    except TimeoutException:
        point = driver.execute_script(POINT_STATE_JS, driver.execute_script(PROVENANCE_POINT_JS, graph_id,
                                                                           PROVENANCE_HOVER))
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
                         if browser.execute_script(PROVENANCE_POINT_JS, g, PROVENANCE_HOVER) is not None)
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
