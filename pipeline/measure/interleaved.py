"""Timing callables as a caller sees them: warm-up budgets, device sync, interleaved rounds, stop rules.

What is measured is the wall latency a caller sees: the device is synchronised before and after
each call, and a monotonic clock reads the time in between. Like ``triton.testing.do_bench``,
budgets are in milliseconds.

At each batch size, for each callable:

1. The first call (compile, graph record, allocator warm-up) is kept apart as ``first_call_ms``,
   then warm-up calls run for ``warmup_ms`` (at least ``min_warmup_calls``). None of them counts.
2. A *window* of rounds runs the callables interleaved, each round in a fresh (seeded) random order,
   A B C, C A B, B C A, A C B ..., so drift of the machine hits all of them alike, and no callable
   always follows the same one (a call's leftovers, warm caches or a busy GPU, fall on all). On the
   CPU each visit settles with an untimed call first, then takes a few samples back to back (the
   previous runtime's leftovers, its thread pool on the cores, fall on the untimed call). A
   callable leaves the rounds at ``max_samples``, or, after
   ``min_samples``, once it has spent ``budget_ms`` or (having spent ``min_window_ms``) its median
   is known to ``rel_precision`` at 95% confidence. Python's cyclic collector is held off
   during a window, as ``timeit`` does.
3. A callable whose samples disagree (median not pinned down, wide p10-p90 spread, or a median
   that drifted within the window) gets another window, up to ``max_repeats``, interleaved with
   the others that disagree; its estimate pools the windows that agree with its calmest one
   (:mod:`pipeline.measure.measurement`). If it still disagrees it is flagged ``noisy`` with the
   reason, never silently smoothed over.
4. On CUDA, callables the caller names are cross-checked against a graph-captured device time: a
   wall latency below the device's own time means the measurement is wrong.

Across batch sizes, :func:`profile_sizes` measures every size in ``passes`` passes, ascending each
time, so that a cell's windows lie seconds apart: one that moved between passes is flagged (see
:mod:`pipeline.measure.measurement`). Its saturation rule judges medians of measured windows only,
never a first call.
"""

from __future__ import annotations

import bisect
import contextlib
import gc
import logging
import random
import statistics
import time
from typing import Any, Callable, Collection, Dict, Iterator, List, Mapping, Optional, Sequence

import torch

from pipeline import devices
from pipeline.config.schema import ProfileConfig
from pipeline.measure.contention import Watch
from pipeline.measure.measurement import Measurement, Settings
from pipeline.measure.statistics import rel_halfwidth, samples_per_second

log = logging.getLogger(__name__)

ORDER_SEED = 0  # the interleaving order is random but the same in every run
YOUNG = 1  # the oldest generation collected before each window (generations 0 and 1; 2 is the old one)
Clock = Callable[[], float]  # seconds, monotonic (time.perf_counter)


def time_call(fn: Callable[[], Any], device: torch.device, clock: Clock = time.perf_counter) -> float:
    """Milliseconds of one call as a caller sees it, the device synchronised before and after."""
    devices.synchronize(device)
    start = clock()
    fn()
    devices.synchronize(device)
    return (clock() - start) * 1e3


def _warm_up(fn: Callable[[], Any], device: torch.device, m: Measurement, s: Settings, clock: Clock) -> None:
    """First call kept apart, then ``warmup_ms`` of calls (at least ``min_warmup_calls``); none count.

    The budget starts after the first call, so a 30 s compile does not eat the warm-up.
    """
    m.first_call_ms = time_call(fn, device, clock)
    spent, calls = 0.0, 0
    while calls < s.min_warmup_calls or spent < s.warmup_ms:
        spent += time_call(fn, device, clock)
        calls += 1
    m.warmup_calls = calls
    m.spent_ms += m.first_call_ms + spent


