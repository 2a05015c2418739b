"""MLflow tracking: one run per job, each stage's results logged as soon as the stage ends.

The store is always explicit (``sqlite:///outputs/mlflow.db`` by default, or a server URL):
current MLflow refuses the plain-file store. In a multirun sweep each job's run is a child of the
sweep's parent run (see :mod:`pipeline.record.sweep`); the job finds the parent through a file in the
sweep directory, so this works for jobs in other processes and on other machines alike.

Many processes may write one SQLite file: every write takes an exclusive file lock next to the
database (one writer at a time) and a write that still meets ``database is locked`` is retried
with backoff, then fails with a message that points at ``tracking=server``.

Before any work, :func:`check_store` refuses a store MLflow would fail on or damage: a server that
does not answer (MLflow's own client would retry for minutes), a file that is not SQLite, another
application's database (MLflow would add its tables to it), a store left half-migrated. A new SQLite
store is created beside its path and renamed into place, so an interrupted first run leaves none.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import random
import socket
import sqlite3
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, Iterator, Mapping, Optional, Set, TypeVar

from omegaconf import DictConfig, OmegaConf

from pipeline.config.errors import ConfigError
from pipeline.config.paths import writable_problem

log = logging.getLogger(__name__)

T = TypeVar("T")
# Written by the sweep callback into the sweep directory; read by every job of the sweep.
PARENT_FILE = "mlflow_parent.json"
# MLflow tag that links a child run to its parent (the UI nests runs by it).
PARENT_TAG = "mlflow.parentRunId"
SWEEP_TAG = "tweakpipe.sweep"
SERVER_HINT = ("many processes writing one SQLite file: run a tracking server instead, e.g.\n"
               "  mlflow server --backend-store-uri sqlite:///outputs/mlflow.db --host 0.0.0.0 --port 5000\n"
               "  python -m pipeline -m tracking=server tracking.uri=http://HOST:5000 ...   (conf/tracking/server.yaml)")
# Tables every MLflow SQLite store has; a database with tables but not these belongs to something else.
MLFLOW_TABLES = {"alembic_version", "experiments", "runs"}
# A probe of the server waits this long; MLflow's own client retries a dead server for minutes.
PROBE_TIMEOUT_S = 5.0


def flatten(cfg: Mapping[str, Any], prefix: str = "") -> Dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``; lists stay values."""
    flat: Dict[str, Any] = {}
    for key, value in cfg.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            flat.update(flatten(value, path + "."))
        else:
            flat[path] = value
    return flat


def sqlite_path(uri: str) -> Optional[Path]:
    """The database file of a ``sqlite:///`` URI, or None for a server."""
    return Path(uri[len("sqlite:///"):]).expanduser() if uri.startswith("sqlite:///") else None


def sqlite_tables(db: Path) -> Optional[Set[str]]:
    """The table names of a SQLite file, read without writing a byte; None if it is not SQLite."""
    try:
        con = sqlite3.connect(f"{db.resolve().as_uri()}?mode=ro", uri=True)
    except sqlite3.Error:
        return None
    try:
        return {row[0] for row in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    except sqlite3.DatabaseError:
        return None
    finally:
        con.close()


def sqlite_problem(db: Path) -> Optional[str]:
    """Why MLflow must not open ``db`` as its store (it would fail, or change another program's file), or None."""
    if not db.exists():
        return writable_problem(db.parent)
    fresh = "point tracking.uri at a new file, e.g. tracking.uri=sqlite:///outputs/mlflow.db"
    if not db.is_file():
        return f"{db} is not a file; {fresh}"
    tables = sqlite_tables(db) if db.stat().st_size else set()
    if tables is None:
        return f"{db} is not a SQLite database, so it is no MLflow store; it was left unchanged; {fresh}"
    leftovers = sorted(t for t in tables if t.startswith("_alembic_tmp_"))
    if leftovers:
        return (f"{db} holds {leftovers[0]}, left by an interrupted MLflow migration, so MLflow cannot open it. "
                f"If its runs do not matter delete it (rm {db}); else back it up, run "
                f"sqlite3 {db} 'DROP TABLE {leftovers[0]}' and then mlflow db upgrade sqlite:///{db}")
    if tables and not MLFLOW_TABLES <= tables:
        shown = ", ".join(sorted(tables)[:5]) + (", ..." if len(tables) > 5 else "")
        return (f"{db} is another application's SQLite database (tables {shown}), not an MLflow store: MLflow "
                f"would add its own tables to it; it was left unchanged; {fresh}")
    return writable_problem(db.parent)


def server_problem(uri: str) -> Optional[str]:
    """Why the tracking server at ``uri`` cannot be used (it does not answer within seconds), or None."""
    try:
        urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=PROBE_TIMEOUT_S).close()
    except urllib.error.HTTPError:
        return None  # it answered
    except (urllib.error.URLError, OSError) as exc:
        if isinstance(getattr(exc, "reason", None), ssl.SSLError):
            return None  # it answered, in TLS this probe does not verify as MLflow may be told to
        where = urllib.parse.urlsplit(uri)
        return (f"the tracking server is unreachable ({getattr(exc, 'reason', exc)}); start one with "
                f"mlflow server --backend-store-uri sqlite:///outputs/mlflow.db --host {where.hostname} "
                f"--port {where.port or 5000}, or run with tracking=sqlite or tracking=off")
    return None


