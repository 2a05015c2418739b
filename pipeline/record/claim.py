"""One process at a time per run directory.

Two processes resuming one directory would both append every cell to ``cells.jsonl`` and write the
same files and MLflow run. A run holds an exclusive ``flock`` on ``tweakpipe.lock`` in its directory
for as long as it runs (the kernel lets it go when the process ends, however it ends), with the
holder's pid, host and start time written in it; a second process is refused in one line naming them.
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import logging
import os
import socket
from pathlib import Path
from typing import Iterator

from pipeline.errors import ConfigError

log = logging.getLogger(__name__)
LOCK_FILE = "tweakpipe.lock"


@contextlib.contextmanager
def claimed(run_dir: Path) -> Iterator[None]:
    """Hold ``run_dir`` for this process; a :class:`ConfigError` names the process that holds it already."""
    path = run_dir / LOCK_FILE
    with open(path, "a+") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            holder = fh.read().strip() or "another process"
            raise ConfigError(f"run directory {run_dir} is in use by {holder}; wait for that run to end (or stop it), "
                              f"then resume={run_dir} continues it; two processes must not write one run") from None
        except OSError as exc:  # a filesystem without locks: run, but say so
            log.warning("could not lock %s (%s); nothing stops another process from writing this run directory too",
                        path, exc)
        fh.seek(0)
        fh.truncate()
        fh.write(f"process {os.getpid()} on {socket.gethostname()} (started "
                 f"{datetime.datetime.now():%Y-%m-%d %H:%M:%S})\n")
        fh.flush()
        try:
            yield
        finally:
            fh.seek(0)
            fh.truncate()
