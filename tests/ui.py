"""Browser-test helpers shared by every dashboard test: serve the real app, read what Plotly drew.

The app runs as a user runs it (``python dashboard/app.py`` in a subprocess, from another folder);
the page is read in headless Debian Chromium through selenium. ``figure`` returns a graph's data as
the browser holds it, once something is drawn, so tests compare what was plotted with the store.
"""

from __future__ import annotations

import contextlib
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

webdriver = pytest.importorskip("selenium.webdriver")
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.action_chains import ActionChains  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402
from selenium.common.exceptions import TimeoutException  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
APP = ROOT / "dashboard" / "app.py"
CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
STARTUP_TIMEOUT_S = 90
RENDER_TIMEOUT_S = 60

needs_browser = pytest.mark.skipif(not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)),
                                   reason="needs Debian chromium and chromium-driver")

# The figure of one dcc.Graph as plain JSON (typed arrays become lists), or null until plotted.
# points_drawn counts bar and marker elements in the SVG; lines_drawn counts drawn line paths.
READ_FIGURE_JS = """
const gd = document.querySelector('#' + arguments[0] + ' .js-plotly-plot');
if (!gd || !gd.data || !gd._fullLayout) return null;
const list = (v) => (v == null ? null : Array.from(v));
return JSON.stringify({
  traces: gd.data.map(t => ({name: t.name, type: t.type || 'scatter', mode: t.mode,
                             x: list(t.x), y: list(t.y), customdata: list(t.customdata),
                             line: t.line || null})),
  shapes: (gd.layout.shapes || []).length,
  annotations: (gd.layout.annotations || []).map(a => a.text),
  bars_drawn: gd.querySelectorAll('.barlayer .point').length,
  points_drawn: gd.querySelectorAll('.barlayer .point, .scatterlayer .point').length,
  lines_drawn: Array.from(gd.querySelectorAll('.scatterlayer .js-line'))
                 .filter(p => (p.getAttribute('d') || '').length > 1).length,
});
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def serve(uri: str, workdir: Path, *args: str):
    """Run the dashboard as a user would, from a folder other than the repo; stop it afterwards.
    ``args``: more of its command-line options."""
    port = free_port()
    log_path = workdir / "dashboard.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, str(APP), "--tracking-uri", uri, "--port", str(port), *args],
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


@contextmanager
def chromium(profile_dir: Path):
    """Headless Debian Chromium driven by selenium (the flags it needs in a container, as root, without a display)."""
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--disable-quic", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--window-size=1280,2400",
                 f"--user-data-dir={profile_dir}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(RENDER_TIMEOUT_S)
    try:
        yield driver
    finally:
        driver.quit()


def figure(driver, graph_id: str) -> dict:
    """Wait until the graph has drawn points (bars or markers) or lines, then return its figure."""
    def plotted(d):
        raw = d.execute_script(READ_FIGURE_JS, graph_id)
        fig = raw and json.loads(raw)
        return fig if fig and (fig["points_drawn"] or fig["lines_drawn"]) else False

    return wait(driver).until(plotted)


READ_TABLE_JS = """
const gd = document.querySelector('#' + arguments[0] + ' .js-plotly-plot');
if (!gd || !gd.data || !gd.data.length || !gd.querySelector('.table .cell-text')) return null;
return JSON.stringify({header: gd.data[0].header.values, columns: gd.data[0].cells.values,
                       title: gd.layout.title && (gd.layout.title.text || gd.layout.title)});
"""


def table(driver, graph_id: str) -> dict:
    """Wait until a plotly table has drawn its cells; its header, columns (lists) and title."""
    return json.loads(wait(driver).until(
        lambda d: d.execute_script(READ_TABLE_JS, graph_id)))


def text(driver, element_id: str) -> str:
    return wait(driver).until(
        lambda d: d.find_element(By.ID, element_id)).text


def select_model(driver, group: str, model: str) -> None:
    """Pick ``model`` in a section's deep-dive selector (a dcc.Dropdown with id ``{group}-model``)."""
    dropdown = wait(driver).until(
        lambda d: d.find_element(By.CSS_SELECTOR, f"#{group}-model"))
    dropdown.click()
    # Dash 4 opens the search box in a popover outside the dropdown, named by its aria-controls.
    popover = wait(driver).until(
        lambda d: dropdown.get_attribute("aria-controls")
        and d.find_element(By.ID, dropdown.get_attribute("aria-controls")))
    search = popover.find_element(By.CSS_SELECTOR, "input.dash-dropdown-search")
    search.send_keys(model)
    search.send_keys("\n")
    wait(driver).until(
        lambda d: model in d.find_element(By.CSS_SELECTOR, f"#{group}-model").text)