def check_store(uri: str) -> None:
    """Refuse, before any work and changing nothing, a store MLflow would fail on or damage."""
    db = sqlite_path(uri)
    if db is not None:
        problem = sqlite_problem(db)
    elif uri.startswith(("http://", "https://")):
        problem = server_problem(uri)
    elif uri.startswith("file:") or "://" not in uri:
        problem = "use sqlite:///path/to/mlflow.db or a server URL (http://host:port); MLflow refuses the plain-file store"
    else:
        problem = None
    if problem:
        raise ConfigError(f"tracking.uri={uri}: {problem}")


def create_sqlite_store(db: Path) -> None:
    """MLflow's tables, made in ``<db>.creating`` and renamed to ``db``: an interrupted creation
    leaves no half-migrated store, only a file the next creation removes. Call under the store's lock."""
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    db.parent.mkdir(parents=True, exist_ok=True)
    for stale in db.parent.glob(db.name + ".creating*"):  # an earlier creation, interrupted
        stale.unlink()
    tmp = db.with_name(db.name + ".creating")
    store = SqlAlchemyStore(f"sqlite:///{tmp}", (db.parent.resolve() / "mlartifacts").as_uri())
    store.engine.dispose()
    os.replace(tmp, db)


def is_locked_error(exc: BaseException) -> bool:
    """SQLite's busy error, however MLflow or SQLAlchemy wrapped it."""
    text = f"{exc} {exc.__cause__ or ''} {exc.__context__ or ''}".lower()
    return "database is locked" in text or "database table is locked" in text


