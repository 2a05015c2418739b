"""MLflow stores that are not what they should be: the report reads a store and never creates, migrates or
changes one; a run refuses a damaged or read-only store before any work; a store locked past its wait
costs the run its MLflow record, not its results; a copied project logs to its own artifact folder."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import re
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, Iterator

import pytest
import torch
from mlflow.tracking import MlflowClient

import pipeline
from conftest import ROOT, read_only
from mlflow_helpers import clean_env, copy_store, init_store, run_with_note
from pipeline.record import report
from pipeline.errors import ConfigError
from pipeline.record.store import StoreGuard, check_store
from pipeline.record.tracker import PARENT_TAG, SWEEP_TAG, MlflowTracker


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    db = tmp_path_factory.mktemp("template") / "mlflow.db"
    init_store(db)
    return db


def foreign(db: Path, template: Path) -> None:
    with sqlite3.connect(db) as con:
        con.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)")
        con.execute("INSERT INTO users (name) VALUES ('ada')")
    con.close()


def truncated(db: Path, template: Path) -> None:
    data = template.read_bytes()
    db.write_bytes(data[: len(data) // 2])


def corrupt(db: Path, template: Path) -> None:
    data = bytearray(template.read_bytes())
    middle = len(data) // 2
    data[middle:middle + 8192] = bytes((i * 37 + 11) % 256 for i in range(8192))  # pages of garbage
    db.write_bytes(bytes(data))


def old_schema(db: Path, template: Path) -> None:
    shutil.copy(template, db)
    with sqlite3.connect(db) as con:
        con.execute("UPDATE alembic_version SET version_num = '0a8213491aaa'")  # MLflow 1.x's first revision
    con.close()


STORES: Dict[str, tuple] = {  # id: (how the file is made, what the report says)
    "foreign": (foreign, r"another application's SQLite database \(tables users\)"),
    "empty": (lambda db, t: db.write_bytes(b""), r"is empty, so it holds no MLflow store"),
    "truncated": (truncated, r"is a damaged SQLite database \(it is cut short: \d+ bytes of the \d+ its header"),
    "corrupt": (corrupt, r"is a damaged SQLite database \("),
    "text": (lambda db, t: db.write_text("not a database\n" * 100), r"is not a SQLite database"),
    "no-tables": (lambda db, t: sqlite3.connect(db).execute("VACUUM").connection.close(),
                  r"a SQLite database without tables, so it holds no MLflow store"),
    "old-schema": (old_schema, r"an MLflow store of another schema \(revision 0a8213491aaa.*opening it would migrate "
                               r"it; it was left unchanged.*mlflow db upgrade"),
}


@pytest.mark.parametrize("case", list(STORES))
def test_the_report_leaves_a_store_it_cannot_read_byte_for_byte_as_it_was(tmp_path, template, capsys, case):
    make, named = STORES[case]
    db = tmp_path / "other_app.db"
    make(db, template)
    before = sha256(db)
    with pytest.raises(SystemExit) as exit_:
        report.main(["--uri", f"sqlite:///{db}", "--out", str(tmp_path / "report")])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.startswith("error: ") and err.count("\n") == 1, err
    assert re.search(named, err), err
    assert sha256(db) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other_app.db"]  # no lock, journal or report beside it


def test_the_report_never_creates_a_store(tmp_path, capsys):
    with pytest.raises(SystemExit):
        report.main(["--uri", f"sqlite:///{tmp_path / 'absent.db'}"])
    assert "no MLflow store at" in capsys.readouterr().err and list(tmp_path.iterdir()) == []


def test_the_latest_sweep_is_named_and_failed_or_empty_sweeps_are_passed_over(tmp_path, template, capsys):
    uri = copy_store(template, tmp_path)
    client = MlflowClient(tracking_uri=uri)
    experiment = client.create_experiment("tweakpipe")

    def sweep(name: str, start: int, status: str, jobs: Dict[str, str]) -> str:
        parent = client.create_run(experiment, run_name=name, start_time=start, tags={SWEEP_TAG: "1"}).info.run_id
        for num, (job, job_status) in enumerate(jobs.items()):
            child = client.create_run(experiment, run_name=job, start_time=start + 1 + num,
                                      tags={PARENT_TAG: parent, "model": job, "hydra.job.num": str(num)}).info.run_id
            client.log_metric(child, "latency_ms/eager/bs1", 0.5)
            client.set_terminated(child, job_status)
        client.set_terminated(parent, status)
        return parent

    good = sweep("sweep good", 1_000, "FINISHED", {"tiny_mlp": "FINISHED", "mlp": "FAILED"})
    sweep("sweep typo", 2_000, "FAILED", {})  # a parent left FAILED before any job ran
    sweep("sweep all failed", 3_000, "FINISHED", {"resnet18": "FAILED"})
    report.main(["--uri", uri, "--sweep", "latest", "--out", str(tmp_path / "report")])
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith(f"report of the newest sweep with a finished run: sweep {good} (sweep good, 1 "
                            f"finished run(s))"), first
    assert "passed over 2 newer one(s)" in first and "sweep typo (failed, 0 finished)" in first, first
    assert "tiny_mlp" in (tmp_path / "report" / "report.md").read_text()


def test_the_report_names_an_unknown_run_in_one_line(tmp_path, template, capsys):
    uri = copy_store(template, tmp_path)
    with pytest.raises(SystemExit) as exit_:
        report.main(["--uri", uri, "--runs", "0123456789abcdef0123456789abcdef"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1, err
    assert "0123456789abcdef0123456789abcdef" in err and "list the runs with mlflow ui" in err


@pytest.mark.slow
def test_the_report_command_on_another_applications_database(tmp_path, template):
    db = tmp_path / "other_app.db"
    foreign(db, template)
    before = sha256(db)
    proc = subprocess.run([sys.executable, "-m", "pipeline.cli", "report", "--uri", f"sqlite:///{db}"], cwd=tmp_path,
                          env={**clean_env(), "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
    assert sha256(db) == before


# ---- a run refuses, before any work, a store it would fail on -------------------------------------------


@pytest.mark.parametrize("case", ["truncated", "corrupt", "old-schema"])
def test_a_run_refuses_a_damaged_store_and_leaves_it_as_it_was(tmp_path, template, case):
    make, named = STORES[case]
    db = tmp_path / "mlflow.db"
    make(db, template)
    before = sha256(db)
    with pytest.raises(ConfigError) as err:
        check_store(f"sqlite:///{db}")
    message = str(err.value)
    assert "\n" not in message and re.search(named, message), message
    assert sha256(db) == before


# ---- a store locked past its wait: the run goes on, its files are the record --------------------------------


@contextlib.contextmanager
def held(uri: str) -> Iterator[None]:
    """The store's write lock, held as another process writing would hold it."""
    with open(StoreGuard(uri).lock_path, "a") as holder:
        fcntl.flock(holder, fcntl.LOCK_EX)
        yield
        fcntl.flock(holder, fcntl.LOCK_UN)


