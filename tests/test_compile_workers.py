"""Compile workers that never run the user's script, cannot hang a run and do not outlive it (issues 36 and 38).

Every case starts real worker processes (``pipeline.compile.worker``) compiling a real Inductor
program on the CPU; "the user" is a plain script without a main guard, run as ``python user_script.py``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import List, Mapping, Sequence

import pytest

from conftest import ROOT, SUITE_CACHE, TINY
from models_for_tests import compile_workers_of as workers_of
from mlflow_helpers import clean_env
from pipeline.compile import ahead as compile_ahead
from pipeline.api import compose_config
from pipeline.errors import ConfigError
from pipeline.preflight.checks import check_config
from pipeline.runner import run

# reference=false: one compiling candidate, so one worker job (the max-autotune reference peer would be a second)
WORKERS = [*TINY, "backends=[eager,inductor]", "stages=[capture]", "compile_cache.workers=1", "reference=false"]

USER_SCRIPT = """
import os, torch, pipeline
print("TOP-LEVEL runs in pid", os.getpid(), flush=True)
m = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8)).eval()
t = pipeline.tune(m, torch.randn(4, 32), overrides=["device=cpu", "backends=[eager,inductor]", "profile=quick",
    "tracking=off", "model.batch_sizes=[1,4]", "compile_cache.workers=1", "compile_cache.dir=CACHE"], run_dir="run")
"""

MAIN_MODEL_SCRIPT = """
import torch, pipeline
class Mine(torch.nn.Module):  # defined in the script itself: a worker cannot import it without running the script
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 4)
    def forward(self, x):
        return torch.relu(self.lin(x))
pipeline.tune(Mine().eval(), torch.randn(4, 8), overrides=["device=cpu", "backends=[eager,inductor]", "profile=quick",
    "tracking=off", "model.batch_sizes=[1,4]", "compile_cache.workers=1", "compile_cache.dir=CACHE"], run_dir="run")
"""


def script_run(tmp_path: Path, body: str, *paths: Path, script_dir: Path = None, cwd: Path = None
               ) -> subprocess.CompletedProcess:
    """``python user_script.py`` in a fresh interpreter, with the repository (and ``paths``) importable; the script
    in ``script_dir``, run from ``cwd`` (both ``tmp_path`` where not given)."""
    script = (script_dir or tmp_path) / "user_script.py"
    script.write_text(body.replace("CACHE", str(tmp_path / "cache")).replace("RUN_DIR", str(tmp_path / "run")))
    env = {**clean_env(), "PYTHONPATH": os.pathsep.join(map(str, [*paths, ROOT])),
           "TWEAKPIPE_HOME": str(tmp_path / "home")}
    return subprocess.run([sys.executable, str(script)], cwd=cwd or tmp_path, env=env, capture_output=True, text=True,
                          timeout=600)


def test_a_script_without_a_main_guard_runs_its_top_level_once_and_its_workers_program_is_a_hit(tmp_path):
    proc = script_run(tmp_path, USER_SCRIPT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("TOP-LEVEL runs in pid") == 1, proc.stdout
    cost = json.loads((tmp_path / "run" / "capture.json").read_text())["inductor"]["cost"]
    assert cost["ahead_s"] > 0 and cost["ahead_compiled"] >= 1  # a worker compiled it first, into an empty cache
    assert cost["cache_hits"] >= 1 and cost["cache_misses"] == 0, cost  # and the run only loaded it


def test_a_workers_standalone_program_counts_as_compiled_into_a_cold_cache_and_not_a_warm_one(tmp_path):
    """A standalone program (``compile_cache.standalone``, the CUDA default) bundles its Inductor graph into
    AOTAutograd's cache entry, which the FX-graph counters never see: its worker's job into an empty cache read
    0 programs compiled, as a warm one's does. A cold tune and a warm one now read apart."""
    overrides = [*WORKERS, "compile_cache.standalone=true", f"compile_cache.dir={tmp_path / 'cache'}"]
    cold = run(compose_config(overrides), tmp_path / "cold").outcomes["inductor"]
    warm = run(compose_config(overrides), tmp_path / "warm").outcomes["inductor"]
    assert cold.status == warm.status == "ok" and cold.cost.trace_s == 0  # its worker's standalone program, loaded
    assert cold.cost.ahead_s > 0 and cold.cost.ahead_compiled >= 1, cold.cost
    assert warm.cost.ahead_compiled == 0, warm.cost


