"""Helpers for the tracking tests: a ready SQLite store, a real ``mlflow server``, sweeps in subprocesses."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Sequence

from doc_blocks import commands, section

ROOT = Path(__file__).resolve().parents[1]
# Two quick jobs of the tiny model, eager only: no compile, seconds each.
SWEEP = ["model=tiny_mlp", "profile=quick", "backends=[eager]", "reference=false", "seed=0,1"]


# MLflow 3's server starts a job runner beside itself (about ten huey consumers, each importing mlflow: seconds of both
# cores at every start) for GenAI jobs, which no run of tweakpipe asks for; the suite's servers go without it.
MLFLOW_SERVER_ENV = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}


def clean_env() -> Dict[str, str]:
    """The test's environment without MLFLOW_* settings that would send runs elsewhere."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    env["PYTHONUNBUFFERED"] = "1"
    return env


def init_store(db: Path) -> None:
    """Create MLflow's tables once (their migrations take seconds); tests copy the file."""
    from mlflow.tracking import MlflowClient

    MlflowClient(tracking_uri=f"sqlite:///{db}").search_experiments()


def copy_store(template: Path, folder: Path) -> str:
    """A fresh store in ``folder`` from the initialised template; returns its URI."""
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(template, folder / "mlflow.db")
    return f"sqlite:///{folder / 'mlflow.db'}"


def run_pipeline(args: Sequence[str], timeout: float = 120, env: Optional[Dict[str, str]] = None,
                 ) -> subprocess.CompletedProcess:
    """``python -m pipeline ARGS`` from the repository root (where Hydra finds the launcher plugin),
    with ``env`` added to the test's environment."""
    proc = subprocess.run([sys.executable, "-m", "pipeline", *args], cwd=ROOT, env={**clean_env(), **(env or {})},
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"pipeline failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-6000:]}"
    return proc


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# docs/scaling-out.md's section on a shared server: its ``mlflow server`` command and a run's line against it.
SHARED_SERVER = section(ROOT / "docs" / "scaling-out.md", "## A shared MLflow server")


@dataclass(frozen=True)
class SharedServer:
    """The docs' ``mlflow server``, up: runs reach it as ``url`` (``http://HOST:PORT``)."""

    host: str  # HOST: this machine's host name, or localhost where that name does not resolve
    address: str  # the one address it listens on, HOST's: a URL naming it is refused (not in --allowed-hosts)
    port: int
    folder: Path  # its working directory, holding mlflow-server/mlflow.db and mlflow-server/artifacts as written
    tracking: List[str]  # the docs' run line's tracking overrides, HOST and the port filled in

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


@contextlib.contextmanager
def docs_server(folder: Path) -> Iterator[SharedServer]:
    """docs/scaling-out.md's ``mlflow server`` command as written, started in ``folder``, this machine's host name as
    HOST, on a free port for 5000, listening on HOST's address alone (not every interface) and with one worker
    (quicker to start on 2 cores)."""
    host = socket.gethostname()
    try:
        address = socket.gethostbyname(host)
    except OSError:
        host, address = "localhost", "127.0.0.1"
    port = free_port()
    server, run_line = commands(SHARED_SERVER)
    assert server[:2] == ["mlflow", "server"] and run_line[1:3] == ["-m", "pipeline"], SHARED_SERVER
    server = [a.replace("HOST", host).replace("5000", str(port)) for a in server]
    server[server.index("--host") + 1] = address
    tracking = [a.replace("HOST", host).replace("5000", str(port)) for a in run_line if a.startswith("tracking")]
    shared = SharedServer(host, address, port, folder, tracking)
    with serving([sys.executable, "-m", *server, "--workers", "1"], folder, shared.url, timeout=120):
        yield shared


@contextlib.contextmanager
def serving(argv: Sequence[str], folder: Path, url: str, timeout: float = 90) -> Iterator[None]:
    """``argv`` (a server) started in ``folder`` and up (``url``/health answers), stopped afterwards; its output is
    ``folder/server.log``."""
    log = (folder / "server.log").open("w")
    proc = subprocess.Popen(list(argv), cwd=folder, env={**clean_env(), **MLFLOW_SERVER_ENV}, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"mlflow server exited ({proc.returncode}):\n{(folder / 'server.log').read_text()}")
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"mlflow server not up after {timeout}s:\n{(folder / 'server.log').read_text()}")
            time.sleep(0.5)
        yield
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()


def sweep_runs(uri: str, experiment: str = "tweakpipe") -> tuple:
    """``(parent, children)`` of the one sweep in ``experiment``; fails unless there is exactly one parent."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(experiment)
    runs = client.search_runs([exp.experiment_id], max_results=1000)
    parents = [r for r in runs if r.data.tags.get("tweakpipe.sweep") == "1"]
    assert len(parents) == 1, f"expected one sweep parent, found {len(parents)}"
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parents[0].info.run_id]
    assert len(runs) == 1 + len(children), "runs outside the sweep"
    return parents[0], sorted(children, key=lambda r: int(r.data.tags["hydra.job.num"]))


def artifact_names(uri: str, run_id: str) -> List[str]:
    from mlflow.tracking import MlflowClient

    return sorted(a.path for a in MlflowClient(tracking_uri=uri).list_artifacts(run_id))


def run_with_note(uri: str, experiment: str, folder: Path, text: str) -> str:
    """A finished tweakpipe MLflow run in ``experiment`` holding one artifact, ``note.txt`` saying ``text``."""
    from pipeline.record.tracker import MlflowTracker

    tracker = MlflowTracker({"uri": uri, "experiment": experiment})
    tracker.start("run", {}, {})
    note = folder / "note.txt"
    note.write_text(text)
    tracker.log_artifact(note)
    tracker.finish("FINISHED")
    return tracker.run_id
