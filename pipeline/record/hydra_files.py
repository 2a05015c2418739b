"""A Hydra callback that keeps credentials out of the files Hydra writes for a run and a sweep.

Hydra records a job's composed config and its command line's overrides verbatim (``<run dir>/.hydra/config.yaml``,
``hydra.yaml``, ``overrides.yaml``) and a sweep's config in ``<sweep dir>/multirun.yaml``, with no hook to change
what it writes: a Redis password given in ``compile_cache.remote=redis://:PASSWORD@...`` would stay there in clear.
``on_job_start`` runs in the job's process right after Hydra wrote them (``hydra.core.utils.run_job``), whatever the
launcher, and rewrites each one :func:`pipeline.redact.redacted`; the job itself runs with the config it was given.

Configured in ``conf/config.yaml`` under ``hydra.callbacks``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, List

from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig

from pipeline.disks import write_atomic
from pipeline.redact import redacted

JOB_FILES = ("config.yaml", "hydra.yaml", "overrides.yaml")
SWEEP_FILE = "multirun.yaml"


def hydra_files(config: DictConfig) -> List[Path]:
    """The files Hydra wrote for the job ``config`` describes (and for its sweep) before the job began."""
    hc = config.hydra
    paths = [Path(hc.runtime.output_dir) / hc.output_subdir / name for name in JOB_FILES] \
        if hc.output_subdir is not None else []
    if hc.mode == RunMode.MULTIRUN:
        paths.append(Path(hc.sweep.dir) / SWEEP_FILE)
    return paths


class RedactHydraFiles(Callback):
    """Hydra's records of a job and its sweep, rewritten with the credentials of their URLs redacted."""

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        for path in hydra_files(config):
            text = path.read_text() if path.is_file() else ""
            if redacted(text) != text:
                write_atomic(path, redacted(text))
