"""Tracking for sweeps: parent and child runs in SQLite and on a real server, parallel jobs, the report."""

from __future__ import annotations

from pipeline.route.figures import figure_name
from pipeline.config import SHIPPED_CONF
import csv
import fcntl
import json
import math
import os
import pty
import re
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Dict, List

import pytest
import torch
from mlflow.tracking import MlflowClient

import pipeline
from conftest import SUITE_CACHE, TINY, tweakpipe_home

from doc_blocks import commands
from mlflow_helpers import ROOT, SHARED_SERVER, SWEEP, SharedServer, artifact_names, clean_env, copy_store, \
    init_store, run_pipeline, sweep_runs
from pipeline.record import report
from pipeline.measure.measurement import Measurement
from pipeline.record.plots import contended_title, latency_figure, latency_plot, spread
from pipeline.progress import Steps
from pipeline.record.recorder import Recorder
from pipeline.record.tracker import MlflowTracker
from pipeline.route.policy import Range
from pipeline.record.store import StoreGuard, open_experiment, server_command
from pipeline.api import compose_config
from pipeline.compile import cache as compile_cache
from pipeline.errors import ConfigError
from pipeline.models import MLP
from pipeline.redact import redacted
from pipeline.runner import run
from redis_helpers import redis_server

QUICK = ["model=tiny_mlp", "profile=quick", "backends=[eager]", "reference=false"]  # seconds a run, no compile
JOB_ARTIFACTS = {"capture.json", "config.yaml", "latency.png", "profile.csv", "route.json", "validation.json"}


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    db = tmp_path_factory.mktemp("template") / "mlflow.db"
    init_store(db)
    return db


def check_sweep(uri: str, jobs: int = 2, experiment: str = "tweakpipe") -> tuple:
    """One finished parent in ``experiment``, ``jobs`` finished children with metrics, tags, the plot and the
    tables."""
    parent, children = sweep_runs(uri, experiment)
    assert parent.info.status == "FINISHED"
    assert len(children) == jobs
    for num, child in enumerate(children):
        assert child.info.status == "FINISHED"
        m, tags = child.data.metrics, child.data.tags
        assert {f"latency_ms/eager/bs{bs}" for bs in (1, 3, 8)} <= set(m)
        assert {f"throughput/eager/bs{bs}" for bs in (1, 3, 8)} <= set(m)
        assert "compile_s/eager" in m and "peak_memory_mb/eager" in m and m["validation_ok"] == 1.0
        assert m["held_memory_mb/eager"] == 0.0  # the CPU: torch counts no memory there
        assert child.data.params["model.name"] == "tiny_mlp"
        assert f"seed={num}" in tags["hydra.overrides"].split() and tags["hydra.job.num"] == str(num)
        assert tags["stages"] == "capture,profile,route,validate"
        assert all(tags[f"stage.{s}"] == "done" for s in ("capture", "profile", "route", "validate"))
        assert JOB_ARTIFACTS <= set(artifact_names(uri, child.info.run_id))
    assert {"report.md", "report.csv"} <= set(artifact_names(uri, parent.info.run_id))
    return parent, children


# ---- fast: the pieces -------------------------------------------------------------------------


def test_guard_waits_for_another_writer_then_points_at_the_server(tmp_path: Path) -> None:
    guard = StoreGuard(f"sqlite:///{tmp_path / 'mlflow.db'}", max_wait_s=5)
    holder = open(guard.lock_path, "a")
    fcntl.flock(holder, fcntl.LOCK_EX)
    threading.Timer(0.3, fcntl.flock, (holder, fcntl.LOCK_UN)).start()
    start = time.monotonic()
    assert guard(lambda: "written") == "written"
    assert time.monotonic() - start >= 0.25
    fcntl.flock(holder, fcntl.LOCK_EX)
    with pytest.raises(RuntimeError, match="tracking=server"):
        StoreGuard(guard.uri, max_wait_s=0.2)(lambda: None)
    holder.close()


def test_guard_retries_a_locked_database_only(tmp_path: Path) -> None:
    calls = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise sqlite3.OperationalError("database is locked")
        return "ok"

    guard = StoreGuard(f"sqlite:///{tmp_path / 'mlflow.db'}", max_wait_s=10)
    assert guard(flaky) == "ok" and len(calls) == 3
    with pytest.raises(ValueError):
        guard(lambda: (_ for _ in ()).throw(ValueError("not a lock")))


def test_plot_is_a_png(tmp_path: Path) -> None:
    medians = {"eager": {1: 1.1, 3: 1.7, 8: 3.4}, "inductor": {1: 0.8, 3: 1.3, 8: 2.7}}
    path = latency_plot(medians, [Range(1, 1, "eager"), Range(2, None, "inductor")], tmp_path / "p.png", "m")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000


