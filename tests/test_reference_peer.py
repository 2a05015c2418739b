"""The reference peers (the user's own torch.compile, once per mode of ``reference_modes``) in every profile: floors
for the router, the best of them compared at every tuned cell in route.json, MLflow and the report; played by the
run's own backend where that one is the same compile; one left unbuilt said plainly; ``reference=false`` leaves them
out."""

from __future__ import annotations

import json
import subprocess
import sys

import mlflow
import pytest
import torch
from torch import nn

import pipeline
from pipeline.route.figures import figure_name, reference_figures
from pipeline.backends import reference
from pipeline.errors import ConfigError
from pipeline.preflight.checks import candidates_of, check_config
from pipeline.record import report
from pipeline.route import versus
from pipeline.route.decision import Race, decide
from pipeline.route.policy import Range, choose_route, owners_with
from pipeline.config.schema import RouteConfig

TIGHT = {b: {1: (ms * 0.99, ms * 1.01)} for b, ms in (("eager", 1.0), ("inductor", 0.97), ("reference", 0.94))}
PROFILE = {"eager": {1: 1.0}, "inductor": {1: 0.97}, "reference": {1: 0.94}}


def test_a_servable_reference_is_a_floor_the_router_never_serves_below():
    # 6% faster than eager: under route.min_gain=0.10 no challenger, but faster beyond both intervals.
    order = list(PROFILE)
    assert owners_with("eager", PROFILE, order, 0.10, "eager", TIGHT) == {1: "eager"}
    assert owners_with("eager", PROFILE, order, 0.10, "eager", TIGHT, ["reference"]) == {1: "reference"}
    # Within the noise, 6% faster by median is still a floor (route.policy.REFERENCE_SLACK: 2%); 1% is not, and
    # eager as the baseline floors beyond both intervals only.
    loose = {b: {1: (0.8, 1.2)} for b in PROFILE}
    assert owners_with("eager", PROFILE, order, 0.10, "eager", loose, ["reference"]) == {1: "reference"}
    near = {**PROFILE, "reference": {1: 0.99}}
    assert owners_with("eager", near, order, 0.10, "eager", loose, ["reference"]) == {1: "eager"}
    assert owners_with("inductor", {**PROFILE, "eager": {1: 0.9}}, order, 0.10, "eager", loose) == {1: "inductor"}
    # One that may not serve is no floor.
    route = choose_route(PROFILE, order, min_gain=0.10, baseline="eager", intervals=TIGHT, references=["reference"],
                         failures={"reference": "outside the accuracy budget"})
    assert [r.backend for r in route] == ["inductor"]  # the fastest that may serve, not the reference
    two = {b: PROFILE[b] for b in ("eager", "reference")}
    assert [r.backend for r in choose_route(two, list(two), min_gain=0.10, baseline="eager", intervals=TIGHT,
                                            references=["reference"])] == ["reference"]


def test_a_cell_measured_on_a_busy_host_is_marked_and_left_out_of_the_summaries():
    """Issue 54: a speed-up that rests on a contended cell (auto's or the reference's) is no result."""
    medians = {"eager": {1: 1.0, 8: 2.0}, "reference": {1: 0.5, 8: 4.0}}
    intervals = {b: {k: (v * 0.99, v * 1.01) for k, v in per.items()} for b, per in medians.items()}
    found = versus.comparison({1: "eager", 8: "eager"}, medians, intervals, {"reference": "default"}, {}, "router",
                              contended={("reference", 1)})
    assert [c["contended"] for c in found["cells"]] == [True, False] and found["contended_cells"] == 1
    assert found["worst_speedup"] == found["geomean_speedup"] == 2.0  # bs 8 alone
    everywhere = versus.comparison({1: "eager", 8: "eager"}, medians, intervals, {"reference": "default"}, {},
                                   "router", lambda cell: {"batch_size": cell}, contended={("eager", 1), ("eager", 8)})
    assert everywhere["worst_speedup"] is None and everywhere["geomean_speedup"] is None
    assert reference_figures(everywhere) == {"contended_speedup_vs_compile/bs1": 0.5,
                                             "contended_speedup_vs_compile/bs8": 2.0}


