"""Progress of long stages: a live bar in a terminal, log lines everywhere else.

Stages call it in a line or two::

    for name, cfg in progress.track(backends.items(), "capture", len(backends), label=lambda kv: kv[0]): ...
    with progress.steps("profile", len(sizes)) as bar:
        ...  bar.next(f"bs={bs}")  ...

In an interactive terminal a rich bar shows the step, and log lines that would go to the terminal
are printed above it instead of tearing it. Anywhere else (a pipe, ``nohup``, CI, a notebook, a
parallel launcher's jobs, which set ``TWEAK_PROGRESS=0``) a step is a log line with done/total,
the time elapsed and an ETA from the steps done so far: the first step, then a step at most every
``QUIET_S`` seconds (fast steps do not flood the log), and a step still running again every
``HEARTBEAT_S`` seconds, so a log never goes quiet while work goes on (a compile can take minutes
in one step). The heartbeat is a thread that reads the task's own clock only (never another
thread's frames), and ends with its task or with the :func:`scope` the task began in. Around the
whole run, :func:`watchdog` speaks wherever nothing else has for ``HEARTBEAT_S`` seconds.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
from typing import Any, Callable, Iterable, Iterator, List, Optional, Tuple, TypeVar

T = TypeVar("T")
log = logging.getLogger(__name__)
HEARTBEAT_S = 10.0  # a step running longer is logged again: the log is never quiet for long
QUIET_S = 5.0  # a new step is logged only if the last line is older: fast steps do not flood the log


def enabled() -> bool:
    """Whether a live bar would help: an interactive terminal, outside CI and parallel jobs."""
    if os.environ.get("CI", "").lower() in ("1", "true", "yes") or os.environ.get("TWEAK_PROGRESS") == "0":
        return False
    return sys.stdout.isatty()


def duration(seconds: float) -> str:
    """``8 s``, ``2 min 5 s``, ``1 h 3 min``: what a reader of a log takes in at a glance."""
    s = int(round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60} s"
    return f"{s // 3600} h {s % 3600 // 60} min"


class Steps:
    """One task of known length; ``next(label)`` finishes the previous step and shows the next.

    The count never passes the task's total, even when a stage takes more steps than it planned.
    """

    def __init__(self, progress: Any = None, task: Any = None, title: str = "", total: Optional[int] = None) -> None:
        self.progress, self.task, self.title, self.total = progress, task, title, total
        self.done = -1  # steps finished; -1 before the first

    def count(self) -> None:
        self.done = self.done + 1 if self.total is None else min(self.done + 1, self.total)

    def next(self, label: str) -> None:
        self.count()
        self.progress.update(self.task, completed=self.done, description=f"{self.title} [bold]{label}[/bold]")


class LoggedSteps(Steps):
    """Steps as log lines: a step as it starts (unless a line is younger than ``QUIET_S``), a step still
    running every ``HEARTBEAT_S`` seconds, and the end.

    The ETA assumes the steps left take as long as the steps done took on average: rough where
    steps differ (one backend compiles for minutes, the next for seconds), and said as such.
    """

    def __init__(self, title: str, total: Optional[int], clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(title=title, total=total)
        self.every_s, self.quiet_s, self.clock = HEARTBEAT_S, QUIET_S, clock
        self.started = self.step_started = self.last_line = self.last_step_line = clock()
        self.label, self.steps = "", 0  # steps begun, more than total where a stage takes more than it planned
        self.lock = threading.Lock()

    def position(self) -> str:
        step = self.done + 1 if self.total is None else min(self.done + 1, self.total)
        return f"{step}/{self.total}" if self.total is not None else str(step)

    def timing(self, now: float) -> str:
        """``12 s elapsed, ETA 30 s``: the ETA once a step is done and the total is known."""
        elapsed = now - self.started
        words = f"{duration(elapsed)} elapsed"
        if self.total is not None and self.done > 0:
            per_step = (self.step_started - self.started) / self.done
            left = per_step * (self.total - self.done) - (now - self.step_started)
            words += f", ETA {duration(left)}" if left > 0 else ", ETA unknown"
        return words

    def say(self, words: str, now: float) -> None:
        self.last_line = now
        log.info("%s %s %s; %s", self.title, self.position(), words, self.timing(now))

    def next(self, label: str) -> None:
        with self.lock:
            self.count()
            self.steps += 1
            self.label, self.step_started = label, self.clock()
            if self.done == 0 or self.step_started - self.last_step_line >= self.quiet_s:
                self.last_step_line = self.step_started
                self.say(label, self.step_started)

    def beat(self) -> None:
        """Log the running step again if this task logged nothing for ``HEARTBEAT_S`` seconds."""
        with self.lock:
            now = self.clock()
            if self.done >= 0 and now - self.last_line >= self.every_s:
                self.say(f"{self.label} still running after {duration(now - self.step_started)}", now)

    def finish(self) -> None:
        """The end, where a step was taken (a task that found nothing to do says nothing)."""
        if self.steps:
            log.info("%s done: %d step(s) in %s", self.title, self.steps, duration(self.clock() - self.started))


_live: List[threading.Event] = []  # the heartbeats of tasks now running, oldest first
_live_lock = threading.Lock()


@contextlib.contextmanager
def heartbeat(bar: LoggedSteps) -> Iterator[None]:
    """A daemon thread that asks ``bar`` for a beat a few times per heartbeat, until the task ends, the
    :func:`scope` it began in ends, or the thread that began it is gone."""
    stop, owner, poll_s = threading.Event(), threading.current_thread(), min(1.0, bar.every_s / 4)

    def beat() -> None:
        while not stop.wait(poll_s) and owner.is_alive():
            bar.beat()

    with _live_lock:
        _live.append(stop)
    thread = threading.Thread(target=beat, name=f"progress-{bar.title}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        with _live_lock:
            if stop in _live:
                _live.remove(stop)
        thread.join()


class LastLine(logging.Handler):
    """When tweakpipe's log last said anything a user sees (INFO and above, from ``pipeline`` or ``stages``)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.at = time.monotonic()

    def emit(self, record: logging.LogRecord) -> None:
        self.at = time.monotonic()


