"""Progress of long stages: a live bar and status line in a terminal, nothing in CI logs or pipes.

Stages call it in a line or two::

    for name, cfg in progress.track(backends.items(), "capture", len(backends), label=lambda kv: kv[0]): ...
    with progress.steps("profile", len(sizes)) as bar:
        ...  bar.next(f"bs={bs}")  ...

While a bar is live, log lines that would go to the terminal are printed above it instead of
tearing it. ``CI=true``, a stdout that is not a terminal, or ``TWEAK_PROGRESS=0`` (set by the
parallel launcher, whose jobs share one terminal) turn it off.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from typing import Any, Callable, Iterable, Iterator, List, Optional, Tuple, TypeVar

T = TypeVar("T")


def enabled() -> bool:
    """Whether a live display would help: an interactive terminal, outside CI."""
    if os.environ.get("CI", "").lower() in ("1", "true", "yes") or os.environ.get("TWEAK_PROGRESS") == "0":
        return False
    return sys.stdout.isatty()


class Steps:
    """One task of known length; ``next(label)`` finishes the previous step and shows the next.

    The count never passes the task's total, even when a stage takes more steps than it planned.
    """

    def __init__(self, progress: Any = None, task: Any = None, title: str = "", total: Optional[int] = None) -> None:
        self.progress, self.task, self.title, self.total = progress, task, title, total
        self.done = -1  # steps finished; -1 before the first

    def next(self, label: str) -> None:
        if self.progress is None:
            return
        self.done = self.done + 1 if self.total is None else min(self.done + 1, self.total)
        self.progress.update(self.task, completed=self.done, description=f"{self.title} [bold]{label}[/bold]")


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
    """A bar for ``total`` steps titled ``title``; a no-op :class:`Steps` when :func:`enabled` is false."""
    if not enabled():
        yield Steps()
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