def test_the_comparison_names_each_slower_cell_with_its_reason():
    medians = {"eager": {1: 1.0, 8: 2.0}, "reference": {1: 0.5, 8: 4.0}}
    intervals = {b: {k: (v * 0.99, v * 1.01) for k, v in per.items()} for b, per in medians.items()}
    found = versus.comparison({1: "eager", 8: "eager"}, medians, intervals, {"reference": "default"},
                              {"reference": "outside the accuracy budget"}, "router")
    assert [c["speedup"] for c in found["cells"]] == [0.5, 2.0]
    assert found["worst_speedup"] == 0.5 and found["geomean_speedup"] == pytest.approx(1.0)
    [slower] = found["slower_cells"]
    assert slower["cell"] == 1 and slower["reason"] == "reference cannot serve: outside the accuracy budget"
    found = versus.comparison({1: "eager"}, medians, intervals, {"reference": "default"}, {}, "first_wins")
    assert "route.strategy=first_wins does not hold the route" in found["slower_cells"][0]["reason"]
    assert versus.comparison({1: "eager"}, medians, intervals, {}, {}, "router") is None


def test_the_run_s_own_backend_plays_the_reference_where_it_is_the_same_compile(compose_cfg):
    cpu = torch.device("cpu")
    played = candidates_of(compose_cfg(["backends=[eager,inductor]", "precision=[fp32]"]), cpu)
    assert list(played) == ["eager", "inductor", "reference_max_autotune"] and played["inductor"].reference == "default"
    assert not played["eager"].reference
    added = candidates_of(compose_cfg(["backends=[eager,inductor_freezing]"]), cpu)
    assert list(added) == ["eager", "inductor_freezing", "reference", "reference_max_autotune"]
    assert added["reference"].reference == "default" and added["reference"].settings.mode == "default"
    both = candidates_of(compose_cfg(["backends=[eager,inductor,inductor_max_autotune_no_cudagraphs]"]), cpu)
    assert {n: c.reference for n, c in both.items() if c.reference} == {
        "inductor": "default", "inductor_max_autotune_no_cudagraphs": "max-autotune"}  # nothing built twice
    gpu = reference.with_reference({"eager": {"kind": "eager"}, "inductor": {"kind": "inductor", "mode": "default"}},
                                   "cuda")
    assert gpu[1] == {"reference": "reduce-overhead", "reference_max_autotune": "max-autotune"}
    assert [gpu[0][n]["mode"] for n in gpu[1]] == ["reduce-overhead", "max-autotune"]
    off = candidates_of(compose_cfg(["backends=[eager,inductor_freezing]", "reference=false",
                                     "reference_modes=[max-autotune]"]), cpu)
    assert list(off) == ["eager", "inductor_freezing"] and not any(c.reference for c in off.values())
    with pytest.raises(ConfigError, match="named 'reference'"):
        reference.with_reference({"reference": {"kind": "eager"}}, "cpu")
    with pytest.raises(ConfigError, match="named 'reference_max_autotune'"):
        reference.with_reference({"reference_max_autotune": {"kind": "eager"}}, "cpu")


def test_each_reference_mode_is_a_candidate_of_its_own_at_every_precision(compose_cfg):
    cfg = compose_cfg(["backends=[eager]", "precision=[fp32,bf16]"])
    on_gpu = candidates_of(cfg, torch.device("cuda"))
    refs = {n: (c.reference, c.settings.mode) for n, c in on_gpu.items() if c.reference}
    assert refs == {"reference": ("reduce-overhead", "reduce-overhead"),
                    "reference_max_autotune": ("max-autotune", "max-autotune"),
                    "reference.bf16": ("reduce-overhead", "reduce-overhead"),
                    "reference.bf16-weights": ("reduce-overhead", "reduce-overhead"),
                    "reference_max_autotune.bf16-weights": ("max-autotune", "max-autotune")}
    # the max-autotune reference's autocast form is not built: the cast-weights form only, after the first mode; a
    # backend of the run's own that plays one keeps both its forms
    mine = candidates_of(compose_cfg(["backends=[eager,inductor]", "precision=[bf16]", "backends.inductor.mode="
                                      "max-autotune", "reference_modes=[reduce-overhead,max-autotune]"]),
                         torch.device("cuda"))
    assert {n: c.reference for n, c in mine.items() if c.reference} == {
        "inductor.bf16": "max-autotune", "reference.bf16": "reduce-overhead",
        "inductor.bf16-weights": "max-autotune", "reference.bf16-weights": "reduce-overhead"}
    first = candidates_of(compose_cfg(["backends=[eager]", "precision=[bf16]", "reference_modes=[max-autotune]"]),
                          torch.device("cuda"))
    assert [n for n, c in first.items() if c.reference] == ["reference_max_autotune.bf16",
                                                           "reference_max_autotune.bf16-weights"]
    # On a CPU torch.compile records no CUDA graphs: max-autotune compiles as max-autotune-no-cudagraphs (which the
    # run's checks take there), and reduce-overhead is the default compile, one reference with it.
    cpu = candidates_of(compose_cfg(["backends=[eager]", "reference_modes=[reduce-overhead,default,max-autotune,"
                                     "max-autotune-no-cudagraphs]"]), torch.device("cpu"))
    assert {n: (c.reference, c.settings.mode) for n, c in cpu.items() if c.reference} == {
        "reference": ("default", "default"), "reference_max_autotune": ("max-autotune", "max-autotune-no-cudagraphs")}
    one = candidates_of(compose_cfg(["backends=[eager]", "reference_modes=[max-autotune]"]), torch.device("cuda"))
    assert [n for n, c in one.items() if c.reference] == ["reference_max_autotune"]
    assert 'mode="max-autotune"' in one["reference_max_autotune"].settings.description


