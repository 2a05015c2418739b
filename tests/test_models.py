"""The shipped models, built as the config tree builds them, give outputs that can catch a wrong backend."""

from __future__ import annotations

import pytest
import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf

from conftest import CONF, TINY
from pipeline.compare import check_informative
from pipeline.models import make_inputs
from pipeline.runner import run

MODELS = sorted(p.stem for p in (CONF / "model").glob("*.yaml") if p.stem != "base_model")


@pytest.mark.parametrize("name", MODELS)
def test_every_shipped_model_answers_differently_for_different_samples(compose_cfg, name):
    cfg = compose_cfg([f"model={name}", "tracking=off"])
    torch.manual_seed(cfg.seed)
    model = instantiate(cfg.model.build).eval()
    spec = OmegaConf.to_container(cfg.model.inputs, resolve=True)
    with torch.inference_mode():
        out = model(**make_inputs(spec, 2, torch.device("cpu"), cfg.seed))
    check_informative(out, name)
    assert not torch.equal(out[0], out[1]), f"{name} gives the same output for two different samples"


def test_a_constant_reference_is_refused_with_its_cause():
    with pytest.raises(ValueError, match="constant 0.0.*zero-initialised last layer"):
        check_informative(torch.zeros(4, 10), "of m")
    check_informative(torch.zeros(1, 1), "of m")  # one element cannot be judged constant
    check_informative((torch.zeros(4, 10), torch.arange(3.0)), "of m")  # one informative tensor is enough


def test_capture_stops_on_a_model_whose_output_is_constant(compose_cfg, tmp_path):
    # No layers, constant inputs: the output is all ones whatever a backend does.
    cfg = compose_cfg(TINY + ["model.build.depth=0", "model.inputs.x.fill=ones"])
    with pytest.raises(ValueError, match="is the constant"):
        run(cfg, tmp_path)