def _window_done(sorted_ms: List[float], spent_ms: float, s: Settings) -> bool:
    n = len(sorted_ms)
    if n >= s.max_samples:
        return True
    if n < s.min_samples:  # min_samples wins over the budget: a median of two calls is not a median
        return False
    if spent_ms >= s.budget_ms:
        return True
    # The interval assumes independent samples; calls close in time share the machine's state, so
    # a precision stop waits until the samples span min_window_ms.
    return spent_ms >= s.min_window_ms and rel_halfwidth(sorted_ms) <= s.rel_precision


@contextlib.contextmanager
def _collector_held() -> Iterator[None]:
    """Collect the young generations, then hold Python's cyclic collector off for a window (as ``timeit`` does).

    The collector runs when allocation counts cross a threshold, not because of the backend; in a
    process holding compiled graphs a full collection takes milliseconds and would land on
    whichever call crossed the threshold. Only the young generations are collected before the window
    (what the last window's calls left): a full collection of a process holding torch, Inductor and
    MLflow (600,000 objects) took 0.43 s on a quiet 2-core host and held the GIL throughout, once per
    window: beside busy loops the run's heartbeats went unheard for 17-40 s. The old generation is left
    to the collector's own thresholds between windows.
    """
    was_enabled = gc.isenabled()
    gc.collect(YOUNG)
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _run_window(fns: Mapping[str, Callable[[], Any]], device: torch.device, s: Settings,
                clock: Clock) -> Dict[str, List[float]]:
    """Rounds until each callable's own stop rule ends it: every callable's samples, in time order.

    Every callable is visited once per round, in an order shuffled anew each round by a seeded generator:
    what a call leaves behind (warm or cold CPU and GPU caches, clocks) then falls on a different
    successor each time. A plain rotation (A B C, B C A, ...) would not do: it keeps C after B in
    almost every round. On the CPU a visit is ``cpu_settle_calls`` untimed calls, then ``cpu_timed_calls``
    timed ones (never past ``max_samples``), so what the previous runtime left on the cores lands on an
    untimed call; elsewhere one timed call.
    """
    settle, timed = (s.cpu_settle_calls, s.cpu_timed_calls) if device.type == "cpu" else (0, 1)
    samples: Dict[str, List[float]] = {n: [] for n in fns}
    ordered: Dict[str, List[float]] = {n: [] for n in fns}
    spent = {n: 0.0 for n in fns}
    active = list(fns)
    shuffler = random.Random(ORDER_SEED)
    with _collector_held():
        while active:
            for name in shuffler.sample(active, len(active)):
                for _ in range(settle):
                    time_call(fns[name], device, clock)
                for _ in range(min(timed, s.max_samples - len(samples[name]))):
                    t = time_call(fns[name], device, clock)
                    samples[name].append(t)
                    bisect.insort(ordered[name], t)
                    spent[name] += t
            active = [n for n in active if not _window_done(ordered[n], spent[n], s)]
    return samples


def measure_interleaved(fns: Mapping[str, Callable[[], Any]], device: torch.device, cfg: Mapping[str, Any], *,
                        clock: Clock = time.perf_counter, device_check: Collection[str] = (),
                        pass_index: int = 0, watch: Optional[Watch] = None,
                        what: str = "a cell") -> Dict[str, Measurement]:
    """Time every callable at one shape, interleaved round by round; see the module docstring.

    ``cfg`` holds the stop rules (a ``ProfileConfig`` or any mapping; missing keys take its
    defaults). ``device_check`` names the callables that may be captured in a CUDA graph for the
    device-time cross-check (not those that are graph replays themselves). ``pass_index`` labels
    the windows with the pass of the profile they belong to. ``watch`` reads the host before and after
    (``pipeline.measure.contention``: it may wait for a quiet host first, or stop the run), and marks every
    measurement ``contended`` where either reading found it busy; ``what`` names the cell in its log lines.
    """
    s = Settings.of(cfg)
    seen_before = watch.before(what) if watch is not None else ""
    results = {name: Measurement() for name in fns}
    for name, fn in fns.items():
        _warm_up(fn, device, results[name], s, clock)
    pending = list(fns)
    for _ in range(1 + s.max_repeats):
        if not pending:
            break
        for name, window in _run_window({n: fns[n] for n in pending}, device, s, clock).items():
            results[name].windows.append(window)
            results[name].spent_ms += sum(window)
            results[name].passes.append(pass_index)
            results[name].settle(s)
        pending = [n for n in pending if results[n].noisy]
    if device.type == "cuda":
        for name in device_check:
            if name in fns:  # a wall median clearly below the device's own time is flagged in settle
                results[name].device_ms = device_time_ms(fns[name], device) or float("nan")
                results[name].settle(s)
    seen_after = watch.after() if watch is not None else ""
    for m in results.values():
        m.contend(seen_before)
        m.contend(seen_after)
    return results


