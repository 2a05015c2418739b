"""The route in two dimensions: which backend serves which (batch range x length range). Pure: no torch.

Where lengths are tuned (``pipeline.seqlen``), the profile holds cells ``(batch size, length)``, and each
tuned length is a row the router's rule (``pipeline.route.policy``) routes as it routes batch sizes: the
incumbent keeps a size unless a challenger is ``min_gain`` faster beyond both intervals, and no profiled
cell is served slower than eager. A call at an untuned length pads to the next tuned length, so it belongs
to that row; the lengths between two tuned ones form the row's band. A band's untuned lengths can be served
only by a candidate whose padding was proved, or one that runs any length unpadded (``any_length``): where the
row's owner is neither, the band below the tuned length gets its own owners, routed over those candidates
on the same row's measurements. Bands with the same batch ranges merge; no length above the largest tuned
one is served.

The incumbent is chosen over the whole table: the one whose table has the fewest tiles, then the least regret
(geometric mean of owner / fastest latency over every tuned cell), then peak throughput, then config order.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Collection, Dict, List, Mapping, Optional, Sequence, Tuple

from pipeline.route.policy import (Range, check_settings, choose_route, left_behind, owners_with, peak_throughput,
                                   ranges_from_owners, resting_cells, usable)

Cell = Tuple[int, int]  # (batch size, length)
Profile2 = Mapping[str, Mapping[Cell, float]]
Intervals2 = Mapping[str, Mapping[Cell, Tuple[float, float]]]


@dataclass(frozen=True)
class Tile:
    """Batch sizes ``lo..hi`` (``hi`` None: no upper bound) at lengths ``len_lo..len_hi`` go to ``backend``."""

    len_lo: int
    len_hi: int
    lo: int
    hi: Optional[int]
    backend: str

    def holds(self, batch_size: int, length: int) -> bool:
        return (self.len_lo <= length <= self.len_hi and self.lo <= batch_size
                and (self.hi is None or batch_size <= self.hi))

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Band:
    """Lengths ``len_lo..len_hi`` and the batch ranges that serve them."""

    len_lo: int
    len_hi: int
    ranges: Tuple[Range, ...]


def row(profile: Mapping[str, Mapping[Cell, Any]], length: int) -> Dict[str, Dict[int, Any]]:
    """backend -> batch size -> value at one length: the 1-D profile the router's rule routes."""
    out: Dict[str, Dict[int, Any]] = {}
    for name, per in profile.items():
        sizes = {bs: v for (bs, n), v in per.items() if n == length}
        if sizes:
            out[name] = sizes
    return out


def tiles(bands: Sequence[Band]) -> List[Tile]:
    """Bands as tiles, merging consecutive bands whose batch ranges are the same."""
    merged: List[Band] = []
    for band in bands:
        if merged and merged[-1].ranges == band.ranges and merged[-1].len_hi + 1 == band.len_lo:
            merged[-1] = Band(merged[-1].len_lo, band.len_hi, band.ranges)
        else:
            merged.append(band)
    return [Tile(b.len_lo, b.len_hi, r.lo, r.hi, r.backend) for b in merged for r in b.ranges]


def bands_of(owners_at: Mapping[int, Tuple[Dict[int, str], Optional[Dict[int, str]]]]) -> List[Band]:
    """Each tuned length's band from its owners: (at the tuned length, at the untuned lengths below it in its
    band; None where none may serve them)."""
    bands, below = [], 0
    for length in sorted(owners_at):
        tuned, untuned = owners_at[length]
        if below + 1 < length and untuned is not None and untuned != tuned:
            bands.append(Band(below + 1, length - 1, tuple(ranges_from_owners(untuned))))
        lo = below + 1 if untuned == tuned or below + 1 == length else length
        bands.append(Band(lo, length, tuple(ranges_from_owners(tuned))))
        below = length
    return bands


def owners_table(incumbent: str, profile: Profile2, lengths: Sequence[int], order: Sequence[str], min_gain: float,
                 any_length: Collection[str], baseline: Optional[str], intervals: Optional[Intervals2],
                 references: Sequence[str] = ()) -> Dict[int, Tuple[Dict[int, str], Optional[Dict[int, str]]]]:
    """Per tuned length, the router's owners under ``incumbent``: at the tuned length, and at the untuned lengths of
    its band (over ``any_length`` candidates only, where the tuned owner of some size is not among them)."""
    out = {}
    for length in lengths:
        medians = row(profile, length)
        bounds = row(intervals, length) if intervals is not None else None
        tuned = owners_with(incumbent, medians, order, min_gain, baseline, bounds, references)
        if all(owner in any_length for owner in tuned.values()):
            out[length] = (tuned, tuned)
            continue
        able = {b: per for b, per in medians.items() if b in any_length}
        untuned = owners_with(incumbent, able, [b for b in order if b in able], min_gain,
                              baseline if baseline in able else None, bounds,
                              [b for b in references if b in able]) if able else None
        out[length] = (tuned, untuned)
    return out


