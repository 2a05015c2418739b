"""The reference peer (the user's own torch.compile) in every profile: a floor for the router, compared at every
tuned cell in route.json, MLflow and the report; played by the run's own backend where that one is the same
compile; ``reference=false`` leaves it out."""

from __future__ import annotations

import json

import mlflow
import pytest
import torch
from torch import nn

import pipeline
from pipeline.record.routed import figure_name
from pipeline.backends import reference
from pipeline.errors import ConfigError
from pipeline.preflight.checks import candidates_of
from pipeline.record import report
from pipeline.record.recorder import Recorder
from pipeline.route import versus
from pipeline.route.policy import choose_route, owners_with

TIGHT = {b: {1: (ms * 0.99, ms * 1.01)} for b, ms in (("eager", 1.0), ("inductor", 0.97), ("reference", 0.94))}
PROFILE = {"eager": {1: 1.0}, "inductor": {1: 0.97}, "reference": {1: 0.94}}


def test_a_servable_reference_is_a_floor_the_router_never_serves_below():
    # 6% faster than eager: under route.min_gain=0.10 no challenger, but faster beyond both intervals.
    order = list(PROFILE)
    assert owners_with("eager", PROFILE, order, 0.10, "eager", TIGHT) == {1: "eager"}
    assert owners_with("eager", PROFILE, order, 0.10, "eager", TIGHT, ["reference"]) == {1: "reference"}
    # Within the noise it is no floor: the incumbent keeps the size.
    loose = {b: {1: (0.8, 1.2)} for b in PROFILE}
    assert owners_with("eager", PROFILE, order, 0.10, "eager", loose, ["reference"]) == {1: "eager"}
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
    found = versus.comparison({1: "eager", 8: "eager"}, medians, intervals, ["reference"], {}, "router",
                              contended={("reference", 1)})
    assert [c["contended"] for c in found["cells"]] == [True, False] and found["contended_cells"] == 1
    assert found["worst_speedup"] == found["geomean_speedup"] == 2.0  # bs 8 alone
    everywhere = versus.comparison({1: "eager", 8: "eager"}, medians, intervals, ["reference"], {}, "router",
                                   lambda cell: {"batch_size": cell}, contended={("eager", 1), ("eager", 8)})
    assert everywhere["worst_speedup"] is None and everywhere["geomean_speedup"] is None
    assert Recorder.reference_metrics(everywhere) == {"contended_speedup_vs_compile/bs1": 0.5,
                                                      "contended_speedup_vs_compile/bs8": 2.0}


def test_the_comparison_names_each_slower_cell_with_its_reason():
    medians = {"eager": {1: 1.0, 8: 2.0}, "reference": {1: 0.5, 8: 4.0}}
    intervals = {b: {k: (v * 0.99, v * 1.01) for k, v in per.items()} for b, per in medians.items()}
    found = versus.comparison({1: "eager", 8: "eager"}, medians, intervals, ["reference"],
                              {"reference": "outside the accuracy budget"}, "router")
    assert [c["speedup"] for c in found["cells"]] == [0.5, 2.0]
    assert found["worst_speedup"] == 0.5 and found["geomean_speedup"] == pytest.approx(1.0)
    [slower] = found["slower_cells"]
    assert slower["cell"] == 1 and slower["reason"] == "reference cannot serve: outside the accuracy budget"
    found = versus.comparison({1: "eager"}, medians, intervals, ["reference"], {}, "first_wins")
    assert "route.strategy=first_wins does not hold the route" in found["slower_cells"][0]["reason"]
    assert versus.comparison({1: "eager"}, medians, intervals, [], {}, "router") is None


def test_the_run_s_own_backend_plays_the_reference_where_it_is_the_same_compile(compose_cfg):
    cpu = torch.device("cpu")
    played = candidates_of(compose_cfg(["backends=[eager,inductor]", "precision=[fp32]"]), cpu)
    assert list(played) == ["eager", "inductor"] and played["inductor"].reference
    assert not played["eager"].reference
    added = candidates_of(compose_cfg(["backends=[eager,inductor_freezing]"]), cpu)
    assert list(added) == ["eager", "inductor_freezing", "reference"] and added["reference"].reference
    assert added["reference"].settings.mode == "default"
    gpu = reference.with_reference({"eager": {"kind": "eager"}, "inductor": {"kind": "inductor", "mode": "default"}},
                                   "cuda")
    assert gpu[1] == "reference" and gpu[0]["reference"]["mode"] == "reduce-overhead"
    off = candidates_of(compose_cfg(["backends=[eager,inductor_freezing]", "reference=false"]), cpu)
    assert list(off) == ["eager", "inductor_freezing"] and not any(c.reference for c in off.values())
    with pytest.raises(ConfigError, match="named 'reference'"):
        reference.with_reference({"reference": {"kind": "eager"}}, "cpu")


class Small(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One CPU run with the reference peer (added: the run's backends are eager alone) and one without."""
    tmp = tmp_path_factory.mktemp("reference")
    uri = f"sqlite:///{tmp / 'mlflow.db'}"
    common = ["backends=[eager]", "profile=quick", f"tracking.uri={uri}", "model.batch_sizes=[1,4]",
              "compile_cache.workers=0"]
    for name, extra in (("with", []), ("without", ["reference=false"])):
        pipeline.tune(Small().eval(), torch.randn(4, 16), run_dir=tmp / name, overrides=[*common, *extra])
    return tmp, uri


def test_the_reference_is_in_route_json_mlflow_and_the_report(runs):
    tmp, uri = runs
    info = json.loads((tmp / "with" / "route.json").read_text())["reference"]
    assert info["candidates"] == ["reference"]
    assert [c["batch_size"] for c in info["cells"]] == [1, 4]
    for c in info["cells"]:
        assert c["reference"] == "reference" and c["speedup"] == pytest.approx(c["reference_ms"] / c["auto_ms"])
    client = mlflow.MlflowClient(uri)
    run_id = json.loads((tmp / "with" / "mlflow_run.json").read_text())["run_id"]
    metrics = client.get_run(run_id).data.metrics
    first = info["cells"][0]  # named contended where it rests on a cell measured on a busy host
    assert metrics[f"{figure_name('speedup_vs_compile', first['contended'])}/bs1"] == pytest.approx(first["speedup"])
    if info["worst_speedup"] is not None:  # None where every cell was measured on a busy host
        assert metrics["speedup_vs_compile/worst"] == pytest.approx(info["worst_speedup"])
    else:
        assert "speedup_vs_compile/worst" not in metrics
    table = report.build([client.get_run(run_id)])
    row = next(r for r in table.rows if r.backend == report.VERSUS_ROW)
    assert row.ms[4] == pytest.approx(info["cells"][1]["speedup"])
    assert any(r.backend == "reference" for r in table.rows)


def test_reference_false_leaves_it_out(runs):
    tmp, uri = runs
    assert json.loads((tmp / "without" / "route.json").read_text())["reference"] is None
    run_id = json.loads((tmp / "without" / "mlflow_run.json").read_text())["run_id"]
    run = mlflow.MlflowClient(uri).get_run(run_id)
    assert not [k for k in run.data.metrics if "speedup_vs_compile" in k or "/reference/" in k]
    assert not [r for r in report.build([run]).rows if r.backend in (report.VERSUS_ROW, "reference")]
