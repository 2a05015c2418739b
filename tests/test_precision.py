"""Precision as a routed choice under an accuracy budget (issue 20): candidates per precision, the budget
against fp32 eager, route.json, the checkpoint's precision, and the mistakes the config checks refuse.

Runs use the eager backend only (no compiles), so every run takes seconds on 2 CPU cores."""

from __future__ import annotations

import json
import logging
import math
import typing

import pytest
import torch

from conftest import CONF, TINY
from pipeline.measure.screening import screen_sizes
from hydra import compose, initialize_config_dir
from pipeline.backends import precision, quantize
from pipeline.backends.candidate import AUTOCAST, Candidate
from pipeline.config import precisions
from pipeline.config.backend_schema import EagerSettings
from pipeline.record.recorder import earlier_results
from pipeline.preflight.checks import check_config
from pipeline.errors import ConfigError
from pipeline.measure import accuracy
from pipeline.record.report import Row, Table, markdown
from pipeline.route import checkpoint
from pipeline.route.checkpoint import CheckpointError
from pipeline.runner import rerun, run

BF16 = [*TINY, "backends=[eager]", "reference=false", "precision=[fp32,bf16]"]


def route_json(run_dir):
    return json.loads((run_dir / "route.json").read_text())


def test_route_json_lists_every_candidate_its_precision_and_score(compose_cfg, tmp_path):
    ctx = run(compose_cfg(BF16), tmp_path)
    route = route_json(tmp_path)
    assert route["accuracy_budget"] == {"metric": "cosine", "bound": 0.999}
    by_name = {c["backend"]: c for c in route["candidates"]}
    assert list(by_name) == ["eager", "eager.bf16", "eager.bf16-weights"]  # fp32 keeps the backend's own name
    assert all(c["metric"] == "cosine" and "error" not in c for c in route["candidates"])
    assert by_name["eager"]["precision"] == "fp32" and by_name["eager"]["score"] == 1.0  # eager against itself
    assert by_name["eager.bf16"]["precision"] == "bf16" and by_name["eager.bf16"]["weights"] == "fp32"
    assert by_name["eager.bf16-weights"]["precision"] == by_name["eager.bf16-weights"]["weights"] == "bf16"
    for name in ("eager.bf16", "eager.bf16-weights"):
        assert 0.999 <= by_name[name]["score"] < 1.0 and by_name[name]["within_budget"]
    assert all(r["precision"] == by_name[r["backend"]]["precision"] and r["weights"] == by_name[r["backend"]]["weights"]
               for r in route["ranges"])
    # every candidate is timed: in the full profile, or in the screen where the screen dropped it
    assert set(route["profile_medians_ms"]) | set(route["screened_out"]) == set(by_name)
    assert ctx.validation["ok"] and all("budget_value" in r for r in ctx.validation["rows"])


def test_a_candidate_outside_the_budget_is_timed_and_recorded_but_never_serves(compose_cfg, tmp_path):
    cfg = compose_cfg([*BF16, "route.accuracy_budget.metric=max_rel_error", "route.accuracy_budget.bound=1e-6",
                       "route.min_gain=0"])
    ctx = run(cfg, tmp_path)
    route = route_json(tmp_path)
    bf16 = next(c for c in route["candidates"] if c["backend"] == "eager.bf16")
    assert bf16["metric"] == "max_rel_error" and not bf16["within_budget"] and bf16["score"] > 1e-6
    assert bf16["status"] == "ok"
    assert "outside the accuracy budget" in route["excluded"]["eager.bf16"]
    screened = route["screened_out"]["eager.bf16"]  # it never serves, so the screen's numbers are all it costs
    assert "outside the accuracy budget" in screened["reason"] and "eager.bf16" not in route["profile_medians_ms"]
    assert {int(bs) for bs in screened["screen_ms"]} == set(screen_sizes(ctx.batch_sizes)) and all(  # its speed
        0 < c["interval"][0] <= c["median"] <= c["interval"][1] for c in screened["screen_ms"].values())
    assert {r["backend"] for r in route["ranges"]} == {"eager"}
    assert "outside the accuracy budget" in route["excluded"]["eager.bf16-weights"]
    capture = json.loads((tmp_path / "capture.json").read_text())
    assert capture["eager.bf16"]["within_budget"] is False and capture["eager"]["within_budget"] is True
    assert ctx.validation["ok"]