def test_plot_reads_at_a_glance_whiskers_noisy_cells_plain_ms_and_who_serves() -> None:
    medians = {"eager": {1: 1.1, 3: 1.7, 8: 3.4}, "inductor": {1: 0.8, 3: 1.3, 8: 2.7}}
    bands = {"eager": {1: (1.0, 1.5), 3: (1.6, 2.0), 8: (3.3, 3.6)}}  # inductor has none
    route = [Range(1, 1, "inductor"), Range(2, 3, "eager"), Range(4, None, "inductor")]
    fig = latency_figure(medians, route, "m", bands, noisy={"eager": {3}})
    fig.canvas.draw()
    latency, speedup = fig.axes
    (whiskers,) = latency.containers  # eager's p10-p90, one whisker per cell
    spans = sorted((seg[:, 1].min(), seg[:, 1].max()) for seg in whiskers.lines[2][0].get_segments())
    assert spans == [pytest.approx((1.0, 1.5)), pytest.approx((1.6, 2.0)), pytest.approx((3.3, 3.6))]
    hollow = [line for line in latency.lines if line.get_marker() == "o" and line.get_markerfacecolor() == "white"]
    assert [(line.get_xdata()[0] / spread("eager", list(medians)), line.get_ydata()[0]) for line in hollow
            if len(line.get_xdata())] == [pytest.approx((3, 1.7))]  # the one noisy cell
    labels = {t.get_text() for t in latency.get_yticklabels() if t.get_text()}
    assert {"1", "2"} <= labels and not any("10^" in lab or "$" in lab for lab in labels)
    assert [t.get_text() for t in speedup.texts] == ["inductor", "eager", "inductor"]  # each range names its server
    (auto,) = [line for line in speedup.lines if line.get_label() == "auto (routed)"]
    assert list(auto.get_ydata()) == pytest.approx([1.1 / 0.8, 1.0, 3.4 / 2.7])
    assert {t.get_text() for t in speedup.get_yticklabels() if t.get_text()} >= {"1x"}


def test_plot_rings_the_cells_of_a_busy_host_and_says_so_in_its_title() -> None:
    """Issue 54: the plot showed a busy machine's 64x speed-up as any other."""
    medians = {"eager": {1: 1.1, 3: 1.7, 8: 3.4}, "inductor": {1: 0.8, 3: 1.3, 8: 2.7}}
    contended = {"eager": {8}, "inductor": {3}}
    fig = latency_figure(medians, [Range(1, None, "inductor")], contended_title("m", contended), contended=contended)
    latency, speedup = fig.axes
    assert latency.get_title().startswith("m\nCONTENDED: 2 cell(s) measured on a busy host")
    rings = lambda ax: sorted(x for line in ax.lines if line.get_markeredgecolor() == "red"  # noqa: E731
                              for x in line.get_xdata())
    assert len(rings(latency)) == 2 and rings(speedup) == [3, 8, 8]  # eager at 8, inductor at 3 and over eager at 8
    assert latency_figure(medians, None, contended_title("m", {})).axes[0].get_title() == "m"


def test_plot_greys_the_screened_out_candidates_at_their_screen_sizes() -> None:
    medians = {"eager": {1: 1.1, 3: 1.7, 8: 3.4}, "inductor": {1: 0.8, 3: 1.3, 8: 2.7}}
    fig = latency_figure(medians, [Range(1, None, "inductor")], "m", screened={"onnxruntime": {1: 9.0, 8: 30.0}})
    latency = fig.axes[0]
    (line,) = [line for line in latency.lines if line.get_label() == "onnxruntime (screened out; screen ms)"]
    assert list(line.get_xdata()) == [1, 8] and list(line.get_ydata()) == [9.0, 30.0]
    assert line.get_color() == "grey" and line.get_linestyle() == "--"
    assert "onnxruntime (screened out; screen ms)" in [t.get_text() for t in latency.get_legend().get_texts()]


def test_report_marks_noisy_cells_and_routes_that_rest_on_them(tmp_path: Path, template: Path) -> None:
    uri = copy_store(template, tmp_path)
    tracker = MlflowTracker({"uri": uri, "experiment": "tweakpipe"})
    tracker.start("mlp", {}, {"model": "mlp", "backends": "eager,inductor",
                              "route_json": '[{"lo": 1, "hi": null, "backend": "eager"}]',
                              "route.rests_on_noisy": "true", "route.noisy_cells": "eager bs=1"})
    for name, bs, ms, noise in [("eager", 1, 1.0, "p10-p90 spread is 90% of the median (limit 20%)"),
                                ("eager", 8, 4.0, ""), ("inductor", 1, 2.0, ""), ("inductor", 8, 3.0, "x")]:
        tracker.log_metrics(Recorder.cell_metrics(name, bs, Measurement(samples_ms=[ms] * 10, noise=noise)))
    tracker.log_metrics({"latency_ms/auto/bs1": 1.0, "latency_ms/auto/bs8": 4.0})  # the routed model's, as runs log
    tracker.finish("FINISHED")
    table = report.build([MlflowClient(tracking_uri=uri).get_run(tracker.run_id)])
    md = report.markdown(table)
    assert "| mlp | eager | 1.00* | 4.00 |" in md and "| mlp | inductor | 2.00 | 3.00* |" in md
    assert md.count("| mlp | auto |") == 1 and "| mlp | auto | 1.00* | 4.00 |" in md  # eager's noisy cell serves 1
    assert report.LEGEND in md and "mlp: the route rests on noisy cells (eager bs=1)" in md
    _, csv_path = report.write(table, tmp_path / "out" / "report")
    assert list(csv.reader(csv_path.open()))[1] == ["mlp", "eager", "1.0", "4.0", "1", ""]


def test_experiments_are_marked_as_model_runs_unless_they_have_a_kind(tmp_path: Path, template: Path) -> None:
    uri = copy_store(template, tmp_path)
    client = MlflowClient(tracking_uri=uri)
    client.create_experiment("older")  # as an earlier tweakpipe made it
    client.create_experiment("chosen", tags={"mlflow.experimentKind": "genai_development",
                                             "mlflow.experiment.primaryMetric.name": "accuracy"})
    tags = {name: client.get_experiment(open_experiment(uri, name, StoreGuard(uri))).tags
            for name in ("tweakpipe", "older", "chosen")}
    assert {name: t["mlflow.experimentKind"] for name, t in tags.items()} == {
        "tweakpipe": "custom_model_development", "older": "custom_model_development",
        "chosen": "genai_development"}  # a kind the user set is theirs
    assert {name: t["mlflow.experiment.primaryMetric.name"] for name, t in tags.items()} == {
        "tweakpipe": "speedup_vs_eager/geomean", "older": "speedup_vs_eager/geomean", "chosen": "accuracy"}


