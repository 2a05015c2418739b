"""A busy host is named, not measured: the verdict on synthetic readings, the watch's waiting, the screen and the
route that contended cells cannot settle, and real runs next to busy loops this test starts."""

from __future__ import annotations

import json
import logging
from datetime import datetime
import multiprocessing
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator, List

import pytest
import torch

from conftest import ROOT, TINY
from mlflow_helpers import clean_env
from pipeline import runner
from pipeline.config.schema import RouteConfig
from pipeline.errors import ConfigError
from pipeline.measure import contention
from pipeline.measure.contention import HostBusy, Reading, Watch, judge, start
from pipeline.measure.measurement import Measurement, Settings
from pipeline.measure.screening import screened_out
from pipeline.route.decision import Race, decide

QUIET = Reading(runnable=0, cores=2, slowdown=1.0)
CROWDED = Reading(runnable=6, cores=2, slowdown=1.0)  # no core free, whatever the kernel says
SLOWED = Reading(runnable=0, cores=2, slowdown=contention.SLOWED * 2)  # no task seen, but the kernel waited
# Two eager candidates, so the route has a choice to make at every cell.
TWINS = [*TINY, "backends=[eager]", "+backends.twin.kind=eager", "model.batch_sizes=[1,4]",
         "validate.check_reload=false"]


def test_a_host_is_busy_where_no_core_is_free_or_the_calibration_kernel_waited():
    assert not judge(QUIET, threads=2).busy and judge(QUIET, threads=2).fit == 2
    one_free = Reading(runnable=1, cores=2, slowdown=1.0)
    assert not judge(one_free, threads=2).busy and judge(one_free, threads=2).fit == 1  # quiet for the thread that fits
    full = Reading(runnable=2, cores=2, slowdown=1.0)
    assert judge(full, threads=1).busy and judge(full, threads=1).fit == 1
    assert judge(CROWDED, threads=1).busy
    assert judge(SLOWED, threads=1).busy
    assert not judge(Reading(runnable=0, cores=2, slowdown=contention.SLOWED), threads=2).busy  # the limit is quiet
    assert judge(Reading(6, 2, 3.1), threads=2).seen == \
        "6 runnable tasks besides this run's on 2 cores, calibration 3.1x its quiet time"


def test_a_parallel_calibration_that_stalls_beyond_its_own_noise_is_busy():
    """Issue 54: a 2-thread run beside one spinning task (one core free: quiet by the task count) took 4.6 ms a call
    against 0.5 ms quiet, and no cell was marked. The run's own threads stall at the barrier of a parallel kernel for
    a scheduler slice; their rounds' median moves far beyond a quiet round's jitter above the fastest round."""
    one_free = Reading(runnable=1, cores=2, slowdown=1.0, parallel_ms=6.0, parallel_fastest_ms=0.2)
    verdict = judge(one_free, threads=2)
    assert verdict.busy and "2 threads 6.00 ms a round against 0.20 ms at best" in verdict.seen
    assert not judge(Reading(1, 2, 1.0, parallel_ms=0.5, parallel_fastest_ms=0.2), threads=2).busy  # a clock halved
    assert not judge(Reading(0, 2, 1.0, parallel_ms=0.6, parallel_fastest_ms=0.1), threads=2).busy  # within 0.5 ms
    # against the fastest round seen this run, where this reading never had a quiet one
    assert judge(Reading(0, 2, 1.0, parallel_ms=9.0, parallel_fastest_ms=8.0), threads=2, fastest_ms=0.2).busy
    assert not judge(Reading(0, 2, 1.0, parallel_ms=9.0, parallel_fastest_ms=8.0), threads=2).busy


def calibrated(rounds: List[float]) -> Any:
    """A parallel calibration whose rounds take ``rounds`` ms (the first wakes the pool and is not counted)."""
    calibration = contention.ParallelCalibration()
    times = iter([0.0, *rounds])
    calibration.round_ms = lambda: next(times)
    return calibration


def test_a_pool_that_was_slow_to_wake_for_one_round_is_not_a_busy_host():
    """On an H100 host every cell of a CUDA run was marked contended: the pool's threads, asleep while the GPU worked,
    took milliseconds to wake for a round (7.66 ms a round against 0.13 ms at best, no other task runnable), and the
    rounds' mean took that for a stalled barrier. The median stands for the rounds; a host that stalls most of them
    is still busy, and it costs half the rounds, not all."""
    woke_late = calibrated([7.7, 0.13, 0.14, 0.13, 0.15, 0.13, 0.14, 0.13, 0.14])
    median, fastest = woke_late.reading()
    assert (median, fastest) == (0.14, 0.13) and not contention.stalled(median, fastest)
    rounds = [0.2, 6.0, 5.0, 7.0, 6.5, 5.5, 0.3, 0.2, 0.2]
    stalling = calibrated(rounds)
    median, fastest = stalling.reading()
    assert contention.stalled(median, fastest)
    assert [stalling.round_ms() for _ in range(3)] == rounds[6:]  # it stopped once most rounds had stalled


