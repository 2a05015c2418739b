"""How fast the host runs Python right now.

Shared and virtualised hosts switch between a fast and a slow state on their own, and launch-bound
latencies (eager, Inductor without graphs) move with them while graph replays do not. A profile
gauges the host in every window (:class:`HostGauge`) and once before and after itself
(:func:`host_probe_ms`).
"""

from __future__ import annotations

import math
import statistics
import time
from typing import Callable, Optional

Clock = Callable[[], float]  # seconds, monotonic (time.perf_counter)
HOST_DRIFT = 0.20  # a host probe this much slower than the fastest state seen marks the host as slow


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


def host_probe_ms(calls: int = 50) -> float:
    """Median time of a fixed piece of pure Python: how fast the host runs a launch thread right now.

    Launch-bound latencies (eager, Inductor without graphs) move with the host's speed, so a
    profile records the probe before and after itself.
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
