"""What a store measured, as Markdown: the figures the sweep's sizing rests on, regenerated from runs.

Sizes in the code (the batch ladder, the KV contexts, the budget model's batch growth) were chosen
from measurements; those measurements go stale with the machine and the code, so they live here,
recomputed from a store, instead of in comments. Paste the output into the README's "Measured"
section (or a PR) with the command that produced it:

    llm-report --tracking-uri sqlite:///mlflow.db > measured.md

Every figure names its group and model; nothing is printed that the store does not hold.
"""

from __future__ import annotations

import argparse
import math
import sys

import pandas as pd

import tracking
from trials import groups

SATURATION_GAIN = 0.05        # a batch "stops gaining" when tok/s rises by less than this over the last


def _seconds(frame: pd.DataFrame) -> pd.Series:
    """Wall time of each trial in its worker (``trial_s``: loading, references and repeats); NaN for
    runs logged before the metric existed."""
    return frame["trial_s"] if "trial_s" in frame else pd.Series(float("nan"), index=frame.index)


def machine(frames: dict[str, pd.DataFrame]) -> str:
    rows = pd.concat([f for f in frames.values() if not f.empty], ignore_index=True)
    if rows.empty:
        return "(no finished runs)"
    parts = []
    for column in ("tags.env.cpu_model", "tags.env.cpu_capability", "tags.env.device_name"):
        if column in rows:
            parts.append(", ".join(sorted(rows[column].dropna().astype(str).unique())))
    first, last = pd.to_datetime(rows["start_time"]).min(), pd.to_datetime(rows["end_time"]).max()
    return f"{' / '.join(p for p in parts if p)}; runs from {first:%Y-%m-%d %H:%M} to {last:%Y-%m-%d %H:%M} UTC"


def trial_times(frames: dict[str, pd.DataFrame]) -> list[str]:
    lines = ["| group | finished runs | median s per trial | total min |", "| --- | --- | --- | --- |"]
    for group, frame in frames.items():
        if frame.empty:
            continue
        seconds = _seconds(frame)
        lines.append(f"| {group} | {len(frame)} | {seconds.median():.1f} | {seconds.sum() / 60:.1f} |")
    return lines


def batching(frame: pd.DataFrame) -> list[str]:
    """tok/s per batch size, and where one more doubling stops paying (what sizes the quick ladder)."""
    if frame.empty:
        return []
    lines = ["| model | tok/s by batch | stops gaining at |", "| --- | --- | --- |"]
    for model, part in frame.groupby("model"):
        by_batch = part.groupby("batch_size")["tok_per_s"].median().sort_index()
        ladder = ", ".join(f"{int(b)}: {v:.0f}" for b, v in by_batch.items())
        gains = by_batch.pct_change().dropna()
        flat = gains[gains < SATURATION_GAIN]
        stop = f"batch {int(flat.index[0])} (+{flat.iloc[0]:.1%})" if len(flat) else "not within the ladder"
        growth = by_batch.iloc[0] * by_batch.index / by_batch       # step cost at b over step cost at 1
        per_row = ((growth - 1) / (by_batch.index - 1)).iloc[1:].median() if len(by_batch) > 1 else float("nan")
        lines.append(f"| {model} | {ladder} | {stop}; decode step grows ~{per_row:.3f} per extra row |")
    return lines


def speculative(frame: pd.DataFrame) -> list[str]:
    if frame.empty:
        return []
    lines = ["| model | proposer | best k | speedup | alpha | lossless |", "| --- | --- | --- | --- | --- | --- |"]
    for (model, proposer), part in frame.groupby(["model", "speculation"]):
        best = part.loc[part["tok_per_s"].idxmax()]
        lines.append(f"| {model} | {proposer} | {int(best['num_draft_tokens'])} | {best['speedup']:.2f}x | "
                     f"{best.get('alpha', float('nan')):.2f} | {best['lossless']:.0f} |")
    return lines


def kv_cache(frame: pd.DataFrame) -> list[str]:
    """Trial seconds per backend at each context (what sizes the quick contexts)."""
    if frame.empty:
        return []
    frame = frame.assign(seconds=_seconds(frame), context=pd.to_numeric(frame["context_tokens"]))
    lines = ["| model | context | backend | bits | median trial s |", "| --- | --- | --- | --- | --- |"]
    for (model, context, backend, bits), part in frame.groupby(["model", "context", "kv_backend", "kv_bits"]):
        lines.append(f"| {model} | {int(context)} | {backend} | {int(bits)} | {part['seconds'].median():.1f} |")
    return lines


