"""The shipped models, built as the config tree builds them, give outputs that can catch a wrong backend."""

from __future__ import annotations

import pytest
import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf

from conftest import CONF
from pipeline.inputs import complete
from pipeline.measure.compare import uninformative
from pipeline.leaves import tensor_leaves
from pipeline.models import make_inputs

# model=custom is your own model, named on the command line (tests/test_own_model.py runs it)
MODELS = sorted(p.stem for p in (CONF / "model").glob("*.yaml") if p.stem not in ("base_model", "custom"))
# model=hf and model=timm at a size that builds in a second.
SMALL = {"hf": ["+model.hf.config={num_hidden_layers: 2, hidden_size: 64, num_attention_heads: 2}",
                "model.hf.seq_len=16"],
         "timm": ["model.timm.name=resnet10t", "model.inputs.x.shape=[3,64,64]"]}


@pytest.mark.parametrize("name", MODELS)
def test_every_shipped_model_answers_differently_for_different_samples(compose_cfg, name):
    cfg = compose_cfg([f"model={name}", "tracking=off", *SMALL.get(name, [])])
    complete(cfg)
    torch.manual_seed(cfg.seed)
    model = instantiate(cfg.model.build).eval()
    spec = OmegaConf.to_container(cfg.model.inputs, resolve=True)
    with torch.inference_mode():
        out = model(**make_inputs(spec, 2, torch.device("cpu"), cfg.seed))
    assert not uninformative(out), name
    first = next(iter(tensor_leaves(out).values()))  # logits, or a transformers output's first field
    assert not torch.equal(first[0], first[1]), f"{name} gives the same output for two different samples"