TALLEST_JS = """
let best = null, most = -1;
for (const el of document.querySelectorAll(arguments[0])) {
  const h = el.getBoundingClientRect().height;
  if (h > most) { best = el; most = h; }
}
return best;
"""


def tallest(selector: str):
    """A finder for ``hover_until``/``click_until``: the element ``selector`` matches with the largest
    height on screen (a bar of a measured value may be 1 px tall, too short to point at)."""
    return lambda d: d.execute_script(TALLEST_JS, selector)


def hover_until(driver, find, read, timeout: float = RENDER_TIMEOUT_S):
    """Rest the pointer on the element ``find(driver)`` returns (or a CSS selector's first match) and
    wait until ``read(driver)`` returns something. A busy machine may draw the chart, or redraw it,
    after the pointer arrived (Plotly then saw no hover, and waiting alone would not help), so the
    pointer moves again, a pixel to and fro, each time the condition is polled and still false."""
    if isinstance(find, str):
        selector = find
        find = lambda d: d.find_element(By.CSS_SELECTOR, selector)  # noqa: E731
    return _point_until(driver, find, read, lambda actions: actions, timeout)


def click_until(driver, find, opened, shift: bool = False, timeout: float = RENDER_TIMEOUT_S):
    """Click the element ``find(driver)`` returns until ``opened(driver)`` returns something.
    Plotly clicks only a point it has seen hovered, and a busy machine may redraw the chart between
    the pointer's arrival and the click (the new point was never hovered, and the click is lost): so
    each poll that still finds nothing opened finds the element again, moves onto it a pixel to and
    fro, and clicks again."""
    def click(actions):
        return actions.key_down(Keys.SHIFT).click().key_up(Keys.SHIFT) if shift else actions.click()

    return _point_until(driver, find, opened, click, timeout)


def _point_until(driver, find, done, then, timeout: float):
    """Check ``done(driver)`` every tenth of a second; at most once a second while it returns nothing,
    move the pointer onto ``find(driver)`` (a pixel to and fro) and perform ``then`` (ActionChains ->
    ActionChains) there. (A click repeated faster than the page answers it would open a run twice.)"""
    moves = iter(range(10**6))
    last = [-1.0]

    def pointed(d):
        found = done(d)
        if found:
            return found
        if time.monotonic() - last[0] >= 1.0:
            last[0] = time.monotonic()
            step = next(moves)
            with contextlib.suppress(Exception):      # the element may be redrawn between find and move
                then(ActionChains(d).move_to_element(find(d)).move_by_offset(step % 2, 0)).perform()
        return None

    try:
        return wait(driver, timeout).until(pointed)
    except TimeoutException:
        raise TimeoutException(f"nothing happened in {timeout:.0f} s of pointing: {_under_pointer(driver, find)}") from None


UNDER_JS = """
const el = arguments[0];
if (!el) return 'no element to point at';
const r = el.getBoundingClientRect(), x = r.x + r.width / 2, y = r.y + r.height / 2;
const top = document.elementFromPoint(x, y);
const name = (e) => e ? e.tagName + (e.id ? '#' + e.id : '') + (e.getAttribute('class') ? '.' + e.getAttribute('class') : '') : 'nothing';
return `target ${name(el)} ${Math.round(r.width)}x${Math.round(r.height)} px at (${Math.round(x)}, ${Math.round(y)}), ` +
       `window ${innerWidth}x${innerHeight} scrolled ${Math.round(scrollY)}; on top there: ${name(top)}` +
       (top && top !== el && !el.contains(top) ? ' (covers the target)' : '');
"""


def _under_pointer(driver, find) -> str:
    """What the pointer would meet at the target's centre (a diagnosis for a failed hover or click)."""
    try:
        return driver.execute_script(UNDER_JS, find(driver))
    except Exception as exc:       # the page itself may be what broke
        return f"the target could not be inspected ({type(exc).__name__})"


def wait(driver, timeout: float = RENDER_TIMEOUT_S) -> WebDriverWait:
    """A wait that checks its condition every tenth of a second (selenium's default: every half second,
    most of it idle once the page has drawn)."""
    return WebDriverWait(driver, timeout, poll_frequency=0.1)
