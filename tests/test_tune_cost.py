"""The tool's own cost: compile once through the shared caches, compile ahead in workers, screen before timing,
re-measure only where the route rests, and account for every second."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import List

import pytest
import torch
from mlflow.tracking import MlflowClient

from conftest import ROOT, TINY
from redis_helpers import free_port, redis_server
from pipeline.api import compose_config
from pipeline.preflight.checks import candidates_of, check_config
from pipeline.errors import ConfigError
from pipeline.context import BackendOutcome, RunContext
from pipeline.compile.cost import CandidateCost
from pipeline.measure.measurement import Measurement, Settings
from pipeline.measure.screening import screen_sizes, screened_out
from pipeline.route.decision import contested, decide
from pipeline.runner import run
from stages import profile as profile_stage
from stages import route as route_stage

CAPTURE_INDUCTOR = [*TINY, "backends=[eager,inductor]", "stages=[capture]", "compile_cache.workers=0"]


def inductor_cost(tmp_path: Path, name: str, *overrides: str) -> CandidateCost:
    ctx = run(compose_config([*CAPTURE_INDUCTOR, *overrides]), tmp_path / name)
    assert ctx.outcomes["inductor"].status == "ok", ctx.outcomes["inductor"].reason
    saved = json.loads((tmp_path / name / "capture.json").read_text())["inductor"]["cost"]
    assert saved == ctx.outcomes["inductor"].cost.to_dict()  # capture.json holds the account
    return ctx.outcomes["inductor"].cost


def test_a_second_run_loads_its_programs_from_the_cache_and_a_changed_option_compiles_again(tmp_path):
    cache = f"compile_cache.dir={tmp_path / 'cache'}"
    first = inductor_cost(tmp_path, "first", cache)
    assert first.cache_misses >= 1 and first.cache_hits == 0 and first.compile_s > 0 and first.trace_s > 0
    assert any((tmp_path / "cache").iterdir())  # the configured directory, not torch's default
    second = inductor_cost(tmp_path, "second", cache)
    assert (second.cache_hits, second.cache_misses) == (first.cache_misses, 0)
    changed = inductor_cost(tmp_path, "changed", cache, "backends.inductor.mode=null",
                            "+backends.inductor.options={max_fusion_size: 32}")
    assert changed.cache_misses >= 1 and changed.cache_hits == 0
    off = inductor_cost(tmp_path, "off", cache, "compile_cache.enabled=false")
    assert off.cache_hits == 0  # enabled=false: every compile cold, though the cache holds the program


def test_compile_workers_fill_the_cache_before_capture_builds_the_candidate(tmp_path):
    cost = inductor_cost(tmp_path, "ahead", f"compile_cache.dir={tmp_path / 'cache'}", "compile_cache.workers=1")
    assert cost.ahead_s > 0  # a worker process compiled it first
    # eager is built in a moment, so capture then waits for the worker: seconds of the run's own, in its total
    assert cost.wait_s > 0 and cost.total_s >= cost.build_s + cost.check_s + cost.wait_s
    steps = json.loads((tmp_path / "ahead" / "cost.json").read_text())["step_s"]  # capture's seconds of no candidate
    assert set(steps) == {"capture.eager_outputs", "capture.workers_setup", "capture.workers_stop"}, steps
    assert cost.cache_hits >= 1 and cost.cache_misses == 0  # so capture loaded every program it needed
    # compile_cache.standalone left null is off on the CPU: the run traced its program (a hit), as its checkpoint's
    # AOTInductor package is held to the traced program; on CUDA the worker's standalone program serves untraced
    assert cost.trace_s > 0


def test_the_runs_own_compiler_options_and_precision_reach_the_workers(tmp_path, caplog, monkeypatch):
    # An Inductor option, a Dynamo option (``.item()`` captured in the graph instead of breaking it: other graphs)
    # and a matmul precision the user's script set before tuning: a fresh worker process is at torch's defaults
    # unless the run sends them (compile.state); with them its programs are the run's.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT / "tests"), str(ROOT)]))  # the worker imports the model
    before = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("medium")
        with torch._inductor.config.patch(max_fusion_size=32), \
                torch._dynamo.config.patch(capture_scalar_outputs=True), \
                caplog.at_level(logging.WARNING, logger="stages.capture"):
            cost = inductor_cost(tmp_path, "options", f"compile_cache.dir={tmp_path / 'cache'}",
                                 "compile_cache.workers=1", "model.build._target_=models_for_tests.GraphBreakMLP",
                                 "~model.build.depth")
    finally:
        torch.set_float32_matmul_precision(before)
    assert cost.ahead_s > 0 and cost.cache_hits >= 1 and cost.cache_misses == 0
    assert not [r for r in caplog.records if "missed the cache" in r.getMessage()]


def test_a_worker_whose_program_differs_from_the_runs_is_named_in_a_warning(tmp_path, caplog):
    # Process state a worker cannot be sent (here a custom Inductor pass of the user's, an object that does not
    # pickle, whose uuid enters the cache key) makes the worker's program miss, and the run compiles again: the log
    # must say so, not only the cost table.
    from torch._inductor.custom_graph_pass import CustomGraphPass

    class UsersPass(CustomGraphPass):
        def __call__(self, graph: torch.fx.Graph) -> None:
            return None

        def uuid(self) -> str:
            return "the-users-own-pass"

    with torch._inductor.config.patch(post_grad_custom_post_pass=UsersPass()), \
            caplog.at_level(logging.WARNING, logger="stages.capture"):
        cost = inductor_cost(tmp_path, "differs", f"compile_cache.dir={tmp_path / 'cache'}", "compile_cache.workers=1")
    assert cost.ahead_s > 0 and cost.cache_misses >= 1
    warned = [r.getMessage() for r in caplog.records if "compile ahead: inductor missed the cache" in r.getMessage()]
    assert len(warned) == 1 and "compiled it twice" in warned[0], [r.getMessage() for r in caplog.records]


def test_a_job_on_another_machine_loads_what_the_first_compiled_from_redis(tmp_path):
    with redis_server() as server:
        remote = f"compile_cache.remote=redis://127.0.0.1:{server.port}"
        first = inductor_cost(tmp_path, "first", f"compile_cache.dir={tmp_path / 'machine_a'}", remote)
        assert first.cache_misses >= 1
        # Another machine: its own, empty local cache; only the Redis server holds the programs.
        second = inductor_cost(tmp_path, "second", f"compile_cache.dir={tmp_path / 'machine_b'}", remote)
        assert second.cache_hits == first.cache_misses and second.cache_misses == 0


def test_a_remote_cache_that_does_not_answer_is_one_line_before_any_work(tmp_path):
    for url, message in ((f"redis://127.0.0.1:{free_port()}", "no Redis server answers at"),
                         ("http://cache:6379", "is not a Redis address")):
        with pytest.raises(ConfigError, match=message):
            check_config(compose_config([*TINY, f"compile_cache.remote={url}"]))
    with pytest.raises(ConfigError, match="compile_cache.workers=-1 must be >= 0"):
        check_config(compose_config([*TINY, "compile_cache.workers=-1"]))


def cell(median: float, halfwidth: float, count: int = 20) -> Measurement:
    """A settled cell whose samples spread evenly over median +- halfwidth."""
    step = 2 * halfwidth / (count - 1)
    samples = [median - halfwidth + i * step for i in range(count)]
    m = Measurement(windows=[samples], passes=[0])
    m.settle(Settings.of({"rel_precision": 1.0, "noise_threshold": 10.0}))
    return m


def test_the_screen_drops_only_what_is_slower_by_the_margin_everywhere_beyond_both_intervals():
    cells = {
        "fast": {1: cell(1.0, 0.05), 8: cell(2.0, 0.1), 64: cell(10.0, 0.5)},
        "slow": {1: cell(2.0, 0.05), 8: cell(4.0, 0.1), 64: cell(20.0, 0.5)},  # 2x everywhere
        "close": {1: cell(1.3, 0.05), 8: cell(4.0, 0.1), 64: cell(20.0, 0.5)},  # within 1.5x at 1
        "wide": {1: cell(2.0, 1.0), 8: cell(4.0, 0.1), 64: cell(20.0, 0.5)},  # 2x at 1, but its interval reaches 1.0
        "wins_once": {1: cell(3.0, 0.05), 8: cell(1.5, 0.1), 64: cell(30.0, 0.5)},
        "baseline": {1: cell(5.0, 0.05), 8: cell(10.0, 0.1), 64: cell(50.0, 0.5)},
        "unscreened": {1: cell(5.0, 0.05), 64: cell(50.0, 0.5)},  # no cell at 8: nothing shows it slow there
        "wrong": {1: cell(0.1, 0.01), 8: cell(0.1, 0.01), 64: cell(0.1, 0.01)},  # fastest, but may not serve
    }
    servable = [n for n in cells if n != "wrong"]
    out = screened_out(cells, servable, keep=["baseline"], margin=1.5)
    # 'fast' is 10x slower than 'wrong' everywhere, but only a candidate that may serve sets the pace
    assert set(out) == {"slow"}
    assert out["slow"].startswith("screened out: 2.00x slower than fast at batch size 1")


def test_the_screen_looks_at_the_smallest_a_middle_and_the_largest_size():
    assert screen_sizes([1, 3, 8, 17, 64]) == [1, 8, 64]
    assert screen_sizes([64, 1]) == [1, 64]
    assert screen_sizes([4]) == [4]
    assert screen_sizes([1, 2, 100, 128]) == [1, 2, 128]


def test_a_screened_out_candidate_keeps_its_numbers_in_route_json_and_mlflow(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    cfg = compose_config([*TINY, "backends=[eager]", "reference=false", "precision=[fp32,bf16]", "tracking=sqlite",
                          f"tracking.uri={uri}", "route.accuracy_budget.metric=max_rel_error",
                          "route.accuracy_budget.bound=1e-9", "validate.check_reload=false"])
    ctx = run(cfg, tmp_path / "run")
    route = json.loads((tmp_path / "run" / "route.json").read_text())
    assert set(route["screened_out"]) == {"eager.bf16", "eager.bf16-weights"}
    assert set(route["profile_medians_ms"]) == {"eager"}
    for name, entry in route["screened_out"].items():
        assert "outside the accuracy budget" in entry["reason"]
        assert set(entry["screen_ms"]) == {str(bs) for bs in screen_sizes(ctx.batch_sizes)}
        assert route["cost"]["candidates"][name]["screen_s"] > 0 and route["cost"]["candidates"][name]["profile_s"] == 0
    client = MlflowClient(tracking_uri=uri)
    run_id = json.loads((tmp_path / "run" / "mlflow_run.json").read_text())["run_id"]
    data = client.get_run(run_id).data
    assert "outside the accuracy budget" in data.tags["screened_out.eager.bf16"]
    assert {f"screen_ms/eager.bf16/bs{bs}" for bs in screen_sizes(ctx.batch_sizes)} <= set(data.metrics)
    assert data.metrics["tune_s"] > 0 and {"compile_s/eager", "cache_hits/eager", "build_s/eager"} <= set(data.metrics)
    assert "tune cost" in (tmp_path / "run" / "tweakpipe.log").read_text()


def test_a_candidate_is_not_built_at_a_precision_where_eager_is_far_outside_the_budget(tmp_path):
    cfg = compose_config([*TINY, "backends=[eager,inductor]", "precision=[fp32,bf16]", "stages=[capture]",
                          "route.accuracy_budget.metric=max_rel_error", "route.accuracy_budget.bound=1e-9"])
    ctx = run(cfg, tmp_path)
    assert not ctx.outcomes["eager.bf16"].within_budget
    for name in ("inductor.bf16", "inductor.bf16-weights"):
        outcome = ctx.outcomes[name]
        assert outcome.status == "skipped" and outcome.reason.startswith("not built: eager.bf16")
        assert "which a compiler's fusions do not recover" in outcome.reason or "eager.bf16-weights" in outcome.reason
    assert ctx.outcomes["inductor"].status == "ok"
    assert list(ctx.outcomes) == list(ctx.candidates)  # capture.json in config order whatever the build order


def contested_ctx(tmp_path: Path) -> RunContext:
    """A profile by hand, every cell noisy: inductor and onnxruntime within each other's noise at batch size 1,
    inductor alone fastest at 8, eager far slower at both."""
    cfg = compose_config([*TINY, "backends=[eager,inductor,onnxruntime]", "model.batch_sizes=[1,8]",
                          "profile.max_repeats=1"])
    ctx = RunContext(cfg=cfg, run_dir=tmp_path, device=torch.device("cpu"), model=torch.nn.Linear(2, 2),
                     inputs={"x": {"shape": [2], "dtype": "float32"}}, candidates=candidates_of(cfg))
    ctx.outcomes = {n: BackendOutcome(name=n, kind=n, status="ok") for n in ("eager", "inductor", "onnxruntime")}
    noisy = Settings.of({"rel_precision": 0.001, "noise_threshold": 10.0})
    for name, medians in (("eager", (10.0, 10.0)), ("inductor", (1.0, 1.0)), ("onnxruntime", (1.02, 3.0))):
        for bs, median in zip((1, 8), medians):
            m = Measurement(windows=[[median * (1 + 0.01 * i) for i in range(10)]], passes=[0])
            m.settle(noisy)  # median known to +-1%, against a target of 0.1%: flagged
            ctx.profile.setdefault(name, {})[bs] = m
    return ctx


def test_a_noisy_cell_is_measured_again_only_where_the_route_rests_on_it(tmp_path):
    ctx = contested_ctx(tmp_path)
    assert all(m.noisy for per in ctx.profile.values() for m in per.values())
    calls = lambda bs, names: {n: (lambda: None) for n in names}  # noqa: E731 -- instant calls: only windows count
    seen: List[tuple] = []
    taken = profile_stage.remeasure_contested(ctx, calls, lambda n, bs, m: seen.append((n, bs)))
    assert sorted(seen) == [("inductor", 1), ("onnxruntime", 1)] and taken == 2
    assert all(len(ctx.profile[n][1].windows) == 2 for n in ("inductor", "onnxruntime"))
    # At 8 no challenger's interval reaches the owner's, and eager is far slower everywhere: their flags stand.
    assert len(ctx.profile["inductor"][8].windows) == len(ctx.profile["onnxruntime"][8].windows) == 1
    assert all(len(m.windows) == 1 for m in ctx.profile["eager"].values())


def test_noise_is_a_warning_only_where_it_could_change_the_route(tmp_path, caplog):
    ctx = contested_ctx(tmp_path)
    with caplog.at_level(logging.INFO, logger="stages.route"):
        route_stage.warn_if_noise_could_change(ctx, contested(decide(ctx.race(), ctx.cfg.route).rests_on))
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "at 1 batch size(s) (bs=1: inductor vs onnxruntime)" in warnings[0]
    assert "profile=thorough" in warnings[0] and "threads=N" in warnings[0]
    caplog.clear()
    ctx.profile["onnxruntime"][1] = ctx.profile["onnxruntime"][8]  # now clearly slower at 1 too: no contest left
    with caplog.at_level(logging.INFO, logger="stages.route"):
        route_stage.warn_if_noise_could_change(ctx, contested(decide(ctx.race(), ctx.cfg.route).rests_on))
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]  # every cell is noisy, none could matter


def test_a_process_held_to_two_cores_of_a_big_host_starts_no_compile_workers():
    """The worker count reads the cores the run may use (affinity, cgroup quota), not the host's: under ``taskset`` or
    in a container given two CPUs of a 64-core host, 16 workers would share those two cores with the run."""
    import subprocess
    import sys
    script = ("import os; os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]}); os.cpu_count = lambda: 64; "
              "from pipeline.compile import ahead; "
              "print(ahead.worker_count(None, 4), ahead.compile_threads(0, 1))")
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["0", "[1]"], out.stdout + out.stderr


def test_inductor_and_graph_inductor_at_one_precision_share_one_compile_job():
    from pipeline.compile import ahead as compile_ahead

    candidates = candidates_of(compose_config(["backends=gpu", "precision=[fp32,bf16]",
                                                     "+backends.inductor_nofuse={kind: inductor, "
                                                     "options: {epilogue_fusion: false}}"]))
    jobs = compile_ahead.plan(candidates)
    assert jobs["inductor"] == jobs["graph_inductor"] == "graph_inductor"  # the graph one records every size
    assert jobs["inductor.bf16-weights"] == "graph_inductor.bf16-weights" != jobs["inductor.bf16"]
    assert jobs["inductor_nofuse"] == "inductor_nofuse"  # other options: another program
    assert "eager" not in jobs and "graph" not in jobs  # they compile nothing
    assert compile_ahead.worker_count(None, 4, cores=16) == 4 and compile_ahead.worker_count(None, 4, cores=2) == 0
    assert compile_ahead.worker_count(2, 1, cores=2) == 1  # never more workers than jobs
    # the worker of an autotuning job (the max-autotune reference) builds its templates on every core, the others
    # on a share: it outlasts their jobs by minutes
    gpu = candidates_of(compose_config(["backends=gpu", "precision=[bf16]"]), torch.device("cuda"))
    heavy = [n for n, c in gpu.items() if c.compiles and compile_ahead.autotunes(c)]
    assert heavy == ["reference_max_autotune.bf16-weights"]
    assert compile_ahead.heavy_count(len(heavy), 3) == 1 and compile_ahead.compile_threads(1, 3, cores=16) == [16, 5, 5]
    # one worker of every core takes the autotuning jobs one after another, the others the rest; a lone worker all
    assert compile_ahead.heavy_count(3, 4) == 1 and compile_ahead.heavy_count(5, 2) == 1
    assert compile_ahead.heavy_count(1, 1) == 1 and compile_ahead.heavy_count(0, 4) == 0


def test_a_jobs_compiled_programs_count_once_on_the_first_candidate_built_from_it():
    """``ahead_compiled`` was counted on the job's runner only: where the runner (a graph candidate) was skipped and
    the inductor candidate sharing its job was built, the tune's total lost the programs that job compiled."""
    from pipeline.compile.ahead import CompileAhead

    ahead = CompileAhead({"inductor": "graph_inductor", "graph_inductor": "graph_inductor"})
    job = {"seconds": 3.0, "compiled": 2}
    assert ahead.compiled_for("inductor", {**job, "shared_with": "graph_inductor"}) == 2  # its runner was skipped
    assert ahead.compiled_for("graph_inductor", job) == 0  # counted once in the tune's total
    assert CompileAhead({"graph_inductor": "graph_inductor"}).compiled_for("graph_inductor", job) == 2


def test_a_worker_builds_a_graph_candidates_standalone_program_by_its_inductor_side_alone():
    """The job a graph candidate runs for its group recorded device graphs at every recorded size in the worker
    though its standalone program is one for every size: cuDNN's plans again, beside capture (mobilenetv3: 72 s)."""
    from pipeline import backends
    from pipeline.backends.inductor import InductorBackend
    from pipeline.compile.worker import program_builder

    candidates = candidates_of(compose_config(["backends=gpu", "precision=[bf16]"]), torch.device("cuda"))
    graph_inductor = backends.create(candidates["graph_inductor.bf16-weights"])
    builder = program_builder(graph_inductor)
    assert isinstance(builder, InductorBackend) and builder.candidate is graph_inductor.candidate
    assert builder.inductor_options() == graph_inductor.inductor_options() and not builder.records_cuda_graphs
    inductor = backends.create(candidates["inductor.bf16-weights"])
    assert program_builder(inductor) is inductor  # already the program alone
    graph = backends.create(candidates["graph.bf16-weights"])
    assert program_builder(graph) is graph  # no Inductor side: it compiles nothing, and runs no job