class StoreGuard:
    """Runs store writes one at a time across processes (SQLite) and retries a locked database.

    A server URI needs neither: the guard then just calls through.
    """

    def __init__(self, uri: str, max_wait_s: float = 120.0) -> None:
        db = sqlite_path(uri)
        self.uri = uri
        self.lock_path = db.with_name(db.name + ".lock") if db is not None else None
        self.max_wait_s = max_wait_s

    @contextlib.contextmanager
    def exclusive(self, deadline: float) -> Iterator[None]:
        """An exclusive ``flock`` on ``<db>.lock``, polled with backoff until ``deadline``."""
        if self.lock_path is None:
            yield
            return
        import fcntl

        self.lock_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.lock_path, "a") as fh:
            delay = 0.01
            while True:
                try:
                    fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"MLflow store {self.uri}: another process held {self.lock_path} "
                                           f"for more than {self.max_wait_s:.0f}s; {SERVER_HINT}") from None
                    time.sleep(delay * random.uniform(1.0, 2.0))
                    delay = min(delay * 2, 1.0)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def __call__(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        deadline = time.monotonic() + self.max_wait_s
        delay = 0.1
        while True:
            try:
                with self.exclusive(deadline):
                    return fn(*args, **kwargs)
            except Exception as exc:
                if not is_locked_error(exc):
                    raise
                if time.monotonic() > deadline:
                    raise RuntimeError(f"MLflow store {self.uri} stayed locked for more than "
                                       f"{self.max_wait_s:.0f}s; {SERVER_HINT}") from exc
                log.warning("mlflow: %s is locked; retrying in %.1fs", self.uri, delay)
                time.sleep(delay * random.uniform(1.0, 2.0))
                delay = min(delay * 2, 5.0)


def open_experiment(uri: str, name: str, guard: StoreGuard) -> str:
    """The experiment's id, created if missing.

    A SQLite store keeps its artifacts beside the database (``<db dir>/mlartifacts``) instead of
    MLflow's default ``./mlruns`` under whatever directory the job started in.
    """
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    check_store(uri)
    db = sqlite_path(uri)

    def get_or_create() -> str:  # under the guard: a fresh SQLite store is created (migrated) by one process
        if db is not None and not MLFLOW_TABLES <= (sqlite_tables(db) or set()):
            create_sqlite_store(db)
        client = MlflowClient(tracking_uri=uri)
        found = client.get_experiment_by_name(name)
        if found is not None:
            return found.experiment_id
        location = (db.parent.resolve() / "mlartifacts").as_uri() if db is not None else None
        try:
            return client.create_experiment(name, artifact_location=location)
        except MlflowException:  # created meanwhile by another process sharing a server
            found = client.get_experiment_by_name(name)
            if found is None:
                raise
            return found.experiment_id

    return guard(get_or_create)


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
    tags = {"hydra.overrides": " ".join(hc.overrides.task) or "(none)", "pid": str(os.getpid()),
            "host": socket.gethostname()}
    if hc.mode != RunMode.MULTIRUN:
        return tags
    tags.update({"hydra.job.num": str(hc.job.num), "sweep_dir": str(hc.sweep.dir)})
    parent = read_parent(Path(hc.sweep.dir))
    if parent is None:
        log.warning("mlflow: no %s in %s; this job's run has no parent (is pipeline.record.sweep.MlflowSweep in "
                    "hydra.callbacks?)", PARENT_FILE, hc.sweep.dir)
    elif parent["tracking_uri"] != uri:
        log.warning("mlflow: the sweep's parent run is in %s, this job logs to %s; no parent link",
                    parent["tracking_uri"], uri)
    else:
        tags[PARENT_TAG] = parent["run_id"]
    return tags


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
    """``tracking=off``: every call is a no-op; the run directory still holds all the files."""

    run_id: Optional[str] = None

    def start(self, cfg: DictConfig, run_dir: Path) -> None: ...
    def log_capture(self, outcomes: Mapping[str, Any], path: Path) -> None: ...
    def log_profile(self, profile: Mapping[str, Mapping[int, Any]], path: Path,
                    host_probe_ms: Mapping[str, float]) -> None: ...
    def log_route(self, route: Iterable[Any], path: Path) -> None: ...
    def log_validation(self, validation: Mapping[str, Any], path: Path) -> None: ...
    def log_artifact(self, path: Path, folder: Optional[str] = None) -> None: ...
    def stage_done(self, stage: str, seconds: float) -> None: ...
    def finish(self, status: str) -> None: ...


class MlflowTracker(NullTracker):
    """Logs to the store named by ``tracking.uri``; every write goes through a :class:`StoreGuard`."""

    def __init__(self, tcfg: Mapping[str, Any]) -> None:
        import mlflow

        self.mlflow = mlflow
        self.tcfg = tcfg
        self.guard = StoreGuard(tcfg["uri"])
        self.experiment_id = open_experiment(tcfg["uri"], tcfg["experiment"], self.guard)
        mlflow.set_tracking_uri(tcfg["uri"])
        self.medians: Dict[str, Dict[int, float]] = {}
        self.title = ""

    def start(self, cfg: DictConfig, run_dir: Path) -> None:
        resolved = OmegaConf.to_container(cfg, resolve=True)
        tags = {"model": cfg.model.name, "stages": ",".join(cfg.stages), "backends": ",".join(cfg.backends),
                "run_dir": str(run_dir), **hydra_job_tags(self.tcfg["uri"]), **device_tags()}
        name = self.tcfg.get("run_name") or cfg.model.name
        if "hydra.job.num" in tags and not self.tcfg.get("run_name"):
            name = f"{tags['hydra.job.num']}_{name}"
        run = self.guard(self.mlflow.start_run, experiment_id=self.experiment_id, run_name=name, tags=tags)
        self.run_id = run.info.run_id
        self.title = f"{cfg.model.name} ({cfg.device})"
        params = {k: str(v)[:6000] for k, v in flatten(resolved).items()}
        self.guard(self.mlflow.log_params, params)
        self.log_artifact(run_dir / "config.yaml")
        log.info("mlflow: run %s in %s%s", self.run_id, self.tcfg["uri"],
                 f" (child of {tags[PARENT_TAG]})" if PARENT_TAG in tags else "")

    def stage_done(self, stage: str, seconds: float) -> None:
        self.guard(self.mlflow.set_tag, f"stage.{stage}", "done")
        self.guard(self.mlflow.log_metric, f"stage_s/{stage}", seconds)

    def log_capture(self, outcomes: Mapping[str, Any], path: Path) -> None:
        metrics = {}
        for name, o in outcomes.items():
            if o.status == "ok":
                metrics[f"compile_s/{name}"] = o.build_seconds
                metrics[f"max_rel_error/{name}"] = o.max_rel_error
                metrics[f"peak_memory_mb/{name}"] = o.peak_memory_bytes / 2**20
        self.guard(self.mlflow.log_metrics, metrics)
        self.guard(self.mlflow.set_tags,
                   {f"backend_status.{n}": f"{o.status}: {o.reason}"[:5000] for n, o in outcomes.items()})
        self.log_artifact(path)

    def log_profile(self, profile: Mapping[str, Mapping[int, Any]], path: Path,
                    host_probe_ms: Mapping[str, float]) -> None:
        metrics = {f"host_probe_ms/{when}": ms for when, ms in host_probe_ms.items()}
        for name, per in profile.items():
            for bs, m in per.items():
                if m.count and not math.isnan(m.median):
                    metrics[f"latency_ms/{name}/bs{bs}"] = m.median
                    metrics[f"throughput/{name}/bs{bs}"] = bs / (m.median / 1e3)
                    self.medians.setdefault(name, {})[int(bs)] = m.median
        self.guard(self.mlflow.log_metrics, metrics)
        self.log_artifact(path)
        self.log_plot(path.parent, route=None)

    def log_route(self, route: Iterable[Any], path: Path) -> None:
        route = list(route)
        self.guard(self.mlflow.set_tags, {
            "route": "; ".join(f"{r.lo}-{r.hi or 'inf'}:{r.backend}" for r in route),
            "route_json": json.dumps([{"lo": r.lo, "hi": r.hi, "backend": r.backend} for r in route]),
        })
        self.log_artifact(path)
        self.log_plot(path.parent, route=route)

    def log_plot(self, run_dir: Path, route: Optional[list]) -> None:
        """Latency against batch size, one line per backend; redrawn with the routed ranges after route."""
        if not self.medians:
            return
        from pipeline.record.plots import latency_plot

        self.log_artifact(latency_plot(self.medians, route, run_dir / "latency.png", self.title))

    def log_validation(self, validation: Mapping[str, Any], path: Path) -> None:
        self.guard(self.mlflow.log_metric, "validation_ok", float(validation["ok"]))
        self.log_artifact(path)

    def log_artifact(self, path: Path, folder: Optional[str] = None) -> None:
        if path.exists():
            self.guard(self.mlflow.log_artifact, str(path), artifact_path=folder)

    def finish(self, status: str) -> None:
        self.guard(self.mlflow.end_run, status=status)


def make_tracker(tcfg: Mapping[str, Any]) -> NullTracker:
    """The tracker the config asks for."""
    return MlflowTracker(tcfg) if tcfg["enabled"] else NullTracker()
