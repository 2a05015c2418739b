"""The user's own data: tuning on example rows, any batch dimension, example files, inputs that cannot be batched."""

from __future__ import annotations

from typing import List, Optional

import pytest
import torch
from torch import nn

import pipeline
from pipeline import runner
from pipeline.api import compose_config
from pipeline.errors import ConfigError
from pipeline.examples import input_spec, pooled
from pipeline.route import checkpoint
from pipeline.errors import CheckpointError
from models_for_tests import CellGRU, sequence_first

QUICK = ["profile=quick", "tracking=off", "backends=[eager]", "reference=false"]


class SqrtFeatures(nn.Module):
    """Valid only on positive features: a square root of a negative one is NaN."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(torch.sqrt(x))


def positive(rows: int) -> torch.Tensor:
    return torch.rand(rows, 4, generator=torch.Generator().manual_seed(rows)) + 0.1


def test_a_model_valid_only_on_its_data_is_tuned_and_validated_on_it(tmp_path):
    model = SqrtFeatures()
    tuned = pipeline.tune(model, positive(5), overrides=[*QUICK, "model.batch_sizes=[1,4]"], run_dir=tmp_path)
    assert (tmp_path / "validation.json").is_file()
    x = positive(9)
    with torch.inference_mode():
        torch.testing.assert_close(tuned(x), model(x))


def test_a_list_of_batches_is_pooled_and_batches_must_agree():
    first, second = {"x": positive(2)}, {"x": positive(3)}
    assert torch.equal(pooled(SqrtFeatures(), [first, second])["x"], torch.cat([first["x"], second["x"]]))
    assert input_spec(SqrtFeatures(), [(positive(2),), (positive(1),)]) == {
        "x": {"shape": [4], "dtype": "float32", "fill": "randn"}}
    with pytest.raises(ValueError, match=r"batch 1: input 'x' is \(2, 5\).*differ only in their batch size"):
        pooled(SqrtFeatures(), [first, {"x": torch.rand(2, 5)}])


def test_inputs_that_are_not_one_tensor_per_name_fail_naming_what_is_supported():
    class Detector(nn.Module):
        def forward(self, images):
            return [image.mean() for image in images]

    class Declared(nn.Module):  # as torchvision's detection models declare it
        def forward(self, images: List[torch.Tensor], targets: Optional[List[dict]] = None):
            return [image.mean() for image in images]

    images = [torch.rand(3, 8, 8), torch.rand(3, 6, 9)]
    for example in ([images], {"images": images}):
        with pytest.raises(TypeError, match=r"example input 'images' is a list of 2 Tensors, not a tensor; "
                                            r"tweakpipe tunes inputs that are one tensor per name"):
            pipeline.tune(Detector(), example, overrides=QUICK)
    with pytest.raises(TypeError, match=r"Declared.forward takes 'images' as List\[torch.Tensor\], not one tensor; "
                                        r"tweakpipe tunes inputs that are one tensor per name"):
        pipeline.tune(Declared(), images, overrides=QUICK)  # two tensors: images and targets, by position


def test_a_sequence_first_gru_is_served_by_inductor_along_its_batch_dimension(tmp_path):
    model = CellGRU()
    tuned = pipeline.tune(model, sequence_first(4), batch_dims={"x": 1}, run_dir=tmp_path, overrides=[
        "profile=quick", "tracking=off", "backends=[eager,inductor]", "backends.inductor.dynamic=true",
        "route=one_backend", "route.backend=inductor", "model.batch_sizes=[1,4]", "validate.extra_batch_sizes=[3]",
        "validate.check_reload=false"])  # the checkpoint round trip of batch dims is the next test's
    assert tuned.route[0].backend == "inductor" and tuned.record.output_batch_dims == {"output[0]": 1, "output[1]": 1}
    with torch.inference_mode():
        for bs in (1, 3, 4, 9):
            x = sequence_first(bs)
            torch.testing.assert_close(tuned(x), model(x), rtol=1e-4, atol=1e-5)


def test_an_nn_gru_without_batch_first_keeps_its_batch_dims_through_the_checkpoint(tmp_path):
    gru = nn.GRU(5, 6, num_layers=2)  # input (time, batch, 5); outputs (time, batch, 6) and h_n (layers, batch, 6)
    tuned = pipeline.tune(gru, sequence_first(4), batch_dims={"input": 1}, run_dir=tmp_path,
                          overrides=[*QUICK, "model.batch_sizes=[1,4]"])
    loaded = checkpoint.load(tmp_path / "model.tweak", nn.GRU(5, 6, num_layers=2))
    assert loaded.record.inputs["input"]["batch_dim"] == 1
    assert tuned.record.output_batch_dims == loaded.record.output_batch_dims == {"output[0]": 1, "output[1]": 1}
    with torch.inference_mode():
        for bs in (1, 3, 9):
            torch.testing.assert_close(loaded(sequence_first(bs)), gru(sequence_first(bs)))
    with pytest.raises(ValueError, match=r"per-sample shape \(3, 4\), but this model was tuned for \(3, 5\) "
                                         r"\(batch in dimension 1\)"):
        tuned(torch.randn(3, 2, 4))


def test_batch_dims_are_checked_against_the_examples():
    with pytest.raises(TypeError, match=r"with no batch dimension 3"):
        input_spec(nn.GRU(5, 6), sequence_first(2), batch_dims={"input": 3})
    with pytest.raises(ValueError, match=r"batch_dims names \['x'\], which are not inputs"):
        input_spec(nn.GRU(5, 6), sequence_first(2), batch_dims={"x": 1})
    assert input_spec(nn.GRU(5, 6), sequence_first(2), batch_dims={"input": 1}) == {
        "input": {"shape": [3, 5], "dtype": "float32", "fill": "randn", "batch_dim": 1}}


def test_a_checkpoint_with_bad_batch_dims_is_refused(tmp_path):
    tuned = pipeline.tune(SqrtFeatures(), positive(3), overrides=[*QUICK, "model.batch_sizes=[2]",
                                                                  "validate.check_reload=false"], run_dir=tmp_path)
    for field, value, named in (("inputs", {"x": {"shape": [4], "dtype": "float32", "batch_dim": 2}}, "batch_dim=2"),
                                ("output_batch_dims", {"output": 99}, r"output_batch_dims\['output'\]=99"),
                                ("output_batch_dims", {"import os": 0}, "is not an output tensor's path")):
        payload = {**checkpoint.payload_of(tuned), field: value}
        path = checkpoint.write(payload, tmp_path / f"{field}.tweak")
        with pytest.raises(CheckpointError, match=named):
            checkpoint.load(path, SqrtFeatures())


def test_a_config_run_takes_its_batches_from_model_examples(tmp_path):
    path = tmp_path / "examples.pt"
    torch.save({"x": torch.rand(6, 16) + 1}, path)
    cfg = compose_config(["model=tiny_mlp", *QUICK, f"model.examples={path}", "stages=[capture]"])
    ctx = runner.run(cfg, tmp_path / "run")
    assert torch.equal(ctx.examples["x"], torch.load(path)["x"])
    assert "your example inputs" in (tmp_path / "run" / "tweakpipe.log").read_text()


@pytest.mark.parametrize("content, named", [
    (None, "no such file"),
    ([torch.zeros(2, 16)], "holds a list; save a dict of input name -> tensor"),
    ({"x": torch.zeros(2, 15)}, r"input 'x' is per-sample \[15\] float32, but model.inputs says \[16\] float32"),
    ({"y": torch.zeros(2, 16)}, r"holds inputs \['y'\], but model.inputs names \['x'\]"),
])
def test_a_bad_examples_file_fails_before_any_work(tmp_path, content, named):
    path = tmp_path / "examples.pt"
    if content is not None:
        torch.save(content, path)
    cfg = compose_config(["model=tiny_mlp", *QUICK, f"model.examples={path}"])
    with pytest.raises(ConfigError, match=named):
        runner.run(cfg, tmp_path / "run")
    assert not (tmp_path / "run").exists()