def served_by(tmp_path_factory, backend):
    """A run whose route serves ``backend`` at every size (route=one_backend), validated after its reload."""
    run_dir = tmp_path_factory.mktemp(backend)
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[*BF16, "route=one_backend", f"route.backend={backend}"])
    return run(cfg, run_dir), run_dir


@pytest.fixture(scope="module")
def bf16_served(tmp_path_factory):
    return served_by(tmp_path_factory, "eager.bf16")


def test_the_checkpoint_rebuilds_the_routed_precision(bf16_served):
    ctx, run_dir = bf16_served
    assert route_json(run_dir)["ranges"] == [{"lo": 1, "hi": None, "backend": "eager.bf16", "precision": "bf16",
                                              "weights": "fp32"}]
    payload = checkpoint.read(ctx.checkpoint_path)
    assert payload["format"] == checkpoint.FORMAT and payload["backends"]["eager.bf16"]["precision"] == "bf16"
    loaded = checkpoint.load(ctx.checkpoint_path, ctx.model)
    assert loaded.backends["eager.bf16"].candidate.precision == "bf16"
    x = torch.randn(5, 16)
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
        expected = ctx.model(x=x).float()
    out = loaded(x=x)
    assert out.dtype == torch.float32 and torch.equal(out, expected)  # bf16 autocast again, answered in fp32
    assert ctx.validation["ok"] and {r["precision"] for r in ctx.validation["rows"]} == {"bf16"}


@pytest.fixture(scope="module")
def cast_served(tmp_path_factory):
    """eager.bf16-weights serving: a bf16 copy of the model."""
    return served_by(tmp_path_factory, "eager.bf16-weights")


def test_cast_weights_serve_a_bf16_copy_and_answer_in_the_models_dtype(cast_served):
    ctx, run_dir = cast_served
    assert route_json(run_dir)["ranges"] == [{"lo": 1, "hi": None, "backend": "eager.bf16-weights",
                                              "precision": "bf16", "weights": "bf16"}]
    assert all(t.dtype == torch.float32 for t in ctx.model.state_dict().values())  # the user's model stays fp32
    payload = checkpoint.read(ctx.checkpoint_path)
    assert payload["backends"]["eager.bf16-weights"]["cast_weights"] is True
    loaded = checkpoint.load(ctx.checkpoint_path, ctx.model)
    backend = loaded.backends["eager.bf16-weights"]
    assert backend.candidate.casts_weights and backend.candidate.precision == "bf16"
    x = torch.randn(5, 16)
    with torch.inference_mode():
        expected = ctx.model.to(torch.bfloat16)(x=x.to(torch.bfloat16)).float()  # bf16 weights, no autocast
        ctx.model.float()
        out = loaded(x=x)
    assert out.dtype == torch.float32 and torch.equal(out, expected)
    assert ctx.validation["ok"] and {r["precision"] for r in ctx.validation["rows"]} == {"bf16"}


class ConvNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv, self.norm = torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.conv(x))


def test_cast_model_is_channels_last_for_image_convolutions_only():
    conv = ConvNet().eval()
    sample = {"x": torch.randn(2, 3, 8, 8)}
    assert precision.convolves_images(conv, sample)
    assert not precision.convolves_images(torch.nn.Linear(4, 4), {"x": torch.randn(2, 4)})
    cast = precision.ReducedPrecision(conv, torch.bfloat16, "cpu", cast_weights=True, channels_last=True)
    assert cast.inner.conv.weight.dtype == torch.bfloat16 and cast.inner.norm.running_mean.dtype == torch.bfloat16
    assert cast.inner.conv.weight.is_contiguous(memory_format=torch.channels_last)
    assert conv.conv.weight.dtype == torch.float32 and conv.conv.weight.is_contiguous()  # the original is untouched
    with torch.inference_mode():
        out, ref = cast(**sample), conv(**sample)
    assert out.dtype == torch.float32 and accuracy.score(out, ref, "cosine") > 0.999


def test_a_backend_named_like_a_candidate_is_refused():
    backends = {"eager": {"kind": "eager"}, "eager.bf16": {"kind": "eager"}}
    for order in (["fp32", "bf16"], ["bf16", "fp32"]):
        with pytest.raises(ConfigError, match="backend 'eager.bf16' has the name of a .<precision> candidate"):
            precision.candidates(backends, order)
    assert list(precision.candidates(backends, ["fp32"])) == ["eager", "eager.bf16"]  # no candidates, no clash


