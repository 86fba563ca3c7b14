"""Which stack should each model run? The best-stack card's decision (``dashboard.decision``), printed.

    llm-recommend                                        # every model of ./mlflow.db, default limits
    llm-recommend --model smollm2-135m-instruct --max-ttft 200ms --max-tpot 50ms --price-per-hour 0.9
    llm-recommend --details                              # each pick in full: its code, its command
    llm-recommend --objective throughput --json          # machine-readable
    llm-recommend --max-ttft 500ms --max-tpot 50ms --rate 2 --price-per-hour 0.1   # servers for 2 req/s

Per model: the fastest single-stream stack, the highest-throughput batched stack, the smallest, (with
a price) the cheapest per 1M output tokens and (with serving runs) the served stack that sustains the
most requests/s within --max-ttft/--max-tpot, each within the quality budget and the latency limits.
By default one table per model (``dashboard.decision_table``): one line per distinct stack with the
picks it wins, its tok/s and 95 % interval, peak memory, quality, latency and $/1M, then why each
runner-up lost. --details prints each pick in full with the command that reruns the trial and the
code for its engine; the objective's pick comes first, marked "recommended". Where nothing passes:
the closest stack and the limits it misses. The dashboard's best-stack card shows the same table.

Then, per model with capacity runs (``dashboard.capacity``): the llama-server configuration with the
highest capacity (requests/s with >= 90 % of requests within --max-ttft and --max-tpot, else the SLO
the runs were searched under) within the quality budget, its interval, its status (measured, or a
lower bound), its command line and, with --rate, the servers that rate takes, $/h and $/1M output
tokens at that load; where nothing is feasible, the closest configuration's single stream against
the SLO. The card shows the same block.
"""

from __future__ import annotations

import argparse
import json
import math
import sys

import tracking
from dashboard import capacity, served
from dashboard.decision_table import glance
from dashboard.decision_table import render as render_table
from dashboard.decision import OBJECTIVES, ROLES, Decision, as_dict, decide, facts
from dashboard.limits import DEFAULT_LIMITS, Limits, parse_latency, parse_nonnegative, parse_percent, parse_share
from dashboard.stack_facts import reproduce
from trials.errors import ConfigError, argument_type, one_line_errors
from trials.measurement.cost import parse_price_per_hour
from trials.redaction import one_line, redact

PROG = "llm-recommend"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0],
                                     epilog=__doc__.split("\n\n", 1)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tracking-uri", default=None,
                        help="MLflow store (default: $MLFLOW_TRACKING_URI or sqlite:///mlflow.db here)")
    parser.add_argument("--model", action="append", default=None, metavar="NAME",
                        help="a model with whole-stack runs in the store (repeat for several; default: every model)")
    parser.add_argument("--objective", choices=OBJECTIVES, default="speed",
                        help="which pick comes first as the recommendation: " +
                             "; ".join(f"{k}: {v}" for k, v in ROLES.items()) + " (default: speed)")
    parser.add_argument("--max-kl", type=argument_type(parse_nonnegative, "--max-kl"), default=DEFAULT_LIMITS.max_kl,
                        metavar="NATS", help="teacher-forced KL divergence against the model's reference precision, "
                                             f"nats per token (default {DEFAULT_LIMITS.max_kl:g})")
    parser.add_argument("--max-perplexity-increase", type=argument_type(parse_percent),
                        default=DEFAULT_LIMITS.max_perplexity_increase, metavar="PERCENT",
                        help="perplexity increase against the reference precision, where measured, e.g. 2%% "
                             f"(default {100 * DEFAULT_LIMITS.max_perplexity_increase:g}%%)")
    parser.add_argument("--min-token-match", type=argument_type(parse_share, "--min-token-match"), default=None,
                        metavar="SHARE", help="also require this share of greedy tokens equal to the reference's "
                                              "(default: shown, not a limit: greedy text drifts at KL ~0.001)")
    parser.add_argument("--max-ttft", type=argument_type(parse_latency), default=None, metavar="LATENCY",
                        help="time to first token per request, e.g. 200ms (checked at the p95 where a run has "
                             "20 requests or more, else at the largest)")
    parser.add_argument("--max-tpot", type=argument_type(parse_latency), default=None, metavar="LATENCY",
                        help="time per output token per request, e.g. 50ms (p95 or largest, as --max-ttft)")
    parser.add_argument("--price-per-hour", type=argument_type(parse_price_per_hour), default=None, metavar="USD",
                        help="the machine's price in US dollars per hour: adds $/1M output tokens and the "
                             "cheapest pick (default: the price each run logged, if any)")
    parser.add_argument("--rate", type=argument_type(capacity.parse_rate), default=None, metavar="REQ_PER_S",
                        help="a target load in requests per second: the capacity pick's servers for it, $/h and "
                             "$/1M output tokens at that load (with --price-per-hour)")
    parser.add_argument("--no-quality-limit", action="store_true",
                        help="drop the KL and perplexity limits (every stack counts, harmful ones too)")
    parser.add_argument("--details", action="store_true",
                        help="each pick in full: every number, the command that reruns it, the code that turns it on")
    parser.add_argument("--json", action="store_true", help="print the decisions as JSON (with the table as rows)")
    return parser.parse_args(argv)