def test_report_says_why_auto_may_be_above_eager(tmp_path: Path, template: Path) -> None:
    """The router keeps a size's owner unless eager is faster beyond both intervals: a footnote says so."""
    uri = copy_store(template, tmp_path)
    tracker = MlflowTracker({"uri": uri, "experiment": "tweakpipe"})
    tracker.start("resnet18", {"route": {"strategy": "router"}}, {
        "model": "resnet18", "backends": "eager,inductor",
        "route_json": '[{"lo": 1, "hi": null, "backend": "inductor"}]'})
    for name, bs, samples in [("eager", 1, [2.30, 2.42, 2.70]), ("inductor", 1, [2.35, 2.60, 2.80]),
                              ("eager", 8, [9.0, 9.5, 10.0]), ("inductor", 8, [5.0, 5.1, 5.2])]:
        tracker.log_metrics(Recorder.cell_metrics(name, bs, Measurement(samples_ms=samples * 4)))
    tracker.finish("FINISHED")
    md = report.markdown(report.build([MlflowClient(tracking_uri=uri).get_run(tracker.run_id)]))
    assert "| resnet18 | auto | 2.60 | 5.10 |" in md and "| resnet18 | eager | 2.42 | 9.50 |" in md
    assert f"resnet18: auto is above eager at bs 1: {report.WITHIN_NOISE}" in md


def test_progress_count_never_passes_its_total() -> None:
    from rich.console import Console
    from rich.progress import Progress
    import io

    with Progress(console=Console(file=io.StringIO())) as progress:
        bar = Steps(progress, progress.add_task("profile", total=3), "profile", 3)
        seen = []
        for step in range(7):  # a stage that takes more steps than it planned
            bar.next(f"step {step}")
            seen.append(progress.tasks[0].completed)
    assert seen == [0, 1, 2, 3, 3, 3, 3]


def test_report_table_auto_is_the_route_or_a_measured_auto(tmp_path: Path, template: Path) -> None:
    uri = copy_store(template, tmp_path)
    client = MlflowClient(tracking_uri=uri)
    exp = open_experiment(uri, "tweakpipe", StoreGuard(uri))
    routed = client.create_run(exp, tags={"model": "resnet18", "backends": "eager,inductor",
                                          "route_json": '[{"lo": 1, "hi": 3, "backend": "eager"}, '
                                                        '{"lo": 4, "hi": null, "backend": "inductor"}]'})
    measured = client.create_run(exp, tags={"model": "vit_b_16", "backends": "eager"})
    for bs, (e, i) in {1: (1.0, 2.0), 3: (1.5, 2.5), 8: (4.0, 3.0)}.items():
        client.log_metric(routed.info.run_id, f"latency_ms/eager/bs{bs}", e)
        client.log_metric(routed.info.run_id, f"latency_ms/inductor/bs{bs}", i)
        client.log_metric(measured.info.run_id, f"latency_ms/eager/bs{bs}", e)
        client.log_metric(measured.info.run_id, f"latency_ms/auto/bs{bs}", e / 2)
    table = report.build([client.get_run(routed.info.run_id), client.get_run(measured.info.run_id)])
    rows = {(r.model, r.backend): r.ms for r in table.rows}
    assert table.sizes == [1, 3, 8]
    assert list(rows) == [("resnet18", "eager"), ("resnet18", "inductor"), ("resnet18", "auto"),
                          ("vit_b_16", "eager"), ("vit_b_16", "auto")]
    assert rows[("resnet18", "auto")] == {1: 1.0, 3: 1.5, 8: 3.0}
    assert rows[("vit_b_16", "auto")] == {1: 0.5, 3: 0.75, 8: 2.0}
    md, csv_path = report.write(table, tmp_path / "out" / "report")
    assert "| resnet18 | auto | 1.00 | 1.50 | 3.00 |" in md.read_text()
    assert list(csv.reader(csv_path.open()))[3] == ["resnet18", "auto", "1.0", "1.5", "3.0", "", ""]


@pytest.mark.parametrize("ci", ["", "true"])
def test_progress_shows_in_a_terminal_only_outside_ci(ci: str) -> None:
    code = ("from pipeline import progress\nimport time\n"
            "for x in progress.track(['alpha', 'beta'], 'capture', 2):\n    time.sleep(0.3)\n")
    env = {**clean_env(), "CI": ci, "TERM": "xterm"}
    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=slave, stderr=slave, env=env, cwd=ROOT)
    os.close(slave)
    out = b""
    while True:
        try:
            chunk = os.read(master, 4096)
        except OSError:
            break
        if not chunk:
            break
        out += chunk
    proc.wait(timeout=30)
    os.close(master)
    assert proc.returncode == 0, out.decode(errors="replace")
    assert (b"beta" in out) == (ci == "")
    piped = subprocess.run([sys.executable, "-c", code], capture_output=True, env=env, cwd=ROOT, timeout=30)
    assert piped.stdout == b"" and piped.returncode == 0


# ---- the routed model as an MLflow logged model ---------------------------------------------------------

# A real Inductor route of the tiny MLP (its compiled artifacts beside the checkpoint), tracked to SQLite.
ROUTED = [*TINY, "backends=[eager,inductor]", "route=one_backend", "route.backend=inductor", "route.aot=false",
          "tracking=sqlite"]
MODEL_FILES = {"MLmodel", "model.tweak", "model.tweak.compiled"}


