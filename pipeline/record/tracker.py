"""MLflow tracking of one run: params, tags, metrics and artifacts, whatever stage they come from.

The store is always explicit (``sqlite:///outputs/mlflow.db`` by default, or a server URL):
current MLflow refuses the plain-file store. In a multirun sweep each job's run is a child of the
sweep's parent run (see :mod:`pipeline.record.sweep`); the job finds the parent through a file in the
sweep directory, so this works for jobs in other processes and on other machines alike.

Everything goes through ``MlflowClient`` with an explicit run id, never MLflow's global active
run: a user's own ``mlflow.start_run()`` in the same process is left alone, and ending a run is one
idempotent write of its status, retried while the store is locked. Each run is tagged with its host
and process, so a run killed outright (SIGKILL) is found and marked KILLED by the next run on the
store (:func:`pipeline.record.store.mark_orphans_killed`). Every param and tag is written with the
credentials of its URLs redacted (:func:`pipeline.redact.redacted`).
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, TypeVar

from pipeline.redact import redacted
from pipeline.record.store import StoreGuard, StoreLocked, mark_orphans_killed, open_experiment, process_tags

if TYPE_CHECKING:
    from pipeline.record.logged_model import LoggedFiles

log = logging.getLogger(__name__)

# Written by the sweep callback into the sweep directory; read by every job of the sweep.
PARENT_FILE = "mlflow_parent.json"
# MLflow tag that links a child run to its parent (the UI nests runs by it).
PARENT_TAG = "mlflow.parentRunId"
SWEEP_TAG = "tweakpipe.sweep"
# A run's tag where its profile measured cells on a busy host ("true"/"false"; ``contended_cells``: how many): its
# speed-ups over those cells are logged as ``contended_...`` (``pipeline.route.figures``), the report and the plot
# mark them.
CONTENDED_TAG = "contended"
# On a sweep's parent run: "N of M jobs failed", and one tag per failed job, "job N (overrides): reason".
JOBS_FAILED_TAG, FAILED_JOB_TAG = "sweep.jobs_failed", "sweep.failed_job."
# + a reference candidate: why the comparison with the best own compile lacks it (route.json: reference.unmeasured)
UNMEASURED_TAG = "reference.unmeasured."
MAX_PARAM = 6000  # MLflow's limit on a param value's length
MAX_PARAMS_TAGS, MAX_METRICS = 100, 1000  # MLflow's limits per batch
LOCAL_UI = "http://127.0.0.1:5000"  # where `mlflow ui` serves by default
FINAL_WAIT_S = 10.0  # after the store was given up on, how long the final status waits for it
T = TypeVar("T")


def dotted_params(cfg: Mapping[str, Any], prefix: str = "") -> Dict[str, Any]:
    """A nested config as MLflow params: ``{"a": {"b": 1}}`` -> ``{"a.b": 1}``; lists stay values."""
    flat: Dict[str, Any] = {}
    for key, value in cfg.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            flat.update(dotted_params(value, path + "."))
        else:
            flat[path] = value
    return flat


def read_parent(sweep_dir: Path) -> Optional[Dict[str, str]]:
    """The parent run the sweep callback recorded in ``sweep_dir``, or None."""
    path = Path(sweep_dir) / PARENT_FILE
    return json.loads(path.read_text()) if path.exists() else None


def hydra_job_tags(uri: str) -> Dict[str, str]:
    """Tags of the Hydra job this process runs: its overrides, job number and, in a sweep, the parent run."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized():
        return {}  # the Python API: no Hydra job
    hc = HydraConfig.get()
    tags = {"hydra.overrides": " ".join(hc.overrides.task) or "(none)"}
    if hc.mode != RunMode.MULTIRUN:
        return tags
    tags.update({"hydra.job.num": str(hc.job.num), "sweep_dir": str(hc.sweep.dir)})
    parent = read_parent(Path(hc.sweep.dir))
    if parent is None:
        log.warning("mlflow: no %s in %s; this job's run has no parent (is pipeline.record.sweep.MlflowSweep in "
                    "hydra.callbacks?)", PARENT_FILE, hc.sweep.dir)
    elif redacted(parent["tracking_uri"]) != redacted(uri):  # the file keeps it redacted
        log.warning("mlflow: the sweep's parent run is in %s, this job logs to %s; no parent link",
                    parent["tracking_uri"], uri)
    else:
        tags[PARENT_TAG] = parent["run_id"]
    return tags