def statuses(uri: str) -> Dict[str, str]:
    client = MlflowClient(tracking_uri=uri)
    experiments = [e.experiment_id for e in client.search_experiments()]
    return {r.info.run_id: r.info.status for r in client.search_runs(experiments)}


def test_a_store_locked_past_its_wait_is_given_up_on_in_one_line_and_marked_when_it_answers(tmp_path, template,
                                                                                             caplog):
    uri = copy_store(template, tmp_path)
    tracker = MlflowTracker({"uri": uri, "experiment": "locked", "max_wait_s": 0.5})
    tracker.start("run", {"seed": 1}, {})
    with held(uri), caplog.at_level(logging.WARNING, logger="pipeline"):
        start = time.monotonic()
        tracker.log_metrics({"before": 1.0})  # waits once, then gives the store up
        tracker.log_metrics({"after": 2.0})
        tracker.set_tags({"after": "1"})
        assert time.monotonic() - start < 5
        lines = [r.getMessage() for r in caplog.records if "stayed locked" in r.getMessage()]
        assert len(lines) == 1 and "\n" not in lines[0], lines
        assert "the run goes on without MLflow and its run directory is the record" in lines[0]
        assert statuses(uri)[tracker.run_id] == "RUNNING"
    tracker.finish("FINISHED")  # the store answers again: the run is marked, saying what it lacks
    run = MlflowClient(tracking_uri=uri).get_run(tracker.run_id)
    assert run.info.status == "FINISHED" and "after" not in run.data.metrics
    assert "what came after is in the run directory only" in run.data.tags["tweakpipe.store_lost"]


