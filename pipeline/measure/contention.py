"""Is the host busy? Runnable tasks against cores, and a calibration kernel against its quiet time.

On a host whose cores other jobs hold, a 0.5 ms call takes 150-600 ms (torch's threads wait at a barrier for
a sibling the scheduler took away), and every number the profile takes then measures the other jobs: a backend
is screened out 334x slower, the plot shows 411x speed-ups, and each cell's passes agree, so nothing is flagged
noisy. This module names what it sees instead, from two cheap readings (:func:`read_host`):

- runnable tasks besides this process's own threads (``procs_running`` of ``/proc/stat``, a snapshot, so the
  median of a few), on the cores this process may use, against those cores;
- a calibration kernel, a fixed pure-Python loop on one thread, timed in wall time and in the thread's CPU
  time: on a free core the two agree, so wall over CPU time is how many times its quiet time it took;
- a parallel calibration on the run's own threads (torch's intra-op pool, as the backends use it): a few rounds
  of a small parallel kernel, each a fraction of a millisecond when every thread has a core. One thread that
  waits for a core stalls the others at the kernel's barrier for a scheduler slice (milliseconds), so the rounds'
  median moves far beyond their own noise above the fastest round seen this run. That catches what the task count
  misses: a 2-thread run beside one spinning task (one core free, so "quiet for the thread that fits") whose
  cells took 4.6 ms against 0.5 ms quiet. The median, not the mean: a pool's threads that slept while a GPU worked
  take milliseconds to wake for one round, which is not a busy host (an H100 run's every cell was marked so by
  the mean). Taken for CPU runs only: a GPU run's cells do not wait at the pool's barrier, the single-thread kernel
  and the task count say what matters to them.

What the readings mean is a pure function (:func:`judge`, and :func:`start` for the run's first look), so its
thresholds are tested on synthetic readings; :class:`Watch` takes readings around every measured cell, waits
for a quiet host or stops the run as ``profile.on_busy`` says, and names what it saw for the cell's
``contention`` (``pipeline.measure.measurement``). A contended cell never settles a decision by itself: the
screen keeps what it would drop on one, and the route treats its interval as unknown (``pipeline.route``).
"""

from __future__ import annotations

import logging
import math
import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Tuple

import torch

from pipeline.errors import ConfigError

log = logging.getLogger(__name__)

ON_BUSY = ("warn", "wait", "fail")
# Wall over CPU time of the calibration kernel above which the host is busy: a thread that waits a third of
# its time for a core. A free core gives about 1.0; one shared with one other spinning task about 2.
SLOWED = 1.5
SNAPSHOTS = 5  # runnable-task snapshots per reading, one before each calibration round (odd: a whole median)
# The parallel calibration: up to PARALLEL_ROUNDS rounds of PARALLEL_OPS parallel adds of PARALLEL_NUMEL floats on the
# run's threads. It is stalled where the rounds' median exceeds both STALL_FACTOR times the fastest round seen and
# that round plus STALL_MS: a barrier that waits for a descheduled thread costs a scheduler slice (milliseconds),
# while a quiet round's own jitter is microseconds (a CPU clock that halves stays within the factor).
PARALLEL_ROUNDS = 9
PARALLEL_OPS = 10
PARALLEL_NUMEL = 1 << 18
STALL_FACTOR = 3.0
STALL_MS = 0.5
# One round of the calibration kernel: this much CPU time of pure Python, longer than a scheduler's time slice, so
# that a round shares its core with whatever else is runnable there (a round of a millisecond often runs whole).
ROUND_CPU_S = 0.004
WAIT_LOG_S = 10.0  # under on_busy=wait, a log line this often
WAIT_POLL_S = 1.0  # and a new reading this often
# A reading after one cell this recent stands for the next cell's reading before it: nothing but building that
# cell's inputs ran in between, and each reading costs tens of milliseconds of a core.
FRESH_S = 1.0
PROC_STAT = Path("/proc/stat")
OWN_TASKS = Path("/proc/self/task")
CPU_MAX = Path("/sys/fs/cgroup/cpu.max")


class HostBusy(ConfigError):
    """``profile.on_busy=fail`` and the host is busy: a one-line error naming what was seen and the fix."""


