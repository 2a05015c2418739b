"""Regional programs: repeated blocks found, traced once, the same answers, and skipped where there are none."""

from __future__ import annotations

import json

import pytest
import torch
import torchvision
import transformers
from torch._dynamo.utils import counters

from conftest import TINY
from models_for_tests import StackedBlocks
from pipeline import backends
from pipeline.api import compose_config
from pipeline.backends import regions
from pipeline.backends.candidate import Candidate
from pipeline.compile import ahead
from pipeline.errors import ConfigError
from pipeline.runner import run

STACKED = ["model.build._target_=models_for_tests.StackedBlocks", "~model.build.width", "~model.build.depth",
           "model.name=stacked"]


def bert(layers: int = 3) -> torch.nn.Module:
    config = transformers.BertConfig(num_hidden_layers=layers, hidden_size=32, num_attention_heads=2,
                                     intermediate_size=64, vocab_size=100)
    return transformers.BertModel(config).eval()


@pytest.mark.parametrize("model, expected", [
    (lambda: bert(3), "3 x BertLayer (encoder.layer.0..encoder.layer.2)"),
    (lambda: torchvision.models.resnet18(), "2 x BasicBlock (layer1.0..layer1.1)"),  # later stages' first downsample
    (lambda: torchvision.models.VisionTransformer(image_size=32, patch_size=8, num_layers=3, num_heads=2,
                                                  hidden_dim=32, mlp_dim=64),
     "3 x EncoderBlock (encoder.layers.encoder_layer_0..encoder.layers.encoder_layer_2)"),
    (lambda: StackedBlocks(), "4 x ResidualBlock (blocks.0..blocks.3)"),
])
def test_the_repeated_blocks_are_found_and_the_view_leaves_the_model_as_it_was(model, expected):
    model = model()
    before = {name: type(m) for name, m in model.named_modules()}
    assert regions.describe(model) == expected
    view = regions.regional_view(model)
    assert {name: type(m) for name, m in model.named_modules()} == before  # the model's own classes, untouched
    assert all(a is b for a, b in zip(model.parameters(), view.parameters()))  # the same weights, not copies
    first = regions.find(model)[0]
    assert type(view.get_submodule(first)) is not type(model.get_submodule(first))  # the view's block is wrapped
    assert isinstance(view.get_submodule(first), type(model.get_submodule(first)))


def test_resnets_first_block_of_a_stage_is_not_a_region_of_the_others():
    """It downsamples: its structure differs from the blocks after it, so it is compiled inline."""
    found = regions.find(torchvision.models.resnet50())
    assert "layer1.0" not in found and {"layer1.1", "layer1.2", "layer4.2"} <= set(found)


def test_a_model_that_repeats_no_block_has_no_regional_view():
    with pytest.raises(regions.NoRegions, match="repeats no block"):
        regions.regional_view(torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2)))


def built(regional: bool, model: torch.nn.Module, x: torch.Tensor) -> backends.Backend:
    backend = backends.create(Candidate.of("inductor_regional" if regional else "inductor",
                                           {"kind": "inductor", "mode": "default", "regional": regional}))
    backend.build(model, {"x": x}, torch.device("cpu"), [1, 8], [1, 8])
    return backend


def test_a_regional_program_traces_the_repeated_block_once_and_answers_as_the_whole_one():
    x = torch.randn(8, 16)
    traced = {}
    for depth in (4, 8):
        model = StackedBlocks(depth=depth).eval()
        for regional in (False, True):
            torch._dynamo.reset()
            counters.clear()
            backend = built(regional, model, x)
            traced[depth, regional] = counters["stats"]["calls_captured"]
            with torch.no_grad():
                torch.testing.assert_close(backend(x=x), model(x), rtol=1e-5, atol=1e-5)
            assert backend.fallback_reason() is None
    # four more blocks: whole, Dynamo traces their four calls each again (16); regional, only the region's call and
    # its lookup (8 on torch 2.14), not what is inside
    whole, regional = traced[8, False] - traced[4, False], traced[8, True] - traced[4, True]
    assert whole == 16 and regional <= whole / 2, traced


def test_a_regional_graph_backend_needs_inductor():
    candidate = Candidate.of("graph_regional", {"kind": "graph", "regional": True})
    with pytest.raises(ConfigError, match="sets regional, which only apply with compile_with_inductor=true"):
        backends.create(candidate)


def test_regional_and_whole_programs_are_separate_compile_jobs():
    whole = Candidate.of("graph_inductor", {"kind": "graph", "compile_with_inductor": True})
    regional = Candidate.of("graph_inductor_regional", {"kind": "graph", "compile_with_inductor": True,
                                                        "regional": True})
    jobs = ahead.plan({"graph_inductor": whole, "graph_inductor_regional": regional})
    assert jobs == {"graph_inductor": "graph_inductor", "graph_inductor_regional": "graph_inductor_regional"}
    assert ahead.priority(regional) < ahead.priority(whole)  # the cheap program's job runs first


def test_a_run_serves_a_regional_program_from_its_checkpoint_and_skips_it_where_no_block_repeats(tmp_path):
    ctx = run(compose_config([*TINY, *STACKED, "backends=[eager,inductor_regional]", "compile_cache.workers=0",
                              "route=one_backend", "route.backend=inductor_regional", "model.batch_sizes=[1,8]"]),
              tmp_path / "stacked")
    outcome = ctx.outcomes["inductor_regional"]
    assert outcome.status == "ok", outcome.reason
    saved = json.loads((tmp_path / "stacked" / "capture.json").read_text())["inductor_regional"]
    assert saved["status"] == "ok"
    assert ctx.validation["ok"], ctx.validation  # reloaded from its checkpoint, the regional program answers as eager
    plain = run(compose_config([*TINY, "backends=[eager,inductor_regional]", "compile_cache.workers=1"]),
                tmp_path / "mlp")
    skipped = plain.outcomes["inductor_regional"]
    assert skipped.status == "skipped" and "repeats no block" in skipped.reason
    assert skipped.cost.ahead_s == 0  # no worker compiled it
