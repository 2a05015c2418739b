"""MLflow tracking: one run per job, each stage's results logged as soon as the stage ends.

The store is always explicit (``sqlite:///outputs/mlflow.db`` by default, or a server URL):
current MLflow refuses the plain-file store.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any, Dict, Iterable, Mapping, Optional

from omegaconf import DictConfig, OmegaConf

log = logging.getLogger(__name__)


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


def ensure_store(uri: str) -> None:
    """Create the folder of a local SQLite store, so the first run on a fresh clone works."""
    if uri.startswith("sqlite:///"):
        Path(uri[len("sqlite:///"):]).expanduser().parent.mkdir(parents=True, exist_ok=True)
    elif uri.startswith("file:") or "://" not in uri:
        raise ValueError(f"tracking.uri={uri!r}: use sqlite:///path/to/mlflow.db or a server URL "
                         f"(http://host:port); MLflow refuses the plain-file store")


class NullTracker:
    """``tracking=off``: every call is a no-op; the run directory still holds all the files."""

    run_id: Optional[str] = None

    def start(self, cfg: DictConfig, run_dir: Path) -> None: ...
    def log_capture(self, outcomes: Mapping[str, Any], path: Path) -> None: ...
    def log_profile(self, profile: Mapping[str, Mapping[int, Any]], path: Path) -> None: ...
    def log_route(self, route: Iterable[Any], path: Path) -> None: ...
    def log_validation(self, validation: Mapping[str, Any], path: Path) -> None: ...
    def log_artifact(self, path: Path, folder: Optional[str] = None) -> None: ...
    def finish(self, status: str) -> None: ...


class MlflowTracker(NullTracker):
    """Logs to the store named by ``tracking.uri``."""

    def __init__(self, tcfg: Mapping[str, Any]) -> None:
        import mlflow

        self.mlflow = mlflow
        self.tcfg = tcfg
        ensure_store(tcfg["uri"])
        mlflow.set_tracking_uri(tcfg["uri"])
        mlflow.set_experiment(tcfg["experiment"])

    def start(self, cfg: DictConfig, run_dir: Path) -> None:
        resolved = OmegaConf.to_container(cfg, resolve=True)
        run = self.mlflow.start_run(run_name=self.tcfg.get("run_name") or f"{cfg.model.name}")
        self.run_id = run.info.run_id
        params = {k: str(v)[:6000] for k, v in flatten(resolved).items()}
        self.mlflow.log_params(params)
        self.mlflow.set_tags({"model": cfg.model.name, "stages": ",".join(cfg.stages),
                              "backends": ",".join(cfg.backends), "run_dir": str(run_dir)})
        self.log_artifact(run_dir / "config.yaml")
        log.info("mlflow: run %s in %s", self.run_id, self.tcfg["uri"])

    def log_capture(self, outcomes: Mapping[str, Any], path: Path) -> None:
        metrics = {}
        for name, o in outcomes.items():
            if o.status == "ok":
                metrics[f"compile_s/{name}"] = o.build_seconds
                metrics[f"max_rel_error/{name}"] = o.max_rel_error
                metrics[f"peak_memory_mb/{name}"] = o.peak_memory_bytes / 2**20
        self.mlflow.log_metrics(metrics)
        self.mlflow.set_tags({f"backend_status.{n}": f"{o.status}: {o.reason}"[:5000] for n, o in outcomes.items()})
        self.log_artifact(path)

    def log_profile(self, profile: Mapping[str, Mapping[int, Any]], path: Path) -> None:
        metrics = {}
        for name, per in profile.items():
            for bs, m in per.items():
                if m.count and not math.isnan(m.median):
                    metrics[f"latency_ms/{name}/bs{bs}"] = m.median
                    metrics[f"throughput/{name}/bs{bs}"] = bs / (m.median / 1e3)
        self.mlflow.log_metrics(metrics)
        self.log_artifact(path)

    def log_route(self, route: Iterable[Any], path: Path) -> None:
        self.mlflow.set_tag("route", "; ".join(f"{r.lo}-{r.hi or 'inf'}:{r.backend}" for r in route))
        self.log_artifact(path)

    def log_validation(self, validation: Mapping[str, Any], path: Path) -> None:
        self.mlflow.log_metric("validation_ok", float(validation["ok"]))
        self.log_artifact(path)

    def log_artifact(self, path: Path, folder: Optional[str] = None) -> None:
        if path.exists():
            self.mlflow.log_artifact(str(path), artifact_path=folder)

    def finish(self, status: str) -> None:
        self.mlflow.end_run(status=status)


def make_tracker(tcfg: Mapping[str, Any]) -> NullTracker:
    """The tracker the config asks for."""
    return MlflowTracker(tcfg) if tcfg["enabled"] else NullTracker()
