"""Stopping and resuming a run: an interrupt always stops it and is recorded KILLED, said in one line with how
to resume; one process at a time writes a run directory; a resume reuses cells only for what they measured,
refuses a finished run, and names a damaged file instead of a traceback."""

from __future__ import annotations

import importlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from mlflow.tracking import MlflowClient

import pipeline
from conftest import ROOT, TINY, read_only
from mlflow_helpers import clean_env, copy_store, init_store
from models_for_tests import InterruptedInCallback
from pipeline import stops
from pipeline.errors import ConfigError
from pipeline.record.claim import claimed
from pipeline.runner import resumed_config, run

QUICK = ["backends=[eager]", "reference=false", "profile=quick", "model.batch_sizes=[1,2]"]
# A profile whose every cell takes about a second: long enough to be stopped in the middle of.
SLOW_PROFILE = ["profile.budget_ms=1000", "profile.max_samples=1000000", "profile.rel_precision=0.00001",
                "profile.min_window_ms=1000", "profile.max_repeats=0", "profile.device_check=false"]


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    db = tmp_path_factory.mktemp("template") / "mlflow.db"
    init_store(db)
    return db


def record(run_dir: Path) -> dict:
    return json.loads((run_dir / "run.json").read_text())


def finished_capture(compose_cfg, run_dir: Path, *extra: str):
    """A capture-only run of the tiny MLP that finished in ``run_dir``."""
    return run(compose_cfg([*TINY, "backends=[eager]", "reference=false", "stages=[capture]", *extra]), run_dir)


# ---- an interrupt always stops the run ------------------------------------------------------------------------


def test_a_ctrl_c_that_lands_in_a_weakref_callback_still_stops_the_run_and_is_recorded_killed(tmp_path, template,
                                                                                               monkeypatch):
    uri = copy_store(template, tmp_path / "store")
    swallowed = []  # what Python reports as "Exception ignored in ..."
    monkeypatch.setattr(sys, "unraisablehook", lambda unraisable: swallowed.append(unraisable.exc_type))
    InterruptedInCallback.calls = 0
    run_dir = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):
        pipeline.tune(InterruptedInCallback(at=40), torch.randn(4, 16), run_dir=run_dir,  # cells of a second each:
                      overrides=[*QUICK, *SLOW_PROFILE, f"tracking.uri={uri}"])  # the stop lands in the profile
    assert swallowed and set(swallowed) == {KeyboardInterrupt}  # Python swallowed the first one
    assert record(run_dir)["status"] == "KILLED" and "profile" not in record(run_dir)["stages_done"]
    run_id = json.loads((run_dir / "mlflow_run.json").read_text())["run_id"]
    assert MlflowClient(tracking_uri=uri).get_run(run_id).info.status == "KILLED"
    log = (run_dir / "tweakpipe.log").read_text()
    assert re.search(rf"stopped by SIGINT \(Ctrl-C\) during (capture|profile); what was measured is in "
                     rf"{re.escape(str(run_dir))}; python -m pipeline resume={re.escape(str(run_dir))} continues", log)


def test_a_ctrl_c_between_a_store_writes_insert_and_its_commit_waits_for_the_commit_and_the_run_is_recorded_killed(
        tmp_path, template):
    """Raised inside the write, the stop left the interrupted connection holding SQLite's lock: the run's KILLED
    status then waited out the store's whole wait and the MLflow run stayed RUNNING (the suite's CI run). The
    profile's cells take a second each, so the held stop lands in the run, not after its end (a warm process
    finished this tiny run within the quarter second the stop waits: FINISHED, then the stop raised at its end)."""
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    uri = copy_store(template, tmp_path / "store")
    metrics_pending, interrupted = [], []

    def note_metrics(conn, cursor, statement, *args) -> None:  # noqa: ANN001 -- SQLAlchemy's event signature
        metrics_pending.append("INSERT INTO metrics" in statement)

    def ctrl_c_at_commit(conn) -> None:  # noqa: ANN001
        if any(metrics_pending) and not interrupted:  # the first commit of a metric: Ctrl-C inside the commit
            interrupted.append(True)
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(100_000):  # the handler runs here, inside the commit
                pass
        metrics_pending.clear()

    event.listen(Engine, "before_cursor_execute", note_metrics)
    event.listen(Engine, "commit", ctrl_c_at_commit)
    run_dir = tmp_path / "run"
    try:
        with pytest.raises(KeyboardInterrupt):
            pipeline.tune(torch.nn.Linear(16, 16), torch.randn(4, 16), run_dir=run_dir,  # cells of a second each:
                          overrides=[*QUICK, *SLOW_PROFILE, f"tracking.uri={uri}", "tracking.max_wait_s=5"])
    finally:
        event.remove(Engine, "before_cursor_execute", note_metrics)
        event.remove(Engine, "commit", ctrl_c_at_commit)
    assert interrupted and record(run_dir)["status"] == "KILLED"
    run = MlflowClient(tracking_uri=uri).get_run(json.loads((run_dir / "mlflow_run.json").read_text())["run_id"])
    assert run.info.status == "KILLED" and "tweakpipe.store_lost" not in run.data.tags
    assert "stayed locked" not in (run_dir / "tweakpipe.log").read_text()