PROJECT_SCRIPT = """
import torch, pipeline
from user_nets import Net  # a module of the user's own, beside the script
pipeline.tune(Net().eval(), torch.randn(4, 32), overrides=["device=cpu", "backends=[eager,inductor]", "profile=quick",
    "tracking=off", "model.batch_sizes=[1,4]", "compile_cache.workers=1", "compile_cache.dir=CACHE"], run_dir="RUN_DIR")
"""

USER_NETS = """
import torch
class Net(torch.nn.Sequential):
    def __init__(self):
        super().__init__(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
"""


def test_a_worker_imports_from_the_runs_own_path_never_from_a_folder_others_can_write(tmp_path):
    """Issue 53: the user's script, in their own folder, run from a folder others can write (like /tmp) where another
    user planted ``json.py``. ``python -m pipeline.compile.worker`` put that folder first on the worker's path, so
    the planted file ran inside the worker; now the worker's path is the run's: the script's folder, not the current
    one, so it also finds the user's own module beside the script and compiles their model ahead."""
    project, shared = tmp_path / "project", tmp_path / "shared"
    project.mkdir()
    shared.mkdir(mode=0o1777)
    shared.chmod(0o1777)
    (project / "user_nets.py").write_text(USER_NETS)
    marker = tmp_path / "planted-ran"
    (shared / "json.py").write_text(f"open({str(marker)!r}, 'a').write('ran')\n")
    proc = script_run(tmp_path, PROJECT_SCRIPT, script_dir=project, cwd=shared)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not marker.exists(), "a module planted in the current directory ran in a compile worker"
    cost = json.loads((tmp_path / "run" / "capture.json").read_text())["inductor"]["cost"]
    assert cost["ahead_s"] > 0, proc.stderr[-3000:]  # the worker imported user_nets from the script's folder
    assert cost["cache_hits"] >= 1 and cost["cache_misses"] == 0, cost