def quantization(frame: pd.DataFrame) -> list[str]:
    if frame.empty:
        return []
    lines = ["| model | precision | perplexity (x reference) | weights MiB | tok/s |", "| --- | --- | --- | --- | --- |"]
    for (model, precision), part in frame.groupby(["model", "precision"]):
        row = part.sort_values("start_time").iloc[-1]
        lines.append(f"| {model} | {precision} | {row['perplexity']:.2f} ({row['perplexity_ratio']:.3f}) | "
                     f"{row['weights_bytes'] / 2**20:.2f} | {row['tok_per_s']:.0f} |")
    return lines


def stacks(frame: pd.DataFrame) -> list[str]:
    """Each stack per model (tok/s with its 95 % interval, memory, quality), then the effects."""
    if frame.empty or "tags.stack_name" not in frame:
        return []
    from trials.stats.factorial import effects

    # "x base": against the base stack measured in the same worker (speedup_vs_baseline), which is not
    # the ratio of two rows of this table when the two workers' machines were loaded differently
    lines = ["| model | stack | tok/s (95 % CI) | x base, same worker | peak MiB | x base, same worker | token match | KL |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    rows = frame.sort_values("start_time").drop_duplicates(["model", "tags.stack_name"], keep="last")
    for _, r in rows.sort_values(["model", "tok_per_s"], ascending=[True, False]).iterrows():
        kl = r.get("kl_divergence")
        lines.append(f"| {r['model']} | {r['tags.stack_name']} | {r['tok_per_s']:.1f} "
                     f"({r.get('tok_per_s_ci_low', float('nan')):.1f}–{r.get('tok_per_s_ci_high', float('nan')):.1f}) | "
                     f"{r['speedup_vs_baseline']:.2f} | {r['peak_memory_bytes'] / 2**20:.1f} | "
                     f"{r['memory_vs_baseline']:.2f} | {r['fidelity_token_match']:.3f} | "
                     f"{'' if pd.isna(kl) else f'{kl:.4f}'} |")
    found, notes = effects(frame)
    lines += ["", "| model | term | x tok/s (95 % CI) | significant | x peak memory |", "| --- | --- | --- | --- | --- |"]
    memory = {(e.model, e.term): e.ratio for e in found if e.response == "peak_memory_bytes"}
    for e in (e for e in found if e.response == "tok_per_s"):
        lines.append(f"| {e.model} | {e.term} | {e.ratio:.3f} ({math.exp(e.ci_low):.3f}–{math.exp(e.ci_high):.3f}) | "
                     f"{'yes' if e.significant else 'no'} | {memory[(e.model, e.term)]:.3f} |")
    lines += [f"\n{model}: {note}" for model, note in notes.items()]
    return lines


SECTIONS = {"batching": batching, "speculative": speculative, "kv_cache": kv_cache,
            "quantization": quantization, "stacks": stacks}


def group_frames(uri: str) -> dict[str, pd.DataFrame]:
    """Each group's finished runs in the store."""
    return {name: tracking.runs_frame(uri, name) for name in groups.NAMES}


def report(uri: str, frames: dict[str, pd.DataFrame]) -> str:
    """The store's figures as Markdown, from ``group_frames(uri)``."""
    out = [f"Measured in `{uri}`: {machine(frames)}", "", *trial_times(frames)]
    for name, section in SECTIONS.items():
        lines = section(frames[name])
        if lines:
            out += ["", f"**{groups.get(name).title}** (`{name}`)", "", *lines]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="llm-report",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--tracking-uri", default=None,
                        help="MLflow store (default: $MLFLOW_TRACKING_URI or sqlite:///mlflow.db here)")
    args = parser.parse_args(argv)
    try:
        uri = tracking.reachable_uri(args.tracking_uri, must_exist=True)
        frames = group_frames(uri)
        if all(frame.empty for frame in frames.values()):
            raise tracking.TrackingError(f"{uri} holds no finished runs: run a sweep into it first "
                                         "(python sweeps/full.py --tracking-uri ...)")
    except tracking.TrackingError as exc:
        print(f"llm-report: error: {exc}", file=sys.stderr)
        return 2
    print(report(uri, frames), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