def regret(owners: Mapping[int, Tuple[Dict[int, str], Any]], profile: Profile2) -> float:
    """Geometric mean over every tuned cell of owner latency / fastest latency (1.0: always the fastest)."""
    logs = []
    for length, (tuned, _) in owners.items():
        medians = row(profile, length)
        for bs, owner in tuned.items():
            fastest = min(per[bs] for per in medians.values() if bs in per)
            logs.append(math.log(medians[owner][bs] / fastest))
    return math.exp(sum(logs) / len(logs)) if logs else 1.0


def peak(profile: Profile2, backend: str, lengths: Sequence[int]) -> float:
    """A backend's best samples per second over the rows."""
    return max((peak_throughput(row(profile, n).get(backend, {})) for n in lengths), default=0.0)


def one_backend_table(backend: str, lengths: Sequence[int], any_length: Collection[str]) -> List[Tile]:
    """Every batch size by ``backend``: at every length up to the largest tuned one where it may serve untuned
    lengths, else at the tuned lengths alone."""
    if backend in any_length:
        return [Tile(1, max(lengths), 1, None, backend)]
    return [Tile(n, n, 1, None, backend) for n in sorted(lengths)]


def choose_table(profile: Profile2, order: Sequence[str], lengths: Sequence[int], strategy: str, min_gain: float,
                 any_length: Collection[str], backend: Optional[str] = None,
                 failures: Optional[Mapping[str, str]] = None, baseline: Optional[str] = None,
                 intervals: Optional[Intervals2] = None, references: Sequence[str] = ()) -> List[Tile]:
    """The table for a strategy (as :func:`pipeline.route.policy.choose_route` gives the 1-D route).
    ``any_length`` names the candidates that may serve untuned lengths (padding proved, or any length unpadded)."""
    failures = failures or {}
    check_settings(strategy, min_gain)
    lengths = sorted(set(lengths))
    serving = usable(profile, order, failures)
    if strategy in ("one_backend", "first_wins") or not serving:
        # The choice of one dimension, which rests on which candidates have a profile, not on their timings; with
        # nothing to serve, choose_route raises with every reason.
        present = {b: {1: 1.0} for b, per in profile.items() if per}
        return one_backend_table(choose_route(present, order, strategy, min_gain, backend, failures)[0].backend,
                                 lengths, any_length)
    if strategy == "highest_throughput":
        chosen = max(serving, key=lambda b: (peak(profile, b, lengths), -order.index(b)))
        return one_backend_table(chosen, lengths, any_length)
    competing = {b: profile[b] for b in serving}
    base = baseline if baseline in serving else None
    floors = [b for b in references if b in serving]
    tables = {b: owners_table(b, competing, lengths, serving, min_gain, any_length, base, intervals, floors)
              for b in serving}

    def merit(incumbent: str) -> tuple:  # as policy.owners_per_size's, over every tuned (batch size, length)
        owners = tables[incumbent]
        behind = sum(left_behind(tuned, row(competing, length), min_gain,
                                 row(intervals, length) if intervals is not None else None)
                     for length, (tuned, _) in owners.items())
        return (behind, len(tiles(bands_of(owners))), regret(owners, competing), -peak(competing, incumbent, lengths),
                serving.index(incumbent))

    return tiles(bands_of(tables[min(tables, key=merit)]))


def backend_at(table: Sequence[Tile], batch_size: int, length: int) -> Optional[str]:
    """The backend that serves ``(batch_size, length)``, or None where the table serves no such length."""
    return next((t.backend for t in table if t.holds(batch_size, length)), None)


def rests_on(table: Sequence[Tile], profile: Profile2, intervals: Intervals2) -> List[Tuple[str, Cell]]:
    """The cells ``(backend, (batch size, length))`` the table's choices rest on (``policy.rests_on`` in 2-D)."""
    keys = sorted({key for per in profile.values() for key in per})
    owners = {key: owner for key in keys if (owner := backend_at(table, *key)) is not None}
    return resting_cells(owners, profile, intervals)


def describe(table: Sequence[Tile]) -> str:
    """``len 1..64 bs 1..4: graph; ...`` for logs and tags."""
    return "; ".join(f"len {t.len_lo}..{t.len_hi} bs {t.lo}..{t.hi if t.hi is not None else 'inf'}: {t.backend}"
                     for t in table)