@dataclass(frozen=True)
class Reading:
    """What the host looked like for a moment."""

    runnable: int  # tasks ready to run besides this process's own threads, on the cores it may use
    cores: int  # the cores this process may use (its affinity, within its cgroup's CPU quota)
    slowdown: float  # the calibration kernel's wall time over its quiet time (its CPU time); 1.0 on a free core
    parallel_ms: float = 0.0  # the parallel calibration's median round on the run's threads (0: not taken)
    parallel_fastest_ms: float = 0.0  # its fastest round in this reading


@dataclass(frozen=True)
class Verdict:
    """A reading judged for a run of ``threads`` threads."""

    busy: bool
    seen: str  # what was seen, one clause: "6 runnable tasks besides this run's on 2 cores, calibration 3.1x ..."
    fit: int  # the most threads the free cores hold (at least 1)


def counted(n: int, thing: str) -> str:
    """``1 core``, ``2 cores``."""
    return f"{n} {thing}{'s' * (n != 1)}"


def judge(reading: Reading, threads: int, fastest_ms: Optional[float] = None) -> Verdict:
    """Whether a run of ``threads`` threads measures the host rather than itself.

    Busy where even the threads that fit would share a core with other runnable tasks (no core is free), where
    the calibration kernel took more than ``SLOWED`` times its quiet time, or where the parallel calibration on
    the run's threads stalled (:func:`stalled`) against the fastest round seen so far (``fastest_ms``, this
    reading's own where None). Where only some cores are free and nothing stalls, the host is quiet for the
    threads that fit (``fit``): a run with fewer threads measures itself.
    """
    free = max(1, reading.cores - reading.runnable)
    fit = max(1, min(threads, free))
    crowded = reading.runnable + fit > reading.cores
    slowed = reading.slowdown > SLOWED
    floor = min(reading.parallel_fastest_ms, fastest_ms) if fastest_ms else reading.parallel_fastest_ms
    seen = f"{counted(reading.runnable, 'runnable task')} besides this run's on {counted(reading.cores, 'core')}, " \
           f"calibration {reading.slowdown:.1f}x its quiet time"
    if reading.parallel_ms:
        seen += f", {counted(threads, 'thread')} {reading.parallel_ms:.2f} ms a round against {floor:.2f} ms at best"
    return Verdict(crowded or slowed or stalled(reading.parallel_ms, floor), seen, fit)


def stalled(round_ms: float, fastest_ms: float) -> bool:
    """Whether a parallel round of ``round_ms`` (one round, or the rounds' median) stalled at its barrier, against a
    fastest round of ``fastest_ms``: beyond both ``STALL_FACTOR`` times it and it plus ``STALL_MS``."""
    return bool(round_ms and fastest_ms) and round_ms > max(STALL_FACTOR * fastest_ms, fastest_ms + STALL_MS)


@dataclass(frozen=True)
class Start:
    """The run's first look at the host: the threads it runs with, and what it says at the top of the run."""

    threads: Optional[int]  # the run's ``threads``, as the config has them
    busy: str  # the one warning line where the host is busy, else ""
    note: str  # an INFO line where the threads oversubscribe a host that is otherwise quiet, else ""


def start(reading: Reading, on_busy: str, threads: Optional[int], default_threads: int) -> Start:
    """What a run does on ``reading`` before it starts: ``threads`` is the config's (None: torch's
    ``default_threads``). Raises :class:`HostBusy` where the host is busy and ``on_busy`` is ``fail``.

    Where the threads would oversubscribe the free cores (a thread waiting for a core stalls its siblings at every
    barrier), the line names the count that fits, and the run keeps its own: Inductor compiles its CPU kernels for
    the thread count in force (its cache key holds it), so a count the run chose would ship programs for a count the
    user does not serve at, whose compiled artifacts then miss at load.
    """
    asked = threads if threads is not None else default_threads
    verdict = judge(reading, asked)
    chosen = threads
    choice = (f"{'threads' if threads is not None else 'torch'}={asked} oversubscribes the "
              f"{counted(verdict.fit, 'free core')}; threads={verdict.fit} fits" if verdict.fit < asked else "")
    if not verdict.busy:
        return Start(chosen, "", f"host: {verdict.seen}; {choice}" if choice else "")
    if on_busy == "fail":
        raise HostBusy(busy_error(verdict.seen))
    then = ("each cell waits for a quiet host (profile.on_busy=wait)" if on_busy == "wait" else
            "cells measured now are marked contended and settle no choice (profile.csv: contended)")
    one = " or set threads=1" if (chosen or asked) > 1 else ""
    return Start(chosen, f"host busy: {verdict.seen}; {choice + '; ' if choice else ''}{then}; for numbers you "
                         f"can quote, quiet the machine{one}", "")