def test_a_gpu_run_takes_no_parallel_calibration(monkeypatch):
    """A CUDA run's cells do not wait at the intra-op pool's barrier: its readings are the task count and the
    single-thread kernel."""
    monkeypatch.setattr(contention, "ParallelCalibration", lambda: pytest.fail("a parallel calibration was taken"))
    monkeypatch.setattr(contention, "_parallel", None)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 4)
    assert contention.read_host(parallel=False).parallel_ms == 0.0


def test_the_watch_judges_each_reading_against_the_fastest_round_of_the_run():
    readings = iter([Reading(0, 2, 1.0, 0.25, 0.2), Reading(0, 2, 1.0, 9.0, 8.0), Reading(0, 2, 1.0, 0.3, 0.2)])
    watch = Watch("warn", 2, 0.0, read=lambda: next(readings), clock=iter(range(0, 100, 10)).__next__)
    assert watch.before("a") == ""
    assert watch.before("b").startswith("busy before it:") and watch.fastest_ms == 0.2
    assert watch.before("c") == ""


def test_one_spinning_task_beside_a_run_of_all_cores_is_seen_by_its_threads():
    """The lighter case, live: one spinning process per core but one, and a run on every core. Some reading of the
    parallel calibration stalls within a few (each round is a fraction of a millisecond, a stall a slice)."""
    cores = contention.usable_cores()
    if cores < 2:
        pytest.skip("needs two cores: one to spin, one free")
    context = multiprocessing.get_context("fork")
    events = [context.Event() for _ in range(cores - 1)]
    loops = [context.Process(target=spin, args=(event,), daemon=True) for event in events]
    threads = torch.get_num_threads()
    torch.set_num_threads(cores)
    try:
        for loop in loops:
            loop.start()
        assert all(event.wait(timeout=120) for event in events)
        watch = Watch("warn", cores, 0.0)
        seen = [watch.verdict() for _ in range(20)]
    finally:
        torch.set_num_threads(threads)
        for loop in loops:
            loop.terminate()
            loop.join()
    assert any(v.busy for v in seen), [v.seen for v in seen]


def test_the_run_names_the_threads_that_fit_and_keeps_its_own():
    # Its own: Inductor compiles CPU kernels for the count in force, so a count chosen here would miss at load.
    one_free = Reading(runnable=1, cores=2, slowdown=1.0)
    named = start(one_free, "warn", threads=None, default_threads=2)
    assert named.threads is None and not named.busy and "torch=2 oversubscribes the 1 free core; threads=1 fits" in \
        named.note
    kept = start(one_free, "warn", threads=2, default_threads=2)
    assert kept.threads == 2 and "threads=2 oversubscribes the 1 free core" in kept.note
    assert start(QUIET, "warn", threads=None, default_threads=2) == contention.Start(None, "", "")


def test_a_busy_host_is_one_line_or_under_fail_a_one_line_error():
    warned = start(CROWDED, "warn", threads=None, default_threads=2)
    assert warned.busy.startswith("host busy: 6 runnable tasks besides this run's on 2 cores, calibration 1.0x")
    assert "threads=1 fits" in warned.busy and "marked contended" in warned.busy and "\n" not in warned.busy
    assert warned.threads is None
    assert "waits for a quiet host" in start(SLOWED, "wait", threads=None, default_threads=2).busy
    with pytest.raises(HostBusy, match=r"^host busy: 6 runnable .*profile.on_busy=fail; quiet the machine, run "
                                       r"with threads=1, or set profile.on_busy=warn") as caught:
        start(CROWDED, "fail", threads=None, default_threads=2)
    assert isinstance(caught.value, ConfigError) and "\n" not in str(caught.value)


class Host:
    """Synthetic readings in turn (the last one repeats), and a clock that only sleeping moves."""

    def __init__(self, readings: List[Reading]) -> None:
        self.readings, self.now, self.slept = list(readings), 0.0, 0

    def read(self) -> Reading:
        return self.readings.pop(0) if len(self.readings) > 1 else self.readings[0]

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        self.slept += 1

    def watch(self, on_busy: str, wait_s: float = 60.0) -> Watch:
        return Watch(on_busy, 1, wait_s, read=self.read, sleep=self.sleep, clock=lambda: self.now)


