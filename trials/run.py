"""Run one trial on its own, with no Ray and no MLflow: dispatch to its group's runner, and the CLI.

The runner is the group's declaration in ``trials.groups``; every runner composes the one
measurement loop of ``trials.loop``.

Run it directly to check a trial on any machine that has torch and transformers:

    python -m trials.run --model zoo-gqa --precision bf16
    python -m trials.run --config trial.json          # a TrialConfig as JSON

The last line printed is the result as JSON.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import sys
import time
from pathlib import Path

import torch

from trials import groups
from trials.config import Runtime, Stack, TrialConfig, Workload, human_bytes, parse_memory_budget
from trials.errors import ConfigError, one_line_errors, positive_int
from trials.loop import OOM, TrialResult, failed_result, free_memory, is_out_of_memory
from trials.measurement.cost import usd_per_million_tokens
from trials.measurement.neighbours import outside_trial
from trials.redaction import one_line


def run_trial(config: TrialConfig, runtime: Runtime = Runtime()) -> TrialResult:
    """Run one trial and return its measurements; raises on failure (the caller records it), except
    out of memory, in any group: that is a FAILED result whose reason starts with ``oom`` -- the
    device or host ran out, or the trial's measured peak exceeds ``runtime.memory_budget_bytes``
    (``--memory-budget``: a smaller device emulated). Every result carries ``outside_cpu_cores``, the
    CPU that processes outside the trial took meanwhile, and tag ``noisy_neighbour``
    (``trials.measurement.neighbours``)."""
    if runtime.num_threads and config.device == "cpu":
        torch.set_num_threads(runtime.num_threads)
    random.seed(config.seed)
    torch.manual_seed(config.seed)
    started = time.perf_counter()
    with outside_trial(runtime.sweep_pids) as outside:    # its tree (a server) and the sweep's: the rest is a neighbour
        try:
            result = groups.get(config.group).run(config, runtime)
            if result.status == "FINISHED":
                add_shared_numbers(config, result)
        except Exception as exc:
            if not is_out_of_memory(exc):
                raise
            result = failed_result(config, exc)
    if result.error and result.error.startswith(OOM):      # outside the handler: its frames hold tensors
        free_memory(config.device)
    over_budget(result, runtime.memory_budget_bytes)
    add_cost(result, runtime.price_per_hour_usd)
    result.metrics["trial_s"] = time.perf_counter() - started   # everything: loading, references, repeats
    metrics, tags = outside.numbers()    # outside_cpu_cores; noisy_neighbour "True" above NOISY_CORES
    result.metrics.update(metrics)
    result.tags.update(tags)
    return result


def add_shared_numbers(config: TrialConfig, result: TrialResult) -> None:
    """Each other group that charts this run (``config.also_charted_by``: it planned the same
    measurement, ``sweeps.measure_once``) adds its own numbers to it. A number the run has already
    stays; where that group's own differs (a quality scored another way), it is kept beside it as
    ``<group>.<name>``, which that group's readers take instead (``tracking``). Tag
    ``<group>.measurement_source`` says which group's trial measured it."""
    for group in config.also_charted_by:
        metrics, tags = groups.get(group).numbers_on_shared_run(config.charted_as(group), result)
        result.tags[f"{group}.measurement_source"] = f"the {config.group} group's trial, one run for both groups"
        for numbers, own in ((result.metrics, metrics), (result.tags, tags)):
            for name, value in own.items():
                if name not in numbers:
                    numbers[name] = value
                elif numbers[name] != value:
                    numbers[f"{group}.{name}"] = value


def add_cost(result: TrialResult, price_per_hour_usd: float | None) -> None:
    """$/1M output tokens at the price the user gave for this machine, beside the price itself."""
    tok_per_s = result.metrics.get("tok_per_s")
    if price_per_hour_usd is None or result.status != "FINISHED" or not tok_per_s:
        return
    result.metrics["price_per_hour_usd"] = float(price_per_hour_usd)
    result.metrics["usd_per_million_output_tokens"] = usd_per_million_tokens(price_per_hour_usd, tok_per_s)


