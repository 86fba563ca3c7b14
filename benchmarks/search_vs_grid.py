"""The capacity search beside the grid, per model, from two stores (printed as trial counts and ratios).

    python sweeps/full.py --sweep benchmarks/search_vs_grid.yaml --search grid --budget none --tracking-uri sqlite:///grid.db
    python sweeps/full.py --sweep benchmarks/search_vs_grid.yaml --budget none --tracking-uri sqlite:///search.db
    python -m benchmarks.search_vs_grid --grid sqlite:///grid.db --search sqlite:///search.db
    python -m benchmarks.search_vs_grid --grid sqlite:///grid.db --replay 10

Two stores, so that the search is not warm-started from the grid's runs. ``--replay N`` needs only the
grid's store: the search runs N times (seeds 0..N-1; the sweep's own seed is 0), each proposal
answered with the grid's measurement of that configuration (a tabular benchmark, as HPO benchmarks
such as HPOBench do: the same measured objective, no second measurement, so the search's luck over
seeds shows, not the machine's drift between two sweeps). Per model and SLO: the
grid's best capacity with its interval and how many trials the grid ran; the search's best after
each of its trials (in ``search_index`` order); the first trial at which the search reached the
grid's best or came within its interval (its lower end), and that count over the grid's (the issue's
target: at most a third). A reader: it writes nothing.
"""

from __future__ import annotations

import argparse
import math
import sys

import pandas as pd

import tracking
from trials.errors import one_line_errors



def runs(uri: str, search: str) -> pd.DataFrame:
    """The searched group's runs of ``uri`` (the capacity group: ``Technique.search``) made by ``search``."""
    from trials import groups

    group = next(g.name for g in groups.GROUPS if g.search)
    frame = tracking.runs_frame(tracking.reachable_uri(uri, must_exist=True), group)
    if frame.empty or "tags.search" not in frame:
        return pd.DataFrame()
    return frame[frame["tags.search"] == search]


def compare(grid: pd.DataFrame, search: pd.DataFrame) -> list[dict]:
    rows = []
    for model, ran in grid.groupby("model"):
        best = ran.loc[ran["capacity_rps"].idxmax()]
        low = best.get("capacity_rps_low", math.nan)
        bar = min(best["capacity_rps"], low) if not math.isnan(low) and low > 0 else best["capacity_rps"]
        searched = search[search["model"] == model].sort_values("search_index") if not search.empty else search
        so_far = searched["capacity_rps"].cummax().tolist() if not searched.empty else []
        reached = next((i for i, value in enumerate(so_far, start=1) if value >= bar), None)
        rows.append({"model": model, "grid_trials": len(ran), "grid_best_rps": float(best["capacity_rps"]),
                     "grid_best_low": float(low), "grid_best_stack": best["stack"], "bar": float(bar),
                     "search_trials": len(searched), "search_best_rps": max(so_far, default=0.0),
                     "search_best_stack": searched.loc[searched["capacity_rps"].idxmax(), "stack"] if so_far else "",
                     "trials_to_reach": reached,
                     "share_of_grid": reached / len(ran) if reached else None})
    return rows


def replay(grid: pd.DataFrame, seeds: int) -> list[dict]:
    """Per model: the search over the grid's measured points, ``seeds`` times; trials to reach the bar."""
    from sweeps.capacity_search import METRIC, CapacitySearcher, _key, warm_start

    rows = []
    for model, ran in grid.groupby("model"):
        ran = ran.sort_values("search_index") if "search_index" in ran else ran
        first = ran.iloc[0]
        slo = {"ttft_slo_s": first["ttft_slo_s"], "tpot_slo_s": first["tpot_slo_s"],
               "attainment_target": first.get("attainment_target", 0.9)}
        points, margins, ratios = warm_start(ran, model, slo)
        knobs = {name: list(dict.fromkeys(p[name] for p in points)) for name in (points[0] if points else {})}
        measured = {_key(p): {METRIC: m, **q} for p, m, q in zip(points, margins, ratios)}
        best = compare(ran, pd.DataFrame())[0]
        reached = []
        for seed in range(seeds):
            searcher = CapacitySearcher(knobs, lambda k, i: {"knobs": k, "search_index": i},
                                        max_trials=len(measured), seed=seed)
            n, found = 0, None
            while (config := searcher.suggest(f"t{n}")) != CapacitySearcher.FINISHED:
                result = measured.get(_key(config["knobs"]))
                searcher.on_trial_complete(f"t{n}", result, error=result is None)
                n += 1
                found = searcher.best()                 # the best feasible point so far
                if found is not None and found.slo_margin >= best["bar"]:
                    break
            reached.append(n if found is not None and found.slo_margin >= best["bar"] else None)
        done = sorted(r for r in reached if r)
        rows.append({**best, "replays": seeds, "grid_points": len(measured), "trials_to_reach": reached,
                     "median_to_reach": done[len(done) // 2] if len(done) == seeds else None})
    return rows


@one_line_errors("search_vs_grid")
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.search_vs_grid", description=__doc__.split("\n\n")[0],
                                     epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--grid", required=True, help="the store of the --search grid sweep")
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--search", help="the store of the searched sweep")
    which.add_argument("--replay", type=int, metavar="N", help="replay the search N times over the grid's measurements")
    args = parser.parse_args(argv)
    if args.replay is not None and args.replay < 1:
        parser.error("--replay needs N >= 1")
    try:
        grid = runs(args.grid, "grid")
        rows = replay(grid, args.replay) if args.replay else compare(grid, runs(args.search, "optuna"))
    except tracking.TrackingError as exc:
        print(f"search_vs_grid: error: {exc}", file=sys.stderr)
        return 2
    if not rows:
        print("no grid runs of the capacity group in --grid: run the first command of --help")
        return 1
    if args.replay:
        for row in rows:
            counts = ", ".join(str(n) if n else "-" for n in row["trials_to_reach"])
            median = row["median_to_reach"]
            print(f"{row['model']}: grid best {row['grid_best_rps']:.3g} req/s (interval low {row['grid_best_low']:.3g}, "
                  f"{row['grid_best_stack']}) of {row['grid_points']} configurations; the search replayed over them "
                  f"reached it in [{counts}] trials (seeds 0..{row['replays'] - 1}; '-': not in the whole grid)"
                  + (f", median {median} = {median / row['grid_points']:.2f} of the grid" if median else ""))
        return 0
    for row in rows:
        reached = (f"reached it at trial {row['trials_to_reach']} of {row['search_trials']} "
                   f"({row['share_of_grid']:.2f} of the grid's trials)" if row["trials_to_reach"]
                   else f"did not reach it in {row['search_trials']} trial(s)")
        print(f"{row['model']}: grid best {row['grid_best_rps']:.3g} req/s (interval low {row['grid_best_low']:.3g}, "
              f"{row['grid_best_stack']}) in {row['grid_trials']} trials; search best {row['search_best_rps']:.3g} "
              f"req/s ({row['search_best_stack']}); the search {reached}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