def test_cast_weights_are_offered_only_where_pytorch_runs_the_model():
    backends = {"eager": {"kind": "eager"}, "onnxruntime": {"kind": "onnxruntime"}}
    assert list(precision.candidates(backends, ["fp32", "fp16"])) == [
        "eager", "onnxruntime", "eager.fp16", "onnxruntime.fp16", "eager.fp16-weights"]
    cast = precision.candidates(backends, ["fp32", "fp16"])["eager.fp16-weights"]
    assert cast.settings == EagerSettings(precision="fp16", cast_weights=True)
    assert cast.casts_weights and cast.weights == "fp16" and cast.compute_dtype is torch.float16


def test_precision_is_one_type_and_parse_is_the_one_way_in():
    """Issue 55: the precisions are one Literal, and an untyped value becomes one through parse alone."""
    assert precisions.PRECISIONS == typing.get_args(precisions.Precision)
    assert tuple(quantize.RECIPES) == typing.get_args(precisions.Quantized)
    assert set(AUTOCAST) == set(typing.get_args(precisions.Reduced))

    class Named(str):
        pass

    typed = precisions.parse(Named("bf16"), "precision")
    assert typed == "bf16" and type(typed) is str  # a plain string: what a weights-only checkpoint load unpickles
    for bad in ("int4", 16, None, "bf16 " * 40):
        with pytest.raises(ConfigError, match=r"^where=.* is unknown; use one of \['fp32', 'tf32', .*'fp8'\]$"):
            precisions.parse(bad, "where")


def test_a_backend_of_an_unknown_precision_is_refused_where_it_becomes_a_candidate():
    """Its settings never hold a precision that is not one, from a config or a stored backend alike."""
    with pytest.raises(ConfigError, match=r"^backend 'mine': precision='int4' is unknown; use one of \["):
        Candidate.of("mine", {"kind": "eager", "precision": "int4"})
    with pytest.raises(ConfigError, match=r"^backend 'mine': precision='int4' is unknown"):
        Candidate.stored("mine", {"name": "mine", "kind": "inductor", "precision": "int4"})


def test_a_resumed_capture_of_an_unknown_precision_is_refused_in_one_line(tmp_path):
    def capture(at: str) -> None:
        outcome = {"name": "eager", "kind": "eager", "precision": at}
        (tmp_path / "capture.json").write_text(json.dumps({"eager": outcome}))

    capture("int4")
    with pytest.raises(ConfigError, match=r"capture.json is not what a run writes \(backend 'eager': "
                                          r"precision='int4' is unknown; use one of .*\); restore it"):
        earlier_results(tmp_path)
    capture("bf16")
    assert earlier_results(tmp_path).outcomes["eager"].precision == "bf16"


@pytest.mark.parametrize("edit, match", [
    (lambda b: b.update(precision="int4"), "precision='int4' is unknown"),
    (lambda b: b.update(precision=16), "precision"),
    (lambda b: b.update(precision="bf16", autocast_enabled=True), "both precision=bf16 and autocast_enabled"),
    (lambda b: b.update(precision="fp32", cast_weights=True), "cast_weights=true at precision=fp32"),
])
def test_a_checkpoint_with_a_bad_precision_is_refused(bf16_served, tmp_path, edit, match):
    ctx, _ = bf16_served
    payload = checkpoint.read(ctx.checkpoint_path)
    edit(payload["backends"]["eager.bf16"])
    bad = checkpoint.write(payload, tmp_path / "bad.tweak")
    before = {k: v.clone() for k, v in ctx.model.state_dict().items()}
    with pytest.raises(CheckpointError, match=match):
        checkpoint.load(bad, ctx.model)
    assert all(torch.equal(before[k], v) for k, v in ctx.model.state_dict().items())


def test_a_format_2_checkpoint_still_loads_as_fp32(compose_cfg, tmp_path):
    ctx = run(compose_cfg([*TINY, "backends=[eager]", "reference=false", "stages=[capture,profile,route]"]), tmp_path)
    payload = checkpoint.read(ctx.checkpoint_path)
    for cfg in payload["backends"].values():
        del cfg["precision"]
    path = tmp_path / "old.tweak"
    data = checkpoint.write({**payload, "format": 2}, path).read_bytes()
    path.write_bytes(data.replace(f"TWEAKPIPE-CHECKPOINT {checkpoint.FORMAT}\n".encode(), b"TWEAKPIPE-CHECKPOINT 2\n"))
    assert checkpoint.load(path, ctx.model).backends["eager"].candidate.precision == "fp32"