def test_wait_waits_for_a_quiet_host_with_a_line_every_ten_seconds(caplog):
    busy_for = int(3 * contention.WAIT_LOG_S / contention.WAIT_POLL_S)
    host = Host([CROWDED] * (busy_for + 1) + [QUIET])
    with caplog.at_level(logging.INFO, logger="pipeline.measure.contention"):
        assert host.watch("wait").before("batch size 4 (pass 1)") == ""  # quiet at last: not contended
    assert host.slept == busy_for + 1
    waiting = [r.getMessage() for r in caplog.records if "still waiting" in r.getMessage()]
    assert len(waiting) == 3 and all("before batch size 4 (pass 1)" in line for line in waiting)
    assert "quiet after" in caplog.records[-1].getMessage()


def test_wait_is_bounded_and_then_measures_marked_contended(caplog):
    host = Host([CROWDED])
    with caplog.at_level(logging.INFO, logger="pipeline.measure.contention"):
        seen = host.watch("wait", wait_s=25.0).before("batch size 1 (pass 1)")
    assert seen.startswith("busy before it: 6 runnable tasks") and host.now == pytest.approx(25.0)
    assert "stayed busy for 25 s" in caplog.records[-1].getMessage() and caplog.records[-1].levelno == logging.WARNING


def test_warn_measures_at_once_and_fail_stops_before_the_cell():
    host = Host([CROWDED])
    assert host.watch("warn").before("bs=1").startswith("busy before it:") and host.slept == 0
    assert host.watch("warn").after().startswith("busy after it:")
    with pytest.raises(HostBusy, match="profile.on_busy=fail"):
        host.watch("fail").before("bs=1")
    assert Host([QUIET]).watch("fail").before("bs=1") == ""
    with pytest.raises(ConfigError, match=r"profile.on_busy='sometimes' is not one of \['warn', 'wait', 'fail'\]"):
        Host([QUIET]).watch("sometimes")


def cell(median: float, contended: str = "") -> Measurement:
    """A settled cell of samples within 1% of ``median``, measured on a busy host where ``contended`` says so."""
    m = Measurement(windows=[[median * (1 + 0.001 * i) for i in range(20)]], passes=[0])
    m.settle(Settings.of({"rel_precision": 1.0, "noise_threshold": 10.0}))
    m.contend(contended)
    return m


def test_a_contended_cell_screens_nothing_out_and_sets_no_pace():
    busy = "busy before it: 6 runnable tasks"
    cells = {"fast": {1: cell(1.0), 8: cell(2.0)},
             "slow_busy": {1: cell(10.0), 8: cell(20.0, busy)},  # slow everywhere, but one of its cells shows nothing
             "slow": {1: cell(10.0), 8: cell(20.0)},
             "faster_busy": {1: cell(0.1, busy), 8: cell(0.2, busy)}}  # would set the pace, were it not contended
    out = screened_out(cells, list(cells), keep=[], margin=1.5)
    assert set(out) == {"slow"} and "slower than fast" in out["slow"]


def race(contended=()) -> Race:
    cells = {"a": {1: cell(1.0), 8: cell(2.0)}, "b": {1: cell(2.0), 8: cell(1.0)}}  # each 2x faster at one size
    return Race({n: {k: m.median for k, m in per.items()} for n, per in cells.items()},
                {n: {k: m.interval for k, m in per.items()} for n, per in cells.items()},
                order=["a", "b"], failures={}, baseline="a", contended=contended)


def test_the_route_splits_only_on_uncontended_evidence_and_says_where_it_is_unsettled():
    rcfg = RouteConfig(min_gain=0.1)
    settled = decide(race(), rcfg)
    assert [r.backend for r in settled.route] == ["a", "b"] and settled.unsettled == []
    shaky = decide(race(contended={("b", 8)}), rcfg)
    assert [r.backend for r in shaky.route] == ["a"]  # b's lead at 8 was measured on a busy host: no split on it
    assert ("b", 8) in shaky.unsettled and ("a", 8) not in shaky.unsettled
    alone = Race({"a": {1: 1.0}}, {"a": {1: (0.9, 1.1)}}, order=["a"], failures={}, baseline="a",
                 contended={("a", 1)})
    assert decide(alone, rcfg).unsettled == []  # nothing else competes: the busy host changes no choice


def spin(started: Any) -> None:
    started.set()
    while True:
        pass


