"""Sweep overhead and two-worker scaling, printed as ratios (targets: <= 0.05 and <= 0.6).

    python -m benchmarks.overhead                      # the quick baseline sweep on the zoo
    python -m benchmarks.overhead --groups baseline --models zoo-gqa,zoo-mha

Runs the same sweep twice into fresh temporary stores, once with one worker and once with two, then
reads the runs back and prints:

- overhead ratio (1 worker): (Tune wall time - sum of the trials' own measured time) / sum of the
  trials' measured time. Everything outside the measurement loop counts as overhead: Ray
  scheduling, model loads, MLflow logging. Ray start-up and the zoo check are reported separately.
- scaling ratio: Tune wall time with 2 workers / with 1 worker.
- clean-measurement ratio: median over configs of tok/s measured with 2 workers / with 1 worker.
  Each trial's torch uses only the CPU Ray granted it, so on a machine with at least two cores the
  two trials should not slow each other: a ratio near 1.0 says the numbers stayed clean.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
import tracking


def run_sweep(workers: int, store: Path, extra: list[str]) -> tuple[dict, str]:
    summary = store / "summary.json"
    uri = f"sqlite:///{store / 'mlflow.db'}"
    command = [sys.executable, str(ROOT / "sweeps" / "full.py"), "--workers", str(workers),
               "--tracking-uri", uri, "--summary-json", str(summary), *extra]
    print("$", " ".join(command), flush=True)
    subprocess.run(command, check=True)
    return json.loads(summary.read_text()), uri


def trial_frame(uri: str, groups: list[str]):
    import pandas as pd

    return pd.concat([tracking.runs_frame(uri, g) for g in groups], ignore_index=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     epilog=__doc__.split("\n\n", 1)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--groups", default="baseline")
    parser.add_argument("--models", default=None)
    parser.add_argument("--profile", default="quick")
    args = parser.parse_args()
    extra = ["--groups", args.groups, "--profile", args.profile]
    if args.models:
        extra += ["--models", args.models]
    groups = args.groups.split(",")

    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for workers in (1, 2):
            store = Path(tmp) / f"workers{workers}"
            store.mkdir()
            summary, uri = run_sweep(workers, store, extra)
            results[workers] = (summary, trial_frame(uri, groups))

    one, frame_one = results[1]
    two, frame_two = results[2]
    measured = frame_one["measured_s"].sum()
    loads = frame_one["model_load_s"].sum()
    overhead = (one["tune_s"] - measured) / measured
    by_hash_one = frame_one.set_index("tags.config_hash")["tok_per_s"]
    by_hash_two = frame_two.set_index("tags.config_hash")["tok_per_s"]
    clean = statistics.median((by_hash_two / by_hash_one).dropna())

    print()
    print(f"trials: {len(frame_one)} (1 worker), {len(frame_two)} (2 workers)")
    print(f"1 worker : Tune {one['tune_s']:.1f} s, trials' measured time {measured:.1f} s, "
          f"model loads {loads:.1f} s; Ray start-up {one['ray_start_s']:.1f} s (separate)")
    print(f"2 workers: Tune {two['tune_s']:.1f} s; Ray start-up {two['ray_start_s']:.1f} s (separate)")
    print(f"overhead ratio (target <= 0.05):           {overhead:.3f}")
    print(f"scaling ratio 2 workers / 1 (target <= 0.6): {two['tune_s'] / one['tune_s']:.3f}")
    print(f"clean-measurement ratio tok/s 2w / 1w:       {clean:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
