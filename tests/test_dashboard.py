"""The dashboard as a user sees it: the real app in a subprocess, a real store, headless Chromium.

The populated test logs real trials of the tiny zoo into a sqlite store, starts
``python dashboard/app.py`` from another working directory, and reads the Plotly figure back out of
the page: what the browser plotted must be exactly what the store holds (latest run per model and
precision), with each bar traceable to its run. Logging a rerun while the server is up and pressing
"Reload data" must show the new number without a restart. Empty groups must name the command that
fills them.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

import tracking
from dashboard.sections import SECTIONS
from sweeps.spaces import SPACES
from trials.config import GROUPS, Stack, TrialConfig, Workload

from ui import APP, RENDER_TIMEOUT_S, needs_browser, serve  # noqa: E402
from ui import figure as _figure, text as _text  # noqa: E402
from selenium.webdriver.common.action_chains import ActionChains  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402


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
