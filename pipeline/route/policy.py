"""Choosing which backend serves which batch sizes, from a profile table. Pure: no timing, no torch.

A route is a list of ranges ``(lo, hi, backend)`` covering every batch size from 1 up; the last
range has ``hi=None`` (no upper bound). A size between two profiled sizes belongs to the owner of
the next profiled size above it (the size it would be padded toward); a size above the largest
profiled size belongs to the owner of the largest.

"Faster by ``min_gain``" compares speeds: a challenger taking 1.0 ms beats an incumbent taking
1.1 ms by exactly 10% (1.1 / 1.0 - 1 = 0.10). Given each cell's interval (where its median would
land on a re-run), a challenger must also be faster beyond both cells' uncertainty: its interval
lies wholly below the incumbent's. A difference the noise could make never splits a range.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from pipeline.measure.statistics import samples_per_second
from pipeline.config.schema import RouteConfig
from pipeline.errors import RouteError

# backend -> batch size -> median latency (ms). A backend may lack some sizes.
Profile = Mapping[str, Mapping[int, float]]
# backend -> batch size -> (low, high) ms: where each median would land on a re-run.
Intervals = Mapping[str, Mapping[int, Tuple[float, float]]]

STRATEGIES = ("router", "highest_throughput", "first_wins", "one_backend")


@dataclass(frozen=True)
class Range:
    lo: int
    hi: Optional[int]  # inclusive; None = no upper bound
    backend: str

    def holds(self, batch_size: int) -> bool:
        return self.lo <= batch_size and (self.hi is None or batch_size <= self.hi)

    def to_dict(self) -> dict:
        return asdict(self)


def peak_throughput(latencies: Mapping[int, float]) -> float:
    """Best samples per second over the profiled sizes."""
    return max((samples_per_second(bs, ms) for bs, ms in latencies.items() if ms > 0), default=0.0)


def profiled(profile: Profile, order: Sequence[str]) -> List[str]:
    """The backends of ``order`` that have a profile, in order; none is an error."""
    candidates = [b for b in order if profile.get(b)]
    if not candidates:
        raise RouteError("no backend has a profile to route on; every backend failed or was skipped")
    return candidates


def highest_throughput_backend(profile: Profile, order: Sequence[str]) -> str:
    """The backend with the best peak throughput; ties go to the earlier one in ``order``."""
    return max(profiled(profile, order), key=lambda b: (peak_throughput(profile[b]), -order.index(b)))


def clearly_below(a: str, b: str, bs: int, profile: Profile, intervals: Optional[Intervals]) -> bool:
    """Whether ``a``'s interval at ``bs`` lies wholly below ``b``'s: their difference exceeds both
    cells' uncertainty together. Without intervals (or without one for a cell) the medians decide."""
    a_hi = intervals[a][bs][1] if intervals and bs in intervals.get(a, {}) else profile[a][bs]
    b_lo = intervals[b][bs][0] if intervals and bs in intervals.get(b, {}) else profile[b][bs]
    return a_hi < b_lo


# A reference (the user's own torch.compile) measured this much faster than a size's owner takes the size from it
# even where the two cells' intervals overlap: on the GPU suite's quick profile (call M of 2026-12-06) an Inductor
# graph 6% slower than the max-autotune reference by median kept batch 128 within the intervals, and served it 11%
# slower. Switching to a backend measured faster costs no speed when the two are equal, only a range.
REFERENCE_SLACK = 0.02


def undercuts(reference: str, owner: str, bs: int, profile: Profile, intervals: Optional[Intervals]) -> bool:
    """Whether ``reference`` is faster than ``owner`` at ``bs`` beyond both intervals, or by more than
    :data:`REFERENCE_SLACK` by median."""
    return (clearly_below(reference, owner, bs, profile, intervals)
            or profile[owner][bs] > profile[reference][bs] * (1.0 + REFERENCE_SLACK))


def owners_with(incumbent: str, profile: Profile, order: Sequence[str], min_gain: float,
                baseline: Optional[str] = None, intervals: Optional[Intervals] = None,
                references: Sequence[str] = ()) -> Dict[int, str]:
    """For each profiled size: ``incumbent``, unless another backend is at least ``min_gain`` faster there
    and, given ``intervals``, :func:`clearly_below` it.

    Where the incumbent was not measured at a size, the fastest backend measured there owns it.
    Among challengers the fastest wins; ties go to the earlier backend in ``order``. Where
    ``baseline`` (plain eager) is faster than that owner (clearly, given intervals), the fastest
    backend owns the size: the routed model never serves a profiled size slower than the model it tunes. The
    ``references`` (the user's own torch.compile, ``pipeline.backends.reference``) are floors the same way, and
    tighter (:func:`undercuts`): auto is never slower than the copy the user would have written beyond both cells'
    intervals, nor by more than :data:`REFERENCE_SLACK` by median.
    """
    sizes = sorted({bs for lat in profile.values() for bs in lat})
    owners: Dict[int, str] = {}
    for bs in sizes:
        measured = [b for b in order if bs in profile.get(b, {})]
        fastest = min(measured, key=lambda b: (profile[b][bs], order.index(b)))
        if incumbent not in measured:
            owners[bs] = fastest
            continue
        challengers = [b for b in measured if b != incumbent
                       and profile[incumbent][bs] / profile[b][bs] - 1.0 >= min_gain - 1e-12
                       and (intervals is None or clearly_below(b, incumbent, bs, profile, intervals))]
        owner = min(challengers, key=lambda b: (profile[b][bs], order.index(b))) if challengers else incumbent
        below_baseline = baseline in measured and clearly_below(baseline, owner, bs, profile, intervals)
        if below_baseline or any(undercuts(r, owner, bs, profile, intervals) for r in references if r in measured):
            owner = fastest
        owners[bs] = owner
    return owners