def runs_table(uri: str, experiment_id: str) -> str:
    """The UI page of the experiment's runs table. MLflow 3.17's UI picks its pages by its own
    GenAI / Model training switch (remembered by the browser), not by the experiment's kind tag, and
    starts on GenAI traces; ``workflowType=machine_learning`` opens the runs."""
    served = uri.startswith(("http://", "https://"))
    page = f"{uri.rstrip('/') if served else LOCAL_UI}/#/experiments/{experiment_id}/runs"
    page += "?workflowType=machine_learning"
    return page if served else f"{page} (after mlflow ui --backend-store-uri {uri})"


def device_tags() -> Dict[str, str]:
    """Which GPU this job holds: the launcher's ``CUDA_VISIBLE_DEVICES`` and the device's own id."""
    tags = {}
    if "CUDA_VISIBLE_DEVICES" in os.environ:
        tags["cuda_visible_devices"] = os.environ["CUDA_VISIBLE_DEVICES"]
    import torch

    if torch.cuda.is_initialized():
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        tags["gpu"] = " ".join(str(x) for x in (props.name, getattr(props, "uuid", ""), getattr(props, "pci_bus_id", ""))
                               if str(x))
    return tags


class NullTracker:
    """``tracking=off``: every call is a no-op; the run directory still holds every file."""

    run_id: Optional[str] = None

    def start(self, name: str, params: Mapping[str, Any], tags: Mapping[str, str],
              resume_id: Optional[str] = None) -> None: ...
    def log_metrics(self, metrics: Mapping[str, float], model_id: Optional[str] = None) -> None: ...
    def set_tags(self, tags: Mapping[str, str]) -> None: ...
    def log_artifact(self, path: Path) -> None: ...
    def log_model(self, model: LoggedFiles) -> Optional[str]:
        return None
    def finish(self, status: str) -> None: ...


class LostClient:
    """Stands in for MLflow's client where the store stayed locked before the client could open it: every write
    is skipped from then on (``MlflowTracker.write``), so its methods are never called; they would do nothing."""

    def __getattr__(self, name: str) -> Callable[..., None]:
        return lambda *args, **kwargs: None


