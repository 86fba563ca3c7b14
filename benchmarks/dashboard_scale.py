"""The dashboard at 10,000 runs, measured in headless Chromium (targets: first render <= 1.5 s, a
model-selector change <= 300 ms, a new run shown without a page reload).

    python -m benchmarks.dashboard_scale                        # copies of ./mlflow.db's runs
    python -m benchmarks.dashboard_scale --from sqlite:///mlflow.db --runs 10000 --store /tmp/scale

1. Seed: copies of every run of a real sweep's store (``--from``, default the main job's
   ./mlflow.db), logged through the real tracking API (``tracking.log_trial``, trial.json and all),
   round-robin until the store holds ``--runs`` runs. Each pass over the source is its own
   ``sweep_id`` (``scale-0001``...), as if the same sweep had been run that many times. An existing
   store that already holds enough runs is reused (seeding 10,000 takes ~8 minutes on 2 cores).
2. Serve ``python dashboard/app.py`` against it, as a user would, and print how long the server took
   to answer its first request (it reads the store once, before it serves).
3. In Chromium: first render (navigation start -> every chart of every section drawn), the median
   and worst of several model-selector changes (choice -> the deep-dive chart redrawn), and a new
   run: one more run logged while the page is open, then the time until the page shows it on its
   own (store-change check every ``--refresh-s``) and after a reload.

Prints one table of times with the targets beside them; exits 1 if a target is missed.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
import tracking
from trials.config import TrialConfig
from trials import groups
from trials.loop import TrialResult

TARGETS = {"first render": 1.5, "selector change (worst)": 0.3}


def _log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def source_results(uri: str) -> list[TrialResult]:
    """Every run of the source store, rebuilt from its trial.json as the trial returned it."""
    results = []
    for group in groups.NAMES:
        frame = tracking.runs_frame(uri, group, status=None)
        for run_id in frame.get("run_id", []):
            data = tracking.read_trial_artifact(uri, run_id)
            results.append(TrialResult(TrialConfig.from_dict(data["config"]), data["status"], data["metrics"],
                                       data["tags"], data["raw"], data.get("error", "")))
    if not results:
        raise SystemExit(f"error: {uri} holds no runs to copy; run `python sweeps/full.py` first or give --from")
    return results


def count_runs(uri: str) -> int:
    return sum(len(tracking.runs_frame(uri, group, status=None)) for group in groups.NAMES)


def seed(source: str, target: str, runs: int) -> None:
    tracking.prepare_store(target)
    have = count_runs(target)
    if have >= runs:
        _log(f"{target} already holds {have} runs; reusing it")
        return
    results = source_results(source)
    _log(f"seeding {runs - have} runs into {target} from {len(results)} runs of {source}")
    started = last = time.monotonic()
    for i in range(have, runs):
        tracking.log_trial(target, results[i % len(results)], sweep_id=f"scale-{i // len(results):04d}")
        if time.monotonic() - last > 15:
            last = time.monotonic()
            done = i + 1 - have
            _log(f"  {i + 1}/{runs} runs, {done / (last - started):.0f} runs/s")
    _log(f"seeded in {time.monotonic() - started:.0f} s")


# Every chart of every section drawn: as many graphs as expected, each with data and drawn marks;
# returns the page's clock (ms since navigation started) at that moment.
ALL_DRAWN_JS = """
const graphs = Array.from(document.querySelectorAll('#sections .js-plotly-plot'));
if (graphs.length < arguments[0]) return null;
const drawn = graphs.every(gd => gd.data && gd._fullLayout && gd.querySelectorAll(
  '.barlayer .point, .scatterlayer .point, .scatterlayer .js-line, .table .cell-text, .heatmaplayer image').length);
