"""What became of a sweep's jobs: which failed and why, kept in the sweep directory for the parent run and the exit.

Hydra's basic sweeper raises the first failed job's error once its batch has run, so ``on_multirun_end`` never
comes and nothing says how many jobs failed. tweakpipe's sweeper (``hydra_plugins/tweakpipe_sweeper``) runs every
job it can and hands each job's ``JobReturn`` here, in the process that launched the sweep, whichever process or
machine ran the job: :func:`ended` reads its reason (a job's :class:`~pipeline.errors.JobFailed` carries the one
line a single run would print and its exit code), :func:`write` keeps them all in ``<sweep dir>/jobs.json``
(redacted, as every record), and the callbacks at the sweep's end read it back: the parent run's tags and artifact
(``pipeline.record.sweep``) and the sweep's exit code (``pipeline.preflight.jobs``).
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import List, Optional, Sequence

from hydra.core.utils import JobReturn, JobStatus

from pipeline.config.errors import one_line
from pipeline.disks import write_atomic
from pipeline.errors import JobFailed
from pipeline.redact import redacted

log = logging.getLogger(__name__)

JOBS_FILE = "jobs.json"


@dataclass(frozen=True)
class JobEnd:
    """One job of a sweep as it ended: its number and overrides, and where it failed, why in one line and the exit
    code a single run would have had (2: a config mistake, 1: a run that failed)."""

    num: int
    overrides: str
    reason: str = ""
    code: int = 0

    @property
    def line(self) -> str:
        return f"job {self.num} ({self.overrides}): {self.reason}"


def ended(num: int, ret: JobReturn) -> JobEnd:
    """Job ``num``'s end from Hydra's ``JobReturn``; an error that is not a :class:`JobFailed` is a bug of
    tweakpipe's, logged with its traceback (Hydra keeps it silently as the job's return value)."""
    overrides = " ".join(ret.overrides or [])
    if ret.status == JobStatus.COMPLETED:
        return JobEnd(num, overrides)
    error = ret._return_value  # what the job raised (JobReturn.return_value would print the overrides and raise it)
    if isinstance(error, JobFailed):
        return JobEnd(num, overrides, error.reason, error.code)
    log.error("sweep job %d (%s) failed with an error of tweakpipe's:", num, redacted(overrides), exc_info=error)
    return JobEnd(num, overrides, f"{type(error).__name__}: {one_line(error)}" if error else "it did not run", 1)


def failed(ends: Sequence[JobEnd]) -> List[JobEnd]:
    return [end for end in ends if end.code]


def headline(ends: Sequence[JobEnd]) -> str:
    """``2 of 4 jobs failed``."""
    return f"{len(failed(ends))} of {len(ends)} jobs failed"


def exit_code(ends: Sequence[JobEnd]) -> int:
    """The sweep's: 0 where every job ran, 2 where none could for mistakes in their configs, else 1."""
    bad = failed(ends)
    if not bad:
        return 0
    return 2 if len(bad) == len(ends) and all(end.code == 2 for end in bad) else 1


def write(sweep_dir: Path, ends: Sequence[JobEnd]) -> Path:
    """``<sweep dir>/jobs.json``: every job's end, and the headline; logged, each failed job in one line."""
    for end in failed(ends):
        log.error("sweep %s", redacted(end.line))
    (log.error if failed(ends) else log.info)("sweep: %s", headline(ends))
    return write_atomic(Path(sweep_dir) / JOBS_FILE, json.dumps(redacted(
        {"summary": headline(ends), "jobs": [asdict(end) for end in ends]}), indent=1))


def read(sweep_dir: Path) -> Optional[List[JobEnd]]:
    """The jobs' ends :func:`write` kept in ``sweep_dir``, or None (another sweeper ran the sweep)."""
    path = Path(sweep_dir) / JOBS_FILE
    return [JobEnd(**end) for end in json.loads(path.read_text())["jobs"]] if path.is_file() else None
