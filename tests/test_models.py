"""The shipped models, built as the config tree builds them, give outputs that can catch a wrong backend."""

from __future__ import annotations

import pytest
import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf

from conftest import CONF
from pipeline.measure.compare import uninformative
from pipeline.models import make_inputs

MODELS = sorted(p.stem for p in (CONF / "model").glob("*.yaml") if p.stem != "base_model")


@pytest.mark.parametrize("name", MODELS)
def test_every_shipped_model_answers_differently_for_different_samples(compose_cfg, name):
    cfg = compose_cfg([f"model={name}", "tracking=off"])
    torch.manual_seed(cfg.seed)
    model = instantiate(cfg.model.build).eval()
    spec = OmegaConf.to_container(cfg.model.inputs, resolve=True)
    with torch.inference_mode():
        out = model(**make_inputs(spec, 2, torch.device("cpu"), cfg.seed))
    assert not uninformative(out), name
    assert not torch.equal(out[0], out[1]), f"{name} gives the same output for two different samples"
