"""What a run says while it works: progress as log lines outside a terminal, a quiet validate, the API's lines."""

from __future__ import annotations

import json
import logging
import re
import subprocess
import sys
import time
from datetime import datetime

import pytest

from conftest import ROOT, TINY
from pipeline import progress
from pipeline.runner import run

PROGRESS = "pipeline.progress"


def lines(caplog: pytest.LogCaptureFixture, logger: str = PROGRESS, level: int = logging.INFO) -> list:
    return [r.getMessage() for r in caplog.records if r.name == logger and r.levelno == level]


def test_logged_steps_say_done_of_total_elapsed_and_an_eta(caplog):
    caplog.set_level(logging.INFO, logger=PROGRESS)
    now = [0.0]
    bar = progress.LoggedSteps("profile", 3, clock=lambda: now[0])
    bar.next("bs=1")
    now[0] = 10.0
    bar.next("bs=8")  # the first step took 10 s: two left, about 20 s
    now[0] = 15.0
    bar.beat()  # only 5 s since the last line: nothing
    now[0] = 20.0
    bar.beat()
    now[0] = 40.0
    bar.beat()  # longer than the average step: no ETA it cannot back
    now[0] = 41.0
    bar.next("bs=64")
    bar.finish()
    assert lines(caplog) == [
        "profile 1/3 bs=1; 0 s elapsed",
        "profile 2/3 bs=8; 10 s elapsed, ETA 20 s",
        "profile 2/3 bs=8 still running after 10 s; 20 s elapsed, ETA 10 s",
        "profile 2/3 bs=8 still running after 30 s; 40 s elapsed, ETA unknown",
        "profile 3/3 bs=64; 41 s elapsed, ETA 20 s",
        "profile done: 3 step(s) in 41 s",
    ]


def test_fast_steps_are_not_a_line_each(caplog):
    caplog.set_level(logging.INFO, logger=PROGRESS)
    now = [0.0]
    bar = progress.LoggedSteps("validate", 20, clock=lambda: now[0])
    for step in range(20):
        now[0] = step * 0.5
        bar.next(f"bs={step}")
    assert [m.split(";")[0] for m in lines(caplog)] == ["validate 1/20 bs=0", "validate 11/20 bs=10"]


def test_a_long_step_is_logged_again_while_it_runs(caplog, monkeypatch):
    """Outside a terminal (pytest captures stdout), a step longer than the heartbeat is logged again."""
    monkeypatch.setattr(progress, "HEARTBEAT_S", 0.2)
    caplog.set_level(logging.INFO, logger=PROGRESS)
    assert not progress.enabled()
    with progress.steps("capture", 2) as bar:
        bar.next("eager")
        bar.next("inductor")
        time.sleep(1.0)  # a compile
    stamps = [r.created for r in caplog.records if r.name == PROGRESS]
    beats = [m for m in lines(caplog) if "still running" in m]
    assert len(beats) >= 3 and beats[0].startswith("capture 2/2 inductor still running after"), lines(caplog)
    assert max(b - a for a, b in zip(stamps, stamps[1:])) < 0.2 + 0.3  # never quiet for much longer than a beat
    assert lines(caplog)[-1].startswith("capture done: 2 step(s)")


def test_a_loop_left_by_an_exception_stops_logging_with_its_stage(caplog, monkeypatch):
    """A ``track`` generator kept alive by a traceback (a notebook keeps the last one) says nothing more
    once the stage's :func:`progress.scope` (the runner's, around each stage) has ended."""
    monkeypatch.setattr(progress, "HEARTBEAT_S", 0.1)
    caplog.set_level(logging.INFO, logger=PROGRESS)

    def stage() -> None:
        for name in progress.track(["eager", "inductor"], "capture", 2):
            if name == "inductor":
                raise KeyboardInterrupt

    try:
        with progress.scope():
            stage()
    except KeyboardInterrupt:
        kept = sys.exc_info()  # holds the stage's frame, and with it the unfinished generator
        time.sleep(0.3)  # beats may land before the check sees the loop is gone
        before = len(lines(caplog))
        time.sleep(0.6)
        assert len(lines(caplog)) == before, lines(caplog)
        assert not any("done" in m for m in lines(caplog))
        del kept


def test_validate_says_one_info_line_and_keeps_each_row_in_validation_json(compose_cfg, tmp_path, caplog):
    caplog.set_level(logging.DEBUG, logger="stages.validate")
    ctx = run(compose_cfg([*TINY, "backends=[eager]", "reference=false", "model.batch_sizes=[1,4]"]), tmp_path)
    rows = json.loads((tmp_path / "validation.json").read_text())["rows"]
    sizes = [1, 2, 4, 5, 100]  # tuned, validate's extra sizes, one above the largest tuned
    assert ctx.validation["ok"] and len(rows) == 2 * len(sizes)  # the routed model and its reload
    (summary,) = lines(caplog, "stages.validate")
    assert summary.startswith(f"validate ok: {len(rows)} of {len(rows)} checks passed (routed and reloaded at bs "
                              f"{', '.join(map(str, sizes))})"), summary
    assert len(lines(caplog, "stages.validate", logging.DEBUG)) == len(rows)


