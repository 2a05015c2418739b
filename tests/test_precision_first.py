"""Compile work ordered by what it can win: the precision-first screen, job priority, and the tune's budget."""

from __future__ import annotations

import json
import logging
import re

import pytest

from conftest import SUITE_CACHE, TINY
from pipeline.api import compose_config
from pipeline.backends.candidate import Candidate
from pipeline.compile import ahead
from pipeline.errors import ConfigError
from pipeline.measure.measurement import Measurement, Settings
from pipeline.measure.screening import numerics_out
from pipeline.preflight.checks import check_config
from pipeline.runner import run
from stages.capture import capture_order, capture_sequence

SLOW_AT_BF16 = ["model.build._target_=models_for_tests.SlowAtReducedPrecision", "~model.build.depth",
                "model.name=slow_at_bf16", "backends=[eager,inductor]", "precision=[fp32,bf16]",
                "model.batch_sizes=[1,8]"]


def cell(median: float, halfwidth: float = 0.02) -> Measurement:
    """A settled cell whose 20 samples spread evenly over median +- halfwidth."""
    m = Measurement(windows=[[median - halfwidth + i * 2 * halfwidth / 19 for i in range(20)]], passes=[0])
    m.settle(Settings.of({"rel_precision": 1.0, "noise_threshold": 10.0}))
    return m


def test_a_precision_is_screened_out_where_its_fastest_uncompiled_candidate_is_slower_by_the_margin_everywhere():
    cells = {"eager": {1: cell(1.0), 64: cell(10.0)}, "graph": {1: cell(0.5), 64: cell(9.0)},
             "eager.bf16-weights": {1: cell(0.9), 64: cell(3.0)}, "graph.bf16-weights": {1: cell(0.2), 64: cell(2.5)},
             "eager.bf16": {1: cell(1.2), 64: cell(5.0)}, "graph.bf16": {1: cell(0.25), 64: cell(4.0)}}
    numerics = {n: n.partition(".")[2] or "fp32" for n in cells}
    out = numerics_out(cells, numerics, list(cells), 1.5)
    # fp32's best (graph) is 2.5x and 3.6x slower than bf16-weights' (graph.bf16-weights); bf16 is close at 1
    assert set(out) == {"fp32"}
    assert out["fp32"].startswith("graph at fp32, the fastest that compile nothing, 2.50x slower than bf16-weights")
    # a candidate that may not serve (outside the accuracy budget) sets no pace: bf16 does
    servable = [n for n in cells if not n.endswith("bf16-weights")]
    out = numerics_out(cells, numerics, servable, 1.5)
    assert set(out) == {"fp32"} and "2.00x slower than bf16 at batch size 1" in out["fp32"]
    # a cell measured on a busy host shows nothing: fp32 is kept, though slower at 64 and at 1 by its other candidate
    cells["graph"][1].contention = "3 runnable tasks besides this run's on 2 cores"
    assert numerics_out(cells, numerics, list(cells), 1.5) == {}


def test_compile_jobs_and_capture_start_with_likely_winners_and_cheap_programs():
    def candidate(name: str, **settings) -> Candidate:
        return Candidate.of(name, {"kind": "graph", "compile_with_inductor": True, **settings})

    candidates = {"graph_inductor": candidate("graph_inductor"),
                  "graph_inductor.bf16": candidate("graph_inductor.bf16", precision="bf16"),
                  "graph_inductor.bf16-weights": candidate("graph_inductor.bf16-weights", precision="bf16",
                                                           cast_weights=True),
                  "graph_inductor_regional.bf16-weights": candidate("graph_inductor_regional.bf16-weights",
                                                                    precision="bf16", cast_weights=True, regional=True),
                  "graph.bf16": Candidate.of("graph.bf16", {"kind": "graph", "precision": "bf16"})}
    assert capture_order(candidates) == ["graph.bf16", "graph_inductor_regional.bf16-weights",
                                         "graph_inductor.bf16-weights", "graph_inductor.bf16", "graph_inductor"]
    assert ahead.priority(candidates["graph_inductor.bf16-weights"]) < ahead.priority(candidates["graph_inductor"])


