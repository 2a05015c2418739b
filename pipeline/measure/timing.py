"""All timing lives here: warm-up budgets, device sync, interleaved rounds, stop rules, noise guards.

What is measured is the wall latency a caller sees: the device is synchronised before and after
each call, and a monotonic clock reads the time in between. Like ``triton.testing.do_bench``,
budgets are in milliseconds.

At each batch size, for each callable:

1. The first call (compile, graph record, allocator warm-up) is kept apart as ``first_call_ms``,
   then warm-up calls run for ``warmup_ms`` (at least ``min_warmup_calls``). None of them counts.
2. A *window* of rounds runs the callables interleaved, each round in a fresh (seeded) random order,
   A B C, C A B, B C A, A C B ..., so drift of the machine hits all of them alike, and no callable
   always follows the same one (a call's leftovers, warm caches or a busy GPU, fall on all). A callable leaves the rounds at ``max_samples``, or, after
   ``min_samples``, once it has spent ``budget_ms`` or (having spent ``min_window_ms``) its median
   is known to ``rel_precision`` at 95% confidence. Python's cyclic collector is held off
   during a window, as ``timeit`` does.
3. A callable whose samples disagree (median not pinned down, wide p10-p90 spread, or a median
   that drifted within the window) gets another window, up to ``max_repeats``, interleaved with
   the others that disagree; its estimate pools the windows that agree with its calmest one
   (see :func:`agreeing_windows`). If it still disagrees it is flagged ``noisy`` with the
   reason, never silently smoothed over.
4. On CUDA, callables the caller names are cross-checked against a graph-captured device time: a
   wall latency below the device's own time means the measurement is wrong.
5. With a :class:`HostGauge`, every round also times a tiny fixed piece of Python, so each window
   knows how fast the host ran it. Shared and virtualised hosts switch between a normal and a
   slow state on their own (an idle H200 VM ran ~1.6-2x slower for seconds at a time), and
   launch-bound calls slow down with them while graph replays do not. A callable whose every
   window the host ran slowly is repeated, and flagged noisy if the host never recovered;
   :func:`profile_sizes` re-measures, once, the sizes whose pooled windows turn out slow against
   the fastest host state seen later. Which windows are pooled is still step 3's choice.

Across batch sizes, :func:`profile_sizes` applies the saturation rule to medians of measured
windows only, never to a first call.
"""

from __future__ import annotations

import bisect
import contextlib
import functools
import gc
import logging
import math
import random
import statistics
import time
from dataclasses import dataclass, field, fields
from typing import Any, Callable, Collection, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

import torch

from pipeline import devices
from pipeline.config.schema import ProfileConfig

log = logging.getLogger(__name__)

Clock = Callable[[], float]  # seconds, monotonic (time.perf_counter)
Z95 = 1.959963984540054
# Fewer samples than this have no distribution-free 95% interval for the median (0.5**5 * 2 > 0.05).
MIN_CI_SAMPLES = 6
ORDER_SEED = 0  # the interleaving order is random but the same in every run

# Drift check: the window is cut into this many consecutive chunks of at least MIN_CHUNK samples.
DRIFT_CHUNKS = 4
MIN_CHUNK = 5
HOST_DRIFT = 0.20  # a host probe this much slower than the fastest state seen marks the host as slow


@functools.lru_cache(maxsize=4096)
def median_ci_ranks(n: int) -> Optional[Tuple[int, int]]:
    """0-based ranks ``(lo, hi)`` of the sorted samples bounding a 95% interval for the median.

    Distribution-free: the number of samples below the true median is Binomial(n, 1/2), so
    ``[x_(r), x_(n+1-r)]`` covers it with probability ``1 - 2 P(B <= r-1)``. Exact for n <= 300,
    the normal approximation above. None when n is too small for any 95% interval.
    """
    if n < MIN_CI_SAMPLES:
        return None
    if n > 300:
        r = max(1, math.floor((n - Z95 * math.sqrt(n)) / 2))
        return r - 1, n - r
    total, r, cdf, comb = 1 << n, 0, 0, 1  # comb = C(n, r); cdf = sum_{i < r} C(n, i)
    while 40 * (cdf + comb) <= total:  # P(B <= r) <= 0.025
        cdf += comb
        comb = comb * (n - r) // (r + 1)
        r += 1
    return r - 1, n - r


