"""Hydra's basic sweeper, except that a failed job does not stop the sweep: every job that can run runs.

Hydra's ``BasicSweeper`` composes every job of a batch before launching it and stops the sweep at the first job it
cannot compose, and once a batch has run it raises the first failed job's error: the jobs of later batches never
run, ``on_multirun_end`` never comes (no sweep table, the parent run left FAILED) and nothing says how many failed.
This one expands the same lists, ranges and ``hydra.sweeper.params`` into the same jobs and numbers, launches them
with whatever launcher is configured, as Hydra does, and keeps what each job returned: a job Hydra cannot compose is
not launched and is recorded FAILED with its one-line reason (the jobs around it keep their numbers), a job that
raised is recorded FAILED as its launcher returned it. At the end every job's outcome goes to
``<sweep dir>/jobs.json`` and the log says ``N of M jobs failed``, each with its overrides and reason
(``pipeline.record.sweep_jobs``), which the sweep's callbacks give to the MLflow parent run and the exit code.
``multirun.yaml`` is written with the credentials of its URLs redacted (``pipeline.redact``).

Configured by ``conf/hydra/sweeper/every_job.yaml`` (the default of ``conf/config.yaml``).
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any, List, Sequence

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.utils import JobReturn, JobStatus
from omegaconf import OmegaConf


class EveryJobSweeper(BasicSweeper):
    """Every job of the sweep, in batches of ``max_batch_size`` (null: one batch), whatever the others did."""

    def sweep(self, arguments: List[str]) -> Any:
        from pipeline.disks import write_atomic  # here: Hydra imports every plugin module at its start
        from pipeline.record import sweep_jobs
        from pipeline.redact import redacted

        assert self.config is not None and self.launcher is not None and self.hydra_context is not None
        params = self._parse_config() + list(arguments)
        parser = OverridesParser.create(config_loader=self.hydra_context.config_loader)
        self.overrides = self.split_arguments(parser.parse_overrides(params), self.max_batch_size)
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        write_atomic(sweep_dir / "multirun.yaml", redacted(OmegaConf.to_yaml(self.config)))  # as Hydra's, no password
        returns: List[Sequence[JobReturn]] = []
        first = 0
        while not self.is_done():
            batch = self.get_job_batch()
            returns.append(self.launch_batch(batch, first))
            first += len(batch)
        sweep_jobs.write(sweep_dir, [sweep_jobs.ended(num, ret)
                                     for num, ret in enumerate(r for batch in returns for r in batch)])
        return returns

    def launch_batch(self, batch: Sequence[Sequence[str]], first: int) -> List[JobReturn]:
        """Job ``first + i`` for each ``batch[i]`` Hydra can compose, launched in runs of consecutive jobs so that
        each keeps its number; the others recorded FAILED, not launched."""
        from pipeline.errors import ConfigError, JobFailed
        from pipeline.preflight.jobs import job_config

        refused = {}
        for i, overrides in enumerate(batch):
            try:
                job_config(self.config, list(overrides))
            except ConfigError as exc:
                refused[i] = str(exc)
        results: List[JobReturn] = []
        for bad, run in itertools.groupby(range(len(batch)), key=lambda i: i in refused):
            jobs = list(run)
            if bad:
                results += [JobReturn(overrides=list(batch[i]), status=JobStatus.FAILED,
                                      _return_value=JobFailed(refused[i], 2)) for i in jobs]
            else:
                results += self.launcher.launch([batch[i] for i in jobs], initial_job_idx=first + jobs[0])
        return results