@pytest.mark.slow
def test_a_piped_run_logs_progress_as_it_goes(tmp_path):
    """The command line under a pipe (nohup, CI): progress lines in stdout and tweakpipe.log, no long silence."""
    proc = subprocess.run([sys.executable, "-m", "pipeline", *TINY, "backends=[eager,inductor]", "reference=false",
                           f"hydra.run.dir={tmp_path}"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for stage, total in (("capture", 2), ("profile", 3), ("validate", 8)):  # validate: 7 sizes and the reload
        assert re.search(rf"\]\[{PROGRESS}\]\[INFO\] - {stage} 1/{total} ", proc.stdout), proc.stdout
        assert f"{stage} done: {total} step(s) in " in proc.stdout
    log = (tmp_path / "tweakpipe.log").read_text()
    assert "capture done: 2 step(s)" in log and "validate done: 8 step(s)" in log
    stamps = [datetime.strptime(m, "%Y-%m-%d %H:%M:%S,%f") for m in re.findall(r"^\[([\d\- :,]+)\]", log, re.M)]
    assert max((b - a).total_seconds() for a, b in zip(stamps, stamps[1:])) < 15


@pytest.mark.slow
def test_tune_and_load_say_where_they_wrote_and_what_they_routed(tmp_path):
    """A plain script that calls ``pipeline.tune`` and ``pipeline.load`` without setting up logging sees their lines
    on stderr."""
    code = ("import torch, pipeline\n"
            "tuned = pipeline.tune(torch.nn.Linear(4, 2), torch.randn(3, 4), run_dir=r'%s', overrides=["
            "'backends=[eager]', 'reference=false', 'profile=quick', 'tracking=off', 'model.batch_sizes=[1,3]'])\n"
            "print(tuned)\nprint(sorted(dir(pipeline)))\n"
            "pipeline.load(r'%s', torch.nn.Linear(4, 2))\n") % (tmp_path / "run", tmp_path / "run" / "model.tweak")
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "[pipeline.api][INFO] - tune: route 1..inf: eager" in proc.stderr
    assert f"[pipeline.api][INFO] - tune: run directory {tmp_path / 'run'}" in proc.stderr
    assert f"[{PROGRESS}][INFO] - profile 1/2 " in proc.stderr
    after_tune = proc.stderr.split("tune: run directory", 1)[1].splitlines()  # validate's reload is tune's
    (load,) = [line for line in after_tune if "[pipeline.route.checkpoint]" in line]  # one line per load
    assert re.search(rf"\[INFO\] - loaded {re.escape(str(tmp_path / 'run' / 'model.tweak'))} in \d+\.\d\d s on cpu, "
                     rf"route 1\.\.inf: eager; compiled artifacts none saved with it", load), load
    assert proc.stdout.splitlines() == ["RoutedModule(1..inf: eager)", "['load', 'load_logged_model', 'save', 'tune']"]


def test_tune_logs_the_route_and_the_run_directory_at_info(tmp_path, caplog):
    import torch

    import pipeline

    caplog.set_level(logging.INFO, logger="pipeline.api")
    tuned = pipeline.tune(torch.nn.Linear(4, 2), torch.randn(3, 4), run_dir=tmp_path, overrides=[
        "backends=[eager]", "reference=false", "profile=quick", "tracking=off", "model.batch_sizes=[1,3]"])
    assert lines(caplog, "pipeline.api") == [f"tune: route {tuned.extra_repr()}", f"tune: run directory {tmp_path}"]
    assert {"tune", "save", "load"} <= set(dir(pipeline)) and not {"Any", "annotations", "importlib"} & set(dir(pipeline))


def test_the_watchdog_speaks_where_nothing_else_did_and_only_there(caplog):
    """Issue 54: a run under load was silent for 60 s while cells were measured again (and 43 s while its context was
    built): wherever tweakpipe's log says nothing for the heartbeat, the watchdog names what is still running."""
    caplog.set_level(logging.INFO)
    stage = "profile"
    with progress.watchdog(lambda: stage, every_s=0.2):
        time.sleep(0.7)  # silent work
    said = [line for line in lines(caplog) if "still running" in line]
    assert said and said[0].startswith("profile still running after ") and "nothing else said for" in said[0]
    caplog.clear()
    with progress.watchdog(lambda: stage, every_s=0.4):
        for _ in range(8):  # a stage that speaks often enough
            logging.getLogger("stages.profile").info("a cell")
            time.sleep(0.1)
    assert not [line for line in lines(caplog) if "still running" in line]
    assert not [h for h in logging.getLogger("pipeline").handlers if isinstance(h, progress.LastLine)]  # removed