LOCKED_RUN = """
import sys
from pipeline.record.tracker import PARENT_TAG, SWEEP_TAG, MlflowTracker
tracker = MlflowTracker({"uri": sys.argv[1], "experiment": "locked", "max_wait_s": 0.5})
tracker.start("run", {}, {})
print(tracker.run_id, flush=True)
sys.stdin.readline()  # the test takes the lock now
tracker.log_metrics({"a": 1.0})
tracker.finish("FINISHED")
"""


def test_a_run_that_ends_while_the_store_is_still_locked_is_marked_killed_by_the_next_run(tmp_path, template):
    uri = copy_store(template, tmp_path)
    proc = subprocess.Popen([sys.executable, "-c", LOCKED_RUN, uri], cwd=ROOT, env=clean_env(), text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    run_id = proc.stdout.readline().strip()
    with held(uri):
        proc.stdin.write("\n")
        proc.stdin.flush()
        out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert "stays RUNNING until a later run on this store finds this process gone" in err
    assert statuses(uri)[run_id] == "RUNNING"
    MlflowTracker({"uri": uri, "experiment": "locked"}).start("next", {}, {})
    assert statuses(uri)[run_id] == "KILLED"


def test_a_run_whose_store_is_locked_from_the_start_finishes_with_every_file(tmp_path, template, caplog):
    uri = copy_store(template, tmp_path / "store")
    with held(uri), caplog.at_level(logging.WARNING, logger="pipeline"):
        tuned = pipeline.tune(torch.nn.Linear(4, 2), torch.randn(2, 4), run_dir=tmp_path / "run",
                              overrides=["backends=[eager]", "reference=false", "profile=quick", "model.batch_sizes=[1,2]",
                                         f"tracking.uri={uri}", "tracking.max_wait_s=0.5"])
    assert tuned is not None
    for name in ("config.yaml", "capture.json", "profile.csv", "route.json", "validation.json", "model.tweak"):
        assert (tmp_path / "run" / name).is_file(), name
    assert not (tmp_path / "run" / "mlflow_run.json").exists()
    assert sum("stayed locked" in r.getMessage() for r in caplog.records) == 1


# ---- a copied project logs to its own artifact folder ------------------------------------------------------


def test_a_copied_then_moved_project_logs_its_artifacts_beside_its_own_store(tmp_path):
    original = tmp_path / "original" / "outputs"
    uri = f"sqlite:///{original / 'mlflow.db'}"
    first = MlflowTracker({"uri": uri, "experiment": "copied"})  # an experiment without artifacts yet
    first.start("run", {}, {})
    first.finish("FINISHED")
    shutil.copytree(tmp_path / "original", tmp_path / "copy")
    shutil.move(str(tmp_path / "copy"), str(tmp_path / "moved"))
    moved = tmp_path / "moved" / "outputs"
    run_with_note(f"sqlite:///{moved / 'mlflow.db'}", "copied", tmp_path, "mine")
    assert list((moved / "mlartifacts").rglob("note.txt"))
    assert not (original / "mlartifacts").exists() or not list((original / "mlartifacts").rglob("note.txt"))
    client = MlflowClient(tracking_uri=uri)  # the original store is left exactly as it pointed
    assert client.get_experiment_by_name("copied").artifact_location.startswith((original / "mlartifacts").as_uri())


def test_a_read_only_store_is_refused_before_any_work(tmp_path, template):
    uri = copy_store(template, tmp_path)
    db = tmp_path / "mlflow.db"
    with read_only(db):
        with pytest.raises(ConfigError) as err:
            check_store(uri)
    assert "\n" not in str(err.value) and re.search(r"mlflow\.db cannot be written \(read-only\); make it writable",
                                                    str(err.value)), err.value
