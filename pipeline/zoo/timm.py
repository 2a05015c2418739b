"""``model=timm``: any timm model, ``timm.create_model(name, pretrained=False, **kwargs)``.

Its input ``x`` takes the model's default input size (its pretrained config's ``input_size``,
with ``img_size`` and ``in_chans`` from ``model.timm.kwargs`` where given); ``model.inputs.x.shape``
overrides it.
"""

from __future__ import annotations

from typing import Any, Dict, Mapping

from torch import nn

from pipeline.errors import ConfigError
from pipeline.zoo import close_to, require

DEFAULT_INPUT = (3, 224, 224)  # for a model without a pretrained config


def timm_module(name: str) -> Any:
    """timm, once ``name`` is known to be one of its models."""
    timm = require("timm", "timm", "model=timm")
    if not timm.is_model(name):
        raise ConfigError(f"model.timm.name={name}: timm {timm.__version__} has no such model"
                          f"{close_to(name, timm.list_models())}; e.g. model.timm.name=resnet18")
    return timm


def build(name: str, kwargs: Mapping[str, Any]) -> nn.Module:
    """The timm model ``name`` with random weights (Hydra calls this through ``model.build``)."""
    return timm_module(name).create_model(name, pretrained=False, **dict(kwargs or {}))


def inputs(spec: Mapping[str, Any]) -> Dict[str, Dict[str, Any]]:
    """``model.inputs`` for the model of ``model.timm``: ``x``, channels x height x width."""
    name, kwargs = str(spec["name"]), dict(spec.get("kwargs") or {})
    pretrained = timm_module(name).get_pretrained_cfg(name)
    channels, *size = pretrained.input_size if pretrained is not None else DEFAULT_INPUT
    if "img_size" in kwargs:
        img = kwargs["img_size"]
        size = list(img) if isinstance(img, (list, tuple)) else [img, img]
    return {"x": {"shape": [int(kwargs.get("in_chans", channels)), *map(int, size)], "dtype": "float32"}}
