"""The dashboard as a user sees it: the real app in a subprocess, a real store, headless Chromium.

The populated test logs real trials of the tiny zoo into a sqlite store, starts
``python dashboard/app.py`` from another working directory, and reads the Plotly figure back out of
the page: what the browser plotted must be exactly what the store holds (latest run per model and
precision), with each bar traceable to its run. Logging a rerun while the server is up and pressing
"Reload data" must show the new number without a restart. Empty groups must name the command that
fills them.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import pytest

import tracking
from dashboard.sections import SECTIONS
from sweeps.spaces import SPACES
from trials.config import GROUPS, Stack, TrialConfig, Workload

webdriver = pytest.importorskip("selenium.webdriver")
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.action_chains import ActionChains  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
APP = ROOT / "dashboard" / "app.py"
CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
STARTUP_TIMEOUT_S = 90
RENDER_TIMEOUT_S = 60

needs_browser = pytest.mark.skipif(not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)),
                                   reason="needs Debian chromium and chromium-driver")

# The figure of one dcc.Graph as plain JSON (typed arrays become lists), or null until plotted.
READ_FIGURE_JS = """
const gd = document.querySelector('#' + arguments[0] + ' .js-plotly-plot');
if (!gd || !gd.data || !gd._fullLayout) return null;
const list = (v) => (v == null ? null : Array.from(v));
return JSON.stringify({
  traces: gd.data.map(t => ({name: t.name, type: t.type, x: list(t.x), y: list(t.y),
                             customdata: list(t.customdata)})),
  bars_drawn: gd.querySelectorAll('.barlayer .point').length,
});
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def serve(uri: str, workdir: Path):
    """Run the dashboard as a user would, from a folder other than the repo; stop it afterwards."""
    port = _free_port()
    log_path = workdir / "dashboard.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, str(APP), "--tracking-uri", uri, "--port", str(port)],
                                cwd=workdir, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/"
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                pytest.fail(f"dashboard exited with {proc.returncode}:\n{log_path.read_text()}")
            try:
                with urllib.request.urlopen(url, timeout=5) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"dashboard did not answer within {STARTUP_TIMEOUT_S} s:\n"
                            f"{log_path.read_text()}")
            time.sleep(0.25)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


@pytest.fixture
def browser(tmp_path):
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--disable-quic", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--window-size=1280,2400",
                 f"--user-data-dir={tmp_path / 'chrome-profile'}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(RENDER_TIMEOUT_S)
    try:
        yield driver
    finally:
        driver.quit()


def _figure(driver, graph_id: str) -> dict:
    """Wait until the graph has plotted its bars, then return its figure."""
    def plotted(d):
        raw = d.execute_script(READ_FIGURE_JS, graph_id)
        figure = raw and json.loads(raw)
        return figure if figure and figure["bars_drawn"] else False

    return WebDriverWait(driver, RENDER_TIMEOUT_S).until(plotted)


def _text(driver, element_id: str) -> str:
    return WebDriverWait(driver, RENDER_TIMEOUT_S).until(
        lambda d: d.find_element(By.ID, element_id)).text


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
    bar = driver.find_element(By.CSS_SELECTOR, "#baseline-throughput .barlayer .point path")
    ActionChains(driver).move_to_element(bar).perform()
    text = WebDriverWait(driver, RENDER_TIMEOUT_S).until(lambda d: d.execute_script(
        "const h = document.querySelector('#baseline-throughput .hoverlayer .hovertext');"
        "return h && h.textContent"))
    frame = tracking.runs_frame(uri, "baseline")
    for needle in ("ttft_s", "tpot_s", "peak memory", frame["tags.env.device_name"].iloc[0],
                   frame["tags.env.git_sha"].iloc[0][:12]):
        assert needle in text, (needle, text)
    assert any(h in text for h in frame["tags.config_hash"]), text


def _assert_empty_states(driver, groups) -> None:
    for group in groups:
        text = _text(driver, f"{group}-empty")
        assert f"python sweeps/full.py --groups {group}" in text
        assert ("not implemented yet" in text) == (group not in SPACES), text


def _trial(model: str, precision: str):
    from trials.run import run_trial

    return run_trial(TrialConfig(group="baseline", model=model, stack=Stack(precision=precision),
                                 workload=Workload("mixed", 1, 8), repeats=2))


@pytest.fixture
def baseline_store(tmp_path, tiny_zoo) -> str:
    uri = tracking.resolve_uri(f"sqlite:///{tmp_path}/mlflow.db")
    tracking.prepare_store(uri)
    for model in ("tiny-gqa", "tiny-mha"):
        for precision in ("fp32", "bf16"):
            tracking.log_trial(uri, _trial(model, precision))
    return uri


@needs_browser
def test_baseline_chart_plots_the_store_and_reloads_cpu(baseline_store, browser, tmp_path):
    with serve(baseline_store, tmp_path) as url:
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
        _assert_empty_states(browser, [s.GROUP for s in SECTIONS if s.GROUP != "baseline"])

        tracking.log_trial(baseline_store, _trial("tiny-gqa", "fp32"))  # a rerun: it replaces the bar
        expected = _expected_bars(baseline_store)
        browser.find_element(By.ID, "reload").click()
        WebDriverWait(browser, RENDER_TIMEOUT_S).until(
            lambda d: _same(_plotted_bars(_figure(d, "baseline-throughput")), expected, strict=False))
        browser.save_screenshot(str(tmp_path / "dashboard.png"))


def _same(plotted: dict, expected: dict, strict: bool = True) -> bool:
    """Same keys, same config hashes, tok/s equal to float precision."""
    same = plotted.keys() == expected.keys() and all(
        plotted[k][1] == expected[k][1] and plotted[k][0] == pytest.approx(expected[k][0], rel=1e-9)
        for k in expected)
    if strict:
        assert same, f"plotted {plotted} != store {expected}"
    return same


@needs_browser
def test_empty_store_shows_every_empty_state_cpu(browser, tmp_path):
    uri = tracking.resolve_uri(f"sqlite:///{tmp_path}/mlflow.db")
    tracking.prepare_store(uri)
    with serve(uri, tmp_path) as url:
        browser.get(url)
        _assert_empty_states(browser, [s.GROUP for s in SECTIONS])
        assert not browser.find_elements(By.CSS_SELECTOR, ".js-plotly-plot")


def test_unreachable_store_is_one_line_and_exit_2_cpu(tmp_path):
    done = subprocess.run([sys.executable, str(APP), "--tracking-uri", "sqlite:////nonexistent/dir/x.db"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "/nonexistent/dir" in lines[0]
    assert done.stdout == ""


def test_every_section_has_the_interface_and_an_empty_state_cpu():
    import pandas as pd

    assert [s.GROUP for s in SECTIONS] == list(GROUPS)
    for section in SECTIONS:
        assert section.TITLE and section.BLURB.endswith((".", "?"))
        assert section.figures(pd.DataFrame()) == []