return drawn ? performance.now() : null;
"""
# A redraw gives each graph under a container a new data array (Plotly.react) or a new element.
STAMP_JS = """
window.__before = Array.from(document.querySelectorAll('#' + arguments[0] + ' .js-plotly-plot')).map(g => g.data);
return true;
"""
REDRAWN_JS = """
const graphs = Array.from(document.querySelectorAll('#' + arguments[0] + ' .js-plotly-plot'));
return graphs.length > 0 && graphs.every(g => g.data && g._fullLayout && !window.__before.includes(g.data));
"""
# The first chart drawn (the page's clock, ms), once every chart in the first screenful is drawn.
FIRST_SCREEN_JS = """
const graphs = Array.from(document.querySelectorAll('#sections .js-plotly-plot'))
  .filter(g => g.getBoundingClientRect().top < window.innerHeight);
if (!graphs.length) return null;
const drawn = graphs.every(gd => gd.data && gd._fullLayout && gd.querySelectorAll(
  '.barlayer .point, .scatterlayer .point, .scatterlayer .js-line, .table .cell-text').length);
return drawn ? performance.now() : null;
"""
SHOWS_JS = """
const gd = document.querySelector('#' + arguments[0] + ' .js-plotly-plot');
return !!(gd && gd.data && gd.data.some(t => Array.from(t.y || []).some(y => Math.abs(y - arguments[1]) < 1e-6)));
"""


def _wait(driver, script: str, *args, timeout: float = 120.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = driver.execute_script(script, *args)
        if value:
            return value
        time.sleep(0.005)
    raise SystemExit(f"error: the page did not get there within {timeout:.0f} s: {script.strip().splitlines()[0]}")


def expected_graphs(runs) -> tuple[int, dict[str, list[str]]]:
    """How many charts the page draws, and each deep-dive selector's models (``app.page_graphs``)."""
    from dashboard.app import page_graphs

    graphs = page_graphs(runs)
    return (sum(len(g["charts"]) + len(g["deep_dive"]) for g in graphs.values()),
            {group: g["models"] for group, g in graphs.items() if g["models"]})


def first_render(driver, url: str, graphs: int) -> tuple[float, float]:
    """Seconds from navigation start to the first screenful of charts drawn, and to every chart
    drawn, by the page's own clock."""
    driver.get("about:blank")
    driver.get(url)
    first = _wait(driver, FIRST_SCREEN_JS) / 1000
    return first, _wait(driver, ALL_DRAWN_JS, graphs) / 1000


def selector_change(driver, group: str, model: str) -> float:
    """Seconds from choosing ``model`` in ``group``'s selector (the Enter key) to its charts redrawn."""
    from selenium.webdriver.common.by import By

    dropdown = driver.find_element(By.CSS_SELECTOR, f"#{group}-model")
    dropdown.click()
    popover = _until(lambda: dropdown.get_attribute("aria-controls")
                     and driver.find_element(By.ID, dropdown.get_attribute("aria-controls")))
    search = popover.find_element(By.CSS_SELECTOR, "input.dash-dropdown-search")
    search.send_keys(model)
    driver.execute_script(STAMP_JS, f"{group}-deep-dive")
    started = time.perf_counter()
    search.send_keys("\n")
    if model not in dropdown.text:
        raise SystemExit(f"error: could not choose {model!r} in {group}'s selector (it shows {dropdown.text!r})")
    _wait(driver, REDRAWN_JS, f"{group}-deep-dive", timeout=30)
    return time.perf_counter() - started