def test_an_import_a_stop_cut_off_is_whole_when_imported_again(tmp_path, monkeypatch):
    """Python drops the interrupted package but keeps the submodules it had finished, bound to the broken package:
    matplotlib's, cut off by a stop during the first plot, failed every later plot of the process."""
    package = tmp_path / "cut_off_package"
    package.mkdir()
    (package / "child.py").write_text("import cut_off_package\n\n\ndef parent_is_whole():\n"
                                      "    return cut_off_package.WHOLE\n")
    (package / "__init__.py").write_text(
        "import os, signal, time\nfrom cut_off_package import child\n"
        "if os.environ.pop('CUT_OFF_ONCE', None):\n    os.kill(os.getpid(), signal.SIGINT)\n"
        "    time.sleep(5)  # the stop lands here\nWHOLE = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("CUT_OFF_ONCE", "1")
    for name in ("cut_off_package", "cut_off_package.child"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    with pytest.raises(KeyboardInterrupt):
        with stops.stoppable() as stop:
            try:
                importlib.import_module("cut_off_package")
            except BaseException as exc:
                stop.caught(exc)  # as the runner does
                raise
    assert importlib.import_module("cut_off_package").child.parent_is_whole()


def test_a_stop_held_by_a_store_write_at_the_very_end_of_the_run_is_still_raised(caplog):
    with pytest.raises(KeyboardInterrupt):
        with stops.stoppable():
            with stops.deferred():
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.01)  # the handler runs here and holds the stop
    assert "stopped by SIGINT (Ctrl-C) as the run ended; its record stands as it ended" in caplog.text


def cli(*args: str, cwd: Path) -> subprocess.Popen:
    env = {**clean_env(), "PYTHONPATH": str(ROOT), "TWEAK_PROGRESS": "0"}
    return subprocess.Popen([sys.executable, "-m", "pipeline", *args], cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def wait_for(path: Path, proc: subprocess.Popen, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not (path.exists() and path.read_text().count("\n") >= 2):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0][-3000:]
        time.sleep(0.2)


@pytest.mark.slow
def test_sigint_and_sigterm_print_one_line_saying_where_the_files_are_and_how_to_resume(tmp_path):
    runs = {}
    for signum in (signal.SIGINT, signal.SIGTERM):
        run_dir = tmp_path / signum.name
        runs[signum] = (run_dir, cli("model=tiny_mlp", "backends=[eager]", "reference=false", "model.batch_sizes=[1,2,4]", *SLOW_PROFILE,
                                     "tracking=off", f"hydra.run.dir={run_dir}", cwd=tmp_path))
    for signum, (run_dir, proc) in runs.items():
        wait_for(run_dir / "profile.csv", proc)
        proc.send_signal(signum)
    for signum, (run_dir, proc) in runs.items():
        out = proc.communicate(timeout=120)[0]
        assert proc.returncode == {signal.SIGINT: 130, signal.SIGTERM: 143}[signum], out[-3000:]
        assert "Traceback" not in out and "Exception" not in out, out[-3000:]
        said = [line for line in out.splitlines() if "stopped by" in line]
        word = "SIGINT \\(Ctrl-C\\)" if signum == signal.SIGINT else "SIGTERM"
        assert len(said) == 1 and re.search(rf"stopped by {word} during profile; what was measured is in "
                                            rf"{re.escape(str(run_dir))}; python -m pipeline resume=", said[0]), out
        assert said[0].split("] - ", 1)[1] in (run_dir / "tweakpipe.log").read_text()
        assert record(run_dir)["status"] == "KILLED"


AFTER_OPENVINO = """
import gc, os, signal, sys, tempfile, time
from pathlib import Path
from pipeline.api import compose_config
from pipeline.runner import run
run(compose_config(["model=tiny_mlp", "profile=quick", "tracking=off", "backends=[eager,openvino,onnxruntime]",
                    "model.batch_sizes=[1,4]", "precision=[fp32,bf16]", "stages=[capture]"]), Path(tempfile.mkdtemp()))
gc.collect()  # the compiled models are freed (what swapped the signal stack back) before the Ctrl-C, not inside it
try:
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(30)  # a Ctrl-C that did not stop the process fails in seconds, not at the test's timeout
    print("not stopped")
except KeyboardInterrupt:
    print("stopped")
"""


@pytest.mark.slow
def test_a_ctrl_c_after_openvino_backends_were_built_stops_without_a_crash():
    """OpenVINO's compile swaps the thread's alternate signal stack and can leave it pointing at freed memory:
    the next signal (a Ctrl-C) then crashed the process with a segmentation fault instead of stopping it."""
    pytest.importorskip("openvino")
    pytest.importorskip("onnxruntime")
    proc = subprocess.run([sys.executable, "-c", AFTER_OPENVINO], cwd=ROOT, env={**clean_env(), "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and proc.stdout.strip() == "stopped", (proc.returncode, proc.stderr[-3000:])


# ---- one process at a time per run directory -----------------------------------------------------------------


def test_a_run_directory_in_use_is_refused_naming_the_process_that_holds_it(compose_cfg, tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    with claimed(run_dir):
        with pytest.raises(ConfigError) as err:
            finished_capture(compose_cfg, run_dir)
    message = str(err.value)
    assert "\n" not in message and re.search(rf"run directory {re.escape(str(run_dir))} is in use by process "
                                             rf"{os.getpid()} on .* \(started .*\); wait for that run to end", message)
    assert not (run_dir / "capture.json").exists()  # nothing written by the refused one
    finished_capture(compose_cfg, run_dir)  # free again once the holder let go


@pytest.mark.slow
def test_a_second_process_resuming_a_running_run_is_refused_in_one_line(tmp_path):
    run_dir = tmp_path / "run"
    first = cli("model=tiny_mlp", "backends=[eager]", "reference=false", "model.batch_sizes=[1,2,4]", *SLOW_PROFILE, "tracking=off",
                f"hydra.run.dir={run_dir}", cwd=tmp_path)
    wait_for(run_dir / "profile.csv", first)
    second = cli(f"resume={run_dir}", cwd=tmp_path)
    out = second.communicate(timeout=120)[0]
    first.send_signal(signal.SIGINT)
    first.communicate(timeout=120)
    assert second.returncode == 2 and "Traceback" not in out, out
    assert re.search(rf"error: run directory .* is in use by process {first.pid} on ", out), out
    rows = (run_dir / "cells.jsonl").read_text().splitlines()
    cells = [(c["backend"], c["batch_size"], tuple(c["cell"]["passes"])) for c in map(json.loads, rows)]
    assert len(cells) == len(set(cells))  # no cell measured twice in one pass (by two processes)


# ---- a resume reuses only what measured the same thing ---------------------------------------------------------


def killed_capture(compose_cfg, run_dir: Path, *extra: str) -> None:
    """A capture-only run whose record says it was killed, as a kill during it would leave it."""
    finished_capture(compose_cfg, run_dir, *extra)
    kept = record(run_dir)
    (run_dir / "run.json").write_text(json.dumps({**kept, "status": "KILLED", "stages_done": []}))


def test_a_resume_whose_model_changed_is_refused_naming_what_changed(compose_cfg, tmp_path):
    run_dir = tmp_path / "run"
    killed_capture(compose_cfg, run_dir)
    saved = (run_dir / "config.yaml").read_text()
    assert "width: 16" in saved
    (run_dir / "config.yaml").write_text(saved.replace("width: 16", "width: 64").replace("- 16\n", "- 64\n"))
    cfg = resumed_config(run_dir)
    with pytest.raises(ConfigError) as err:
        run(cfg, run_dir, resume=True)
    message = str(err.value)
    assert "\n" not in message and re.search(r"the model's structure changed \(.*\) since that run measured its cells, "
                                             r"so they cannot be reused; start a new run without resume=", message)


def test_a_resume_whose_device_or_backends_changed_is_refused(compose_cfg, tmp_path):
    run_dir = tmp_path / "run"
    killed_capture(compose_cfg, run_dir)
    kept = record(run_dir)
    for part, value, named in (("device", {"type": "cpu", "name": "another cpu"}, "the device"),
                               ("backends", {"eager": {"kind": "inductor"}}, "the backends' configs")):
        (run_dir / "run.json").write_text(json.dumps({**kept, "fingerprint": {**kept["fingerprint"], part: value}}))
        with pytest.raises(ConfigError, match=rf"{named} changed"):
            run(resumed_config(run_dir), run_dir, resume=True)
    (run_dir / "run.json").write_text(json.dumps(kept))
    run(resumed_config(run_dir), run_dir, resume=True)  # the same: resumed
    assert record(run_dir)["status"] == "FINISHED"


def test_a_read_only_run_directory_is_refused_before_a_resume_begins(compose_cfg, tmp_path):
    killed_capture(compose_cfg, tmp_path)
    cfg = resumed_config(tmp_path)
    with read_only(tmp_path):
        with pytest.raises(ConfigError) as err:
            run(cfg, tmp_path, resume=True)
    message = str(err.value)
    assert "\n" not in message and re.search(r"run directory .*: cannot write in .*; make it writable to resume the run "
                                             r"there", message), message


def test_resuming_a_finished_run_says_so(compose_cfg, tmp_path):
    finished_capture(compose_cfg, tmp_path)
    with pytest.raises(ConfigError, match=r"resume=.*: that run finished \(stages capture done\); its results are "
                                          r"there\. Nothing to resume: start a new run to tune again"):
        resumed_config(tmp_path)


RESUME_CASES = {  # id: (how the run directory is damaged, what the one line names)
    "bad-row": (lambda d: (d / "cells.jsonl").write_text('{"backend": "eager"}\n{"backend": "eager", "batch_size": 1}\n'),
                r"cells\.jsonl line 1 is not a measured cell \(KeyError: '\w+'\); delete that line"),
    "not-json": (lambda d: (d / "cells.jsonl").write_text("garbage\n{}\n"), r"cells\.jsonl line 1 is not JSON"),
    "capture": (lambda d: (d / "capture.json").write_text("{not json"), r"capture\.json cannot be read"),
    "record": (lambda d: (d / "run.json").write_text("{not json"), r"run\.json cannot be read"),
}


@pytest.mark.parametrize("case", list(RESUME_CASES))
def test_a_damaged_file_of_a_resumed_run_is_named_in_one_line(compose_cfg, tmp_path, case):
    killed_capture(compose_cfg, tmp_path)
    damage, named = RESUME_CASES[case]
    damage(tmp_path)
    with pytest.raises(ConfigError) as err:
        run(resumed_config(tmp_path), tmp_path, resume=True)
    assert "\n" not in str(err.value) and re.search(named, str(err.value)), err.value


def test_a_cut_last_row_is_what_a_kill_leaves_and_is_measured_again(compose_cfg, tmp_path):
    from pipeline.record.recorder import earlier_results

    killed_capture(compose_cfg, tmp_path)
    (tmp_path / "cells.jsonl").write_text('{"backend": "eag')
    assert earlier_results(tmp_path).cells == {}


@pytest.mark.parametrize("config", ["model: [not, a, mapping", "model: {batch_sizes: many}"], ids=["yaml", "schema"])
def test_an_unreadable_config_of_a_resumed_run_is_named_in_one_line(compose_cfg, tmp_path, config):
    killed_capture(compose_cfg, tmp_path)
    (tmp_path / "config.yaml").write_text(config)
    with pytest.raises(ConfigError) as err:
        resumed_config(tmp_path)
    assert "\n" not in str(err.value) and "its config.yaml cannot be read as a run's config" in str(err.value)


@pytest.mark.slow
def test_resume_naming_a_file_is_refused_in_one_line(tmp_path):
    afile = tmp_path / "run.txt"
    afile.write_text("")
    proc = cli(f"resume={afile}", cwd=tmp_path)
    out = proc.communicate(timeout=120)[0]
    assert proc.returncode == 2 and out.count("\n") == 1 and "Traceback" not in out, out
    assert re.search(r"error: resume=.*run\.txt is a file; resume takes the directory of an interrupted run", out), out
