"""Durable runs: what was measured survives a kill, every way out ends the MLflow run, a killed run
resumes, runs never share a directory, and a moved store keeps its artifacts."""

from __future__ import annotations

import csv
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch
from mlflow.tracking import MlflowClient

import pipeline
from conftest import ROOT, SUITE_CACHE
from mlflow_helpers import run_with_note
from pipeline.record.store import StoreGuard, open_experiment, repair_moved_artifacts
from pipeline.record.tracker import MlflowTracker

# A profile whose every cell takes about a second: long enough to be killed in the middle of.
SLOW_PROFILE = ["profile.budget_ms=1000", "profile.max_samples=1000000", "profile.rel_precision=0.00001",
                "profile.min_window_ms=1000", "profile.max_repeats=0", "profile.device_check=false"]


def cli(*args: str, cwd: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TWEAK_PROGRESS": "0"}
    return subprocess.Popen([sys.executable, "-m", "pipeline", *args], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def rows(path: Path) -> list:
    with path.open() as f:
        return list(csv.DictReader(f))


def wait_for_rows(path: Path, count: int, proc: subprocess.Popen, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and len(rows(path)) >= count:
            return
        assert proc.poll() is None, proc.communicate()[0][-3000:]
        time.sleep(0.2)
    raise AssertionError(f"no {count} profile rows in {timeout}s")


def statuses(uri: str) -> dict:
    client = MlflowClient(tracking_uri=uri)
    experiments = [e.experiment_id for e in client.search_experiments()]
    return {r.info.run_id: r.info.status for r in client.search_runs(experiments)}


def test_sigkill_keeps_the_measured_cells_the_next_run_marks_it_killed_and_resume_finishes_it(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run_dir = tmp_path / "run"
    common = [f"tracking.uri={uri}"]
    # Two sizes: the kill lands in the second, which the resumed run measures (each size more costs it 4 s of cells).
    proc = cli("model=tiny_mlp", "backends=[eager,inductor]", "model.batch_sizes=[1,2]", *SLOW_PROFILE, *common,
               "reference=false", f"compile_cache.dir={SUITE_CACHE}", f"hydra.run.dir={run_dir}", cwd=tmp_path)
    wait_for_rows(run_dir / "profile.csv", 2, proc)  # the first batch size: both backends measured
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    measured = rows(run_dir / "profile.csv")
    assert {(r["backend"], r["batch_size"]) for r in measured} >= {("eager", "1"), ("inductor", "1")}
    killed_id = json.loads((run_dir / "mlflow_run.json").read_text())["run_id"]
    assert statuses(uri)[killed_id] == "RUNNING"  # nothing could end it

    other = cli("model=tiny_mlp", "backends=[eager]", "reference=false", "profile=quick", "stages=[capture]", *common, cwd=tmp_path)
    assert other.wait(timeout=120) == 0, other.communicate()[0][-3000:]
    after = statuses(uri)
    assert after[killed_id] == "KILLED" and "RUNNING" not in after.values()

    profiled = [c for c in map(json.loads, (run_dir / "cells.jsonl").read_text().splitlines()) if c["phase"] == "profile"]
    first_cell = profiled[0]
    resumed = cli(f"resume={run_dir}", cwd=tmp_path)
    out = resumed.communicate(timeout=300)[0]
    assert resumed.returncode == 0, out[-3000:]
    final = {(r["backend"], int(r["batch_size"])): r for r in rows(run_dir / "profile.csv")}
    assert set(final) == {(b, bs) for b in ("eager", "inductor") for bs in (1, 2)}
    lines = (run_dir / "cells.jsonl").read_text().splitlines()
    cells = {(c["backend"], c["batch_size"]): c["cell"] for c in map(json.loads, lines) if c["phase"] == "profile"}
    kept = cells[(first_cell["backend"], first_cell["batch_size"])]
    assert first_cell["cell"]["passes"] == [0] and kept["passes"] == [0, 1]  # the resumed run added the second pass
    assert kept["windows"][0] == first_cell["cell"]["windows"][0]  # to the first, measured before the kill
    assert json.loads((run_dir / "route.json").read_text())["ranges"]
    assert statuses(uri)[killed_id] == "FINISHED"  # the same MLflow run, finished by the resumed run


def test_sigterm_ends_the_run_as_killed(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run_dir = tmp_path / "run"
    proc = cli("model=tiny_mlp", "backends=[eager]", "reference=false", "model.batch_sizes=[1,2,4]", *SLOW_PROFILE,
               f"tracking.uri={uri}", f"hydra.run.dir={run_dir}", cwd=tmp_path)
    wait_for_rows(run_dir / "profile.csv", 1, proc)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) != 0
    run_id = json.loads((run_dir / "mlflow_run.json").read_text())["run_id"]
    assert statuses(uri)[run_id] == "KILLED"
    assert rows(run_dir / "profile.csv")  # and the cells measured before it stay


def test_a_resume_of_a_directory_without_a_run_is_refused_in_one_line(tmp_path):
    proc = cli(f"resume={tmp_path / 'nothing'}", cwd=tmp_path)
    out = proc.communicate(timeout=120)[0]
    assert proc.returncode == 2 and "no config.yaml there" in out and "Traceback" not in out, out
    assert not (tmp_path / "nothing").exists()


def test_two_runs_started_together_get_two_directories(tmp_path):
    procs = [cli("model=tiny_mlp", "backends=[eager]", "reference=false", "profile=quick", "tracking=off", "stages=[capture]",
                 cwd=tmp_path) for _ in range(2)]
    for proc in procs:
        assert proc.wait(timeout=120) == 0, proc.communicate()[0][-2000:]
    runs = list((tmp_path / "outputs" / "runs").iterdir())
    assert len(runs) == 2 and all((r / "capture.json").is_file() for r in runs)


def test_an_api_run_directory_holds_the_plot_and_the_log(tmp_path):
    pipeline.tune(torch.nn.Linear(4, 2), torch.randn(2, 4), run_dir=tmp_path,
                  overrides=["backends=[eager]", "reference=false", "profile=quick", "tracking=off", "model.batch_sizes=[1,2]"])
    for name in ("config.yaml", "capture.json", "profile.csv", "route.json", "validation.json", "model.tweak",
                 "latency.png", "tweakpipe.log"):
        assert (tmp_path / name).is_file(), name
    assert "route   batch 1..inf -> eager" in (tmp_path / "tweakpipe.log").read_text()


def test_the_final_status_is_written_after_a_brief_lock(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracker = MlflowTracker({"uri": uri, "experiment": "locked"})
    tracker.start("run", {"seed": 1}, {})
    lock = open(StoreGuard(uri).lock_path, "a")
    fcntl.flock(lock, fcntl.LOCK_EX)  # another process writing: the guard waits for it
    threading.Timer(1.0, lambda: fcntl.flock(lock, fcntl.LOCK_UN)).start()
    start = time.monotonic()
    tracker.finish("FINISHED")
    assert time.monotonic() - start >= 0.9
    assert statuses(uri)[tracker.run_id] == "FINISHED"
    lock.close()


def test_a_moved_store_keeps_its_artifacts(tmp_path):
    old = tmp_path / "old" / "outputs"
    run_id = run_with_note(f"sqlite:///{old / 'mlflow.db'}", "moved", tmp_path, "kept")
    new = tmp_path / "new" / "outputs"
    new.parent.mkdir()
    shutil.move(str(old), str(new))
    new_uri = f"sqlite:///{new / 'mlflow.db'}"
    open_experiment(new_uri, "moved", StoreGuard(new_uri))  # any run on the moved store repairs it
    client = MlflowClient(tracking_uri=new_uri)
    assert client.get_experiment_by_name("moved").artifact_location.startswith((new / "mlartifacts").as_uri())
    local = client.download_artifacts(run_id, "note.txt", str(tmp_path))
    assert Path(local).read_text() == "kept"
    assert repair_moved_artifacts(new / "mlflow.db") == []  # already repaired: nothing to do
