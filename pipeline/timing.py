"""All timing lives here: warm-up budgets, device sync, interleaved rounds, stop rules.

Like ``triton.testing.do_bench``, budgets are in milliseconds. What is measured is the wall
latency a caller sees (launch + device time), with the device synchronised around each call.
The first call at a new shape (compile, graph record, allocator warm-up) is kept apart and
never counts as a sample.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Sequence

import torch

from pipeline import devices

Z95 = 1.96


@dataclass
class Measurement:
    """Per-call samples of one callable at one shape, with the first (cold) call kept apart."""

    samples_ms: List[float] = field(default_factory=list)
    first_call_ms: float = float("nan")
    warmup_calls: int = 0
    repeats: int = 0

    @property
    def count(self) -> int:
        return len(self.samples_ms)

    @property
    def median(self) -> float:
        return statistics.median(self.samples_ms) if self.samples_ms else float("nan")

    def quantile(self, q: float) -> float:
        """Linear-interpolated quantile of the samples."""
        if not self.samples_ms:
            return float("nan")
        xs = sorted(self.samples_ms)
        pos = q * (len(xs) - 1)
        lo, hi = math.floor(pos), math.ceil(pos)
        return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)

    @property
    def rel_halfwidth(self) -> float:
        """Half-width of a distribution-free 95% confidence interval of the median, relative to it."""
        n = self.count
        if n < 3:
            return float("inf")
        xs = sorted(self.samples_ms)
        half = Z95 * math.sqrt(n) / 2
        lo = max(0, math.floor(n / 2 - half))
        hi = min(n - 1, math.ceil(n / 2 + half) - 1)
        med = self.median
        return (xs[hi] - xs[lo]) / 2 / med if med > 0 else float("inf")

    @property
    def noisy(self) -> bool:
        """Whether the spread is so wide that the median should not be trusted to 10%."""
        return self.rel_halfwidth > 0.10

    def summary(self) -> Dict[str, float]:
        return {
            "median_ms": self.median,
            "p10_ms": self.quantile(0.10),
            "p90_ms": self.quantile(0.90),
            "samples": self.count,
            "rel_ci95": self.rel_halfwidth,
            "first_call_ms": self.first_call_ms,
            "repeats": self.repeats,
        }


def time_call(fn: Callable[[], Any], device: torch.device) -> float:
    """Milliseconds for one call, the device synchronised before and after."""
    devices.synchronize(device)
    start = time.perf_counter()
    fn()
    devices.synchronize(device)
    return (time.perf_counter() - start) * 1e3


def _warm_up(fn: Callable[[], Any], device: torch.device, m: Measurement, warmup_ms: float, min_calls: int) -> None:
    m.first_call_ms = time_call(fn, device)
    spent, calls = 0.0, 0
    while calls < min_calls or spent < warmup_ms:
        spent += time_call(fn, device)
        calls += 1
        if calls >= 10 * max(min_calls, 1) and spent >= warmup_ms / 10:
            break  # a slow call: enough warm-up without spending the whole budget here
    m.warmup_calls = calls


def measure_interleaved(fns: Mapping[str, Callable[[], Any]], device: torch.device, cfg: Mapping[str, Any]) -> Dict[str, Measurement]:
    """Time every callable round by round (A B C A B C ...) so machine drift hits them alike.

    Each callable stops on its own once its median is known to ``rel_precision`` (after at least
    ``min_samples``), after ``max_samples``, or when the shared ``budget_ms`` is spent.
    """
    results = {name: Measurement() for name in fns}
    for name, fn in fns.items():
        _warm_up(fn, device, results[name], cfg["warmup_ms"], cfg["min_warmup_calls"])
    active = list(fns)
    budget_ms = cfg["budget_ms"] * max(len(fns), 1)
    spent = 0.0
    while active:
        for name in list(active):
            t = time_call(fns[name], device)
            results[name].samples_ms.append(t)
            spent += t
        active = [n for n in active if not _done(results[n], cfg)]
        if spent >= budget_ms and all(results[n].count >= cfg["min_samples"] for n in active):
            break
    return results


def _done(m: Measurement, cfg: Mapping[str, Any]) -> bool:
    if m.count >= cfg["max_samples"]:
        return True
    return m.count >= cfg["min_samples"] and m.rel_halfwidth <= cfg["rel_precision"]


def saturated(throughputs: Sequence[float], cutoff: float, backoff: int) -> bool:
    """True once throughput has not grown by ``cutoff`` (relative) over the last ``backoff`` measured sizes."""
    if backoff <= 0 or len(throughputs) <= backoff:
        return False
    best_before = max(throughputs[:-backoff])
    return max(throughputs[-backoff:]) < best_before * (1 + cutoff)
