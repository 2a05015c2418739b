"""Hydra callbacks on a multirun sweep's jobs: each one checked before the sweep starts, and the sweep's exit code
from what became of them.

A config mistake in one job (``device=cuda`` on a CPU machine, a bad value in a list of values, a misspelt option in
a list of options: ``profile=quick,quik``) would otherwise surface only when that job runs: after the sweep
directory, the MLflow parent run and every job before it. ``on_multirun_start`` runs before all of them
(``sweep_jobs`` comes first in ``hydra.callbacks``): each job's config is composed as the launcher will compose it
and is prepared as a single run prepares it (``pipeline.preflight.prepare``: its inputs completed and set at the
longest tuned length, then every check). Where every job is mistaken, the sweep is refused before it makes anything,
naming each job and its mistake in one line (:class:`SweepRefused`: Hydra turns a callback's ``Exception`` into a
warning and launches the sweep anyway); where only some are, each is named in a warning and the others run, the
mistaken ones failing at their own check (or not launched, where Hydra cannot compose them) and recorded FAILED as
any failed job is. A job Hydra cannot compose is named the way a single run's command line is
(``pipeline.config.errors.composition_problem``: the misspelt option and the valid ones).

``on_multirun_end`` comes last (Hydra ends callbacks in reverse order, so after the MLflow parent run is closed): where
a job failed, :class:`SweepFailed` ends the sweep with exit code 1, or 2 where no job could run for mistakes in their
configs (``pipeline.record.sweep_jobs``, which tweakpipe's sweeper wrote).

Only Hydra's basic sweeper, and tweakpipe's built on it, list their jobs up front; under another sweeper each job is
checked as it starts.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, List

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import ConfigCompositionException, OverrideParseException
from hydra.experimental.callback import Callback
from hydra.utils import get_class
from omegaconf import DictConfig, OmegaConf, open_dict

from pipeline.config.errors import composition_problem
from pipeline.errors import ConfigError
from pipeline.preflight.prepare import prepare
from pipeline.record import sweep_jobs
from pipeline.redact import redacted

log = logging.getLogger(__name__)
BASIC_SWEEPER = f"{BasicSweeper.__module__}.{BasicSweeper.__qualname__}"


class SweepRefused(BaseException):
    """Every job of a sweep is a :class:`ConfigError`; ``python -m pipeline`` prints them in one line and exits 2."""


class SweepFailed(BaseException):
    """Some job of a sweep failed (each is named in the log and the parent run); ``python -m pipeline`` prints the
    count in one line and exits with ``code``."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def job_overrides(sweep: DictConfig) -> List[List[str]]:
    """Each job's overrides, in job order, as the basic sweeper expands them (``hydra.sweeper.params``,
    then the command line's)."""
    params = sweep.hydra.sweeper.get("params") or {}
    arguments = [f"{key}={value}" for key, value in params.items()]
    arguments += OmegaConf.to_container(sweep.hydra.overrides.task, resolve=False)
    parsed = OverridesParser.create().parse_overrides(arguments)
    return [job for batch in BasicSweeper.split_arguments(parsed, None) for job in batch]


def config_dirs(sweep: DictConfig) -> List[Path]:
    """The config directories Hydra searches for this sweep (the shipped tree, ``--config-dir``, searchpath)."""
    return [Path(s.path) for s in sweep.hydra.runtime.config_sources if s.schema == "file"]


def job_config(sweep: DictConfig, overrides: List[str]) -> DictConfig:
    """The config one job's ``main`` will get (Hydra's own node left out); a job Hydra cannot compose is a
    :class:`ConfigError` naming why in one line."""
    try:
        cfg = GlobalHydra.instance().config_loader().load_sweep_config(sweep, overrides)
    except (ConfigCompositionException, OverrideParseException) as exc:
        raise ConfigError(composition_problem(exc, overrides, config_dirs(sweep))) from None
    with open_dict(cfg):
        del cfg["hydra"]
    return cfg


def lists_jobs(sweep: DictConfig) -> bool:
    """Whether the sweep's sweeper is Hydra's basic one or built on it: its jobs are known before it starts. By name:
    Hydra's plugin scan imports its core plugins' modules again, so the class a plugin subclasses may be another
    object than the one imported here."""
    sweeper = get_class(sweep.hydra.sweeper._target_)
    return any(f"{c.__module__}.{c.__qualname__}" == BASIC_SWEEPER for c in sweeper.__mro__)


class SweepJobs(Callback):
    """Every job's config checked before the sweep makes anything; the sweep's exit code from its jobs' ends."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        if not lists_jobs(config):
            return
        jobs = job_overrides(config)
        mistakes = []
        for num, overrides in enumerate(jobs):
            try:
                prepare(job_config(config, overrides))
            except ConfigError as exc:
                mistakes.append(f"sweep job {num} ({' '.join(overrides)}): {exc}")
        if len(mistakes) == len(jobs):
            raise SweepRefused(f"{'; '.join(mistakes)}; no job of the sweep can run, so nothing was run")
        for mistake in mistakes:
            log.warning("%s; it is recorded FAILED and the sweep runs its other jobs", redacted(mistake))

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(str(config.hydra.sweep.dir))
        ends = sweep_jobs.read(sweep_dir)
        code = sweep_jobs.exit_code(ends) if ends else 0
        if code:
            raise SweepFailed(f"{sweep_jobs.headline(ends)}, each named above with its reason, and in "
                              f"{sweep_dir / sweep_jobs.JOBS_FILE}", code)
