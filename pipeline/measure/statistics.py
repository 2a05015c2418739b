"""Order statistics for latency samples: distribution-free intervals for the median, quantiles, throughput.

Pure Python (no torch), so the router and reports use the same figures as the measurement.
"""

from __future__ import annotations

import functools
import math
import statistics
from typing import Optional, Sequence, Tuple

Z95 = 1.959963984540054
# Fewer samples than this have no distribution-free 95% interval for the median (0.5**5 * 2 > 0.05).
MIN_CI_SAMPLES = 6


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


def samples_per_second(batch_size: int, latency_ms: float) -> float:
    """Throughput of one call: ``batch_size`` samples in ``latency_ms`` (nan for no latency)."""
    return batch_size / (latency_ms / 1e3) if latency_ms == latency_ms and latency_ms > 0 else float("nan")