def median_ci(sorted_ms: Sequence[float]) -> Tuple[float, float]:
    """95% interval for the median of sorted samples; the full range when there are too few."""
    if not sorted_ms:
        return float("nan"), float("nan")
    ranks = median_ci_ranks(len(sorted_ms))
    if ranks is None:
        return sorted_ms[0], sorted_ms[-1]
    return sorted_ms[ranks[0]], sorted_ms[ranks[1]]


def rel_halfwidth(sorted_ms: Sequence[float]) -> float:
    """Half-width of the median's 95% interval relative to the median (inf below 6 samples)."""
    if median_ci_ranks(len(sorted_ms)) is None:
        return float("inf")
    med = statistics.median(sorted_ms)
    lo, hi = median_ci(sorted_ms)
    return (hi - lo) / 2 / med if med > 0 else float("inf")


def quantile(sorted_ms: Sequence[float], q: float) -> float:
    """Linear-interpolated quantile of sorted samples."""
    if not sorted_ms:
        return float("nan")
    pos = q * (len(sorted_ms) - 1)
    lo, hi = math.floor(pos), math.ceil(pos)
    return sorted_ms[lo] + (sorted_ms[hi] - sorted_ms[lo]) * (pos - lo)


@dataclass(frozen=True)
class Settings:
    """The stop rules in force; missing keys take :class:`ProfileConfig`'s defaults."""

    warmup_ms: float
    min_warmup_calls: int
    min_samples: int
    max_samples: int
    budget_ms: float
    min_window_ms: float
    rel_precision: float
    noise_threshold: float
    max_repeats: int

    @classmethod
    def of(cls, cfg: Mapping[str, Any]) -> "Settings":
        defaults = ProfileConfig()
        s = cls(**{f.name: type(getattr(defaults, f.name))(cfg.get(f.name, getattr(defaults, f.name)))
                   for f in fields(cls)})
        if s.min_samples < 1 or s.max_samples < s.min_samples:
            raise ValueError(f"profile: need 1 <= min_samples <= max_samples, got min_samples={s.min_samples}, "
                             f"max_samples={s.max_samples}; e.g. profile.min_samples=10 profile.max_samples=200")
        if s.rel_precision <= 0 or s.noise_threshold <= 0 or s.budget_ms < 0 or s.warmup_ms < 0 or s.max_repeats < 0:
            raise ValueError("profile: rel_precision and noise_threshold must be > 0, and budget_ms, warmup_ms and "
                             f"max_repeats >= 0; got {s}")
        return s


