"""Quantized precisions (issue 32): torchao's int8 and fp8 recipes as routed candidates under the accuracy budget,
their checkpoint (the fp32 weights and the recipe's name, quantized again on load), and the reasons they are skipped.

CPU runs of the tiny MLP, eager only except where a test is about compiled programs."""

from __future__ import annotations

import importlib.util
import json
import sys

import pytest
import torch
from torch import nn

from conftest import CONF, TINY
from hydra import compose, initialize_config_dir
from pipeline.record import report
from pipeline.backends import precision, quantize
from pipeline.backends.candidate import Candidate
from pipeline.preflight.checks import check_config
from pipeline.errors import ConfigError
from pipeline.models import MLP
from pipeline.route import checkpoint, payload as payload_check
from pipeline.route.checkpoint import CheckpointError
from pipeline.runner import run

needs_torchao = pytest.mark.skipif(importlib.util.find_spec("torchao") is None,
                                   reason="torchao is the optional extra .[quant]")
# The tiny MLP's Linears are far below torchao's row-wise filter, which the precision list applies by default (the
# test of the filter is below): these runs quantize every Linear, as a user may ask with large_linears_only=false.
EVERY = ["backends.eager.large_linears_only=false"]
INT8 = [*TINY, "precision=[fp32,int8_weight_only]"]
CPU = torch.device("cpu")


def composed(overrides):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name="config", overrides=overrides)


def route_json(run_dir):
    return json.loads((run_dir / "route.json").read_text())


def state_of(model):
    return {k: (type(v), v.detach().clone()) for k, v in model.state_dict(keep_vars=True).items()}


def unchanged(model, before):
    return all(type(v) is before[k][0] and torch.equal(v.detach(), before[k][1])
               for k, v in model.state_dict(keep_vars=True).items())


@pytest.fixture(scope="module")
def int8_run(tmp_path_factory):
    """eager and Inductor at fp32 and int8_weight_only, tracked in a fresh MLflow store."""
    folder = tmp_path_factory.mktemp("int8")
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    model = MLP(width=16, depth=2).eval()
    before = state_of(model)
    # profile.screen=false: every candidate goes through the full profile, whatever the screen would drop
    cfg = composed([*INT8, "backends=[eager,inductor]", *EVERY, "backends.inductor.large_linears_only=false", "reference=false",
                    "tracking=sqlite", f"tracking.uri={uri}",
                    "profile.screen=false"])
    return run(cfg, folder / "run", model=model), folder / "run", uri, before


@needs_torchao
def test_int8_candidates_record_precision_score_and_budget_verdict(int8_run):
    ctx, run_dir, _, before = int8_run
    route = route_json(run_dir)
    by_name = {c["backend"]: c for c in route["candidates"]}
    assert list(by_name) == ["eager", "inductor", "eager.int8_weight_only", "inductor.int8_weight_only"]
    capture = json.loads((run_dir / "capture.json").read_text())
    for name in ("eager.int8_weight_only", "inductor.int8_weight_only"):
        c = by_name[name]
        assert (c["precision"], c["weights"], c["status"]) == ("int8_weight_only", "int8", "ok")
        assert 0.999 <= c["score"] < 1.0 and c["within_budget"]  # scored against fp32 eager; int8 is not exact
        assert capture[name]["accuracy"] == c["score"] and capture[name]["within_budget"] is True
        assert set(route["profile_medians_ms"][name]) == {"1", "3", "8"}  # timed at every tuned size
    assert ctx.validation["ok"]
    assert unchanged(ctx.model, before)  # quantizing worked on a copy: the user's weights stay fp32 Parameters


@needs_torchao
def test_each_quantized_candidate_compiles_its_own_program(int8_run):
    ctx, run_dir, _, _ = int8_run
    capture = json.loads((run_dir / "capture.json").read_text())
    plain, quantized = ctx.backends["inductor"], ctx.backends["inductor.int8_weight_only"]
    assert plain.program is not quantized.program
    for name in ("inductor", "inductor.int8_weight_only"):
        assert capture[name]["compile"]["graphs"] >= 1 and capture[name]["compile"]["eager_calls"] == 0, name
        assert ctx.backends[name].fallback_reason() is None
    assert quantized.candidate.quantizes and not plain.candidate.quantizes