@pytest.fixture(scope="module")
def busy_loops() -> Iterator[int]:
    """Three spinning processes per core, each spinning (its event set) before the test goes on."""
    context = multiprocessing.get_context("fork")  # a spinning copy of this process: no start-up to wait for
    events = [context.Event() for _ in range(3 * contention.usable_cores())]
    loops = [context.Process(target=spin, args=(event,), daemon=True) for event in events]
    try:
        for loop in loops:
            loop.start()
        for event in events:
            assert event.wait(timeout=120), "a busy loop did not start"
        yield len(loops)
    finally:
        for loop in loops:
            loop.terminate()
        for loop in loops:
            loop.join()


def test_a_run_next_to_busy_loops_says_so_in_one_line_and_its_route_rests_on_no_contended_cell_alone(
        compose_cfg, busy_loops, tmp_path):
    run_dir = tmp_path / "run"
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    threads = torch.get_num_threads()
    torch.set_num_threads(contention.usable_cores())  # torch's default, a user's: more than the free core holds
    try:
        ctx = runner.run(compose_cfg([*TWINS, "tracking=sqlite", f"tracking.uri={uri}"]), run_dir)
        kept = ctx.cfg.threads == torch.get_num_threads() == contention.usable_cores()  # the run keeps its count
    finally:
        torch.set_num_threads(threads)
    log = (run_dir / "tweakpipe.log").read_text().splitlines()
    busy = [line for line in log if "host busy:" in line]
    assert len(busy) == 1 and busy[0] == log[0] and "runnable tasks besides this run's" in busy[0]
    assert "threads=1 fits" in busy[0] and kept
    assert json.loads((run_dir / "run.json").read_text())["host"] == busy[0].split(" - ", 1)[1]
    rows = (run_dir / "profile.csv").read_text().splitlines()
    header = rows[0].split(",")
    assert "contended" in header and all(row.split(",")[header.index("contended")] == "True" for row in rows[1:])
    cells = [json.loads(line)["cell"] for line in (run_dir / "cells.jsonl").read_text().splitlines()]
    assert all(c["contention"].startswith("busy") for c in cells)
    route = json.loads((run_dir / "route.json").read_text())
    assert route["settled"] is False and route["rests_on"]
    assert {(c["backend"], c["batch_size"]) for c in route["contended_cells"]} == \
        {(c["backend"], c["batch_size"]) for c in route["rests_on"]}
    assert any("route   unsettled:" in line for line in log)
    # Issue 54: no number of a busy host stands as a result: every speed-up is named contended, there is no geomean
    # (the primary metric), the run is tagged, the report marks its figures and the plot's title says so.
    from mlflow.tracking import MlflowClient

    from pipeline.record import report

    run = MlflowClient(uri).get_run(json.loads((run_dir / "mlflow_run.json").read_text())["run_id"])
    speedups = [k for k in run.data.metrics if "speedup" in k]
    assert speedups and all(k.startswith("contended_") for k in speedups), speedups
    assert run.data.tags["contended"] == "true" and int(run.data.tags["contended_cells"]) >= 4
    table = report.build([run])
    assert all(r.contended == set(r.ms) for r in table.rows), [(r.backend, r.contended) for r in table.rows]
    assert report.CONTENDED_LEGEND in report.footer(table) and "!" in report.markdown(table)
    assert route["reference"]["geomean_speedup"] is None and all(c["contended"] for c in route["reference"]["cells"])
    # and the log was never silent for 15 s, re-measures and the save included
    stamped = [(datetime.strptime(line[1:24], "%Y-%m-%d %H:%M:%S,%f"), line) for line in log if line.startswith("[20")]
    gap, before, after = max(((b - a).total_seconds(), la, lb) for (a, la), (b, lb) in zip(stamped, stamped[1:]))
    assert gap < 15, f"the log was silent {gap:.1f} s between\n{before}\n{after}"


def test_on_busy_fail_exits_2_in_one_line_leaving_no_run_directory(busy_loops, tmp_path):
    proc = subprocess.run([sys.executable, "-m", "pipeline", *TINY, "backends=[eager]", "profile.on_busy=fail",
                           f"hydra.run.dir={tmp_path / 'run'}"], cwd=ROOT, env=clean_env(), capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-3000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "host busy:" in lines[0] and "profile.on_busy=warn" in lines[0], proc.stderr
    assert not Path(tmp_path / "run").exists()


def test_a_reading_after_a_cell_stands_for_the_next_cells_reading_before_it_while_it_is_fresh():
    host = Host([QUIET, CROWDED])
    watch = host.watch("warn")
    assert watch.after() == ""  # quiet after one cell
    assert watch.before("the next") == ""  # no new reading: the host was quiet a moment ago
    host.sleep(contention.FRESH_S)
    assert watch.before("a later one").startswith("busy before it:")  # stale: read again
