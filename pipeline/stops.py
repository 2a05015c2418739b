"""How a run stops when asked to: Ctrl-C (SIGINT) and SIGTERM, the same way, and always.

While a run is stoppable, either signal raises in the main thread (``KeyboardInterrupt`` for
SIGINT, :class:`Terminated` for SIGTERM), so the run records what it measured and ends KILLED.
Python swallows an exception raised where it cannot propagate (a weakref callback, a ``__del__``:
"Exception ignored in ..."), and a Ctrl-C that lands there used to let the run go on to
FINISHED. So a stop, once asked for, is raised again every :data:`AGAIN_S` seconds until the run
says it caught it (:meth:`Stop.caught`): a timer fires, and raises unless the stop is already on
its way up (being handled in an ``except`` or ``finally`` block). A second signal (a second Ctrl-C, or a
``timeout`` wrapper passing on the group's SIGINT) is absorbed while the first is handled, so the stop is one
line, not a traceback from the cleanup it would have interrupted; a third raises again.

Where a stop lands can break more than the run, so:

- it is never raised inside a :func:`deferred` block (a write to an SQLite store): one raised between SQLite's
  insert and its commit left the database locked by the interrupted connection, so the run's own KILLED status
  could not be written for the store's whole wait. The timer raises it within :data:`AGAIN_S` of the block's
  end, and a block that ends with a stop still held raises it as it ends: a stop is never lost.
- an import it cut off halfway is forgotten as the stop is caught: Python drops the interrupted package from
  ``sys.modules`` but keeps the submodules it had finished, bound to the broken package, so the next import
  found them (matplotlib's, cut off during the first plot, failed every later plot of the process with an
  ``AttributeError``). Only modules whose package went missing since the stop was raised are forgotten.

Both were found by the suite's stop tests.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import sys
import threading
from typing import Any, Iterator, Optional, Set

log = logging.getLogger(__name__)
AGAIN_S = 0.25  # how soon a swallowed stop is raised again
NAMES = {signal.SIGINT: "SIGINT (Ctrl-C)", signal.SIGTERM: "SIGTERM"}
_deferring = [0]  # how many deferred() blocks the main thread is in


class Terminated(BaseException):
    """SIGTERM arrived: the run stops as if interrupted and is recorded KILLED."""


def stop_for(signum: int) -> BaseException:
    return KeyboardInterrupt() if signum == signal.SIGINT else Terminated(f"signal {signum}")


def is_stop(exc: Optional[BaseException]) -> bool:
    return isinstance(exc, (KeyboardInterrupt, Terminated))


def described(exc: BaseException) -> str:
    """The signal a stop came from, in words."""
    return NAMES[signal.SIGINT if isinstance(exc, KeyboardInterrupt) else signal.SIGTERM]


class Stop:
    """What :func:`stoppable` yields: :meth:`caught` tells it a stop reached the run, so it is not raised again."""

    def __init__(self) -> None:
        self.asked: list = []  # the signals received
        self.pending = False  # asked for and not caught yet
        self.modules_at_raise: Set[str] = set()  # sys.modules as the stop was last raised

    def raised(self) -> BaseException:
        """The stop to raise now, noting which modules were loaded (see :func:`forget_half_imported`)."""
        self.modules_at_raise = set(sys.modules)
        return stop_for(self.asked[-1])

    def caught(self, exc: BaseException) -> None:
        if is_stop(exc) and self.pending:
            signal.setitimer(signal.ITIMER_REAL, 0)
            self.pending = False
            forget_half_imported(self.modules_at_raise)


def forget_half_imported(modules_at_raise: Set[str]) -> None:
    """Drop from ``sys.modules`` the submodules of a package that was loaded when the stop was raised and is gone
    now (its import was cut off): the next import runs them again, bound to a whole package."""
    gone = tuple(f"{name}." for name in modules_at_raise if name not in sys.modules)
    for name in [name for name in list(sys.modules) if name.startswith(gone)] if gone else []:
        sys.modules.pop(name, None)


@contextlib.contextmanager
def stoppable() -> Iterator[Stop]:
    """SIGINT and SIGTERM stop the block for sure (see the module docstring); outside the main thread,
    where no signal handler can run, the block runs as it is."""
    stop = Stop()
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return

    def on_signal(signum: int, frame: Any) -> None:
        stop.asked.append(signum)
        if len(stop.asked) == 2:  # the first is on its way up (or swallowed, and the timer raises it again):
            return  # raising now would land in its cleanup, printed by Python as "Exception ignored in ..."
        stop.pending = True
        signal.setitimer(signal.ITIMER_REAL, AGAIN_S, AGAIN_S)
        if _deferring[0] and len(stop.asked) == 1:
            return  # the timer raises it once the write is done
        raise stop.raised()  # a third signal raises at once: whoever sends it insists

    def again(signum: int, frame: Any) -> None:
        if not _deferring[0] and not is_stop(sys.exc_info()[1]):  # swallowed: raise it where it can propagate
            raise stop.raised()

    previous = {s: signal.signal(s, on_signal) for s in NAMES}
    previous[signal.SIGALRM] = signal.signal(signal.SIGALRM, again)
    try:
        yield stop
    except BaseException as exc:
        stop.caught(exc)
        raise
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    if stop.pending:  # held to the block's end (or swallowed just before it): still a stop
        stop.pending = False
        exc = stop_for(stop.asked[-1])
        log.warning("stopped by %s as the run ended; its record stands as it ended", described(exc))
        raise exc


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """A stop asked for inside the block is raised just after it, not in it (see the module docstring); outside
    the main thread, where no stop is raised, the block runs as it is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _deferring[0] += 1
    try:
        yield
    finally:
        _deferring[0] -= 1