def route_regret(owners: Mapping[int, str], profile: Profile) -> float:
    """Geometric mean over the profiled sizes of owner latency / fastest latency (1.0 = always the fastest)."""
    logs = [math.log(profile[owner][bs] / min(lat[bs] for lat in profile.values() if bs in lat))
            for bs, owner in owners.items()]
    return math.exp(sum(logs) / len(logs))


def left_behind(owners: Mapping[Any, str], profile: Mapping[str, Mapping[Any, float]], min_gain: float,
                intervals: Optional[Mapping[str, Mapping[Any, Tuple[float, float]]]] = None) -> int:
    """The cells an incumbent's route serves at least ``min_gain`` slower by median than the fastest there. Without
    intervals there are none (a challenger that much faster takes the cell); with them, an incumbent keeps such a
    cell wherever the two intervals overlap. A cell whose interval is unknown (measured on a busy host:
    ``pipeline.route.decision``) tells nothing either way: it neither leaves a size behind nor is left behind."""
    def known(name: str, key: Any) -> bool:
        return intervals is None or math.isfinite(intervals.get(name, {}).get(key, (0.0, 0.0))[1])

    behind = 0
    for key, owner in owners.items():
        rivals = [per[key] for name, per in profile.items() if key in per and known(name, key)]
        behind += known(owner, key) and profile[owner][key] / min(rivals) - 1.0 >= min_gain - 1e-12
    return behind


def owners_per_size(profile: Profile, order: Sequence[str], min_gain: float,
                    baseline: Optional[str] = None, intervals: Optional[Intervals] = None,
                    references: Sequence[str] = ()) -> Dict[int, str]:
    """Per-size owners under the incumbent that leaves no size behind with the fewest ranges.

    Every backend is tried as the incumbent. The route that serves the fewest sizes ``min_gain`` slower than the
    fastest by median wins (:func:`left_behind`: an incumbent keeps those only because noisy intervals overlap, and
    another incumbent's route, whose every switch the intervals prove, may serve them with the faster backend);
    then the one with the fewest ranges, because the ``min_gain`` rule exists to keep switches few; then the one
    closest to the fastest backend at every size (:func:`route_regret`); then the higher peak throughput; then
    config order. Choosing by peak throughput alone let a backend ahead by 5% at the largest size only keep a size
    where another was 7% faster, and cost a switch besides. Choosing by ranges first kept ONNX Runtime on
    mobilenet_v3_small at every size on the 16-core CPU table (call BF of 2026-12-06), one range, where OpenVINO was
    18-20% faster by median at 8 and 17 within overlapping intervals; OpenVINO as the incumbent served those and
    gave 1 and 64 to ONNX Runtime, proven faster there, and the table's timing found OpenVINO 1.11-1.13x ahead.
    """
    routes = {b: owners_with(b, profile, order, min_gain, baseline, intervals, references)
              for b in profiled(profile, order)}

    def merit(incumbent: str) -> tuple:
        owners = routes[incumbent]
        return (left_behind(owners, profile, min_gain, intervals), len(ranges_from_owners(owners)),
                route_regret(owners, profile), -peak_throughput(profile[incumbent]), order.index(incumbent))

    return routes[min(routes, key=merit)]


def ranges_from_owners(owners: Mapping[int, str]) -> List[Range]:
    """Merge per-size owners into contiguous ranges covering 1..infinity."""
    ranges: List[Range] = []
    lo = 1
    sizes = sorted(owners)
    for i, bs in enumerate(sizes):
        last = i == len(sizes) - 1
        if last or owners[sizes[i + 1]] != owners[bs]:
            ranges.append(Range(lo, None if last else bs, owners[bs]))
            lo = bs + 1
    return ranges


def eager_baseline(kinds: Mapping[str, str]) -> Optional[str]:
    """The first backend (in config order) of kind ``eager``: no size is served slower than it.

    ``kinds`` maps names to their backends' kinds.
    """
    return next((name for name, kind in kinds.items() if kind == "eager"), None)


