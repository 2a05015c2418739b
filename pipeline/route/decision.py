"""The route the profile so far gives, and the cells it rests on: what the route stage ships, and what the
profile re-measures (a noisy cell is worth another window only where the route rests on it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

from pipeline.backends.precision import precision_of
from pipeline.context import RunContext
from pipeline.route.policy import Range, choose_route, eager_baseline, rests_on, usable

TIMED = ("router", "highest_throughput")  # the strategies whose choice rests on the profile's timings


@dataclass(frozen=True)
class Decision:
    route: List[Range]
    baseline: Optional[str]  # the eager candidate no profiled size is served slower than
    failures: Dict[str, str]  # candidates that may not serve, and why
    rests_on: List[Tuple[str, int]]  # (candidate, batch size): the cells the route's choices rest on


def contested(cells: List[Tuple[str, int]]) -> Dict[int, List[str]]:
    """Batch size -> the candidates whose cells a choice rests on, where more than the owner's does (another
    candidate's interval overlaps the owner's): only there can a re-measure or a quieter host change the route."""
    at: Dict[int, List[str]] = {}
    for name, bs in cells:
        if name not in at.setdefault(bs, []):
            at[bs].append(name)
    return {bs: names for bs, names in at.items() if len(names) > 1}


def baseline(ctx: RunContext) -> Optional[str]:
    """Plain eager at fp32 where it competes (else the first eager candidate): the route never loses to it."""
    candidates = ctx.candidates
    return (eager_baseline({n: c for n, c in candidates.items() if precision_of(c) == "fp32"})
            or eager_baseline(candidates))


def decide(ctx: RunContext) -> Decision:
    """The configured strategy over the profile's medians and intervals (``pipeline.route.policy``)."""
    rcfg = ctx.cfg.route
    medians, intervals = ctx.medians(), ctx.intervals()
    order, failures, eager = list(ctx.candidates), ctx.failures(), baseline(ctx)
    route = choose_route(medians, order, rcfg.strategy, rcfg.min_gain, rcfg.backend, failures,
                         baseline=eager, intervals=intervals)
    competed = {b: medians[b] for b in usable(medians, order, failures)}
    cells = rests_on(route, competed, intervals) if rcfg.strategy in TIMED else []
    return Decision(route, eager, failures, cells)