def test_the_router_respects_the_max_autotune_reference_where_it_is_fastest(compose_cfg):
    candidates = candidates_of(compose_cfg(["backends=[eager,graph_inductor]"]), torch.device("cuda"))
    refs = {n: c.reference for n, c in candidates.items() if c.reference}
    # At 8 reduce-overhead is slower than the route's owner, max-autotune 6% faster: under min_gain, no challenger,
    # but beyond both intervals, so the max-autotune reference is the floor there; at 1 graph_inductor leads.
    medians = {"eager": {1: 1.0, 8: 4.0}, "graph_inductor": {1: 0.2, 8: 2.0}, "reference": {1: 0.4, 8: 2.4},
               "reference_max_autotune": {1: 0.3, 8: 1.88}}
    assert set(medians) == set(candidates)
    intervals = {b: {k: (v * 0.99, v * 1.01) for k, v in per.items()} for b, per in medians.items()}
    race = Race(medians, intervals, list(candidates), {}, "eager", references=list(refs))
    route = decide(race, RouteConfig()).route
    assert route == [Range(1, 1, "graph_inductor"), Range(2, None, "reference_max_autotune")]
    owners = {1: "graph_inductor", 8: "reference_max_autotune"}
    found = versus.comparison(owners, medians, intervals, refs, {}, "router")
    assert [(c["reference"], c["reference_mode"], c["speedup"]) for c in found["cells"]] == [
        ("reference_max_autotune", "max-autotune", pytest.approx(1.5)), ("reference_max_autotune", "max-autotune", 1.0)]
    assert found["modes"] == {"reference": "reduce-overhead", "reference_max_autotune": "max-autotune"}
    # Without it among the references, graph_inductor would keep 8, slower than the user's max-autotune compile.
    only = Race(medians, intervals, list(candidates), {}, "eager", references=["reference"])
    assert decide(only, RouteConfig()).route == [Range(1, None, "graph_inductor")]


@pytest.mark.parametrize("modes, says", [("[max_autotune]", "reference_modes 'max_autotune' is unknown"),
                                         ("[]", "names no torch.compile mode"),
                                         ("[default,default]", "lists default more than once")])
