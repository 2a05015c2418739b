"""A Hydra callback that composes and checks every job of a multirun sweep before the sweep starts.

A config mistake in one job (``device=cuda`` on a CPU machine, a bad value in a list of values, a misspelt option in
a list of options: ``profile=quick,quik``) would otherwise surface only when that job runs: after the sweep
directory, the MLflow parent run and every job before it. ``on_multirun_start`` runs before all of them
(``check_jobs`` comes first in ``hydra.callbacks``): each job's config is composed as the launcher will compose it
and is prepared as a single run prepares it (``pipeline.preflight.prepare``: its inputs completed and set at the
longest tuned length, then every check); the first mistake stops the sweep, naming the job (:class:`SweepRefused`:
Hydra turns a callback's ``Exception`` into a warning and launches the sweep anyway). A job Hydra cannot compose is
named the way a single run's command line is (``pipeline.config.errors.composition_problem``: the misspelt option
and the valid ones).

Only Hydra's basic sweeper lists its jobs up front; under another sweeper each job is checked as it starts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, List

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import ConfigCompositionException, OverrideParseException
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf, open_dict

from pipeline.config.errors import composition_problem
from pipeline.errors import ConfigError
from pipeline.preflight.prepare import prepare

BASIC_SWEEPER = f"{BasicSweeper.__module__}.{BasicSweeper.__name__}"


class SweepRefused(BaseException):
    """A sweep job's :class:`ConfigError`; ``python -m pipeline`` prints it in one line and exits 2."""


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


class CheckJobs(Callback):
    """Every job's config checked before the sweep makes anything."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        if config.hydra.sweeper._target_ != BASIC_SWEEPER:
            return
        for num, overrides in enumerate(job_overrides(config)):
            try:
                prepare(job_config(config, overrides))
            except ConfigError as exc:
                raise SweepRefused(f"sweep job {num} ({' '.join(overrides)}): {exc}; nothing was run") from None