def busy_error(seen: str) -> str:
    """The one-line error of ``profile.on_busy=fail``: what was seen, and the ways on."""
    return (f"host busy: {seen}, and profile.on_busy=fail; quiet the machine, run with threads=1, or set "
            f"profile.on_busy=warn to measure anyway with the cells marked contended")


def settings_problem(on_busy: str, wait_s: float) -> Optional[str]:
    """What is wrong with ``profile.on_busy`` and ``profile.on_busy_wait_s``, with the fix; None if nothing."""
    if on_busy not in ON_BUSY:
        return f"profile.on_busy={on_busy!r} is not one of {list(ON_BUSY)}; e.g. profile.on_busy=warn"
    if not wait_s >= 0:  # NaN too
        return f"profile.on_busy_wait_s={wait_s} must be >= 0 seconds; e.g. profile.on_busy_wait_s=300"
    return None


def usable_cores() -> int:
    """The cores this process may run on: its affinity, within its cgroup's CPU quota where one is set."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:
        quota, period = CPU_MAX.read_text().split()[:2]
        if quota != "max":
            cores = min(cores, max(1, math.ceil(int(quota) / int(period))))
    except (OSError, ValueError):
        pass  # no cgroup v2 quota to read
    return max(1, cores)


def runnable_besides_ours() -> Optional[int]:
    """Tasks ready to run on the whole host (``procs_running``), less this process's own running threads;
    None where ``/proc`` does not tell (not Linux)."""
    try:
        running = next(int(line.split()[1]) for line in PROC_STAT.read_text().splitlines()
                       if line.startswith("procs_running "))
    except (OSError, StopIteration, ValueError, IndexError):
        return None
    ours = 0
    for task in OWN_TASKS.iterdir() if OWN_TASKS.is_dir() else ():
        try:
            ours += task.joinpath("stat").read_text().rsplit(")", 1)[1].split()[0] == "R"
        except (OSError, IndexError):
            continue  # a thread that ended between the listing and the read
    return max(0, running - ours)


def calibration_round() -> Tuple[float, float]:
    """One round of the calibration kernel: its wall seconds and this thread's CPU seconds."""
    wall, cpu = time.perf_counter(), time.thread_time()
    total = 0
    while time.thread_time() - cpu < ROUND_CPU_S:
        for i in range(1000):
            total += i * i
    return time.perf_counter() - wall, time.thread_time() - cpu


class ParallelCalibration:
    """The parallel calibration's kernel: adds of preallocated tensors in torch's intra-op pool, on the threads in
    force. Rounds stop early once more than half of them stalled against the fastest round of the reading (the rest
    cannot move the median back), so a busy host costs about half the rounds, not all of them."""

    def __init__(self) -> None:
        self.a, self.b, self.out = torch.ones(PARALLEL_NUMEL), torch.ones(PARALLEL_NUMEL), torch.empty(PARALLEL_NUMEL)
        self.add = torch.add

    def round_ms(self) -> float:
        start = time.perf_counter()
        for _ in range(PARALLEL_OPS):
            self.add(self.a, self.b, out=self.out)
        return (time.perf_counter() - start) * 1e3

    def reading(self) -> Tuple[float, float]:
        """The rounds' median and the fastest, in milliseconds."""
        self.round_ms()  # wakes the pool's threads
        times: list = []
        while len(times) < PARALLEL_ROUNDS:
            times.append(self.round_ms())
            if sum(stalled(t, min(times)) for t in times) > PARALLEL_ROUNDS // 2:  # the rest cannot move the median
                break
        return statistics.median(times), min(times)


_parallel: Optional[ParallelCalibration] = None


