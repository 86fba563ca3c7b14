"""The zoo's command line (``python -m trials.models.zoo``, ``llm-zoo``): build a set, list the models."""

from __future__ import annotations

import argparse
import logging
import sys
import time

from trials.models.zoo.builder import build
from trials.models.zoo.cache import (CARD_FILE, DEFAULT_ZOO_DIR, ZOO_ENV_VAR, _read_json, damage, is_built, model_path,
                                     zoo_dir)
from trials.models.zoo.quality import ZooQualityError
from trials.models.zoo.recipes import RECIPES, SETS, ZOO_SETS


def _status(name: str) -> str:
    if is_built(name):
        return "built"
    if damage(name):
        return "damaged"
    return "stale" if (model_path(name) / CARD_FILE).exists() else "missing"


def format_table(set_names: list[str]) -> str:
    header = ("model", "set", "role", "family", "params", "layers", "heads/kv", "head_dim", "ppl", "draft",
              "status")
    rows = [header]
    for set_name in set_names:
        for name in ZOO_SETS[set_name]:
            r = RECIPES[name]
            card = _read_json(model_path(name) / CARD_FILE) or {}
            params = card.get("parameters")
            ppl = card.get("heldout_perplexity")
            pairing = r.default_draft if r.role == "target" else "for " + ",".join(r.draft_for)
            rows.append((name, set_name, r.role, r.family, f"{params / 1e6:.2f}M" if params else "-",
                         str(r.layers), f"{r.attention_heads}/{r.kv_heads}", str(r.head_dim),
                         f"{ppl:.2f}" if ppl else "-", pairing, _status(name)))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows)


def _fail(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m trials.models.zoo",
        description="Build and list the offline zoo of small trained Llama models "
                    f"(cache: ${ZOO_ENV_VAR} or {DEFAULT_ZOO_DIR}; now {zoo_dir()}).")
    sub = parser.add_subparsers(dest="command", required=True)
    p_build = sub.add_parser("build", help="train the models of a set that are missing or out of date",
                             description="Train the models of a zoo set that are missing or out of date.")
    p_build.add_argument("--set", default=None, metavar="{" + ",".join(SETS) + "}",
                         help="which zoo set (default: full, or the set of the --model given)")
    p_build.add_argument("--force", action="store_true", help="rebuild even if up to date")
    p_build.add_argument("--model", action="append", metavar="NAME",
                         help="build only this model (and its teacher); repeatable. "
                              f"Models: {', '.join(RECIPES)}")
    p_build.add_argument("--jobs", type=int, default=None, help="parallel training processes (default: min(2, CPUs))")
    p_list = sub.add_parser("list", help="show each model: role, params, held-out ppl, built or not",
                            description="Show each zoo model: role, params, held-out ppl, built or not.")
    p_list.add_argument("--set", default="all", metavar="{" + ",".join([*SETS, "all"]) + "}",
                        help="which zoo set (default: all)")
    args = parser.parse_args(argv)

    if args.command == "build" and args.set is None:
        first = (args.model or [None])[0]
        args.set = RECIPES[first].zoo_set if first in RECIPES else "full"
    if args.set not in SETS and not (args.command == "list" and args.set == "all"):
        valid = list(SETS) + (["all"] if args.command == "list" else [])
        return _fail(f"unknown zoo set {args.set!r}; valid sets: {', '.join(valid)}")
    if args.command == "list":
        print(format_table(list(SETS) if args.set == "all" else [args.set]))
        return 0

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    for name in args.model or []:
        if name not in ZOO_SETS[args.set]:
            return _fail(f"unknown model {name!r} for set {args.set!r}; valid models: {', '.join(ZOO_SETS[args.set])}")
    start = time.time()
    try:
        build(args.set, force=args.force, only=args.model, jobs=args.jobs)
    except ZooQualityError as exc:
        print(format_table([args.set]))
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(format_table([args.set]))
    print(f"zoo set {args.set!r} ready in {zoo_dir()} ({time.time() - start:.1f}s)")
    return 0