WATCHED = ("pipeline", "stages")  # the loggers whose lines count as the run speaking


@contextlib.contextmanager
def watchdog(doing: Callable[[], str], every_s: float = HEARTBEAT_S) -> Iterator[None]:
    """While the block runs, a line ``<doing()> still running after ...`` whenever tweakpipe's log has said nothing
    for ``every_s`` seconds, from whatever part of the run is silent: a stage's work between its own steps, a
    checkpoint's save and its ahead-of-time builds, cells measured again on a loaded host. A log that goes quiet for
    a minute reads as a hang; the progress bars' own heartbeats name their step, this covers the rest."""
    last, began, stop = LastLine(), time.monotonic(), threading.Event()
    loggers = [logging.getLogger(name) for name in WATCHED]
    for logger in loggers:
        logger.addHandler(last)

    def watch() -> None:
        while not stop.wait(min(1.0, every_s / 4)):
            now = time.monotonic()
            if now - last.at >= every_s:
                log.info("%s still running after %s (nothing else said for %s)", doing(), duration(now - began),
                         duration(now - last.at))

    thread = threading.Thread(target=watch, name="progress-watchdog", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        for logger in loggers:
            logger.removeHandler(last)


@contextlib.contextmanager
def scope() -> Iterator[None]:
    """Every progress task begun inside ends with it (the runner opens one per stage).

    A :func:`track` loop that an exception left unfinished does not end by itself: its generator
    lives as long as the traceback does (a notebook keeps the last one), and would go on logging a
    step that no longer runs.
    """
    with _live_lock:
        begun = len(_live)
    try:
        yield
    finally:
        with _live_lock:
            for stop in _live[begun:]:
                stop.set()
            del _live[begun:]


@contextlib.contextmanager
def logs_above(stream: Any) -> Iterator[None]:
    """Point the root logger's terminal handlers at ``stream`` (rich's proxy) for the duration."""
    moved: List[Tuple[logging.StreamHandler, Any]] = []
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.StreamHandler) and handler.stream in (sys.__stdout__, sys.__stderr__):
            moved.append((handler, handler.setStream(stream)))
    try:
        yield
    finally:
        for handler, old in moved:
            handler.setStream(old)


@contextlib.contextmanager
def steps(title: str, total: Optional[int]) -> Iterator[Steps]:
    """A bar for ``total`` steps titled ``title`` in a terminal (:func:`enabled`), else :class:`LoggedSteps`."""
    if not enabled():
        bar = LoggedSteps(title, total)
        with heartbeat(bar):
            yield bar
        bar.finish()
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    with Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), transient=True) as progress, logs_above(sys.stdout):
        yield Steps(progress, progress.add_task(title, total=total), title, total)


def track(items: Iterable[T], title: str, total: Optional[int], label: Callable[[T], str] = str) -> Iterator[T]:
    """:func:`steps` over ``items``: each item's label shows while the loop body works on it."""
    with steps(title, total) as bar:
        for item in items:
            bar.next(label(item))
            yield item