class MlflowTracker(NullTracker):
    """Logs to the store named by ``tracking.uri``; every write goes through a :class:`StoreGuard`.

    A store that stays locked past the guard's wait (``tracking.max_wait_s``) is given up on for the rest
    of the run, in one warning: the run goes on and its directory is the record. At the end the run's
    status is tried once more, briefly; a store still locked leaves the MLflow run RUNNING until a later
    run finds this process gone and marks it KILLED, as for a ``kill -9``.
    """

    def __init__(self, tcfg: Mapping[str, Any]) -> None:
        from mlflow.tracking import MlflowClient

        self.uri = tcfg["uri"]
        self.guard = StoreGuard(self.uri, float(tcfg.get("max_wait_s", 120.0)))
        self.lost: Optional[str] = None  # when the store stayed locked past its wait (then nothing is written)
        self.experiment_id = self.write(open_experiment, self.uri, tcfg["experiment"], self.guard, guarded=False)
        # Opening the client reads the store (SQLite's schema check), so it waits like a write; a store lost
        # already leaves a stand-in, since nothing more is written to it.
        self.client = self.write(MlflowClient, tracking_uri=self.uri) or LostClient()

    def write(self, fn: Callable[..., T], *args: Any, guarded: bool = True, **kwargs: Any) -> Optional[T]:
        """``fn(*args, **kwargs)`` under the guard (``guarded=False``: ``fn`` takes the guard itself), or
        nothing once the store stayed locked past its wait."""
        if self.lost is not None:
            return None
        try:
            return self.guard(fn, *args, **kwargs) if guarded else fn(*args, **kwargs)
        except StoreLocked:
            self.lost = time.strftime("%Y-%m-%d %H:%M:%S")
            log.warning("mlflow: %s stayed locked by other writers for more than %.0f s; the run goes on without "
                        "MLflow and its run directory is the record%s (a tracking server avoids this: "
                        "tracking=server)", self.uri, self.guard.max_wait_s,
                        f"; MLflow run {self.run_id} gets its status if the store answers by the end, else a later "
                        f"run marks it KILLED" if self.run_id else "")
            return None

    def start(self, name: str, params: Mapping[str, Any], tags: Mapping[str, str],
              resume_id: Optional[str] = None) -> None:
        """A new run (or ``resume_id`` reopened), tagged with this job, process and device."""
        self.write(mark_orphans_killed, self.client)
        tags = {**tags, **hydra_job_tags(self.uri), **device_tags(), **process_tags()}
        if resume_id is not None and self._reopen(resume_id):
            self.run_id = resume_id
        else:
            if "hydra.job.num" in tags:
                name = f"{tags['hydra.job.num']}_{name}"
            created = self.write(self.client.create_run, self.experiment_id, run_name=name) \
                if self.experiment_id is not None else None
            if created is None:
                return
            self.run_id = created.info.run_id
            from mlflow.entities import Param

            for chunk in chunks([Param(k, redacted(str(v))[:MAX_PARAM]) for k, v in dotted_params(params).items()],
                                MAX_PARAMS_TAGS):
                self.write(self.client.log_batch, self.run_id, params=chunk)
        self.set_tags(tags)
        log.info("mlflow: run %s in %s%s; runs table: %s", self.run_id, self.uri,
                 f" (child of {tags[PARENT_TAG]})" if PARENT_TAG in tags else "",
                 runs_table(self.uri, self.experiment_id))

    def _reopen(self, run_id: str) -> bool:
        """Mark an interrupted run RUNNING again; False where the store no longer has it."""
        from mlflow.exceptions import MlflowException

        try:
            self.write(self.client.update_run, run_id, status="RUNNING")
        except MlflowException:
            log.warning("mlflow: run %s is not in %s; the resumed run is logged as a new run", run_id, self.uri)
            return False
        return True

    def log_metrics(self, metrics: Mapping[str, float], model_id: Optional[str] = None) -> None:
        """Metrics of the run; with ``model_id``, of that logged model too (one write puts them on both)."""
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(k, float(v), now, 0, model_id=model_id) for k, v in metrics.items() if v == v]  # NaN says nothing
        for chunk in chunks(batch, MAX_METRICS):
            self.write(self.client.log_batch, self.run_id, metrics=chunk)

    def set_tags(self, tags: Mapping[str, str]) -> None:
        from mlflow.entities import RunTag

        for chunk in chunks([RunTag(k, redacted(str(v))[:5000]) for k, v in tags.items()], MAX_PARAMS_TAGS):
            self.write(self.client.log_batch, self.run_id, tags=chunk)

    def log_artifact(self, path: Path) -> None:
        if path.exists():
            self.write(self.client.log_artifact, self.run_id, str(path))

    def log_model(self, model: LoggedFiles) -> Optional[str]:
        """``model`` as an MLflow logged model of this run (the run's output, in the experiment's Models tab), its
        metrics on the model and the run; its files and an ``MLmodel`` file (metadata, no code) as its artifacts.
        READY once they are uploaded, FAILED where the upload failed. Returns its id (None where MLflow is lost)."""
        from mlflow.entities import LoggedModelOutput

        if self.run_id is None:
            return None
        logged = self.write(self.client.create_logged_model, self.experiment_id, name=model.name,
                            source_run_id=self.run_id, tags=redacted(dict(model.tags)),
                            params=redacted(dict(model.params)),
                            model_type=model.model_type)
        if logged is None:
            return None
        model_id = logged.model_id
        self.write(self.client.log_outputs, self.run_id, [LoggedModelOutput(model_id, step=0)])
        self.log_metrics(model.metrics, model_id=model_id)
        try:
            with model.staged(logged) as folder:
                self.write(self.client.log_model_artifacts, model_id, str(folder))
        except BaseException:
            self.write(self.client.finalize_logged_model, model_id, "FAILED")
            raise
        self.write(self.client.finalize_logged_model, model_id, "READY")
        return model_id

    def finish(self, status: str) -> None:
        """One write of the run's status; retried while the store is locked, and safe to repeat. After the
        store was given up on, one more brief try, which also says from when MLflow lacks the run's data."""
        if self.run_id is None:
            return
        if self.lost is None:
            self.write(self.client.set_terminated, self.run_id, status)
            return
        try:
            StoreGuard(self.uri, min(self.guard.max_wait_s, FINAL_WAIT_S))(self._mark_lost, status)
            log.info("mlflow: the store answered again; run %s is marked %s", self.run_id, status)
        except StoreLocked:
            log.warning("mlflow: %s is still locked; run %s stays RUNNING until a later run on this store finds this "
                        "process gone and marks it KILLED", self.uri, self.run_id)

    def _mark_lost(self, status: str) -> None:
        self.client.set_tag(self.run_id, "tweakpipe.store_lost", f"the store stayed locked from {self.lost} on: "
                                                                   f"what came after is in the run directory only")
        self.client.set_terminated(self.run_id, status)


def chunks(items: Sequence[Any], size: int) -> Iterator[List[Any]]:
    """``items`` in lists of at most ``size`` (MLflow's per-batch limits)."""
    for i in range(0, len(items), size):
        yield list(items[i:i + size])


def make_tracker(tcfg: Mapping[str, Any]) -> NullTracker:
    """The tracker the config asks for."""
    return MlflowTracker(tcfg) if tcfg["enabled"] else NullTracker()