def _until(fn, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = fn()
        except Exception:
            value = None
        if value:
            return value
        time.sleep(0.02)
    raise SystemExit("error: the selector did not open")


def a_new_run(uri: str) -> tuple[float, str]:
    """Log one more baseline run: a rerun of the newest configuration, its throughput 0.01 % above
    the one it replaces (a value no run has had, so the page can be watched for it, and a chart that
    stays true to the measurement); returns that throughput and the chart that shows it."""
    frame = tracking.runs_frame(uri, "baseline").sort_values("start_time")
    frame = frame[frame["tags.sweep_id"] != "scale-new-run"]          # a copy of a measured run
    data = tracking.read_trial_artifact(uri, frame["run_id"].iloc[-1])
    value = float(frame["tok_per_s"].iloc[-1]) * 1.0001 + (time.time() % 1) * 1e-4
    metrics = {k: v for k, v in data["metrics"].items() if not k.startswith("tok_per_s_")}
    result = TrialResult(TrialConfig.from_dict(data["config"]), "FINISHED", {**metrics, "tok_per_s": value},
                         data["tags"], data["raw"])
    tracking.log_trial(uri, result, sweep_id="scale-new-run")
    return value, "baseline-throughput"


def measure(uri: str, folder: Path, rounds: int, refresh_s: float) -> dict[str, float]:
    from dashboard.reader import open_store
    from tests.ui import chromium, serve

    runs = open_store(uri)
    graphs, selectors = expected_graphs(runs)
    _log(f"{runs.count()} runs; the page draws {graphs} charts; selectors: "
         + ", ".join(f"{g} ({len(m)} models)" for g, m in selectors.items()))
    times: dict[str, float] = {}
    started = time.monotonic()
    with serve(uri, folder, "--refresh-s", str(refresh_s)) as url, chromium(folder / "chromium") as driver:
        times["server start (reads the store once)"] = time.monotonic() - started
        first_render(driver, url, graphs)                        # warm the browser's cache of the page's JS
        renders = [first_render(driver, url, graphs) for _ in range(rounds)]
        driver.save_screenshot(str(folder / "dashboard.png"))
        _log(f"screenshot of the first screen: {folder / 'dashboard.png'}")
        times["first render"] = statistics.median(first for first, _ in renders)
        times[f"every chart drawn ({graphs})"] = statistics.median(every for _, every in renders)
        _log("page loads (first screenful, every chart): "
             + ", ".join(f"{first:.2f}/{every:.2f}" for first, every in renders) + " s")
        changes = []
        for group, models in selectors.items():
            for i in range(rounds):
                if len(models) > 1:
                    changes.append(selector_change(driver, group, models[(i + 1) % len(models)]))
        _log(f"selector changes: {', '.join(f'{c:.3f}' for c in changes)} s")
        if changes:
            times["selector change (median)"] = statistics.median(changes)
            times["selector change (worst)"] = max(changes)
        value, graph = a_new_run(uri)
        logged = time.monotonic()
        _wait(driver, SHOWS_JS, graph, value, timeout=60 + 3 * refresh_s)
        times[f"new run shown without a reload (check every {refresh_s:g} s)"] = time.monotonic() - logged
        driver.get(url)
        _wait(driver, SHOWS_JS, graph, value)
        times["new run shown after a reload"] = driver.execute_script("return performance.now()") / 1000
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.dashboard_scale", description=__doc__.split("\n\n")[0])
    parser.add_argument("--from", dest="source", default="sqlite:///mlflow.db", metavar="URI",
                        help="the store whose runs are copied (default: the main job's ./mlflow.db)")
    parser.add_argument("--runs", type=int, default=10_000, help="runs in the seeded store (default 10000)")
    parser.add_argument("--store", type=Path, default=None,
                        help="folder of the seeded store (reused when it holds enough runs; default: a new "
                             "temporary folder)")
    parser.add_argument("--rounds", type=int, default=3, help="changes to time per model selector (default 3)")
    parser.add_argument("--refresh-s", type=float, default=2.0, help="the page's store-change check (default 2)")
    args = parser.parse_args(argv)

    folder = (args.store or Path(tempfile.mkdtemp(prefix="dashboard-scale-"))).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    target = f"sqlite:///{folder / 'mlflow.db'}"
    try:
        seed(tracking.reachable_uri(args.source), target, args.runs)
    except tracking.TrackingError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    times = measure(target, folder, args.rounds, args.refresh_s)
    print(f"\nThe dashboard with {count_runs(target)} runs ({target}):")
    width = max(map(len, times))
    missed = []
    for name, seconds in times.items():
        target_s = TARGETS.get(name)
        verdict = "" if target_s is None else f"target <= {target_s:g} s: " + ("met" if seconds <= target_s else "MISSED")
        if target_s is not None and seconds > target_s:
            missed.append(name)
        print(f"  {name:<{width}}  {seconds:7.3f} s   {verdict}")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
