"""Inductor's compile-worker pool: one that a checkpoint load started is ended when the load returns.

A load that traces (artifacts refused or absent, or a routed backend with no program ahead of time) goes through
Dynamo's Inductor backend, which starts Inductor's compile-worker pool where Triton is installed: a sidecar process
that imports torch and forks one worker per core. The load's compiles are over when it returns, yet the pool stayed
for the life of the served process (one per replica, each holding torch's memory: ``bench/load.py``'s
``left_running``). A pool that was running before the load (the user's own compiles) is theirs and is left alone;
a compile after the load starts a fresh one.

Ending a pool waits for its processes to exit (0.9 s for two workers on a 2-core machine), so :func:`end` resets
Inductor's pool state at once and leaves that wait to a thread: the load returns without it.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
from typing import Iterator

log = logging.getLogger(__name__)

MODULE = "torch._inductor.async_compile"


def running() -> int:
    """How many compile-worker pools Inductor holds in this process (0 while Inductor's compile was never imported)."""
    module = sys.modules.get(MODULE)
    return len(getattr(module, "_pool_set", ())) if module is not None else 0


def end() -> None:
    """Shut down Inductor's compile-worker pools: forgotten here at once (Inductor's own reset, as after a fork: the
    next compile starts a fresh pool), their processes told to exit and waited for in a background thread."""
    import torch._inductor.async_compile as async_compile

    pools = list(async_compile._pool_set)
    async_compile.after_fork()
    for pool in pools:
        threading.Thread(target=pool.shutdown, name="tweakpipe-end-compile-pool", daemon=True).start()


@contextlib.contextmanager
def none_left_behind() -> Iterator[None]:
    """Inside: compiles may start the pool and use it. On leaving (returning or raising), a pool that was not running
    on entry is ended; where Inductor's pool internals differ from those :func:`end` knows (another torch), the pool
    stays and a warning says so: the load itself stands."""
    before = running()
    try:
        yield
    finally:
        if not before and running():
            log.debug("ending the compile-worker pool the load started")
            try:
                end()
            except Exception as exc:  # noqa: BLE001 -- a cleanup: whatever it hit, what was built is kept
                log.warning("the compile-worker pool this load started could not be ended (%s: %s); it stays "
                            "running in this process", type(exc).__name__, exc)