def test_capture_builds_what_is_ready_while_a_worker_still_compiles_and_a_reference_peer_after_the_rest():
    """The user's max-autotune compile takes minutes: capture builds the later candidates whose jobs are done (or who
    compile nothing) first, then waits for the others that are no reference, and builds the reference after them
    unless its job ends before; the order is unchanged where every job is done."""
    from dataclasses import replace

    names = ["inductor.bf16-weights", "reference_max_autotune.bf16-weights", "inductor.bf16", "graph_inductor.bf16",
             "reference.bf16"]
    candidates = {n: Candidate.of(n, {"kind": "inductor"}) for n in names}
    for n in ("reference_max_autotune.bf16-weights", "reference.bf16"):
        candidates[n] = replace(candidates[n], reference="max-autotune")
    done = {"inductor.bf16-weights", "inductor.bf16"}
    built = []
    for name in capture_sequence(names, candidates, done.__contains__):
        built.append(name)
        if name == "inductor.bf16":
            done.add("reference.bf16")  # a job that ends meanwhile is taken in its turn
    assert built == ["inductor.bf16-weights", "inductor.bf16", "reference.bf16", "graph_inductor.bf16",
                     "reference_max_autotune.bf16-weights"]
    assert list(capture_sequence(names, candidates, lambda n: True)) == names
    # nothing ready: the references wait behind the rest, in their order
    assert list(capture_sequence(names, candidates, lambda n: False)) == [
        "inductor.bf16-weights", "inductor.bf16", "graph_inductor.bf16", "reference_max_autotune.bf16-weights",
        "reference.bf16"]
    # a likely winner still compiling lets a later one whose job is done go first, then is waited for
    assert list(capture_sequence(names, candidates, {"inductor.bf16", "graph_inductor.bf16"}.__contains__)) == [
        "inductor.bf16", "graph_inductor.bf16", "inductor.bf16-weights", "reference_max_autotune.bf16-weights",
        "reference.bf16"]


def test_a_precision_slower_without_compiling_gets_no_compiled_candidate_and_no_compile_job(tmp_path, caplog):
    caplog.set_level(logging.INFO)
    # threads=1: on CI's 2 cores, another test's compile leaves this run a free core, so its cells are not contended
    overrides = [*TINY, *SLOW_AT_BF16, "compile_cache.workers=1", f"compile_cache.dir={SUITE_CACHE}", "threads=1"]
    ctx = run(compose_config(overrides), tmp_path / "screened")
    outcomes = ctx.outcomes
    assert outcomes["inductor"].status == "ok", outcomes["inductor"].reason
    assert "compile ahead: 1 worker(s) paused" in caplog.text  # the precision screen timed with its worker stopped
    assert ctx.step_seconds["capture.precision_screen"] > 0  # its seconds, which no candidate's account holds
    route = json.loads((tmp_path / "screened" / "route.json").read_text())
    dropped = set(route["precision_screen"])
    if "measured on a busy host" in caplog.text:  # another test's compile took both cores: a cell settles nothing
        assert dropped <= {"bf16", "bf16-weights"}  # and only what quiet cells showed slower everywhere may drop
    else:
        assert dropped == {"bf16", "bf16-weights"} and "slower than fp32" in route["precision_screen"]["bf16"]
        # the bf16-weights job was the worker's first (the likeliest winner), so it ran; the autocast one never started,
        # nor did the max-autotune reference peer's (the precision screen applies to references too)
        never = re.search(r"job\(s\) never started, their candidates dropped first: (.*)", caplog.text)
        assert never and {"inductor.bf16", "reference_max_autotune.bf16-weights"} == \
            set(never.group(1).split(", ")), caplog.text[-2000:]
    for name in ("inductor.bf16", "inductor.bf16-weights"):
        if ctx.candidates[name].numerics in dropped:
            assert outcomes[name].status == "skipped" and "precision screen" in outcomes[name].reason, outcomes[name]
            assert outcomes[name].within_budget  # not built is not outside the budget
        else:
            assert outcomes[name].status == "ok", outcomes[name].reason
    # the contrast needs only the screened precisions' Inductor candidates built (no reference peers: half the compiles)
    kept = run(compose_config([*overrides, "profile.precision_screen=false", "compile_cache.workers=0",
                               "reference=false"]), tmp_path / "kept")
    assert all(kept.outcomes[n].status == "ok" for n in ("inductor.bf16", "inductor.bf16-weights"))
    assert json.loads((tmp_path / "kept" / "route.json").read_text())["precision_screen"] == {}


def test_a_spent_budget_skips_the_candidates_not_built_and_profiles_one_pass_and_validation_still_runs(tmp_path):
    ctx = run(compose_config([*TINY, "backends=[eager,inductor]", "compile_cache.workers=0", "tune.budget_s=0.001"]),
              tmp_path / "run")
    assert ctx.outcomes["eager"].status == "ok"  # the baseline is always built
    inductor = ctx.outcomes["inductor"]
    assert inductor.status == "skipped" and "tune.budget_s=0.001 spent" in inductor.reason
    budget = json.loads((tmp_path / "run" / "route.json").read_text())["budget"]
    assert budget["budget_s"] == 0.001 and set(budget["skipped"]) == {"inductor", "reference_max_autotune"}  # the
    # references are capped like the others (inductor plays the default-mode one)
    assert "one pass" in budget["profile"]
    assert {m.passes[-1] for per in ctx.profile.values() for m in per.values()} == {0}
    assert ctx.validation["ok"]


@pytest.mark.parametrize("value", ["0", "-5"])
def test_a_budget_that_is_not_a_positive_number_of_seconds_is_refused_in_one_line(value):
    with pytest.raises(ConfigError, match=f"tune.budget_s={value} must be a positive number of seconds"):
        check_config(compose_config([*TINY, f"tune.budget_s={value}"]))
