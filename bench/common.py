"""What every bench shares: the command that made its figures (without machine paths), and the lanes
of the table benches (one model after another in one process, the tables rewritten after each)."""

from __future__ import annotations

import argparse
import gc
import sys
from pathlib import Path
from typing import Any, Callable, Dict, List, Sequence

import torch

ROOT = Path(__file__).resolve().parents[1]
PATH_OPTIONS = ("--out",)


def command_line(argv: Sequence[str] = ()) -> str:
    """``python bench/<script> ...`` as run, the script repository-relative and ``--out DIR`` as ``--out OUT``."""
    argv = list(argv or sys.argv)
    script = Path(argv[0]).resolve()
    words = ["python", str(script.relative_to(ROOT)) if script.is_relative_to(ROOT) else script.name]
    rest = argv[1:]
    for i, word in enumerate(rest):
        if i and rest[i - 1] in PATH_OPTIONS:
            word = "OUT"
        elif word.startswith(tuple(f"{o}=" for o in PATH_OPTIONS)):
            word = word.split("=", 1)[0] + "=OUT"
        words.append(word)
    return " ".join(words)


def lane_arguments(parser: argparse.ArgumentParser, models: Sequence[str], profile: str) -> None:
    """The options of a table bench: its output, tag, models (one lane), profile preset, device, and --combine."""
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--tag", default="h200")
    parser.add_argument("--models", nargs="+", default=list(models))
    parser.add_argument("--profile", default=profile)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--combine", nargs="+", type=Path, help="join these lanes' JSON instead of running")


def run_lane(args: argparse.Namespace, meta: Callable[[], Dict[str, Any]], bench_model: Callable[[str], Dict],
             write: Callable[[Path, str, Dict[str, Any], List[Dict]], str],
             combine: Callable[[List[Path], Path, str], None]) -> None:
    """Bench ``args.models`` one after another, rewriting the tables after each model so that a run cut short
    keeps what finished; or, with ``--combine``, join lanes' JSON."""
    args.out.mkdir(parents=True, exist_ok=True)
    if args.combine:
        combine(args.combine, args.out, args.tag)
        return
    about, rows = meta(), []
    for model in args.models:
        rows.append(bench_model(model))
        print(write(args.out, args.tag, about, rows), flush=True)
        gc.collect()  # the finished model's backends, graphs and compiled code go before the next model
        torch.cuda.empty_cache()
