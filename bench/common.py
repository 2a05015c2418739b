"""What benches write beside their figures: the command that made them, without machine paths, and
how fast the host ran Python while they measured."""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path
from typing import Sequence

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


def host_probe_ms(calls: int = 50) -> float:
    """Median milliseconds of a fixed piece of pure Python (``sum(range(20_000))``).

    Launch-bound latencies (eager, Inductor without graphs) move with how fast the host runs a
    launch thread, so a bench records this beside them.
    """
    def once() -> float:
        start = time.perf_counter()
        sum(range(20_000))
        return (time.perf_counter() - start) * 1e3

    return statistics.median(once() for _ in range(calls))
