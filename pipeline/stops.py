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
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from typing import Any, Iterator, Optional

AGAIN_S = 0.25  # how soon a swallowed stop is raised again
NAMES = {signal.SIGINT: "SIGINT (Ctrl-C)", signal.SIGTERM: "SIGTERM"}


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

    def caught(self, exc: BaseException) -> None:
        if is_stop(exc) and self.asked:
            signal.setitimer(signal.ITIMER_REAL, 0)


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
        signal.setitimer(signal.ITIMER_REAL, AGAIN_S, AGAIN_S)
        raise stop_for(signum)  # a third signal raises again: whoever sends it insists

    def again(signum: int, frame: Any) -> None:
        if not is_stop(sys.exc_info()[1]):  # swallowed somewhere: raise it where it can propagate
            raise stop_for(stop.asked[-1])

    previous = {s: signal.signal(s, on_signal) for s in NAMES}
    previous[signal.SIGALRM] = signal.signal(signal.SIGALRM, again)
    try:
        yield stop
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        for signum, handler in previous.items():
            signal.signal(signum, handler)