def disagreement(samples_ms: Sequence[float], s: Settings) -> str:
    """Why these samples (in time order) do not pin down one latency, or "" when they do."""
    xs = sorted(samples_ms)
    if not xs:
        return "no samples"
    med = statistics.median(xs)
    hw = rel_halfwidth(xs)
    if hw > s.rel_precision:
        return f"median known only to +-{hw:.1%} at 95% (target +-{s.rel_precision:.1%}) after {len(xs)} samples"
    spread = (quantile(xs, 0.9) - quantile(xs, 0.1)) / med
    if spread > s.noise_threshold:
        return f"p10-p90 spread is {spread:.0%} of the median (limit {s.noise_threshold:.0%})"
    chunks = min(DRIFT_CHUNKS, len(xs) // MIN_CHUNK)
    if chunks >= 2:
        size = len(samples_ms) / chunks
        medians = [statistics.median(samples_ms[round(i * size):round((i + 1) * size)]) for i in range(chunks)]
        drift = max(abs(m - med) for m in medians) / med
        if drift > s.noise_threshold / 2:
            return f"median drifted {drift:.0%} within a window (limit {s.noise_threshold / 2:.0%})"
    return ""


def agreeing_windows(windows: Sequence[Sequence[float]], rel_precision: float) -> List[int]:
    """Indices of the windows pooled into the estimate: the calmest window and those that agree with it.

    A busy CPU only ever adds time (a preempted launch thread, a late sync), so a disturbed
    window's median moves up. The anchor is the window whose median is most surely low, the one
    with the lowest *upper* 95% bound, not simply the lowest median: the minimum of several
    imprecise medians is low by chance, and picking it blindly would bias every repeated backend
    downward against the others. A window agrees when its median lies in the anchor's interval
    widened by ``rel_precision`` (two medians each known to that precision may differ by about
    that much). On a quiet machine every window pools into one plain median, with no selection
    bias; a disturbed window, or a wide one whose median sits between two modes, is dropped.
    """
    filled = [i for i, w in enumerate(windows) if w]
    if not filled:
        return []
    cis = {i: median_ci(sorted(windows[i])) for i in filled}
    anchor = min(filled, key=lambda i: (cis[i][1], i))
    med = statistics.median(windows[anchor])
    lo, hi = cis[anchor][0] - rel_precision * med, cis[anchor][1] + rel_precision * med
    return [i for i in filled if lo <= statistics.median(windows[i]) <= hi]


@dataclass
class Measurement:
    """One callable at one shape: the accepted samples, every window, and the cold first call apart."""

    samples_ms: List[float] = field(default_factory=list)  # pooled agreeing windows, in time order
    first_call_ms: float = float("nan")
    warmup_calls: int = 0
    windows: List[List[float]] = field(default_factory=list)  # every window's samples, kept
    accepted: List[int] = field(default_factory=list)  # which windows are pooled into samples_ms
    device_ms: float = float("nan")  # graph-captured device time of one call (CUDA), when checked
    host_ms: List[float] = field(default_factory=list)  # per window: the host probe's median (nan: no gauge)
    host_slowdown: float = float("nan")  # the best pooled window's host probe against the fastest host state seen
    noise: str = ""  # why the measurement stayed noisy; "" when it settled

    @property
    def count(self) -> int:
        return len(self.samples_ms)

    @property
    def repeats(self) -> int:
        """Windows run beyond the first, because the samples disagreed."""
        return max(0, len(self.windows) - 1)

    @property
    def median(self) -> float:
        return statistics.median(self.samples_ms) if self.samples_ms else float("nan")

    def quantile(self, q: float) -> float:
        """Linear-interpolated quantile of the accepted samples."""
        return quantile(sorted(self.samples_ms), q)

    @property
    def rel_halfwidth(self) -> float:
        """Half-width of the median's distribution-free 95% interval, relative to the median."""
        return rel_halfwidth(sorted(self.samples_ms))

    @property
    def noisy(self) -> bool:
        """Whether the samples still disagreed after every repeat (``noise`` says how)."""
        return bool(self.noise)

    def settle(self, s: Settings, host: Optional["HostGauge"] = None) -> None:
        """Pool the agreeing windows into ``samples_ms`` and judge what is left.

        A window the host ran slowly is not dropped for that alone: a latency it did not raise
        (a graph replay) is as good as any, and one it raised loses to a calmer window anyway.
        Only when every window was slow is the measurement noisy because of the host, so that it
        is measured again. A window the probe calls normal can still be disturbed otherwise (the
        H200 VM showed one at 7.5 ms between two at 4.2 ms), so the probe never picks a window.
        """
        self.accepted = agreeing_windows(self.windows, s.rel_precision)
        self.samples_ms = [x for i in self.accepted for x in self.windows[i]]
        self.noise = disagreement(self.samples_ms, s)
        slack = max(2 * s.rel_precision, 0.05)
        if self.device_ms == self.device_ms and self.median < self.device_ms * (1 - slack):
            self.flag(f"wall median {self.median:.4f} ms is below the graph-captured device time "
                      f"{self.device_ms:.4f} ms")
        if host is not None and self.accepted:
            readings = [ms for ms, window in zip(self.host_ms, self.windows) if window]
            self.host_slowdown = host.slowdown(min(self.host_ms[i] for i in self.accepted))
            if all(host.slow(ms) for ms in readings):
                self.flag(f"the host ran {host.slowdown(min(readings)):.2f}x slower than its fastest state in every "
                          "window, so a launch-bound latency here may read high")

    def flag(self, reason: str) -> None:
        """Add a reason the measurement is noisy to those already found."""
        self.noise = f"{self.noise}; {reason}" if self.noise else reason

    def absorb(self, later: "Measurement", s: Settings, host: Optional["HostGauge"] = None) -> None:
        """Add a later measurement's windows (the first call stays this one's) and settle again."""
        self.windows += later.windows
        self.host_ms += later.host_ms
        self.warmup_calls += later.warmup_calls
        self.settle(s, host)

    def summary(self) -> Dict[str, Any]:
        return {
            "median_ms": self.median,
            "p10_ms": self.quantile(0.10),
            "p90_ms": self.quantile(0.90),
            "samples": self.count,
            "rel_ci95": self.rel_halfwidth,
            "first_call_ms": self.first_call_ms,
            "warmup_calls": self.warmup_calls,
            "repeats": self.repeats,
            "windows_used": len(self.accepted),
            "device_ms": self.device_ms,
            "host_slowdown": self.host_slowdown,
            "noisy": self.noisy,
            "noise": self.noise,
        }


def python_probe_ms(n: int = 2_000, clock: Clock = time.perf_counter) -> float:
    """Milliseconds the host takes for a fixed piece of pure Python (``sum(range(n))``)."""
    start = clock()
    sum(range(n))
    return (clock() - start) * 1e3


class HostGauge:
    """How fast the host runs Python right now, against the fastest state seen in this profile.

    ``probe`` returns milliseconds for a fixed piece of work (about 30 us by default, once per
    round); a window's reading is the median of its rounds' probes. Tests pass a scripted probe.
    """

    def __init__(self, probe: Callable[[], float] = python_probe_ms, tolerance: Optional[float] = None) -> None:
        self.probe = probe
        self.tolerance = HOST_DRIFT if tolerance is None else tolerance
        self.best_ms = float("inf")

    def note(self, window_ms: float) -> None:
        if window_ms == window_ms:
            self.best_ms = min(self.best_ms, window_ms)

    def slowdown(self, window_ms: float) -> float:
        return window_ms / self.best_ms if window_ms == window_ms and math.isfinite(self.best_ms) else float("nan")

    def slow(self, window_ms: float) -> bool:
        """Whether a window's reading is more than ``tolerance`` above the fastest state seen."""
        return self.slowdown(window_ms) > 1.0 + self.tolerance


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
    """Collect, then hold Python's cyclic collector off for a window (as ``timeit`` does).

    The collector runs when allocation counts cross a threshold, not because of the backend; in a
    process holding compiled graphs a full collection takes milliseconds and would land on
    whichever call crossed the threshold.
    """
    was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _run_window(fns: Mapping[str, Callable[[], Any]], device: torch.device, s: Settings, clock: Clock,
                host: Optional[HostGauge] = None) -> Tuple[Dict[str, List[float]], float]:
    """Rounds until each callable's own stop rule ends it: samples in time order, and the host's reading.

    The reading is the median of one host probe per round (nan without a gauge).

    Every callable runs once per round, in an order shuffled anew each round by a seeded generator:
    what a call leaves behind (warm or cold CPU and GPU caches, clocks) then falls on a different
    successor each time. A plain rotation (A B C, B C A, ...) would not do: it keeps C after B in
    almost every round.
    """
    samples: Dict[str, List[float]] = {n: [] for n in fns}
    ordered: Dict[str, List[float]] = {n: [] for n in fns}
    spent = {n: 0.0 for n in fns}
    active = list(fns)
    shuffler = random.Random(ORDER_SEED)
    probes: List[float] = []
    with _collector_held():
        while active:
            for name in shuffler.sample(active, len(active)):
                t = time_call(fns[name], device, clock)
                samples[name].append(t)
                bisect.insort(ordered[name], t)
                spent[name] += t
            if host is not None:
                probes.append(host.probe())
            active = [n for n in active if not _window_done(ordered[n], spent[n], s)]
    return samples, statistics.median(probes) if probes else float("nan")


def measure_interleaved(fns: Mapping[str, Callable[[], Any]], device: torch.device, cfg: Mapping[str, Any], *,
                        clock: Clock = time.perf_counter, device_check: Collection[str] = (),
                        host: Optional[HostGauge] = None) -> Dict[str, Measurement]:
    """Time every callable at one shape, interleaved round by round; see the module docstring.

    ``cfg`` holds the stop rules (a ``ProfileConfig`` or any mapping; missing keys take its
    defaults). ``device_check`` names the callables that may be captured in a CUDA graph for the
    device-time cross-check (not those that are graph replays themselves). ``host`` gauges the
    host's speed in every window; a callable it ran slowly in every window is repeated (step 5).
    """
    s = Settings.of(cfg)
    results = {name: Measurement() for name in fns}
    for name, fn in fns.items():
        _warm_up(fn, device, results[name], s, clock)
    pending = list(fns)
    for _ in range(1 + s.max_repeats):
        if not pending:
            break
        windows, host_ms = _run_window({n: fns[n] for n in pending}, device, s, clock, host)
        if host is not None:
            host.note(host_ms)
        for name, window in windows.items():
            results[name].windows.append(window)
            results[name].host_ms.append(host_ms)
            results[name].settle(s, host)
        pending = [n for n in pending if results[n].noisy]
    if device.type == "cuda":
        for name in device_check:
            if name in fns:  # a wall median clearly below the device's own time is flagged in settle
                results[name].device_ms = device_time_ms(fns[name], device) or float("nan")
                results[name].settle(s, host)
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


def host_probe_ms(calls: int = 50) -> float:
    """Median time of a fixed piece of pure Python: how fast the host runs a launch thread right now.

    Shared and virtualised hosts change speed on their own (an idle H200 VM took 0.24 ms for this,
    minutes later 0.49 ms), and launch-bound latencies (eager, Inductor without graphs) move with
    it, so a profile records the probe before and after itself.
    """
    return statistics.median(python_probe_ms(20_000) for _ in range(calls))


def host_drift(before_ms: float, after_ms: float) -> str:
    """Why a profile between two host probes may not repeat, or "" when the host held its speed."""
    change = max(before_ms, after_ms) / min(before_ms, after_ms) - 1.0
    if change <= HOST_DRIFT:
        return ""
    return (f"the host's CPU speed changed during profiling: a fixed piece of Python took {before_ms:.3f} ms before "
            f"and {after_ms:.3f} ms after ({change:.0%} apart), so launch-bound latencies (eager, Inductor without "
            "graphs) may not repeat; profile again on a quieter host or with profile=thorough")


def profile_sizes(make_fns: Callable[[int], Mapping[str, Callable[[], Any]]], sizes: Sequence[int],
                  device: torch.device, cfg: Mapping[str, Any], *, clock: Clock = time.perf_counter,
                  device_check: Collection[str] = (), host: Optional[HostGauge] = None,
                  ) -> Dict[str, Dict[int, Measurement]]:
    """Measure every callable at every size, ascending; one that has saturated skips larger sizes.

    ``make_fns(bs)`` returns the callables at batch size ``bs``. Saturation (``saturation_cutoff``,
    ``saturation_backoff`` in ``cfg``) is judged on throughput from medians of measured windows;
    a first call, which may compile or record, never enters it. With a ``host`` gauge, a size
    whose windows were all taken on a slow host, judged against the fastest host state of the
    whole profile, is measured once more at the end and the two measurements pooled.
    """
    defaults = ProfileConfig()
    cutoff = float(cfg.get("saturation_cutoff", defaults.saturation_cutoff))
    backoff = int(cfg.get("saturation_backoff", defaults.saturation_backoff))
    profile: Dict[str, Dict[int, Measurement]] = {}
    throughputs: Dict[str, List[float]] = {}
    stopped: Dict[str, int] = {}
    for bs in sorted(set(int(b) for b in sizes)):
        fns = {n: f for n, f in make_fns(bs).items() if n not in stopped}
        if not fns:
            log.info("profile: every backend saturated before batch size %d", bs)
            break
        for name, m in measure_interleaved(fns, device, cfg, clock=clock, device_check=device_check,
                                           host=host).items():
            profile.setdefault(name, {})[bs] = m
            throughputs.setdefault(name, []).append(bs / (m.median / 1e3) if m.count else float("nan"))
            if saturated(throughputs[name], cutoff, backoff):
                stopped[name] = bs
                log.info("profile: %s saturated at batch size %d (throughput grew < %.0f%% over %d sizes)",
                         name, bs, cutoff * 100, backoff)
    if host is not None:
        remeasure_slow_sizes(profile, make_fns, device, cfg, clock, host)
    return profile


def remeasure_slow_sizes(profile: Dict[str, Dict[int, Measurement]],
                         make_fns: Callable[[int], Mapping[str, Callable[[], Any]]], device: torch.device,
                         cfg: Mapping[str, Any], clock: Clock, host: HostGauge) -> None:
    """Judge every cell against the host's fastest state of the whole profile; measure slow sizes once more.

    A size measured early, before the host showed how fast it can be, may have passed as normal.
    """
    s = Settings.of(cfg)
    for per in profile.values():
        for m in per.values():
            m.settle(s, host)
    slow = sorted({bs for per in profile.values() for bs, m in per.items()
                   if m.host_slowdown > 1 + host.tolerance})
    for bs in slow:
        names = [n for n, per in profile.items() if bs in per]
        log.info("profile: the host ran slowly while batch size %d was measured; measuring it again", bs)
        fns = {n: f for n, f in make_fns(bs).items() if n in names}
        again = measure_interleaved(fns, device, cfg, clock=clock, host=host)  # device times are known
        for name, later in again.items():
            profile[name][bs].absorb(later, s, host)