@needs_torchao
def test_report_accuracy_shows_the_quantized_candidates(int8_run, tmp_path):
    from mlflow.tracking import MlflowClient

    _, _, uri, _ = int8_run
    client = MlflowClient(tracking_uri=uri)
    (tracked,) = client.search_runs([client.get_experiment_by_name("tweakpipe").experiment_id])
    report.main(["--uri", uri, "--runs", tracked.info.run_id, "--accuracy", "--out", str(tmp_path)])
    rows = {line.split(" | ")[1]: line.split(" | ")[2:5] for line in (tmp_path / "report.md").read_text().splitlines()
            if line.startswith("| ") and "int8" in line}
    assert set(rows) == {"eager.int8_weight_only", "inductor.int8_weight_only"}
    for precision_cell, score, within in rows.values():
        assert precision_cell == "int8_weight_only" and 0.999 <= float(score) < 1.0 and within == "yes"


@needs_torchao
def test_a_quantized_candidate_outside_the_budget_is_timed_but_never_serves(compose_cfg, tmp_path):
    cfg = compose_cfg([*TINY, "backends=[eager]", "reference=false", *EVERY, "precision=[fp32,int8_dynamic]", "route.min_gain=0",
                       "route.accuracy_budget.metric=max_rel_error", "route.accuracy_budget.bound=1e-6"])
    ctx = run(cfg, tmp_path)
    route = route_json(tmp_path)
    dynamic = next(c for c in route["candidates"] if c["backend"] == "eager.int8_dynamic")
    assert dynamic["status"] == "ok" and dynamic["weights"] == "int8"
    assert dynamic["score"] > 1e-6 and not dynamic["within_budget"]
    assert "outside the accuracy budget" in route["excluded"]["eager.int8_dynamic"]
    assert route["screened_out"]["eager.int8_dynamic"]["screen_ms"]  # timed in the screen, which it cannot pass
    assert {r["backend"] for r in route["ranges"]} == {"eager"} and ctx.validation["ok"]


@pytest.fixture(scope="module")
def int8_served(tmp_path_factory):
    """A run whose route serves eager.int8_weight_only at every size, validated after its reload."""
    run_dir = tmp_path_factory.mktemp("int8-served")
    cfg = composed([*INT8, "backends=[eager]", "reference=false", *EVERY, "route=one_backend", "route.backend=eager.int8_weight_only"])
    return run(cfg, run_dir)


@needs_torchao
def test_an_int8_checkpoint_stores_fp32_weights_and_the_recipe_and_reloads_exactly(int8_served):
    ctx = int8_served
    payload = checkpoint.read(ctx.checkpoint_path)
    assert payload["format"] == checkpoint.FORMAT >= 5
    assert payload["backends"]["eager.int8_weight_only"]["precision"] == "int8_weight_only"
    assert payload["versions"]["torchao"] == checkpoint.version_of("torchao")
    assert payload_check.foreign_object(payload) is None  # plain data and plain tensors only
    model_state = ctx.model.state_dict()
    assert all(type(v) is torch.Tensor and v.dtype == torch.float32 and torch.equal(v, model_state[k])
               for k, v in payload["state_dict"].items())  # the model's own fp32 weights, no quantized tensor
    loaded = checkpoint.load(ctx.checkpoint_path, ctx.model)
    backend = loaded.backends["eager.int8_weight_only"]
    assert backend.candidate.quantizes and backend.candidate.weights == "int8"
    for rows in (1, 5, 8, 13):
        x = torch.randn(rows, 16)
        out, tuned = loaded(x=x), ctx.routed(x=x)
        assert out.dtype == torch.float32 and torch.equal(out, tuned)  # quantized again, to the same tensors
    assert ctx.validation["ok"] and {r["precision"] for r in ctx.validation["rows"]} == {"int8_weight_only"}


def int8_tensor(weight):
    from torchao.quantization import Int8Tensor, PerRow

    return Int8Tensor.from_hp(weight.to(torch.bfloat16), granularity=PerRow())


