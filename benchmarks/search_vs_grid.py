"""The capacity search beside the grid, per model, from two stores (printed as trial counts and ratios).

    python sweeps/full.py --sweep benchmarks/search_vs_grid.yaml --search grid --budget none --tracking-uri sqlite:///grid.db
    python sweeps/full.py --sweep benchmarks/search_vs_grid.yaml --budget none --tracking-uri sqlite:///search.db
    python -m benchmarks.search_vs_grid --grid sqlite:///grid.db --search sqlite:///search.db

Two stores, so that the search is not warm-started from the grid's runs. Per model and SLO: the
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
                     "grid_best_low": float(low), "grid_best_stack": best["stack"],
                     "search_trials": len(searched), "search_best_rps": max(so_far, default=0.0),
                     "search_best_stack": searched.loc[searched["capacity_rps"].idxmax(), "stack"] if so_far else "",
                     "trials_to_reach": reached,
                     "share_of_grid": reached / len(ran) if reached else None})
    return rows


@one_line_errors("search_vs_grid")
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.search_vs_grid", description=__doc__.split("\n\n")[0],
                                     epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--grid", required=True, help="the store of the --search grid sweep")
    parser.add_argument("--search", required=True, help="the store of the searched sweep")
    args = parser.parse_args(argv)
    try:
        rows = compare(runs(args.grid, "grid"), runs(args.search, "optuna"))
    except tracking.TrackingError as exc:
        print(f"search_vs_grid: error: {exc}", file=sys.stderr)
        return 2
    if not rows:
        print("no grid runs of the capacity group in --grid: run the first command of --help")
        return 1
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