def read_host(parallel: bool = True) -> Reading:
    """A reading of the host, over a few calibration rounds (some tens of milliseconds); with ``parallel``, the
    parallel calibration too (a run on the CPU: its cells wait at the pool's barrier)."""
    global _parallel
    cores, online = usable_cores(), os.cpu_count() or 1
    counts, wall, cpu = [], 0.0, 0.0
    for _ in range(SNAPSHOTS):
        count = runnable_besides_ours()
        if count is not None:
            counts.append(count * cores / max(cores, online))  # the share of the host's tasks on our cores
        round_wall, round_cpu = calibration_round()
        wall, cpu = wall + round_wall, cpu + round_cpu
    runnable = round(statistics.median(counts)) if counts else 0
    if not parallel or torch.get_num_threads() < 2:  # one thread meets no barrier: the kernel above says it all
        return Reading(runnable, cores, wall / cpu)
    _parallel = _parallel or ParallelCalibration()
    return Reading(runnable, cores, wall / cpu, *_parallel.reading())


class Watch:
    """Readings of the host around each measured cell, acted on as ``profile.on_busy`` says.

    ``before(what)`` reads the host before a cell (``what`` names it in log lines): under ``wait`` it waits,
    reading again every ``WAIT_POLL_S`` and logging every ``WAIT_LOG_S``, until the host is quiet or ``wait_s``
    have passed; under ``fail`` a busy host raises :class:`HostBusy`. ``after()`` reads it once the cell is
    measured, and stands for the next cell's reading before it within ``FRESH_S``. Each returns what was seen
    where the host was busy, else "": the cell's contention.
    """

    def __init__(self, on_busy: str, threads: int, wait_s: float, read: Callable[[], Reading] = read_host,
                 sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.monotonic) -> None:
        problem = settings_problem(on_busy, wait_s)
        if problem:
            raise ConfigError(problem)
        self.on_busy, self.threads, self.wait_s = on_busy, threads, wait_s
        self.read, self.sleep, self.clock = read, sleep, clock
        self.last: Optional[Tuple[float, Verdict]] = None  # when the latest reading was taken, and its verdict
        self.fastest_ms: Optional[float] = None  # the parallel calibration's fastest round so far

    def verdict(self) -> Verdict:
        """A verdict on a new reading, against the fastest parallel round seen so far."""
        reading = self.read()
        if reading.parallel_fastest_ms:
            self.fastest_ms = min(self.fastest_ms or reading.parallel_fastest_ms, reading.parallel_fastest_ms)
        verdict = judge(reading, self.threads, self.fastest_ms)
        self.last = (self.clock(), verdict)
        return verdict

    def before(self, what: str) -> str:
        last = self.last
        verdict = last[1] if last is not None and self.clock() - last[0] < FRESH_S else self.verdict()
        if verdict.busy and self.on_busy == "fail":
            raise HostBusy(busy_error(verdict.seen))
        if verdict.busy and self.on_busy == "wait":
            verdict = self.wait(what, verdict)
        return f"busy before it: {verdict.seen}" if verdict.busy else ""

    def wait(self, what: str, verdict: Verdict) -> Verdict:
        """Wait for a quiet host, at most ``wait_s``; the last verdict."""
        began = logged = self.clock()
        log.info("profile: host busy (%s); waiting up to %.0f s for it to quieten before %s", verdict.seen,
                 self.wait_s, what)
        while verdict.busy and self.clock() - began < self.wait_s:
            self.sleep(WAIT_POLL_S)
            verdict = self.verdict()
            if verdict.busy and self.clock() - logged >= WAIT_LOG_S:
                logged = self.clock()
                log.info("profile: still waiting for a quiet host before %s (%.0f of %.0f s): %s", what,
                         logged - began, self.wait_s, verdict.seen)
        if verdict.busy:
            log.warning("profile: the host stayed busy for %.0f s (%s); measuring %s anyway, marked contended",
                        self.wait_s, verdict.seen, what)
        else:
            log.info("profile: the host is quiet after %.0f s; measuring %s", self.clock() - began, what)
        return verdict

    def after(self) -> str:
        verdict = self.verdict()
        return f"busy after it: {verdict.seen}" if verdict.busy else ""