def test_a_bad_reference_mode_is_one_line_naming_the_valid_modes(compose_cfg, modes, says):
    with pytest.raises(ConfigError) as caught:
        check_config(compose_cfg(["model=tiny_mlp", "backends=[eager]", f"reference_modes={modes}"]))
    message = str(caught.value)
    assert says in message and "\n" not in message
    if "unknown" in says:
        assert all(m in message for m in ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"))


def test_the_command_line_answers_a_bad_reference_mode_in_one_line():
    for override, says in (("reference_modes=[fast]", "reference_modes 'fast' is unknown; use some "
                                                      "of ['default', 'reduce-overhead', 'max-autotune', "
                                                      "'max-autotune-no-cudagraphs']"),
                           ("reference.modes=[default]", "reference is a value, not a section; closest: "
                                                         "reference_modes")):
        proc = subprocess.run([sys.executable, "-m", "pipeline", "model=tiny_mlp", "tracking=off", override],
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert says in proc.stderr


class Small(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """CPU runs: with the reference peers of the default modes (added: the run's backends are eager alone), without
    them, and with a tune budget spent before any was built."""
    tmp = tmp_path_factory.mktemp("reference")
    uri = f"sqlite:///{tmp / 'mlflow.db'}"
    common = ["backends=[eager]", "profile=quick", f"tracking.uri={uri}", "model.batch_sizes=[1,4]",
              "compile_cache.workers=0"]
    for name, extra in (("with", []), ("without", ["reference=false"]), ("starved", ["tune.budget_s=1e-9"])):
        pipeline.tune(Small().eval(), torch.randn(4, 16), run_dir=tmp / name, overrides=[*common, *extra])
    return tmp, uri


def run_of(tmp, uri, name):
    return mlflow.MlflowClient(uri).get_run(json.loads((tmp / name / "mlflow_run.json").read_text())["run_id"])


def test_each_reference_is_timed_and_the_best_per_size_is_in_route_json_mlflow_and_the_report(runs):
    tmp, uri = runs
    info = json.loads((tmp / "with" / "route.json").read_text())["reference"]
    assert info["candidates"] == ["reference", "reference_max_autotune"] and info["unmeasured"] == {}
    assert info["modes"] == {"reference": "default", "reference_max_autotune": "max-autotune"}
    medians = json.loads((tmp / "with" / "route.json").read_text())["profile_medians_ms"]
    assert [c["batch_size"] for c in info["cells"]] == [1, 4]
    for c in info["cells"]:
        bs = str(c["batch_size"])
        best = min(info["candidates"], key=lambda n: medians[n][bs])  # both may serve: the faster one is the floor
        assert (c["reference"], c["reference_mode"]) == (best, info["modes"][best])
        assert c["reference_ms"] == medians[best][bs]
        assert c["speedup"] == pytest.approx(c["reference_ms"] / c["auto_ms"])
    run = run_of(tmp, uri, "with")
    metrics = run.data.metrics
    assert {"latency_ms/reference/bs4", "latency_ms/reference_max_autotune/bs4"} <= set(metrics)
    first = info["cells"][0]  # named contended where it rests on a cell measured on a busy host
    assert metrics[f"{figure_name('speedup_vs_compile', first['contended'])}/bs1"] == pytest.approx(first["speedup"])
    if info["worst_speedup"] is not None:  # None where every cell was measured on a busy host
        assert metrics["speedup_vs_compile/worst"] == pytest.approx(info["worst_speedup"])
    else:
        assert "speedup_vs_compile/worst" not in metrics
    table = report.build([run])
    row = next(r for r in table.rows if r.backend == report.VERSUS_ROW)
    assert report.VERSUS_ROW == "auto vs best own compile (x)"
    assert row.ms[4] == pytest.approx(info["cells"][1]["speedup"])
    assert {"reference", "reference_max_autotune"} <= {r.backend for r in table.rows}
    assert not [n for n in table.notes if "leaves out" in n]


def test_a_reference_the_budget_left_unbuilt_is_said_plainly(runs):
    tmp, uri = runs
    info = json.loads((tmp / "starved" / "route.json").read_text())["reference"]
    assert info["cells"] == [] and set(info["unmeasured"]) == {"reference", "reference_max_autotune"}
    assert all("tune.budget_s=1e-09 spent" in why for why in info["unmeasured"].values())
    run = run_of(tmp, uri, "starved")
    assert "tune.budget_s" in run.data.tags["reference.unmeasured.reference_max_autotune"]
    notes = report.build([run]).notes
    assert any(f"{report.VERSUS_ROW} leaves out reference_max_autotune, not measured: skipped: not built: tune.budget_s"
               in n for n in notes), notes
    assert not [k for k in run.data.metrics if "speedup_vs_compile" in k]  # no figure against a weaker floor


def test_the_default_max_autotune_reference_is_named_with_what_leaves_it_out(runs):
    tmp, _ = runs
    said = "capture: reference_max_autotune plays your torch.compile(mode=\"max-autotune\"), a default reference"
    log = (tmp / "with" / "tweakpipe.log").read_text()
    assert said in log and "reference_modes=[default] leaves it out" in log
    assert said not in (tmp / "without" / "tweakpipe.log").read_text()


def test_reference_false_leaves_it_out(runs):
    tmp, uri = runs
    assert json.loads((tmp / "without" / "route.json").read_text())["reference"] is None
    run = run_of(tmp, uri, "without")
    assert not [k for k in run.data.metrics if "speedup_vs_compile" in k or "/reference" in k]
    assert not [r for r in report.build([run]).rows if r.backend in (report.VERSUS_ROW, "reference")]