def limits_from(args: argparse.Namespace) -> Limits:
    quality = {} if not args.no_quality_limit else {"max_kl": None, "max_perplexity_increase": None}
    return Limits(**{"max_kl": args.max_kl, "max_perplexity_increase": args.max_perplexity_increase, **quality},
                  min_token_match=args.min_token_match, max_ttft_s=args.max_ttft, max_tpot_s=args.max_tpot,
                  price_per_hour_usd=args.price_per_hour)


def headline(decision: Decision | None, objective: str) -> str:
    """The model's first line: its recommendation for the objective, how many stacks, the limits."""
    if decision is None:
        return ""
    pick = decision.pick(objective)
    if pick is not None:
        chosen = pick.row["name"]
    elif objective == "cost" and decision.limits.price_per_hour_usd is None:
        chosen = "none (no price: give --price-per-hour)"
    else:
        chosen = "none (no stack qualifies)"
    return (f"{decision.model}: recommended for {objective}: {chosen} ({len(decision.rows)} stacks measured; "
            f"limits: {decision.limits.describe()})")


def render(decision: Decision, objective: str) -> str:
    """One model's decision in full (``--details``): the objective's pick first."""
    lines = [f"{decision.model}: {len(decision.rows)} stacks measured; limits: {decision.limits.describe()}"]
    picks = sorted(decision.picks, key=lambda p: p.role != objective)
    if not any(p.role == objective for p in picks):
        why = ("no price: give --price-per-hour" if objective == "cost" and decision.limits.price_per_hour_usd is None
               else "no stack qualifies")
        lines.append(f"  recommended ({objective}): none ({why})")
    for pick in picks:
        command, code = reproduce(pick.row)
        mark = "recommended: " if pick.role == objective else ""
        lines.append(f"  {mark}{pick.title}: {pick.row['name']}")
        lines += [f"      {fact}" for fact in facts(pick.row, decision.rows, decision.limits)]
        lines.append(f"      why not the next: {pick.runner_up}")
        if pick.excluded:
            lines.append(f"      ranked above it, excluded by the limits: {pick.excluded}")
        lines.append(f"      reproduce: {command}")
        lines.append("      turn it on in your code:")
        lines += [f"        {line}" for line in code.splitlines()]
    if decision.closest is not None:
        row, missed = decision.closest
        lines.append(f"  nothing within the limits; closest: {row['name']}, which misses: {'; '.join(missed)}")
        lines += [f"      {fact}" for fact in facts(row, decision.rows, decision.limits)]
    if decision.note:
        lines.append(f"  note: {decision.note}")
    if decision.failed is not None and len(decision.failed):
        for _, row in decision.failed.iterrows():
            lines.append(f"  FAILED: {row.get('tags.stack_name', '?')}: {str(row.get('tags.error', ''))[:200]}")
    return "\n".join(lines)


def deciding_section():
    """The dashboard section whose runs the decision reads (it declares ``DECIDES = True``)."""
    from dashboard.sections import all_sections

    found = [s for s in all_sections() if getattr(s, "DECIDES", False)]
    if not found:
        raise ConfigError("no dashboard section declares DECIDES = True: no group's runs to decide from")
    return found[0]