@pytest.mark.parametrize("overrides, match", [
    (["precision=[fp32,int8]"], "precision='int8' is unknown"),
    (["precision=[fp32,bf16,fp32]"], "lists fp32 more than once"),
    (["precision=[]"], "names no precision"),
    (["precision=[fp32,bf16]", "backends.eager.autocast_enabled=true"], "sets autocast_enabled=True itself"),
    (["precision=[fp32,bf16]", "backends.eager.precision=fp16"], "sets precision=fp16 itself"),
    (["backends.eager.cast_weights=true"], "cast_weights=true at precision=fp32"),
    (["backends.eager.precision=int4"], "precision=.int4. is unknown"),
    (["route.accuracy_budget.metric=psnr"], "accuracy_budget.metric='psnr' is unknown"),
    (["route.accuracy_budget.bound=1.5"], "outside cosine's range"),
    (["route.accuracy_budget.metric=max_rel_error", "route.accuracy_budget.bound=-1"], "outside max_rel_error's"),
    (["precision=[fp32,bf16]", "route=one_backend", "route.backend=eager.fp16"], "not among the selected backends"),
    pytest.param(["precision=[tf32]"], "runs nothing on cpu", marks=pytest.mark.skipif(
        torch.cuda.is_available(), reason="tf32 runs on CUDA")),
])
def test_config_mistakes_fail_early(compose_cfg, overrides, match):
    with pytest.raises(ConfigError, match=match):
        check_config(compose_cfg([*TINY, "backends=[eager]", "reference=false", *overrides]))


def test_reduced_precisions_run_on_cpu_and_tf32_is_skipped_there(compose_cfg, tmp_path):
    cpu = torch.device("cpu")
    assert precision.device_problem("bf16", cpu) is None and precision.device_problem("fp16", cpu) is None
    cfg = compose_cfg([*TINY, "backends=[eager]", "reference=false", "precision=[fp32,tf32,fp16]", "stages=[capture]"])
    check_config(cfg)  # one_backend may name eager.fp16 now; tf32 is not an error on a CPU, just skipped
    ctx = run(cfg, tmp_path)
    assert ctx.outcomes["eager.tf32"].status == "skipped" and "CUDA" in ctx.outcomes["eager.tf32"].reason
    assert ctx.outcomes["eager.fp16"].status == "ok" and ctx.outcomes["eager.fp16"].precision == "fp16"


def test_budget_metrics():
    ref = torch.tensor([[1.0, 2.0, 3.0], [3.0, 2.0, 1.0]])
    out = torch.tensor([[1.0, 2.0, 2.9], [1.0, 2.0, 3.0]])  # row 2 has another arg-max
    assert accuracy.score(out, ref, "top1_agreement") == 0.5
    assert accuracy.score(out, ref, "max_rel_error") == pytest.approx(2 / 3)
    assert accuracy.score(ref, ref, "cosine") == 1.0
    assert accuracy.score(-ref, ref, "cosine") == pytest.approx(-1.0)
    assert accuracy.score({"a": ref}, {"a": ref, "b": ref}, "cosine") == -1.0  # a missing leaf is the worst
    nan = ref.clone()
    nan[0, 0] = math.nan
    assert accuracy.score(nan, ref, "max_rel_error") == math.inf
    assert not accuracy.within(math.nan, "cosine", 0.9) and accuracy.within(0.01, "max_rel_error", 0.01)


def test_report_shows_precision_and_score_beside_latency():
    table = Table(sizes=[1, 8], accuracy=True, rows=[Row("mlp", "inductor.bf16", {1: 0.5, 8: 0.7}, precision="bf16",
                                                             score=0.99, within=False)])
    lines = markdown(table).splitlines()
    assert lines[2].split(" | ")[2:5] == ["precision", "score", "in budget"]
    assert "| mlp | inductor.bf16 | bf16 | 0.99 | NO | 0.50 | 0.70 |" in lines


def test_mlflow_and_the_report_name_the_score_by_its_metric(compose_cfg, tmp_path):
    from mlflow.tracking import MlflowClient

    from pipeline.record import report

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run(compose_cfg([*BF16, "tracking=sqlite", f"tracking.uri={uri}", "stages=[capture,profile]"]), tmp_path / "run")
    client = MlflowClient(tracking_uri=uri)
    (logged,) = client.search_runs([client.get_experiment_by_name("tweakpipe").experiment_id])
    metrics = logged.data.metrics
    assert metrics["accuracy/cosine/eager"] == 1.0 and 0.999 <= metrics["accuracy/cosine/eager.bf16"] < 1.0
    assert not any(k.startswith("error/") for k in metrics)
    table = report.build([logged], accuracy=True)
    assert table.title.endswith("; score against fp32 eager (worst tuned size), budget cosine >= 0.999")
    rows = {r.backend: r.score for r in table.rows if r.backend != "auto"}  # the candidates the profile timed
    assert "eager" in rows and rows == {n: metrics[f"accuracy/cosine/{n}"] for n in rows}


