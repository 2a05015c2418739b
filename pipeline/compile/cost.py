"""The tool's own cost, per candidate and per stage: a product figure, reported with every run.

A candidate's account holds the wall seconds of building it (compiles, exports, graph recording) and
of checking it against eager, how much of that Dynamo's tracing and Inductor's compiling took (torch's
own timers) with the FX-graph cache's hits and misses, the seconds a compile worker spent on it ahead
of capture, and the seconds its calls took in the screen and the profile. ``tune_s`` is the run's
wall time from the first build to the end of its last stage.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import asdict, dataclass, fields
from typing import Any, Dict, Iterator, Mapping

from pipeline.compile import cache as compile_cache


@dataclass
class BuildCost:
    """What building a backend and warming it up cost (``pipeline.compile.build``), wherever it is built: the
    tune's account of a candidate (:class:`CandidateCost`) and a load's of a backend (``artifacts.BackendLoad``)."""

    build_s: float = 0.0  # wall: building it (compiles, exports, graph warm-up and recording)
    trace_s: float = 0.0  # of build and warm-up: Dynamo tracing
    compile_s: float = 0.0  # of build and warm-up: AOTAutograd and Inductor, cache loads included
    cache_hits: int = 0  # FX-graph cache: programs loaded instead of compiled
    cache_misses: int = 0  # programs compiled
    record_s: float = 0.0  # of build: device-graph recording
    # of build: device graphs' first calls of the program at each recorded size, before recording (every compile,
    # and the device libraries' set-up for each new shape: a fresh CUDA load's seconds are mostly these)
    first_calls_s: float = 0.0


@dataclass
class CandidateCost(BuildCost):
    """Seconds (and cache counts) one candidate cost the tune; its warm-up is capture's check against eager."""

    check_s: float = 0.0  # wall: its outputs against eager at every tuned size (and its own variants)
    ahead_s: float = 0.0  # a compile worker's seconds on its program, before capture built it (overlapped)
    # the programs that worker's job compiled (its cache misses: the FX graph's for a traced program, AOTAutograd's
    # for a standalone one; counted once per job, on the first candidate built from it): with cache_misses,
    # whether a tune's seconds were a cold or a warm cache's
    ahead_compiled: int = 0
    wait_s: float = 0.0  # capture blocked on that worker: the part of its seconds nothing else overlapped
    screen_s: float = 0.0  # its calls in the screen
    profile_s: float = 0.0  # its calls in the profile
    aot_s: float = 0.0  # routed only: building its program ahead of time at save, and holding it to the traced one

    @property
    def total_s(self) -> float:
        """What it cost the run's own process: build, checks, waiting on its compile worker, screen, profile and its
        program ahead of time (a worker's own seconds run beside it)."""
        return self.build_s + self.check_s + self.wait_s + self.screen_s + self.profile_s + self.aot_s

    def to_dict(self) -> Dict[str, float]:
        return {**asdict(self), "total_s": self.total_s}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "CandidateCost":
        return cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data})


@contextlib.contextmanager
def compiles_into(cost: BuildCost) -> Iterator[None]:
    """Add the Dynamo and Inductor seconds and the cache hits and misses of the block to ``cost``."""
    before = compile_cache.counts()
    try:
        yield
    finally:
        after = compile_cache.counts()
        cost.trace_s += after["trace_s"] - before["trace_s"]
        cost.compile_s += after["compile_s"] - before["compile_s"]
        cost.cache_hits += int(after["cache_hits"] - before["cache_hits"])
        cost.cache_misses += int(after["cache_misses"] - before["cache_misses"])


class Stopwatch:
    """Wall seconds since it was made (``time.perf_counter``)."""

    def __init__(self) -> None:
        self.start = time.perf_counter()

    @property
    def seconds(self) -> float:
        return time.perf_counter() - self.start


# The table's columns: a figure of the account -> its heading
COLUMNS = {"build_s": "build", "check_s": "check", "trace_s": "trace", "compile_s": "compile", "cache_hits": "hits",
           "cache_misses": "misses", "record_s": "record", "ahead_s": "ahead", "wait_s": "wait", "screen_s": "screen",
           "profile_s": "profile", "aot_s": "aot", "total_s": "total"}


def table(costs: Mapping[str, CandidateCost], stage_seconds: Mapping[str, float], tune_s: float,
          step_seconds: Mapping[str, float]) -> str:
    """The cost account as a short text table: a row per candidate, then the stages, the steps of a stage that
    belong to no candidate (``step_seconds``), and ``tune_s``."""
    width = max([len("candidate"), *(len(n) for n in costs)])
    lines = [f"  {'candidate':<{width}}  " + "  ".join(f"{h:>7}" for h in COLUMNS.values())]
    for name, cost in costs.items():
        row = cost.to_dict()
        cells = [f"{row[c]:>7d}" if c.startswith("cache") else f"{row[c]:>7.1f}" for c in COLUMNS]
        lines.append(f"  {name:<{width}}  " + "  ".join(cells))
    stages = ", ".join(f"{stage} {seconds:.1f} s" for stage, seconds in stage_seconds.items())
    steps = ", ".join(f"{step} {seconds:.1f} s" for step, seconds in step_seconds.items())
    lines.append(f"  stages: {stages}{f' (of which {steps})' if steps else ''}; tune_s {tune_s:.1f} (seconds; hits and "
                 f"misses: FX-graph cache; ahead: compile workers, overlapped; wait: capture blocked on a worker; "
                 f"aot: the program built ahead of time at save)")
    return "\n".join(lines)