def test_a_model_defined_in_the_script_compiles_in_the_run_with_the_reason_in_one_line(tmp_path):
    proc = script_run(tmp_path, MAIN_MODEL_SCRIPT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    said = [line for line in proc.stderr.splitlines() if "compile ahead: off" in line]
    assert len(said) == 1 and "Mine from your script (__main__)" in said[0], proc.stderr[-3000:]
    cost = json.loads((tmp_path / "run" / "capture.json").read_text())["inductor"]["cost"]
    assert cost["ahead_s"] == 0 and cost["cache_misses"] >= 1


def test_a_candidate_out_of_memory_beside_busy_workers_is_built_again_once_they_stop(tmp_path, caplog):
    """Device memory a worker holds is not the candidate's fault: it is built again after the workers, not failed."""
    with caplog.at_level("INFO", logger="stages.capture"):
        ctx = run(compose_config([*WORKERS, f"compile_cache.dir={SUITE_CACHE}", "~model.build.depth",
                                  "model.build._target_=models_for_tests.CrowdedByWorkers"]), tmp_path / "run")
    said = [r.getMessage() for r in caplog.records if "ran out of device memory" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith("capture: eager ran out") and "built again" in said[0], said
    assert ctx.outcomes["eager"].status == "ok" and ctx.outcomes["inductor"].status == "ok"
    assert list(ctx.outcomes) == ["eager", "inductor"]  # config order, as ever


# A worker's compile as max-autotune and ptxas make it: one short process after another, the worker waiting on each.
SHORT_CHILDREN = """
import subprocess, sys, time
burn = "import time; t = time.process_time()\\nwhile time.process_time() - t < 0.25: pass"
end = time.monotonic() + 120
while time.monotonic() < end:
    subprocess.run([sys.executable, "-c", burn])
    print("ended", flush=True)
"""


def test_a_worker_waiting_on_one_short_process_after_another_is_making_progress():
    """On an H100, a max-autotune reference's job was ended as stalled ("its processes used no CPU") while its
    compile ran short processes one after another: a snapshot of the living tree misses the seconds of the children
    that ended. They count now (``cutime``), so such a worker is not stopped. Counted in children ended, not in wall
    seconds, so a busy machine (CI's two cores) does not starve the children between the two readings."""
    proc = subprocess.Popen([sys.executable, "-c", SHORT_CHILDREN], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "ended\n"
        first = compile_ahead.process_tree_cpu_s(proc.pid)
        ended = [proc.stdout.readline() for _ in range(4)]  # four children burned 0.25 CPU seconds each, and ended
        later = compile_ahead.process_tree_cpu_s(proc.pid)
    finally:
        proc.kill()
        proc.wait()
    assert ended == ["ended\n"] * 4, ended
    # a snapshot of the living tree would see at most one living child's 0.25 s between the readings
    assert first is not None and later is not None and later - first >= 0.9, (first, later)


def test_a_stopped_worker_is_named_and_bypassed_and_capture_compiles_its_candidate(tmp_path, caplog, monkeypatch):
    assert compile_ahead.STALL_S <= 90  # the bound a user gets: a stopped worker costs at most this much
    monkeypatch.setattr(compile_ahead, "STALL_S", 6.0)  # the same rule, sooner (3 polls), so the test is short
    stopped_when_started()
    start = time.monotonic()
    with caplog.at_level("WARNING", logger="pipeline.compile.ahead"):
        ctx = run(compose_config([*WORKERS, f"compile_cache.dir={SUITE_CACHE}"]), tmp_path / "run")
    assert time.monotonic() - start < 120
    warned = [r.getMessage() for r in caplog.records if "did not finish" in r.getMessage()]
    assert len(warned) == 1 and "made no progress for 6 s" in warned[0] and "capture compiles it" in warned[0]
    assert ctx.outcomes["inductor"].status == "ok" and ctx.outcomes["inductor"].cost.ahead_s == 0
    assert not workers_of(os.getpid())  # stopped, not left behind


def stopped_when_started() -> None:
    """Stop (SIGSTOP) this process's first compile worker as soon as it starts, from a thread: its job then lasts
    as long as the test wants."""
    def stop_the_worker() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            for pid in workers_of(os.getpid()):
                os.kill(pid, signal.SIGSTOP)
                return
            time.sleep(0.2)

    threading.Thread(target=stop_the_worker, daemon=True).start()


def test_a_wait_bounded_in_time_leaves_the_job_running_for_a_later_wait():
    """``wait(name, within)`` returns None once ``within`` seconds pass with the job unfinished, and leaves it
    running: the caller drops it (capture, its budget spent) or waits again."""
    with ahead_of(["inductor"], workers=1) as ahead:
        [worker] = ahead.workers
        worker.signal(signal.SIGSTOP)
        assert ahead.wait("inductor", within=1.0) is None
        assert worker.process.poll() is None and not worker.gone
        worker.signal(signal.SIGCONT)
        assert ahead.wait("inductor") is not None


def test_a_jobs_time_bound_counts_from_when_its_worker_took_it_not_its_time_in_the_queue(monkeypatch):
    """A job queued behind a long one (a max-autotune reference takes 4-9 min on an H100, bench/results/README.md)
    is not stopped for the minutes it waited: the bound counts from when its worker took it, less the pauses while
    the host was timed. The running job's own bound still ends the worker, whichever job is waited for."""
    monkeypatch.setattr(compile_ahead, "STALL_S", 600.0)  # the stopped worker below is the job's length, not a stall
    bound = ["compile_cache.job_timeout_s=8"]
    with ahead_of(["inductor.bf16", "inductor"], workers=1, overrides=bound) as ahead:
        [worker] = ahead.workers
        with ahead.paused():  # the first job's clock stops; the second, queued, waits all the while
            time.sleep(9)
        assert ahead.wait("inductor") is not None, worker.gone
    with ahead_of(["inductor.bf16", "inductor"], workers=1, overrides=bound) as ahead:
        [worker] = ahead.workers
        worker.signal(signal.SIGSTOP)
        time.sleep(9)
        assert ahead.wait("inductor") is None  # the running job ahead of it ran past the bound: compiled in the run
        assert "inductor.bf16's job past compile_cache.job_timeout_s=8 s" in worker.gone
        assert worker.process.poll() is not None
        failed = ahead.wait("inductor.bf16")  # the job that ran past it: its candidate fails
        assert failed and "not compiled again in the run's process" in failed["timed_out"], failed


def test_a_candidate_whose_workers_job_runs_past_its_bound_fails_with_the_reason_and_is_not_compiled_again(
        tmp_path, caplog, monkeypatch):
    """A job past ``compile_cache.job_timeout_s`` (a compile still busy, or hung on the device with its CPU spinning)
    was compiled again in the run's process, as long again or hung for good; now its candidate fails, named, the
    run goes on and leaves no worker behind."""
    monkeypatch.setattr(compile_ahead, "STALL_S", 600.0)  # the stopped worker reads as a job that never ends
    stopped_when_started()
    with caplog.at_level("INFO"):
        ctx = run(compose_config([*WORKERS, f"compile_cache.dir={SUITE_CACHE}", "compile_cache.job_timeout_s=3"]),
                  tmp_path / "run")
    outcome = ctx.outcomes["inductor"]
    assert outcome.status == "failed" and "job past compile_cache.job_timeout_s=3 s" in outcome.reason, outcome
    assert "not compiled again in the run's process" in outcome.reason and outcome.cost.compile_s == 0
    assert outcome.cost.wait_s >= 3 and ctx.outcomes["eager"].status == "ok"
    assert "capture compiles it itself" not in caplog.text
    assert not workers_of(os.getpid())


@pytest.mark.parametrize("value", ["0", "-60"])
def test_a_job_bound_that_is_not_a_positive_number_of_seconds_is_refused_in_one_line(value):
    with pytest.raises(ConfigError, match=f"compile_cache.job_timeout_s={value} must be a positive number of seconds"):
        check_config(compose_config([*TINY, f"compile_cache.job_timeout_s={value}"]))


def test_capture_waits_for_a_workers_job_no_longer_than_the_tunes_budget(tmp_path, caplog):
    """GPT-Neo's max-autotune reference compiled for over 8 min in its worker on an H100 while the run, its budget of
    524 s spent, waited for it until the suite's bench killed it (call BP, 2026-12-06). The budget bounds the wait:
    the candidate is skipped with the reason and its worker stopped, and the run goes on (the worker here is
    stopped outright, a job that would never end; STALL_S, 60 s, is far off)."""
    stopped_when_started()
    with caplog.at_level("INFO"):
        ctx = run(compose_config([*WORKERS, f"compile_cache.dir={SUITE_CACHE}", "tune.budget_s=10"]), tmp_path / "run")
    outcome = ctx.outcomes["inductor"]
    assert outcome.status == "skipped" and "tune.budget_s=10 spent" in outcome.reason, outcome.reason
    assert "of it waiting for its compile worker's job" in outcome.reason and outcome.cost.wait_s > 1, outcome
    assert outcome.cost.wait_s < compile_ahead.STALL_S  # cut by the budget, not by the stall rule
    assert ctx.budget_skipped == {"inductor": outcome.reason} and ctx.outcomes["eager"].status == "ok"
    assert "did not finish" not in caplog.text  # dropped, not failed: capture does not compile it itself
    assert not workers_of(os.getpid())  # stopped, not left behind


KILLED_RUN = """
import sys, pipeline.runner as runner
from pipeline.api import compose_config
runner.run(compose_config(sys.argv[2:]), __import__("pathlib").Path(sys.argv[1]))
"""


def test_a_run_killed_outright_leaves_no_worker_behind(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", KILLED_RUN, str(tmp_path / "run"), *WORKERS,
                             f"compile_cache.dir={tmp_path / 'cache'}"], cwd=ROOT,
                            env={**clean_env(), "TWEAKPIPE_HOME": str(tmp_path / "home")},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not workers_of(proc.pid):
        assert time.monotonic() < deadline and proc.poll() is None, "no worker started"
        time.sleep(0.2)
    orphans = workers_of(proc.pid)
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + 10
    while any(Path(f"/proc/{pid}").exists() and b"pipeline.compile.worker" in Path(f"/proc/{pid}/cmdline").read_bytes()
              for pid in orphans if Path(f"/proc/{pid}/cmdline").exists()):
        assert time.monotonic() < deadline, f"worker(s) {orphans} outlived the run by 10 s"
        time.sleep(0.2)


def ahead_of(names: List[str], workers: int, overrides: Sequence[str] = (), settings: Mapping[str, dict] = {}):
    """Real compile workers started for ``names`` (inductor at a precision each, and ``settings`` of its own where
    given) on a tiny MLP, on the CPU, with the run's ``compile_cache`` config (and ``overrides`` to it)."""
    import torch
    from omegaconf import OmegaConf

    from pipeline.backends.candidate import Candidate
    from pipeline.batching import BatchDims, output_batch_dims
    from pipeline.compile.build import BuildSpec
    from pipeline.models import MLP

    model, device = MLP(width=16, depth=2).eval(), torch.device("cpu")
    cells = {bs: {"x": torch.randn(bs, 16)} for bs in (1, 4)}
    dims = output_batch_dims(model, lambda bs: {"x": torch.randn(bs, 16)})
    spec = BuildSpec(model, cells[4], device, range(1, 5), [1, 4], BatchDims(inputs={"x": 0}, outputs=dims))
    cache = compose_config([*TINY, f"compile_cache.dir={SUITE_CACHE}", *overrides]).compile_cache
    candidates = {n: Candidate.of(n, {"kind": "inductor", **({"precision": "bf16"} if "bf16" in n else {}),
                                      **settings.get(n, {})})
                  for n in names}
    return compile_ahead.started(candidates, spec, cells, 1, OmegaConf.to_container(cache, resolve=True), workers)


def test_a_worker_whose_running_job_is_dropped_with_none_after_it_is_stopped(caplog):
    """A dropped job that already runs takes cores the compiles still wanted: its worker stops, unless a job it could
    take is still queued (then the job finishes and the worker goes on to the next)."""
    caplog.set_level("INFO", logger="pipeline.compile.ahead")
    with ahead_of(["inductor.bf16", "inductor"], workers=1) as ahead:
        [worker] = ahead.workers
        assert worker.running == "inductor.bf16" and [c.name for c in ahead.queue.pending] == ["inductor"]
        ahead.drop("inductor.bf16")  # running, with the fp32 job queued: it goes on
        assert worker.process.poll() is None and ahead.working() and not worker.stopped
        assert ahead.wait("inductor") is not None  # and the job behind it is done as before
    with ahead_of(["inductor.bf16", "inductor"], workers=2) as ahead:
        first, second = ahead.workers
        assert first.running == "inductor.bf16" and not ahead.queue.pending and second.running == "inductor"
        ahead.drop("inductor.bf16")
        assert first.process.poll() is not None and first.stopped == ["inductor.bf16"]
        assert second.process.poll() is None and ahead.working()
        assert ahead.wait("inductor") is not None  # the other worker's job is untouched
    said = [r.getMessage() for r in caplog.records if "stopped, its running job" in r.getMessage()]
    assert said == ["compile ahead: worker 0 stopped, its running job (inductor.bf16) dropped and none left for it"]


def test_a_job_goes_to_whichever_worker_frees_up_first_not_behind_a_long_one(monkeypatch):
    """Jobs were dealt out in turn, so a job waited behind a long one (a max-autotune compile: minutes) on its worker
    while another sat idle (DistilBERT's ``reference.bf16``, 2026-12-06). Now each worker takes the next job as it
    frees up: with the first worker held up, the third job goes to the second, after its own."""
    monkeypatch.setattr(compile_ahead, "STALL_S", 600.0)  # the stopped worker is a long compile here, not a stall
    nofuse = {"inductor_nofuse": {"options": {"epilogue_fusion": False}}}
    with ahead_of(["inductor.bf16", "inductor", "inductor_nofuse"], workers=2, settings=nofuse) as ahead:
        first, second = ahead.workers
        assert (first.running, second.running) == ("inductor.bf16", "inductor")
        first.signal(signal.SIGSTOP)  # a long compile
        try:
            assert ahead.wait("inductor_nofuse", within=240) is not None, (second.gone, first.gone)
            assert ahead.queue.taken["inductor_nofuse"] is second and first.running == "inductor.bf16"
            assert not first.gone and not second.gone
        finally:
            first.signal(signal.SIGCONT)


def test_autotuning_jobs_go_first_to_one_worker_of_every_core_one_after_another_and_the_others_to_the_rest(
        monkeypatch):
    """The worker compiling on every core takes an autotuning job at once, though it is queued after a likely winner,
    and the next one after it (no two autotune beside each other); the other workers, on a share of the cores, take
    the rest and never an autotuning job while that worker lives; a lone worker takes them in priority order."""
    monkeypatch.setattr(compile_ahead, "STALL_S", 600.0)  # the held-up worker is a long autotuning compile here
    tuned = {name: {"mode": "max-autotune-no-cudagraphs", "fullgraph": name.endswith("2")}
             for name in ("inductor_tuned", "inductor_tuned2")}
    with ahead_of(["inductor_tuned", "inductor_tuned2", "inductor.bf16"], workers=2, settings=tuned) as ahead:
        assert ahead.queue.autotuning == {"inductor_tuned", "inductor_tuned2"}
        first, second = ahead.workers
        assert first.heavy and not second.heavy
        assert (first.running, second.running) == ("inductor_tuned", "inductor.bf16")
        first.signal(signal.SIGSTOP)
        try:
            assert ahead.wait("inductor.bf16", within=240) is not None, second.gone
            # the other worker is free, and waits: the second autotuning job is the first worker's, after its first
            assert [c.name for c in ahead.queue.pending] == ["inductor_tuned2"] and second.running is None
        finally:
            first.signal(signal.SIGCONT)
    with ahead_of(["inductor_tuned", "inductor.bf16"], workers=1, settings=tuned) as ahead:
        [worker] = ahead.workers
        assert worker.heavy and worker.running == "inductor.bf16"  # no other worker: the likely winner first


GRAPH_BREAK_SCRIPT = """
import torch, pipeline
from models_for_tests import GraphBreakMLP
torch.manual_seed(0)
pipeline.tune(GraphBreakMLP().eval(), torch.randn(4, 16), run_dir="run", overrides=[
    "device=cpu", "backends=[eager,inductor]", "profile=quick", "tracking=off", "model.batch_sizes=[1,4]",
    "compile_cache.workers=1", "compile_cache.standalone=true", "compile_cache.dir=CACHE"])
"""


def test_a_model_with_no_standalone_program_is_compiled_by_its_worker_as_ever_and_traced_with_the_reason(tmp_path):
    """compile_cache.standalone on a model whose graph breaks (no single graph to compile standalone): the worker
    falls back to the traced program, whose cache entries the run's own trace then hits, and the log says why.
    From a plain script: in the suite's process, what earlier tests traced is Dynamo's history too."""
    proc = script_run(tmp_path, GRAPH_BREAK_SCRIPT, ROOT / "tests")  # the worker imports the model
    assert proc.returncode == 0, proc.stderr[-3000:]
    said = [line for line in proc.stderr.splitlines() if "capture: inductor is traced here" in line]
    assert len(said) == 1 and "its standalone build failed" in said[0], proc.stderr[-3000:]
    cost = json.loads((tmp_path / "run" / "capture.json").read_text())["inductor"]["cost"]
    assert cost["ahead_s"] > 0 and cost["trace_s"] > 0 and cost["cache_misses"] == 0, (cost, proc.stderr[-3000:])