def over_budget(result: TrialResult, budget: int | None) -> None:
    """A finished trial whose measured peak exceeds the memory budget becomes an ``oom`` FAILED run,
    its measurements kept (the batching group also refuses by prediction before it runs)."""
    peak = result.metrics.get("peak_memory_bytes")
    if budget is None:
        return
    result.metrics["memory_budget_bytes"] = float(budget)
    if result.status == "FINISHED" and peak is not None and peak > budget:
        result.status = "FAILED"
        result.error = (f"{OOM}: measured peak {human_bytes(peak)} exceeds the memory budget "
                        f"({human_bytes(budget)})")


JSON_KINDS = {list: "an array", str: "a string", int: "a number", float: "a number", bool: "true or false",
              type(None): "null"}


def read_config(source: str) -> TrialConfig:
    """``--config``: a TrialConfig as JSON text or a JSON file, read in one place, so that what is
    not one is a ``ConfigError`` line: a file that cannot be read or decoded, JSON that is malformed
    or nested too deeply to parse, or a document that is not an object."""
    if source.lstrip().startswith(("{", "[")):
        text = source
    else:
        try:
            text = Path(source).read_text(encoding="utf-8")
        except UnicodeDecodeError as exc:
            raise ConfigError(f"--config {source}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    try:
        data = json.loads(text)
    except RecursionError:
        raise ConfigError("--config: JSON nested too deeply to read (a trial config is two levels deep)") from None
    except ValueError as exc:                        # JSONDecodeError, and numbers too long to convert
        raise ConfigError(f"--config: not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"--config: a trial config is a JSON object (its fields by name), not "
                          f"{JSON_KINDS.get(type(data), 'a ' + type(data).__name__)}")
    if too_deep(data, MAX_CONFIG_DEPTH):
        raise ConfigError(f"--config: nested more than {MAX_CONFIG_DEPTH} levels deep; a trial config's values "
                          "are numbers, strings, and mappings or lists of them")
    return TrialConfig.from_dict(data)


MAX_CONFIG_DEPTH = 6      # config -> declared -> entry -> value: 4 at most


def too_deep(value, limit: int) -> bool:
    """Whether mappings and lists nest deeper than ``limit`` in ``value`` (walked without recursion)."""
    level = [value]
    for _ in range(limit + 1):
        level = [v for item in level if isinstance(item, (dict, list))
                 for v in (item.values() if isinstance(item, dict) else item)]
        if not level:
            return False
    return True


@one_line_errors("llm-trial")
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trials.run", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", help="a TrialConfig as a JSON file or JSON string")
    parser.add_argument("--model", default="zoo-gqa")
    parser.add_argument("--group", default=groups.implemented()[0], help=f"one of {', '.join(groups.implemented())}")
    parser.add_argument("--precision", default="fp32")
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--prompt-set", default="mixed")
    parser.add_argument("--prompts-per-type", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--threads", type=positive_int, default=None, help="torch CPU threads")
    parser.add_argument("--memory-budget", default=None, metavar="SIZE",
                        help="emulate a device with this much memory, e.g. 2GiB: a trial whose peak exceeds it is an "
                             "'oom' FAILED run (the batching group also refuses by its predicted peak)")
    parser.add_argument("--raw", action="store_true", help="include per-repeat numbers and texts")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        if args.config:
            config = read_config(args.config)
        else:
            config = TrialConfig(group=args.group, model=args.model, device=args.device,
                                 stack=Stack(precision=args.precision, batch_size=args.batch_size),
                                 workload=Workload(args.prompt_set, args.prompts_per_type,
                                                   args.max_new_tokens),
                                 repeats=args.repeats)
        budget = None if args.memory_budget is None else parse_memory_budget(args.memory_budget)
        result = run_trial(config, Runtime(num_threads=args.threads, memory_budget_bytes=budget))
    except (ConfigError, OSError) as exc:
        print(f"error: {one_line(exc)}", file=sys.stderr)
        return 2
    out = result.to_dict()
    if not args.raw:
        out.pop("raw")
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