def device_time_ms(fn: Callable[[], Any], device: torch.device, target_ms: float = 10.0) -> Optional[float]:
    """Device time of one call, from replays of a CUDA graph that captured it, timed by CUDA events.

    A floor for the wall latency: launch overhead and a busy CPU cannot reach into a replay.
    Returns None off CUDA or where the callable cannot be captured (host syncs, graph replays of
    its own, dynamic allocation); the backend is then judged on its wall latency alone.
    """
    if device.type != "cuda":
        return None
    graph = None
    try:
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):  # warm up on a side stream, as capture wants
            fn()
        torch.cuda.current_stream(device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with devices.graph_capture_workspace(device), torch.cuda.graph(graph):
            fn()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        graph.replay()
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        replays = int(min(100, max(1, target_ms / max(start.elapsed_time(end), 1e-3))))
        times = []
        for _ in range(5):
            start.record()
            for _ in range(replays):
                graph.replay()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / replays)
        return statistics.median(times)
    except Exception as exc:  # capture is optional: any failure falls back to wall latency only
        log.debug("device time: graph capture failed (%s: %s); wall latency only", type(exc).__name__, exc)
        try:
            torch.cuda.synchronize(device)
        except Exception:
            pass
        return None
    finally:
        del graph  # frees the graph's private memory pool


def saturated(throughputs: Sequence[float], cutoff: float, backoff: int) -> bool:
    """True once throughput has not grown by ``cutoff`` (relative) over the last ``backoff`` measured sizes.

    ``throughputs`` must come from measured windows (medians), one per profiled size, ascending.
    """
    xs = [t for t in throughputs if t == t]  # a size with no samples says nothing
    if backoff <= 0 or len(xs) <= backoff:
        return False
    return max(xs[-backoff:]) < max(xs[:-backoff]) * (1 + cutoff)