def check_profile(profile: Profile) -> None:
    """Every latency must be a positive, finite number of milliseconds."""
    for name, per in profile.items():
        for bs, ms in per.items():
            if int(bs) < 1 or not (isinstance(ms, (int, float)) and math.isfinite(ms) and ms > 0):
                raise RouteError(f"profile of {name!r} at batch size {bs}: {ms!r} ms is not a positive finite latency")


def check_settings(strategy: str, min_gain: float) -> None:
    """Refuse an unknown strategy or a negative ``min_gain``: checked with the config, before any work."""
    if strategy not in STRATEGIES:
        raise RouteError(f"unknown route.strategy {strategy!r}; use one of {list(STRATEGIES)}, e.g. route=router")
    if not min_gain >= 0:  # NaN too
        raise RouteError(f"route.min_gain={min_gain} must be >= 0 (0.10 = a challenger must be 10% faster); "
                         f"e.g. route.min_gain=0.10")


def usable(profile: Profile, order: Sequence[str], failures: Mapping[str, str]) -> List[str]:
    """The backends of ``order`` that may serve: profiled and not excluded."""
    return [b for b in order if profile.get(b) and b not in failures]


def choose_route(profile: Profile, order: Sequence[str], strategy: str = RouteConfig.strategy,
                 min_gain: float = RouteConfig.min_gain,
                 backend: Optional[str] = None, failures: Optional[Mapping[str, str]] = None,
                 baseline: Optional[str] = None, intervals: Optional[Intervals] = None,
                 references: Sequence[str] = ()) -> List[Range]:
    """The route for a strategy.

    ``order`` is the config order of the backends; ``failures`` maps excluded backends (failed to
    build, did not match eager, unsupported) to their reason: they never serve, and
    ``one_backend`` raises the named backend's own error. ``baseline`` names the plain-eager
    backend, which the router never lets a size be served slower than. ``intervals`` make the
    router split a range only on differences beyond both cells' uncertainty; ``references`` are floors like
    ``baseline`` (:func:`owners_with`).
    """
    failures = failures or {}
    check_profile(profile)
    check_settings(strategy, min_gain)
    serving = usable(profile, order, failures)
    if strategy == "one_backend":
        if not backend:
            raise RouteError("route.strategy=one_backend needs route.backend=<name>")
        if backend not in order:
            raise RouteError(f"route.backend={backend} is not among the selected backends {list(order)}; "
                             f"add it, e.g. 'backends=[eager,{backend}]'")
        if backend in failures:
            raise RouteError(f"route.backend={backend} was excluded: {failures[backend]}")
        if backend not in serving:
            raise RouteError(f"route.backend={backend} has no profile to serve from; was the profile stage run?")
        return [Range(1, None, backend)]
    if not serving:
        raise RouteError("no backend has a profile to route on; every backend failed, was skipped or is unverified: "
                         + "; ".join(f"{b}: {r}" for b, r in failures.items()))
    if strategy == "first_wins":
        return [Range(1, None, serving[0])]
    if strategy == "highest_throughput":
        return [Range(1, None, highest_throughput_backend(profile, serving))]
    return ranges_from_owners(owners_per_size({b: profile[b] for b in serving}, serving, min_gain,  # the router
                                              baseline if baseline in serving else None, intervals,
                                              [b for b in references if b in serving]))


def rests_on(route: Sequence[Range], profile: Profile, intervals: Intervals) -> List[Tuple[str, int]]:
    """The cells ``(backend, batch size)`` a route's choices rest on: at every profiled size, the
    owner's cell, and each other backend's whose interval overlaps the owner's (within the noise,
    either could be the faster). ``profile`` holds the backends that competed."""
    sizes = sorted({bs for per in profile.values() for bs in per})
    return resting_cells({bs: backend_for(route, bs) for bs in sizes}, profile, intervals)


def resting_cells(owners: Mapping[Any, str], profile: Mapping[str, Mapping[Any, float]],
                  intervals: Mapping[str, Mapping[Any, Tuple[float, float]]]) -> List[Tuple[str, Any]]:
    """:func:`rests_on` for any cells (batch sizes, or (batch size, length) pairs): ``owners`` maps each
    profiled cell to the backend that serves it."""
    cells: List[Tuple[str, Any]] = []
    for key in sorted(owners):
        owner = owners[key]
        if key not in profile.get(owner, {}):
            continue
        cells.append((owner, key))
        cells += [(b, key) for b, per in profile.items() if b != owner and key in per
                  and not clearly_below(b, owner, key, profile, intervals)
                  and not clearly_below(owner, b, key, profile, intervals)]
    return cells


def backend_for(route: Sequence[Range], batch_size: int) -> str:
    """The backend that serves ``batch_size``."""
    for r in route:
        if r.holds(batch_size):
            return r.backend
    raise RouteError(f"batch size {batch_size} is outside the route {route}")


def sizes_owned(route: Sequence[Range], backend: str, sizes: Sequence[int]) -> List[int]:
    """The subset of ``sizes`` that ``backend`` serves."""
    return [bs for bs in sizes if backend_for(route, bs) == backend]