def test_a_screened_out_candidate_is_shown_with_its_screen_numbers(compose_cfg, tmp_path, caplog):
    """Dropped by the screen (outside the budget), a candidate is still in the log's profile lines and the report's
    table: its screen medians, marked screened out, and why."""
    from mlflow.tracking import MlflowClient

    from pipeline.record import report

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    caplog.set_level(logging.INFO, logger="stages.profile")
    ctx = run(compose_cfg([*BF16, "route.accuracy_budget.metric=max_rel_error", "route.accuracy_budget.bound=1e-6",
                           "tracking=sqlite", f"tracking.uri={uri}", "stages=[capture,profile]"]), tmp_path / "run")
    assert set(ctx.screened_out) == {"eager.bf16", "eager.bf16-weights"}
    screen = ctx.screened_medians()["eager.bf16"]
    (said,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("profile eager.bf16 ")]
    assert "screened out: screen median " + ", ".join(f"bs={bs} {ms:.4f} ms" for bs, ms in screen.items()) in said
    assert said.endswith("outside the accuracy budget, so it never serves (timed in the screen only)"), said
    client = MlflowClient(tracking_uri=uri)
    (logged,) = client.search_runs([client.get_experiment_by_name("tweakpipe").experiment_id])
    table = report.build([logged])
    (row,) = [r for r in table.rows if r.backend == "eager.bf16"]
    assert row.label == "eager.bf16 (screened out)" and row.ms == pytest.approx(screen)
    assert "| eager.bf16 (screened out) |" in report.markdown(table)
    assert any(n.startswith("tiny_mlp: eager.bf16 screened out") and "outside the accuracy budget" in n
               for n in report.footer(table)), report.footer(table)


def test_tf32_is_on_only_inside_a_tf32_call_and_restored_exactly():
    def state():
        new = [m.fp32_precision for m in (torch.backends.cuda.matmul, torch.backends.cudnn.conv)
               if hasattr(m, "fp32_precision")]
        return torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32, new

    before = state()
    with precision.tf32(True):
        assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
    assert state() == before


@pytest.mark.gpu
def test_tf32_and_bf16_candidates_compete_on_cuda(compose_cfg, tmp_path):
    if not torch.cuda.is_available():
        pytest.skip("tf32 needs CUDA")
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    ctx = run(compose_cfg([*TINY, "device=cuda", "backends=[eager,inductor,graph]", "precision=[fp32,tf32,bf16]",
                           "profile.screen=false"]), tmp_path)  # every candidate stays built: each answers below
    route = route_json(tmp_path)
    assert [c["backend"] for c in route["candidates"]] == [
        "eager", "inductor", "graph", "eager.tf32", "inductor.tf32", "graph.tf32", "eager.bf16", "inductor.bf16",
        "graph.bf16", "eager.bf16-weights", "inductor.bf16-weights", "graph.bf16-weights"]
    assert all(c["status"] == "ok" and c["within_budget"] for c in route["candidates"]), route["candidates"]
    assert ctx.validation["ok"]
    assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == before
    x = torch.randn(3, 16, device="cuda")
    assert {name: b(x=x).dtype for name, b in ctx.backends.items()} == dict.fromkeys(ctx.backends, torch.float32)


def test_a_rerun_over_one_precision_routes_from_the_same_cells_and_leaves_a_folder_only_where_it_wrote(
        compose_cfg, tmp_path):
    """What the benches ask (``runner.rerun``): a profile again writes nothing, so no folder is left for it; a route
    over the fp32 candidates alone saves its checkpoint in a folder of its own; the run's own results stay."""
    ctx = run(compose_cfg(BF16), tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    rerun(ctx, "profile")
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    narrower = rerun(ctx, "route", precision=["fp32"])
    (folder,) = [p for p in tmp_path.iterdir() if p.name.startswith("rerun-route-")]
    assert narrower.run_dir == folder and (folder / "model.tweak").is_file()
    assert {r.backend for r in narrower.route} == {"eager"} and route_json(tmp_path)["ranges"]
