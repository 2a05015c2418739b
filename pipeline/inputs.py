"""Where a run's ``model.inputs`` come from when the config leaves them out: filled in before the checks.

Inputs written in the config are used as written. Left out (or an input's ``shape: ???``), they come
from ``model.examples`` (the user's own tensors, which then also make every tuned batch), else from
the model's library: ``model=hf`` reads the transformers model's signature and config, ``model=timm``
the model's default input size.
"""

from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Tuple

import torch
from omegaconf import DictConfig, OmegaConf

from pipeline import examples as user_examples
from pipeline.errors import ConfigError
from pipeline.config.schema import InputSpec
from pipeline.seqlen import spec_at

MISSING_SHAPE = "???"
Spec = Dict[str, Dict[str, Any]]


def given_inputs(mcfg: DictConfig) -> Optional[Spec]:
    """``model.inputs`` as written (shapes left out as ``???``), or None where it is left out or empty."""
    if OmegaConf.is_missing(mcfg, "inputs") or not mcfg.inputs:
        return None
    return OmegaConf.to_container(mcfg.inputs, resolve=True)


def derived_inputs(mcfg: DictConfig, given: Optional[Mapping[str, Any]]
                   ) -> Tuple[Optional[Spec], Dict[str, torch.Tensor]]:
    """The inputs the model's source implies (None where nothing implies any), and the example tensors
    where that source is a file."""
    if mcfg.examples:
        examples, spec = user_examples.from_file(mcfg.examples, given)
        return spec, examples
    if mcfg.hf is not None and mcfg.timm is not None:
        raise ConfigError("model sets both hf and timm; a model comes from one library, e.g. model=hf or model=timm")
    if mcfg.hf is not None:
        from pipeline.zoo import hf

        return hf.inputs(OmegaConf.to_container(mcfg.hf, resolve=True)), {}
    if mcfg.timm is not None:
        from pipeline.zoo import timm

        return timm.inputs(OmegaConf.to_container(mcfg.timm, resolve=True)), {}
    return None, {}


def complete(cfg: DictConfig) -> Dict[str, torch.Tensor]:
    """Fill in what ``cfg.model.inputs`` leaves out; return the user's example tensors (``model.examples``,
    on the CPU), empty where there are none."""
    mcfg = cfg.model
    given = given_inputs(mcfg)
    derived, examples = derived_inputs(mcfg, given)
    if derived is None:
        if given is None:
            raise ConfigError("model.examples is missing, and model.inputs names no input: save a batch of your "
                              "model's inputs, torch.save({'x': x}, 'my_inputs.pt'), and give "
                              "model.examples=my_inputs.pt (or write each input's shape under inputs in a model YAML)")
        return {}
    inputs = dict(derived) if given is None else given
    for name, entry in inputs.items():
        if entry.get("shape") == MISSING_SHAPE:
            if name not in derived:
                raise ConfigError(f"model.inputs.{name} has no shape, and the model has no input {name!r} to take "
                                  f"it from (its inputs: {sorted(derived)}); give model.inputs.{name}.shape")
            entry["shape"] = derived[name]["shape"]
    mcfg.inputs = {name: InputSpec(**entry) for name, entry in inputs.items()}
    return examples


def at_longest(cfg: DictConfig) -> None:
    """With tuned lengths (``model.seq_lens``, checked first: ``pipeline.preflight.checks.check_lengths``), every
    input's length dimension at the longest of them: the spec then describes the largest call, which the memory
    checks and the graph buffers are sized for."""
    lengths = list(cfg.model.seq_lens)
    if not lengths:
        return
    spec = OmegaConf.to_container(cfg.model.inputs, resolve=True)
    cfg.model.inputs = {name: InputSpec(**entry) for name, entry in spec_at(spec, max(lengths)).items()}