@needs_torchao
@pytest.mark.parametrize("edit, match", [
    (lambda p: p["backends"]["eager.int8_weight_only"].update(precision="int8_weight_only; import os"),
     r"precision='int8_weight_only; import os' is unknown"),
    (lambda p: p["backends"]["eager.int8_weight_only"].update(precision="int4_weight_only"),
     r"precision='int4_weight_only' is unknown; use one of \[.*'int8_weight_only', 'int8_dynamic', 'fp8'\]"),
    (lambda p: p["backends"]["eager.int8_weight_only"].update(precision="int8_weight_only" * 100_000),
     r"precision='int8_weight_\.\.\.8_weight_only' is unknown"),
    (lambda p: p["backends"]["eager.int8_weight_only"].update(cast_weights=True),
     "cast_weights=true at precision=int8_weight_only"),
    (lambda p: p["state_dict"].update({"layers.0.weight": int8_tensor(p["state_dict"]["layers.0.weight"])}),
     r"payload\['state_dict'\]\['layers.0.weight'\] is a torchao\..*Int8Tensor, which a checkpoint never holds"),
])
def test_a_crafted_recipe_or_quantized_tensor_is_refused(int8_served, tmp_path, edit, match):
    ctx = int8_served
    payload = checkpoint.read(ctx.checkpoint_path)
    edit(payload)
    bad = checkpoint.write(payload, tmp_path / "bad.tweak")
    before = state_of(ctx.model)
    with pytest.raises(CheckpointError, match=match) as refused:
        checkpoint.load(bad, ctx.model)
    assert len(str(refused.value)) < 2000 and "\n" not in str(refused.value)  # one line, however long the name
    assert unchanged(ctx.model, before)


def test_without_torchao_the_quantized_candidates_are_skipped_naming_the_extra(compose_cfg, tmp_path, monkeypatch):
    for name in ("torchao", "torchao.quantization", "torchao.utils"):
        monkeypatch.setitem(sys.modules, name, None)  # an import of it fails, as where it is not installed
    reason = Candidate.of("eager", {"kind": "eager", "precision": "int8_weight_only"}).unsupported_reason(CPU)
    assert reason and "torchao" in reason and "pip install -e '.[quant]'" in reason
    ctx = run(compose_cfg([*TINY, "backends=[eager]", "reference=false", "precision=[fp32,int8_weight_only,int8_dynamic]",
                           "stages=[capture]"]), tmp_path)
    for name in ("eager.int8_weight_only", "eager.int8_dynamic"):
        assert ctx.outcomes[name].status == "skipped" and ".[quant]" in ctx.outcomes[name].reason
    assert ctx.outcomes["eager"].status == "ok"


class ConvOnly(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x).mean((2, 3))


@needs_torchao
def test_fp8_off_cuda_and_a_model_without_linear_layers_are_skipped_with_the_reason(compose_cfg, tmp_path):
    if not torch.cuda.is_available():
        assert "compute capability >= 8.9" in Candidate.of("eager", {"kind": "eager", "precision": "fp8"}
                                                            ).unsupported_reason(CPU)
    model = ConvOnly().eval()
    before = state_of(model)
    cfg = compose_cfg([*TINY, "backends=[eager]", "reference=false", "precision=[fp32,int8_weight_only,fp8]", "stages=[capture]",
                       "model.inputs.x.shape=[3,8,8]"])
    ctx = run(cfg, tmp_path, model=model)
    skipped = ctx.outcomes["eager.int8_weight_only"]
    assert skipped.status == "skipped" and "quantized none of the model's layers" in skipped.reason
    assert ctx.outcomes["eager.fp8"].status == "skipped"
    assert unchanged(model, before)