@pytest.fixture(scope="module")
def routed_run(tmp_path_factory: pytest.TempPathFactory, template: Path):
    """One CPU run whose route serves every size with Inductor, signed with the key of its own TWEAKPIPE_HOME;
    ``(ctx, uri, home, the MLflow run, its logged model)``."""
    folder = tmp_path_factory.mktemp("logged")
    uri, home = copy_store(template, folder), folder / "home"
    with tweakpipe_home(home):
        ctx = run(compose_config([*ROUTED, f"tracking.uri={uri}", f"compile_cache.dir={SUITE_CACHE}"]),
                  folder / "run")
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("tweakpipe").experiment_id
    (logged,) = client.search_logged_models([experiment])
    (found,) = client.search_runs([experiment])
    return ctx, uri, home, found, logged


def test_each_run_logs_its_routed_model_with_its_metrics_and_artifacts(routed_run) -> None:
    ctx, uri, _, found, logged = routed_run
    client = MlflowClient(tracking_uri=uri)
    assert logged.status == "READY" and logged.source_run_id == found.info.run_id
    assert logged.model_type == "tweakpipe-routed" and logged.params["route"] == "1-inf:inductor"
    assert [o.model_id for o in client.get_run(found.info.run_id).outputs.model_outputs] == [logged.model_id]
    assert {a.path for a in client.list_logged_model_artifacts(logged.model_id)} == MODEL_FILES  # no pickled code
    on_model = {m.key: m.value for m in logged.metrics}
    medians = ctx.medians()
    peak = {b: max(bs / ms for bs, ms in per.items()) for b, per in medians.items()}  # samples per ms at its best size
    best = max(("eager", "inductor"), key=peak.get)  # the one backend route=highest_throughput would deploy
    busy = ctx.contended()  # a figure over a cell measured on a busy host is named so (pipeline.route.figures)
    for bs in (1, 3, 8):
        auto = medians["inductor"][bs]  # the route's backend serves every size
        assert on_model[f"latency_ms/auto/bs{bs}"] == pytest.approx(auto)
        for figure, other in (("speedup_vs_eager", "eager"), ("speedup_vs_best_single", best)):
            name = figure_name(figure, ("inductor", bs) in busy or (other, bs) in busy)
            assert on_model[f"{name}/bs{bs}"] == pytest.approx(medians[other][bs] / auto)
    speedups = [medians["eager"][bs] / medians["inductor"][bs] for bs in (1, 3, 8)
                if not {("inductor", bs), ("eager", bs)} & busy]
    if speedups:
        assert on_model["speedup_vs_eager/geomean"] == pytest.approx(math.prod(speedups) ** (1 / len(speedups)))
    else:
        assert "speedup_vs_eager/geomean" not in on_model
    assert on_model["tune_s"] > 0 and on_model["load_s"] == pytest.approx(ctx.validation["reload"]["total_s"])
    run_metrics = found.data.metrics  # the compare view's figures: the routed model's beside each backend's
    assert {k: run_metrics[k] for k in on_model} == on_model and "latency_ms/inductor/bs8" in run_metrics
    assert {"cells.jsonl", "run.json", "model.tweak", "model.tweak.compiled"} <= set(artifact_names(uri, found.info.run_id))


def test_a_logged_model_loads_back_with_its_compiled_artifacts(routed_run, tmp_path: Path, monkeypatch) -> None:
    ctx, uri, home, _, logged = routed_run
    monkeypatch.setenv("TWEAKPIPE_HOME", str(home))  # the user who tuned it: the artifacts carry their signature
    with compile_cache.active({"dir": str(tmp_path / "empty_cache"), "enabled": True}):
        served = pipeline.load_logged_model(f"models:/{logged.model_id}", MLP(width=16, depth=2).eval(),
                                            tracking_uri=uri, download_to=tmp_path / "model")
    assert served.load_report.artifacts == "used" and served.load_report.backends["inductor"].cache_misses == 0
    assert {p.name for p in (tmp_path / "model").iterdir()} == {"model.tweak", "model.tweak.compiled"}
    for bs in (1, 3, 8, 9):
        x = torch.randn(bs, 16)
        assert torch.equal(served(x), ctx.routed(x)), bs


LOAD_LOGGED = """
import sys, pipeline
from pipeline.models import MLP
served = pipeline.load_logged_model(sys.argv[1], MLP(width=16, depth=2).eval(), tracking_uri=sys.argv[2])
print(served)
"""


@pytest.mark.slow
def test_load_logged_model_says_its_line_in_a_plain_script_as_load_does(routed_run, tmp_path: Path) -> None:
    """A script that set up no logging sees the load's one line on stderr, as ``pipeline.load`` shows it."""
    _, uri, home, found, logged = routed_run
    env = {**clean_env(), "TWEAKPIPE_HOME": str(home), "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", LOAD_LOGGED, logged.model_id, uri], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "RoutedModule(1..inf: inductor)"
    (load,) = [line for line in proc.stderr.splitlines() if "[pipeline.route.checkpoint][INFO] - loaded " in line]
    assert re.search(r"in \d+\.\d\d s on cpu, route 1\.\.inf: inductor; compiled artifacts used", load), load
    assert f"logged model {logged.model_id} (run {found.info.run_id}) downloaded from {uri}" in proc.stderr


def test_a_logged_model_keeps_the_trust_rules_of_a_file(routed_run, tmp_path: Path, monkeypatch) -> None:
    """Another user (another key) gets the same model, rebuilt, unless they trust its compiled artifacts."""
    ctx, uri, _, _, logged = routed_run
    monkeypatch.setenv("TWEAKPIPE_HOME", str(tmp_path / "other_user"))
    with compile_cache.active({"dir": str(tmp_path / "empty_cache"), "enabled": True}):
        served = pipeline.load_logged_model(logged.model_id, MLP(width=16, depth=2).eval(), tracking_uri=uri)
    assert served.load_report.artifacts.startswith("ignored") and "signed" in served.load_report.artifacts
    x = torch.randn(3, 16)
    assert torch.allclose(served(x), ctx.routed(x))
    with pytest.raises(ConfigError, match=r"model_id=m-nope: .* holds no logged model of that id"):
        pipeline.load_logged_model("m-nope", MLP(width=16, depth=2).eval(), tracking_uri=uri)


