"""A Hydra callback that makes a multirun sweep one MLflow parent run, with every job's run as its child.

``on_multirun_start`` (in the process that launches the sweep) creates the parent run and writes
its id to ``<sweep dir>/mlflow_parent.json``. Each job, in whatever process or machine the
launcher put it, reads that file when its tracker starts and tags its run ``mlflow.parentRunId``
(:func:`pipeline.record.tracker.hydra_job_tags`). ``on_multirun_end`` tags the parent with what became of
the jobs (``sweep.jobs_failed``: "N of M jobs failed", and ``sweep.failed_job.<N>``: each failed job's overrides
and reason in one line, from ``<sweep dir>/jobs.json``, also logged: :mod:`pipeline.record.sweep_jobs`), logs the
sweep's latency table (:mod:`pipeline.record.report`) and closes it FINISHED: the sweep ran every job it could. A
sweep that dies early closes it as FAILED.

Configured in ``conf/config.yaml`` under ``hydra.callbacks``; single runs are untouched.
"""

from __future__ import annotations

import atexit
import json
import logging
from pathlib import Path
from typing import Any, Optional

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from pipeline.redact import redacted
from pipeline.record.store import StoreGuard, open_experiment, process_tags
from pipeline.record import sweep_jobs
from pipeline.record.tracker import FAILED_JOB_TAG, JOBS_FAILED_TAG, PARENT_FILE, SWEEP_TAG, runs_table

log = logging.getLogger(__name__)


class MlflowSweep(Callback):
    """Parent run for a sweep. Holds only strings, so Hydra can ship it to job processes."""

    def __init__(self) -> None:
        self.run_id: Optional[str] = None
        self.uri: Optional[str] = None

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        tcfg = config.tracking
        if not tcfg.enabled:
            return
        from mlflow.tracking import MlflowClient

        sweep_dir = Path(str(config.hydra.sweep.dir))
        guard = StoreGuard(tcfg.uri)
        experiment_id = open_experiment(tcfg.uri, tcfg.experiment, guard)
        overrides = OmegaConf.to_container(config.hydra.overrides.task, resolve=True)
        params = config.hydra.sweeper.get("params")
        params = OmegaConf.to_container(params, resolve=True) if params else {}
        tags = {SWEEP_TAG: "1", "sweep_dir": str(sweep_dir), "hydra.overrides": " ".join(overrides) or "(none)",
                "hydra.sweeper.params": json.dumps(params), "hydra.launcher": str(config.hydra.launcher._target_),
                **process_tags()}
        client = MlflowClient(tracking_uri=tcfg.uri)
        run = guard(client.create_run, experiment_id, run_name=f"sweep {sweep_dir.name}", tags=redacted(tags))
        self.run_id, self.uri = run.info.run_id, tcfg.uri
        sweep_dir.mkdir(parents=True, exist_ok=True)
        (sweep_dir / PARENT_FILE).write_text(json.dumps(
            {"run_id": self.run_id, "experiment_id": experiment_id, "tracking_uri": redacted(tcfg.uri)}, indent=2))
        atexit.register(self.close, "FAILED")
        log.info("mlflow: sweep parent run %s in %s; runs table: %s", self.run_id, tcfg.uri,
                 runs_table(tcfg.uri, experiment_id))

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        if self.run_id is None:
            return
        try:
            self.log_jobs(Path(str(config.hydra.sweep.dir)))
            self.log_report(Path(str(config.hydra.sweep.dir)))
        finally:
            self.close("FINISHED")

    def log_jobs(self, sweep_dir: Path) -> None:
        """What became of the jobs (``jobs.json``, which tweakpipe's sweeper wrote), as tags and an artifact."""
        from mlflow.entities import RunTag
        from mlflow.tracking import MlflowClient

        ends = sweep_jobs.read(sweep_dir)
        if ends is None:
            return
        tags = {JOBS_FAILED_TAG: sweep_jobs.headline(ends),
                **{f"{FAILED_JOB_TAG}{end.num}": end.line[:5000] for end in sweep_jobs.failed(ends)}}
        client, guard = MlflowClient(tracking_uri=self.uri), StoreGuard(self.uri)
        guard(client.log_batch, self.run_id, tags=[RunTag(k, v) for k, v in redacted(tags).items()])
        guard(client.log_artifact, self.run_id, str(sweep_dir / sweep_jobs.JOBS_FILE))

    def log_report(self, sweep_dir: Path) -> None:
        """The sweep's latency table (terminal, Markdown, CSV), also kept in the sweep directory."""
        from mlflow.tracking import MlflowClient

        from pipeline.record import report

        client = MlflowClient(tracking_uri=self.uri)
        table = report.build(report.runs_of_sweep(client, self.run_id), failed=report.failed_jobs(client, self.run_id))
        if not table.rows:
            log.warning("mlflow: no child run of sweep %s has latency metrics; no report", self.run_id)
            return
        report.show(table)
        paths = report.write(table, sweep_dir / "report")
        guard = StoreGuard(self.uri)
        for path in paths:
            guard(client.log_artifact, self.run_id, str(path))

    def close(self, status: str) -> None:
        """End the parent run once: FINISHED from on_multirun_end, FAILED at exit if a job's error stopped the sweep."""
        if self.run_id is None:
            return
        from mlflow.tracking import MlflowClient

        run_id, self.run_id = self.run_id, None
        atexit.unregister(self.close)
        StoreGuard(self.uri)(MlflowClient(tracking_uri=self.uri).set_terminated, run_id, status)