class OneLargeLinear(nn.Module):
    """A Linear torchao's row-wise filter admits (above 1024 in and 2048 out), and a small one it does not."""

    def __init__(self) -> None:
        super().__init__()
        self.large = nn.Linear(1056, 2080)
        self.small = nn.Linear(2080, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.small(torch.relu(self.large(x)))


@needs_torchao
def test_the_precision_list_quantizes_only_linears_large_enough_to_gain(compose_cfg, tmp_path):
    cfg = compose_cfg([*TINY, "backends=[eager]", "reference=false", "precision=[fp32,int8_weight_only]", "stages=[capture]"])
    ctx = run(cfg, tmp_path / "tiny")
    skipped = ctx.outcomes["eager.int8_weight_only"]
    assert skipped.status == "skipped" and "none of the model's 2 Linear layers is large enough" in skipped.reason
    assert "the largest here takes 16 to 16" in skipped.reason
    candidate = precision.candidates({"eager": {"kind": "eager"}}, ["fp32", "int8_weight_only"])["eager.int8_weight_only"]
    assert candidate.settings.large_linears_only is True  # what its checkpoint stores, so a load quantizes the same
    copy = precision.ReducedPrecision(OneLargeLinear(), torch.bfloat16, "cpu", cast_weights=True,
                                      recipe="int8_weight_only", large_only=True)
    assert copy.quantized == 1 and type(copy.inner.small.weight) is nn.Parameter
    every = precision.ReducedPrecision(OneLargeLinear(), torch.bfloat16, "cpu", cast_weights=True,
                                       recipe="int8_weight_only")
    assert every.quantized == 2  # large_linears_only=false (and checkpoints written before it): every Linear


def test_a_recipe_quantizes_only_a_copy():
    with pytest.raises(ValueError, match="quantizes a copy"):
        precision.ReducedPrecision(MLP(16, 1), torch.bfloat16, "cpu", cast_weights=False, recipe="int8_weight_only")


@pytest.mark.parametrize("overrides, match", [
    (["precision=[fp32,int4_weight_only]"], r"precision='int4_weight_only' is unknown; use one of .*'fp8'"),
    (["precision=[fp32,fp8,fp8]"], "lists fp8 more than once"),
    (["precision=[fp32,fp8]", "backends.eager.precision=int8_dynamic"], "sets precision=int8_dynamic itself"),
])
def test_quantized_precision_mistakes_fail_early(compose_cfg, overrides, match):
    with pytest.raises(ConfigError, match=match):
        check_config(compose_cfg([*TINY, "backends=[eager]", "reference=false", *overrides]))


def test_quantized_candidates_are_named_like_the_others():
    backends = {"eager": {"kind": "eager"}, "graph": {"kind": "graph"}}
    names = precision.candidates(backends, ["fp32", *quantize.RECIPES])
    assert list(names) == ["eager", "graph", "eager.int8_weight_only", "graph.int8_weight_only", "eager.int8_dynamic",
                           "graph.int8_dynamic", "eager.fp8", "graph.fp8"]
    fp8 = names["graph.fp8"]
    assert fp8.precision == "fp8" and not fp8.settings.cast_weights  # no cast_weights: the recipe implies it
    assert fp8.casts_weights and fp8.weights == "fp8" and fp8.compute_dtype is torch.bfloat16


@pytest.mark.gpu
@needs_torchao
def test_quantized_candidates_on_cuda(compose_cfg, tmp_path):
    """fp8 (where the GPU has float8 matmuls) and int8 weight-only on every GPU backend, routed, reloaded, validated."""
    device = torch.device("cuda")
    recipes = ["int8_weight_only"] + (["fp8"] if quantize.unsupported_reason("fp8", device) is None else [])
    every = [f"backends.{b}.large_linears_only=false" for b in ("eager", "inductor", "graph", "graph_inductor")]
    cfg = compose_cfg(["model=tiny_mlp", "profile=quick", "tracking=off", "device=cuda", "backends=gpu", *every,
                       f"precision=[fp32,{','.join(recipes)}]"])
    ctx = run(cfg, tmp_path)
    for backend in ("eager", "inductor", "graph", "graph_inductor"):
        for recipe in recipes:
            outcome = ctx.outcomes[f"{backend}.{recipe}"]
            assert outcome.status == "ok" and outcome.weights == quantize.RECIPES[recipe], (backend, recipe, outcome)
            assert outcome.within_budget or recipe == "fp8", (backend, recipe, outcome.accuracy)  # fp8 may fall out
    assert ctx.validation["ok"]