def _clean(value):
    """JSON without NaN (not JSON): null."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    return value


def _capacity_text(capacities: dict, model: str, limits: Limits) -> str:
    """The model's capacity block; a model without capacity runs, where others have them: one line."""
    if model in capacities:
        return capacity.render(capacities[model], limits)
    return f"{model}: no capacity runs for this model (python sweeps/full.py runs the capacity search)" \
        if capacities else ""


def _no_capacity_line(capacities: dict) -> None:
    if not capacities:
        print(capacity.NO_RUNS + "\n")


@one_line_errors(PROG)
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        uri = tracking.reachable_uri(args.tracking_uri, must_exist=True)
        group = deciding_section().GROUP
        frame = tracking.runs_frame(uri, group, status=None)
        capacity_runs = capacity.read(uri)
    except tracking.TrackingError as exc:
        print(f"{PROG}: error: {one_line(exc)}", file=sys.stderr)
        return 2
    limits = limits_from(args)
    if args.objective == "cost" and limits.price_per_hour_usd is None and "price_per_hour_usd" not in frame:
        raise ConfigError("--objective cost needs a price: give --price-per-hour (US dollars per hour of this machine)")
    finished = frame[frame["status"] == "FINISHED"] if "status" in frame else frame
    serving, in_process = served.read(uri)
    served_models = sorted(served.latest_served(serving)["model"].dropna().unique()) if not serving.empty else []
    has_stacks = not finished.empty and "tags.stack_name" in finished
    capacity_models = capacity.models(capacity_runs)
    if not has_stacks and not served_models and not capacity_models:
        raise ConfigError(f"{redact(uri)} holds no finished runs of the {group} group: run "
                          f"python sweeps/full.py --groups {group} --tracking-uri ... first")
    known = sorted(set(finished["model"].dropna().unique() if has_stacks else ()) | set(served_models)
                   | set(capacity_models))
    unknown = [m for m in args.model or [] if m not in known]
    if unknown:
        raise ConfigError(f"no {group} runs for {', '.join(map(repr, unknown))} in {redact(uri)}"
                          f"{' (nor served or capacity runs)' if served_models or capacity_models else ''}; "
                          f"models with {group} runs: "
                          f"{', '.join(known)}")
    decisions = {d.model: d for d in (decide(frame, limits, args.model) if has_stacks else [])}
    picks = {d.model: d for d in served.decide_served(serving, in_process, limits, args.model)}
    capacities = {d.model: d for d in capacity.decide_capacity(capacity_runs, in_process, limits, args.model,
                                                               args.rate)}
    models = [m for m in (args.model or known) if m in decisions or m in picks or m in capacities]
    if args.json:
        print(json.dumps(_clean([{**(as_dict(decisions[m]) if m in decisions else {"model": m}),
                                  "served": served.as_dict(picks[m], limits) if m in picks else None,
                                  "capacity_decision": capacity.as_dict(capacities[m]) if m in capacities else None,
                                  "table": glance(decisions.get(m), picks.get(m), limits, args.objective).rows()
                                  if m in decisions or m in picks else []}
                                 for m in models]), indent=1))
    elif args.details:
        print(f"Store: {redact(uri)} ({group} group{'; served stacks from the serving runs' if picks else ''}"
              f"{'; capacity from the capacity runs' if capacities else ''})\n")
        print("\n\n".join("\n".join(part for part in (render(decisions[m], args.objective) if m in decisions else "",
                                                       served.render(picks[m], limits) if m in picks else "",
                                                       _capacity_text(capacities, m, limits)) if part)
                             for m in models))
        _no_capacity_line(capacities)
    else:
        print(f"Store: {redact(uri)} ({group} group{'; served stacks from the serving runs' if picks else ''}"
              f"{'; capacity from the capacity runs' if capacities else ''})\n")
        for m in models:
            decision, pick = decisions.get(m), picks.get(m)
            parts = []
            if decision is not None or pick is not None:
                head = headline(decision, args.objective) or f"{m}: served stacks only (limits: {limits.describe()})"
                parts.append(render_table(glance(decision, pick, limits, args.objective), head))
            print("\n".join(parts + [_capacity_text(capacities, m, limits)]).strip("\n") + "\n")
        _no_capacity_line(capacities)
        print("--details: each pick in full, with the code that turns it on and the command that reruns it")
    return 0


if __name__ == "__main__":
    sys.exit(main())
