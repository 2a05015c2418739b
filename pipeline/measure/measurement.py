"""One callable at one shape: its windows of samples, which of them are pooled, and why it is noisy.

A window whose samples do not pin down one latency (median not known to ``rel_precision``, wide
p10-p90 spread, drift within the window) is measured again; the estimate pools the calmest window
with those that agree with it (:func:`agreeing_windows`), and a measurement that still disagrees is
flagged ``noisy`` with the reason, never silently smoothed over: its estimate then pools every window.

A profile measures every cell in several passes, seconds apart, because a host that changes speed
for seconds at a time moves a launch-bound median between windows far more than the samples of
one window show. A cell whose passes agree states an interval that spans them
(:attr:`Measurement.interval`); one whose passes disagree is flagged, and its interval spans every window.

A cell measured while the host was busy (``pipeline.measure.contention``) is ``contended``, apart from
``noisy``: a host that is busy throughout makes every window agree on the wrong latency, so agreement
cannot show it, and the reading taken around the cell says what was seen.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field, fields
from typing import Any, Dict, List, Mapping, Sequence, Tuple

from pipeline.config.schema import ProfileConfig
from pipeline.measure.statistics import median_ci, quantile, rel_halfwidth

# Drift check: the window is cut into this many consecutive chunks of at least MIN_CHUNK samples.
DRIFT_CHUNKS = 4
MIN_CHUNK = 5


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
    cpu_settle_calls: int
    cpu_timed_calls: int
    noise_threshold: float
    max_repeats: int
    passes: int

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
        if s.cpu_settle_calls < 0 or s.cpu_timed_calls < 1:
            raise ValueError(f"profile: a visit needs cpu_settle_calls >= 0 and cpu_timed_calls >= 1, got "
                             f"{s.cpu_settle_calls} and {s.cpu_timed_calls}; e.g. profile.cpu_settle_calls=1 "
                             "profile.cpu_timed_calls=4")
        if s.passes < 1:
            raise ValueError(f"profile.passes={s.passes}: every cell needs at least one pass; e.g. profile.passes=2")
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
    passes: List[int] = field(default_factory=list)  # per window: the pass of the profile that measured it
    device_ms: float = float("nan")  # graph-captured device time of one call (CUDA), when checked
    noise: str = ""  # why the measurement stayed noisy; "" when it settled
    contention: str = ""  # what the host looked like where a window of it was measured on a busy host; "" if never
    spent_ms: float = 0.0  # every timed call of it: first calls, warm-ups and samples (the cost account)

    @property
    def count(self) -> int:
        return len(self.samples_ms)

    @property
    def repeats(self) -> int:
        """Windows run beyond one per pass, because the samples disagreed."""
        return len(self.windows) - len(set(self.passes))

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

    @property
    def contended(self) -> bool:
        """Whether a window of it was measured while the host was busy (``contention`` says what was seen)."""
        return bool(self.contention)

    def contend(self, seen: str) -> None:
        """Add what the host looked like around a window measured on a busy host ("" adds nothing)."""
        if seen and seen not in self.contention.split("; "):
            self.contention = f"{self.contention}; {seen}" if self.contention else seen

    @property
    def interval(self) -> Tuple[float, float]:
        """Where a re-run's median is expected to land: the pooled median's 95% interval, widened to
        the 95% interval of every pooled window's median (every window's, once the cell is noisy).

        The samples of one window share the host's state of that moment, so their interval alone is
        too narrow to hold on a re-run; the windows of other passes show how far the state moves it,
        each known only to its own precision.
        """
        if not self.samples_ms:
            return float("nan"), float("nan")
        bounds = [median_ci(sorted(w)) for w in (self.samples_ms, *(self.windows[i] for i in self.accepted))]
        return min(lo for lo, _ in bounds), max(hi for _, hi in bounds)

    def settle(self, s: Settings) -> None:
        """Pool the agreeing windows into ``samples_ms`` and judge what is left.

        Windows of every pass must agree: a pass none of whose windows is pooled means the median
        moved with the host between passes, and no interval of one pass would hold on a re-run.
        Windows that do not settle on one latency pool whole: the calmest of them is a best case a
        re-run may never see again (a host's rare fast second), and the flag says why.
        """
        self.accepted = agreeing_windows(self.windows, s.rel_precision)
        reason = disagreement(self.pooled(), s)
        moved = set(self.passes) - {self.passes[i] for i in self.accepted}
        if reason or moved:
            self.accepted = [i for i, w in enumerate(self.windows) if w]
            reason = disagreement(self.pooled(), s) or reason
        self.samples_ms, self.noise = self.pooled(), reason
        if moved:
            medians = [statistics.median(self.windows[i]) for i in self.accepted]
            self.flag(f"median moved between passes ({min(medians):.4g}-{max(medians):.4g} ms "
                      f"over {len(set(self.passes))} passes)")
        slack = max(2 * s.rel_precision, 0.05)
        if self.device_ms == self.device_ms and self.median < self.device_ms * (1 - slack):
            self.flag(f"wall median {self.median:.4f} ms is below the graph-captured device time "
                      f"{self.device_ms:.4f} ms")

    def pooled(self) -> List[float]:
        """The samples of the accepted windows, in time order."""
        return [x for i in self.accepted for x in self.windows[i]]

    def flag(self, reason: str) -> None:
        """Add a reason the measurement is noisy to those already found."""
        self.noise = f"{self.noise}; {reason}" if self.noise else reason

    def absorb(self, later: "Measurement", s: Settings) -> None:
        """Add a later pass's windows (the first call and device time stay this one's) and settle again."""
        self.windows += later.windows
        self.passes += later.passes
        self.warmup_calls += later.warmup_calls
        self.spent_ms += later.spent_ms
        for seen in later.contention.split("; "):
            self.contend(seen)
        self.settle(s)

    def to_dict(self) -> Dict[str, Any]:
        """Every field, as plain data: what a run directory keeps so an interrupted profile can resume."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Measurement":
        return cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data})

    def summary(self) -> Dict[str, Any]:
        """The cell as a table row: median and its interval, spread, samples and flags."""
        lo, hi = self.interval
        return {
            "median_ms": self.median,
            "ci_lo_ms": lo,
            "ci_hi_ms": hi,
            "p10_ms": self.quantile(0.10),
            "p90_ms": self.quantile(0.90),
            "samples": self.count,
            "first_call_ms": self.first_call_ms,
            "warmup_calls": self.warmup_calls,
            "passes": len(set(self.passes)),
            "repeats": self.repeats,
            "windows_used": len(self.accepted),
            "device_ms": self.device_ms,
            "noisy": self.noisy,
            "noise": self.noise,
            "contended": self.contended,
            "contention": self.contention,
        }