# ---- slow: sweeps in subprocesses -------------------------------------------------------------


@pytest.mark.slow
def test_sweep_into_sqlite_is_one_parent_with_children(tmp_path: Path, template: Path) -> None:
    uri = copy_store(template, tmp_path)
    run_pipeline(["-m", *SWEEP, f"tracking.uri={uri}", f"hydra.sweep.dir={tmp_path / 'sweep'}"])
    parent, _ = check_sweep(uri)
    assert (tmp_path / "sweep" / "mlflow_parent.json").exists()
    assert (tmp_path / "sweep" / "report.md").exists()
    assert parent.data.tags["sweep_dir"] == str(tmp_path / "sweep")


@pytest.mark.slow
def test_a_sweep_whose_every_job_is_a_mistake_makes_nothing(tmp_path: Path) -> None:
    """Every job's config is checked before the sweep directory, the MLflow store or its parent run exist; where no
    job can run, each is named in one line."""
    proc = subprocess.run([sys.executable, "-m", "pipeline", "-m", *SWEEP, "route.min_gain=-0.1,-0.5",
                           f"tracking.uri=sqlite:///{tmp_path / 'mlflow.db'}", f"hydra.sweep.dir={tmp_path / 'sweep'}"],
                          cwd=ROOT, env=clean_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr[-3000:]
    assert proc.stderr.startswith("error: sweep job 0 (model=tiny_mlp profile=quick backends=[eager] reference=False "
                                  "seed=0 route.min_gain=-0.1 ")  # job numbers as Hydra counts them
    assert "route.min_gain=-0.5 must be >= 0" in proc.stderr and "sweep job 3 (" in proc.stderr
    assert proc.stderr.endswith("no job of the sweep can run, so nothing was run\n")
    assert "Launching" not in proc.stdout + proc.stderr and list(tmp_path.iterdir()) == []


def sweep_process(tmp_path: Path, args: List[str]) -> subprocess.CompletedProcess:
    """``python -m pipeline -m ARGS`` into a store and a sweep directory in ``tmp_path``, whatever its exit code."""
    return subprocess.run([sys.executable, "-m", "pipeline", "-m", *args,
                           f"tracking.uri=sqlite:///{tmp_path / 'mlflow.db'}", f"hydra.sweep.dir={tmp_path / 'sweep'}"],
                          cwd=ROOT, env=clean_env(), capture_output=True, text=True, timeout=300)


def failed_job_tags(parent) -> Dict[str, str]:
    return {k: v for k, v in parent.data.tags.items() if k.startswith("sweep.failed_job.")}


@pytest.mark.slow
def test_a_sweep_runs_every_job_it_can_and_names_each_failed_one_in_the_log_the_parent_run_and_the_report(
        tmp_path: Path) -> None:
    """Two of four jobs cannot run (their inputs do not fit the model, found only once it is built): the sweep stopped
    at the first of them, the later valid jobs never ran, and nothing said how many failed."""
    proc = sweep_process(tmp_path, [*QUICK, "model.inputs.x.shape=[17],[16]", "seed=0,1"])
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-4000:]
    log = proc.stdout + proc.stderr
    for num in (0, 1):
        assert re.search(rf"sweep job {num} \(model=tiny_mlp .*model.inputs.x.shape=\[17\] seed={num} .*\): "
                         rf"eager fails on random inputs of seed {num} at batch size 2", log), log[-4000:]
    assert "sweep: 2 of 4 jobs failed" in log
    assert proc.stderr.splitlines()[-1].startswith("error: 2 of 4 jobs failed")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    parent, children = sweep_runs(uri)
    assert parent.info.status == "FINISHED" and parent.data.tags["sweep.jobs_failed"] == "2 of 4 jobs failed"
    assert sorted(failed_job_tags(parent)) == ["sweep.failed_job.0", "sweep.failed_job.1"]
    assert all("x.shape=[17]" in line and "eager fails on random inputs" in line
               for line in failed_job_tags(parent).values())
    assert [(c.data.tags["hydra.job.num"], c.info.status) for c in children] == [("2", "FINISHED"), ("3", "FINISHED")]
    assert {"jobs.json", "report.md"} <= set(artifact_names(uri, parent.info.run_id))
    out = subprocess.run([sys.executable, "-m", "pipeline.cli", "report", "--uri", uri, "--sweep", "latest", "--out",
                          str(tmp_path / "report")], cwd=ROOT, env=clean_env(), capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0 and "2 of 4 jobs failed:" in out.stdout, out.stderr
    md = (tmp_path / "report" / "report.md").read_text()
    assert md.count("| tiny_mlp [seed=") == 4 and "2 of 4 jobs failed:" in md
    assert all(re.search(rf"job {n} \(model=tiny_mlp .*x.shape=\[17\] seed={n} .*\): eager fails", md) for n in (0, 1))


@pytest.mark.slow
def test_a_sweep_in_fresh_processes_runs_past_a_failed_run_and_jobs_that_cannot_be_composed(tmp_path: Path) -> None:
    """Jobs 0 and 2 name a profile that does not exist (warned up front, not launched, their neighbours keeping their
    numbers); job 1's route is refused (a RunFailed: its MLflow run FAILED); job 3 runs. The sweep was refused
    whole for its misspelt jobs, and a RunFailed ended Hydra's sweep in a traceback before its parent run was closed."""
    proc = sweep_process(tmp_path, ["model=tiny_mlp", "backends=[eager]", "reference=false", "model.batch_sizes=[1]",
                                    "route.require_confident=true,false", "profile=quik,quick",
                                    "profile.noise_threshold=1e-9", "hydra/launcher=joblib_fresh"])
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-4000:]
    log = proc.stdout + proc.stderr
    warned = log[:log.index("launching")]
    assert all(re.search(rf"sweep job {n} \(.*profile=quik.*\): unknown profile 'quik'; .*; it is recorded FAILED",
                         warned) for n in (0, 2)), warned
    assert "sweep: 3 of 4 jobs failed" in log and proc.stderr.splitlines()[-1].startswith("error: 3 of 4 jobs failed")
    parent, children = sweep_runs(f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert parent.info.status == "FINISHED" and parent.data.tags["sweep.jobs_failed"] == "3 of 4 jobs failed"
    tags = failed_job_tags(parent)
    assert sorted(tags) == ["sweep.failed_job.0", "sweep.failed_job.1", "sweep.failed_job.2"]
    assert "unknown profile 'quik'" in tags["sweep.failed_job.2"] and "route.require_confident=true" in tags[
        "sweep.failed_job.1"]
    assert [(c.info.run_name, c.info.status) for c in children] == [("1_tiny_mlp", "FAILED"),
                                                                     ("3_tiny_mlp", "FINISHED")]
    assert sorted(p.name for p in (tmp_path / "sweep").iterdir() if p.is_dir()) == ["1_tiny_mlp", "3_tiny_mlp"]


@pytest.mark.slow
def test_a_sweep_job_is_checked_at_the_length_it_runs_at(tmp_path: Path) -> None:
    """The sweep's check prepares each job as its run will (``pipeline.preflight.prepare``), its inputs at the longest
    tuned length: 65536 tokens at batch size 65536 do not fit in memory, though the config's own 64 did, so a
    check at the config's length (as the sweep's was) launched a job that its run then refused."""
    long_inputs = ["model=bert_tiny", "backends=[eager]", "reference=false", "tracking=off", "model.seq_lens=[64,65536]",
                   "model.batch_sizes=[1,65536]", "model.inputs.input_ids.seq_dim=1",
                   "model.inputs.attention_mask.seq_dim=1"]
    proc = subprocess.run([sys.executable, "-m", "pipeline", "-m", *long_inputs, "seed=0,1",
                           f"hydra.sweep.dir={tmp_path / 'sweep'}"],
                          cwd=ROOT, env=clean_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr[-3000:]
    assert proc.stderr.startswith("error: sweep job 0 (model=bert_tiny "), proc.stderr
    assert "model.batch_sizes: at batch size 65536 the inputs alone take 64.0 GiB (input_ids: [65536]" in proc.stderr
    assert "Launching" not in proc.stdout + proc.stderr and list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_single_run_has_no_parent(tmp_path: Path, template: Path) -> None:
    uri = copy_store(template, tmp_path)
    run_pipeline(["model=tiny_mlp", "profile=quick", "backends=[eager]", "reference=false", f"tracking.uri={uri}",
                  f"hydra.run.dir={tmp_path / 'run'}"])
    client = MlflowClient(tracking_uri=uri)
    (run,) = client.search_runs([client.get_experiment_by_name("tweakpipe").experiment_id])
    assert run.info.status == "FINISHED" and "mlflow.parentRunId" not in run.data.tags
    assert "latency_ms/eager/bs8" in run.data.metrics and "latency.png" in artifact_names(uri, run.info.run_id)


@pytest.mark.slow
def test_sweep_against_a_real_mlflow_server(shared_server: SharedServer, tmp_path: Path) -> None:
    run_pipeline(["-m", *SWEEP, "tracking=server", f"tracking.uri={shared_server.url}", "tracking.experiment=sweep",
                  f"hydra.sweep.dir={tmp_path / 'sweep'}"])
    check_sweep(shared_server.url, experiment="sweep")


# A second machine: reads a run, downloads one of its artifacts and loads its logged model, through the server alone.
SECOND_MACHINE = """
import json, sys, mlflow, pipeline
from mlflow.tracking import MlflowClient
from pipeline.models import MLP
uri, experiment, folder = sys.argv[1:]
client = MlflowClient(tracking_uri=uri)
(run,) = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
route = mlflow.artifacts.download_artifacts(run_id=run.info.run_id, artifact_path="route.json", dst_path=folder,
                                            tracking_uri=uri)
(logged,) = client.search_logged_models([run.info.experiment_id])
served = pipeline.load_logged_model(logged.model_id, MLP(width=16, depth=2).eval(), tracking_uri=uri)
print(json.dumps({"status": run.info.status, "artifacts": run.info.artifact_uri, "route": route, "served": repr(served),
                  "experiment": run.info.experiment_id}))
"""


@pytest.mark.slow
def test_the_docs_shared_server_takes_runs_by_host_name_and_serves_them_to_a_second_machine(
        shared_server: SharedServer, tmp_path: Path) -> None:
    """docs/scaling-out.md's ``mlflow server`` command (the shared server: mlflow_helpers.docs_server), this machine's
    host name as HOST: a run logs to it by that name, and another process reads the run, its artifact and its logged
    model back through it. An address the server was not told to allow is refused before any work, in one line
    naming ``--allowed-hosts``."""
    host = socket.gethostname()
    if shared_server.host != host:
        pytest.skip(f"this machine's host name {host!r} does not resolve")
    url, address, port = shared_server.url, shared_server.address, shared_server.port
    assert shared_server.tracking == ["tracking=server", f"tracking.uri={url}"], SHARED_SERVER
    assert " ".join(commands(SHARED_SERVER)[0]) == server_command("HOST", 5000, listen="0.0.0.0")  # what errors say
    tiny = ["model=tiny_mlp", "profile=quick", "backends=[eager]", "reference=false"]
    # The docs' run line and an experiment of this test's own (the suite's other server tests log to theirs).
    run_pipeline([*tiny, *shared_server.tracking, "tracking.experiment=docs", f"hydra.run.dir={tmp_path}/run"])
    (tmp_path / "elsewhere").mkdir()
    proc = subprocess.run([sys.executable, "-c", SECOND_MACHINE, url, "docs", str(tmp_path / "elsewhere")],
                          cwd=tmp_path / "elsewhere", env=clean_env(), capture_output=True, text=True, timeout=180)
    refused = subprocess.run([sys.executable, "-m", "pipeline", *tiny, "tracking=server",
                              f"tracking.uri=http://{address}:{port}", f"hydra.run.dir={tmp_path}/refused"],
                             cwd=tmp_path, env=clean_env(), capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr[-3000:]
    assert f"refuses requests addressed to {address}:{port}" in refused.stderr and \
        f"--allowed-hosts {address}:{port}" in refused.stderr, refused.stderr
    assert not (tmp_path / "refused").exists()
    assert proc.returncode == 0, proc.stderr[-3000:]
    read = json.loads(proc.stdout.splitlines()[-1])
    assert read["status"] == "FINISHED" and read["served"] == "RoutedModule(1..inf: eager)"
    assert read["artifacts"].startswith("mlflow-artifacts:"), read  # uploaded through the server, not a local path
    assert Path(read["route"]).read_text() == (tmp_path / "run" / "route.json").read_text()
    # Where --artifacts-destination says, in the experiment's folder
    stored = list((shared_server.folder / "mlflow-server" / "artifacts" / read["experiment"]).rglob("route.json"))
    assert len(stored) == 1 and stored[0].read_text() == (tmp_path / "run" / "route.json").read_text()


@pytest.mark.slow
def test_parallel_fresh_processes_one_gpu_each_lose_no_run_and_report(tmp_path: Path, template: Path) -> None:
    uri = copy_store(template, tmp_path)
    # Three jobs on two "GPUs" (ids only: the jobs run on the CPU): job 2 waits for GPU 0. A second of
    # warm-up per batch size keeps the jobs busy long enough to see them overlap.
    three = [arg for arg in SWEEP if not arg.startswith("seed=")] + ["seed=0,1,2"]
    proc = run_pipeline(["-m", *three, "profile.warmup_ms=1000", "hydra/launcher=joblib_fresh",
                         f"tracking.uri={uri}", f"hydra.sweep.dir={tmp_path / 'sweep'}"],
                        timeout=300, env={"CUDA_VISIBLE_DEVICES": "0,1"})
    assert "a fresh process each, GPUs 0,1" in proc.stdout + proc.stderr
    parent, children = check_sweep(uri, jobs=3)
    pids = [c.data.tags["tweakpipe.pid"] for c in children]
    assert len(set(pids)) == 3, f"jobs shared a process: {pids}"
    assert [c.data.tags["cuda_visible_devices"] for c in children] == ["0", "1", "0"]
    first, second, third = children
    assert first.info.start_time < second.info.end_time and second.info.start_time < first.info.end_time, \
        "jobs on two GPUs did not overlap"
    assert third.info.start_time > first.info.end_time, "GPU 0 ran two jobs at once"

    out = subprocess.run([sys.executable, "-m", "pipeline.cli", "report", "--uri", uri, "--sweep", parent.info.run_id,
                          "--out", str(tmp_path / "report")], cwd=ROOT, env=clean_env(), capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert all(f"tiny_mlp [seed={n}]" in out.stdout for n in range(3)) and "auto" in out.stdout
    rows = list(csv.DictReader((tmp_path / "report" / "report.csv").open()))
    assert [(r["model"], r["backend"]) for r in rows] == [
        (f"tiny_mlp [seed={n}]", backend) for n in range(3) for backend in ("eager", "auto")]
    for child, (eager, auto) in zip(children, zip(rows[::2], rows[1::2])):
        for bs in ("1", "3", "8"):
            assert float(eager[bs]) == pytest.approx(child.data.metrics[f"latency_ms/eager/bs{bs}"])
            assert auto[bs] == eager[bs]  # the only backend owns the whole route
    md = (tmp_path / "report" / "report.md").read_text()
    assert md.count("| tiny_mlp [seed=") == 6


def test_launcher_configs_compose() -> None:
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(SHIPPED_CONF), version_base="1.3"):
        fresh = compose("config", overrides=["hydra/launcher=joblib_fresh"], return_hydra_config=True)
        assert fresh.hydra.launcher._target_.endswith("FreshProcessLauncher") and fresh.hydra.launcher.n_jobs == 0
        assert fresh.hydra.callbacks.mlflow_sweep._target_ == "pipeline.record.sweep.MlflowSweep"
        pytest.importorskip("hydra_plugins.hydra_submitit_launcher", reason="pip install -e '.[slurm]'")
        slurm = compose("config", overrides=["hydra/launcher=slurm"], return_hydra_config=True)
        assert slurm.hydra.launcher._target_.endswith("SlurmLauncher") and slurm.hydra.launcher.gpus_per_node == 1


def gpu_count() -> int:
    import torch

    return torch.cuda.device_count()


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.skipif(gpu_count() < 2, reason="needs 2 CUDA GPUs")
def test_two_gpus_run_one_job_each_at_the_same_time(tmp_path: Path, template: Path) -> None:
    uri = copy_store(template, tmp_path)
    run_pipeline(["-m", *SWEEP, "device=cuda", "profile.warmup_ms=1000", "hydra/launcher=joblib_fresh",
                  f"tracking.uri={uri}", f"hydra.sweep.dir={tmp_path / 'sweep'}"], timeout=300)
    _, children = check_sweep(uri)
    assert len({c.data.tags["cuda_visible_devices"] for c in children}) == 2
    assert len({c.data.tags["gpu"] for c in children}) == 2, [c.data.tags["gpu"] for c in children]
    assert max(c.info.start_time for c in children) < min(c.info.end_time for c in children), "jobs did not overlap"


# ---- no credential at rest: nothing a run or a sweep writes keeps a URL's password ----------------------------

REDIS_SECRET, TRACKING_SECRET = "Zq7redis53a", "Zq7mlflow53a"  # nothing a run writes may hold either


def holding(folder: Path, *secrets: str) -> List[str]:
    """Every file under ``folder`` (a SQLite store and its artifacts, run and sweep directories) whose bytes hold
    one of ``secrets``."""
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*")
                  if p.is_file() and any(s.encode() in p.read_bytes() for s in secrets))


def test_the_credentials_of_any_url_in_any_string_are_redacted() -> None:
    assert redacted("compile_cache.remote=redis://:pa@ss@127.0.0.1:6379/0 x") == \
        "compile_cache.remote=redis://:***@127.0.0.1:6379/0 x"  # the password runs to the host's "@", as urllib's
    assert redacted({"uri": ["http://me:pw@host:5000/#/x", 3]}) == {"uri": ["http://me:***@host:5000/#/x", 3]}
    assert redacted("rediss://h:1/?password=pw&db=0 https://h/x?access_token=t") == \
        "rediss://h:1/?password=***&db=0 https://h/x?access_token=***"
    # a name given alone may be a token (https://TOKEN@host), escaped by Hydra in a sweep's overrides or not
    assert redacted("tracking.uri=https://ghp_T0k3n@host/x") == "tracking.uri=https://***@host/x"
    assert redacted(r"tracking.uri=https\://ghp_T0k3n@host") == r"tracking.uri=https\://***@host"
    for kept in ("redis://alice:***@h:1", "sqlite:////tmp/a:b@c.db", "http://host:5000/x@y", "redis://:***@h:1",
                 "redis://***@h:1", "mail me@host"):
        assert redacted(kept) == kept  # a user name beside a password, paths, ports and what is redacted already


def test_a_redacted_redis_url_takes_its_password_from_the_environment(monkeypatch) -> None:
    """What a resumed run reads from its config.yaml: the URL's own "***" would win over the password given."""
    with redis_server(password=REDIS_SECRET) as server:
        remote = f"redis://:***@127.0.0.1:{server.port}"
        monkeypatch.setenv(compile_cache.PASSWORD_ENV, REDIS_SECRET)
        assert compile_cache.remote_problem(remote) is None
        assert compile_cache.remote_problem(f"redis://***@127.0.0.1:{server.port}") is None  # a name redacted alone
        monkeypatch.delenv(compile_cache.PASSWORD_ENV)
        assert "refused the credentials" in compile_cache.remote_problem(remote)


@pytest.mark.slow
def test_a_run_keeps_no_password_of_a_url_in_its_store_or_its_directory(tmp_path: Path, template: Path) -> None:
    uri = copy_store(template, tmp_path / "store")
    with redis_server(password=REDIS_SECRET) as server:
        remote = f"redis://:{REDIS_SECRET}@127.0.0.1:{server.port}"
        run_pipeline([*QUICK, f"compile_cache.remote={remote}", f"compile_cache.dir={tmp_path / 'cache'}",
                      f"tracking.uri={uri}", f"hydra.run.dir={tmp_path / 'run'}"])
    client = MlflowClient(tracking_uri=uri)
    (run,) = client.search_runs([client.get_experiment_by_name("tweakpipe").experiment_id])
    shown = f"redis://:***@127.0.0.1:{server.port}"
    assert f"compile_cache.remote={shown}" in run.data.tags["hydra.overrides"]
    assert run.data.params["compile_cache.remote"] == shown and run.info.status == "FINISHED"
    assert f"compile_cache.remote={shown}" in (tmp_path / "run" / ".hydra" / "overrides.yaml").read_text()
    assert holding(tmp_path, REDIS_SECRET) == []


@pytest.mark.slow
def test_a_sweep_keeps_no_password_of_a_url_in_its_store_or_its_directories(shared_server: SharedServer,
                                                                            tmp_path: Path) -> None:
    """A Redis password and a tracking server's (``http://USER:PASSWORD@HOST``), on the parent run and each job's;
    nothing in the server's folder (its store, its artifacts, its log) holds either."""
    url = shared_server.url
    tracked = url.replace("http://", f"http://tweak:{TRACKING_SECRET}@")
    with redis_server(password=REDIS_SECRET) as server:
        run_pipeline(["-m", *SWEEP, "tracking=server", f"tracking.uri={tracked}", "tracking.experiment=secrets",
                      f"compile_cache.remote=redis://:{REDIS_SECRET}@127.0.0.1:{server.port}",
                      f"compile_cache.dir={tmp_path / 'cache'}", f"hydra.sweep.dir={tmp_path / 'sweep'}"])
    parent, children = check_sweep(url, experiment="secrets")
    shown = tracked.replace(TRACKING_SECRET, "***")
    assert f"tracking.uri={shown}" in parent.data.tags["hydra.overrides"]
    assert all(c.data.params["tracking.uri"] == shown for c in children)
    assert holding(tmp_path, REDIS_SECRET, TRACKING_SECRET) == []
    assert holding(shared_server.folder, REDIS_SECRET, TRACKING_SECRET) == []