def profile_sizes(make_fns: Callable[[int], Mapping[str, Callable[[], Any]]], sizes: Sequence[int],
                  device: torch.device, cfg: Mapping[str, Any], *, clock: Clock = time.perf_counter,
                  device_check: Collection[str] = (),
                  known: Optional[Mapping[str, Mapping[int, Measurement]]] = None,
                  on_cell: Optional[Callable[[str, int, Measurement], None]] = None,
                  on_step: Optional[Callable[[int, int], None]] = None,
                  watch: Optional[Watch] = None, where: str = "",
                  ) -> Dict[str, Dict[int, Measurement]]:
    """Measure every callable at every size, ascending, in ``passes`` passes; one that has saturated skips larger sizes.

    ``make_fns(bs)`` returns the callables at batch size ``bs``. Saturation (``saturation_cutoff``,
    ``saturation_backoff`` in ``cfg``) is judged in the first pass, on throughput from medians of
    measured windows; a first call, which may compile or record, never enters it. Later passes
    measure the cells of the first once more each and pool them (:meth:`Measurement.absorb`).

    ``known`` cells (an interrupted run's) keep the passes they have; ``on_cell(name, bs, m)`` hears
    of every cell as soon as it is measured, again after each pass, so a run killed midway keeps what
    it measured. ``on_step(pass, bs)`` hears of each size of each pass before it is measured. ``watch`` reads
    the host around each size of each pass (:func:`measure_interleaved`); ``where`` follows the size in its lines.
    """
    s = Settings.of(cfg)
    defaults = ProfileConfig()
    cutoff = float(cfg.get("saturation_cutoff", defaults.saturation_cutoff))
    backoff = int(cfg.get("saturation_backoff", defaults.saturation_backoff))
    profile: Dict[str, Dict[int, Measurement]] = {n: dict(per) for n, per in (known or {}).items()}
    throughputs: Dict[str, List[float]] = {}
    stopped: Dict[str, int] = {}
    report = on_cell or (lambda name, bs, m: None)
    step = on_step or (lambda pass_index, bs: None)
    for pass_index in range(s.passes):
        for bs in sorted(set(int(b) for b in sizes)):
            first = pass_index == 0
            fns = make_fns(bs) if first else {}
            names = [n for n in fns if n not in stopped] if first else [n for n, per in profile.items() if bs in per]
            if first and not names:
                log.info("profile: every backend saturated before batch size %d", bs)
                break
            todo = [n for n in names if bs not in profile.get(n, {}) or pass_index not in profile[n][bs].passes]
            if todo:
                step(pass_index, bs)
                fns = fns or make_fns(bs)
                measured = measure_interleaved({n: fns[n] for n in todo}, device, cfg, clock=clock,
                                               device_check=device_check if first else (), pass_index=pass_index,
                                               watch=watch, what=f"batch size {bs}{where} (pass {pass_index + 1})")
                for name, m in measured.items():
                    if bs in profile.get(name, {}):
                        profile[name][bs].absorb(m, s)
                    else:
                        profile.setdefault(name, {})[bs] = m
                    report(name, bs, profile[name][bs])
            for name in names if first else ():
                throughputs.setdefault(name, []).append(samples_per_second(bs, profile[name][bs].median))
                if saturated(throughputs[name], cutoff, backoff):
                    stopped[name] = bs
                    log.info("profile: %s saturated at batch size %d (throughput grew < %.0f%% over %d sizes)",
                             name, bs, cutoff * 100, backoff)
    return profile


def profile_cells(make_fns: Callable[[Any], Mapping[str, Callable[[], Any]]], batch_sizes: Sequence[int],
                  lengths: Sequence[int], device: torch.device, cfg: Mapping[str, Any], *,
                  device_check: Collection[str] = (), known: Optional[Mapping[str, Mapping[Any, Measurement]]] = None,
                  on_cell: Optional[Callable[[str, Any, Measurement], None]] = None,
                  on_step: Optional[Callable[[int, Any], None]] = None,
                  watch: Optional[Watch] = None) -> Dict[str, Dict[Any, Measurement]]:
    """:func:`profile_sizes` over cells: the batch sizes alone without ``lengths``; with them, every batch size at
    each length, one length after another (each in its passes, its own saturation), keyed ``(batch size, length)``
    (``pipeline.seqlen``). ``make_fns``, ``known``, ``on_cell`` and ``on_step`` take and give those keys; ``watch``
    reads the host around every measured cell."""
    report = on_cell or (lambda name, key, m: None)
    step = on_step or (lambda pass_index, key: None)
    if not lengths:
        return profile_sizes(make_fns, batch_sizes, device, cfg, device_check=device_check, known=known,
                             on_cell=report, on_step=step, watch=watch)
    out: Dict[str, Dict[Any, Measurement]] = {}
    for n in sorted(set(lengths)):
        part = profile_sizes(
            lambda bs: make_fns((bs, n)), batch_sizes, device, cfg, device_check=device_check,
            known={name: {key[0]: m for key, m in per.items() if key[1] == n} for name, per in (known or {}).items()},
            on_cell=lambda name, bs, m: report(name, (bs, n), m), on_step=lambda p, bs: step(p, (bs, n)),
            watch=watch, where=f" at length {n}")
        for name, per in part.items():
            out.setdefault(name, {}).update({(bs, n): m for bs, m in per.items()})
    return out
