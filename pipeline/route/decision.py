"""The route the profile so far gives, and the cells it rests on: what the route stage ships, and what the
profile re-measures (a noisy cell is worth another window only where the route rests on it). Where lengths
are tuned, the route is a (batch range x length range) table (``pipeline.route.table``). Decided on plain data
(:class:`Race`), which the run context hands over (``RunContext.race``).

A cell measured on a busy host (``contended``: ``pipeline.measure.contention``) settles no choice: its median
tells where the host was, not the candidate, so its interval is taken as unknown (0 to infinity). No range is
split on it, and where the route's choice at a cell rests on one, the decision names it ``unsettled``."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Collection, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from pipeline.backends.candidate import Candidate
from pipeline.config.schema import RouteConfig
from pipeline.route import table
from pipeline.route.policy import Range, choose_route, eager_baseline, rests_on, usable

TIMED = ("router", "highest_throughput")  # the strategies whose choice rests on the profile's timings


@dataclass(frozen=True)
class Race:
    """What a route is decided on: the profile's medians and intervals (candidate -> cell -> ms), the candidates in
    config order, those that may not serve (and why), the eager baseline no profiled cell is served slower than,
    the tuned lengths (none: a route of batch ranges), the candidates that may serve untuned lengths, the reference
    peer's candidates, and the (candidate, cell) pairs measured on a busy host."""

    medians: Mapping[str, Mapping[Any, float]]
    intervals: Mapping[str, Mapping[Any, Tuple[float, float]]]
    order: Sequence[str]
    failures: Mapping[str, str]
    baseline: Optional[str]
    lengths: Sequence[int] = ()
    any_length: Collection[str] = ()
    references: Sequence[str] = ()  # the user's own torch.compile: floors like the baseline (policy.owners_with)
    contended: Collection[Tuple[str, Any]] = ()


@dataclass(frozen=True)
class Decision:
    route: Union[List[Range], List[table.Tile]]  # tiles where lengths are tuned
    baseline: Optional[str]  # the eager candidate no profiled size is served slower than
    failures: Dict[str, str]  # candidates that may not serve, and why
    rests_on: List[Tuple[str, Any]]  # (candidate, cell): the cells the route's choices rest on
    # The contended cells among those, where another candidate competes: the choice there is not settled.
    unsettled: List[Tuple[str, Any]] = field(default_factory=list)


def contested(cells: List[Tuple[str, Any]]) -> Dict[Any, List[str]]:
    """Cell -> the candidates whose cells a choice rests on, where more than the owner's does (another
    candidate's interval overlaps the owner's): only there can a re-measure or a quieter host change the route."""
    at: Dict[Any, List[str]] = {}
    for name, bs in cells:
        if name not in at.setdefault(bs, []):
            at[bs].append(name)
    return {bs: names for bs, names in at.items() if len(names) > 1}


def baseline(candidates: Mapping[str, Candidate]) -> Optional[str]:
    """Plain eager at fp32 where it competes (else the first eager candidate): the route never loses to it."""
    kinds = {n: c.kind for n, c in candidates.items()}
    return (eager_baseline({n: kind for n, kind in kinds.items() if candidates[n].precision == "fp32"})
            or eager_baseline(kinds))


def decide(race: Race, rcfg: RouteConfig) -> Decision:
    """The configured strategy (``route``: strategy, min_gain, backend) over the race's medians and intervals
    (``pipeline.route.policy``; in two dimensions ``pipeline.route.table``)."""
    medians, eager = race.medians, race.baseline
    unknown = (0.0, math.inf)
    intervals = {b: {key: unknown if (b, key) in race.contended else iv for key, iv in per.items()}
                 for b, per in race.intervals.items()}
    order, failures = list(race.order), dict(race.failures)
    competed = {b: medians[b] for b in usable(medians, order, failures)}
    timed = rcfg.strategy in TIMED
    if race.lengths:
        tiles = table.choose_table(medians, order, list(race.lengths), rcfg.strategy, rcfg.min_gain,
                                   set(race.any_length), rcfg.backend, failures, baseline=eager, intervals=intervals,
                                   references=race.references)
        cells = table.rests_on(tiles, competed, intervals) if timed else []
        return Decision(tiles, eager, failures, cells, unsettled(cells, race.contended))
    route = choose_route(medians, order, rcfg.strategy, rcfg.min_gain, rcfg.backend, failures,
                         baseline=eager, intervals=intervals, references=race.references)
    cells = rests_on(route, competed, intervals) if timed else []
    return Decision(route, eager, failures, cells, unsettled(cells, race.contended))


def unsettled(cells: List[Tuple[str, Any]], contended: Collection[Tuple[str, Any]]) -> List[Tuple[str, Any]]:
    """The contended cells among those a route rests on, at cells where more than one candidate competes: there a
    quiet host may choose otherwise. A contended cell no other candidate competes at decides nothing."""
    at = contested(cells)
    return [(name, key) for name, key in cells if key in at and (name, key) in contended]
