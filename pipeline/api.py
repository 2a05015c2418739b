"""The Python API: tune your own model in-process with the same config tree and stages as the command line.

    tuned = pipeline.tune(model, {"x": x}, overrides=["backends=[eager,inductor]", "tracking=off"])
    pipeline.save(tuned, "model.tweak")
    served = pipeline.load("model.tweak", model)
"""

from __future__ import annotations

from pipeline.config import SHIPPED_CONF
import copy
import datetime
import inspect
from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple, Union

import torch
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig
from torch import nn

from pipeline import runner
from pipeline.route.checkpoint import load, save
from pipeline.config.errors import ConfigError
from pipeline.models import DTYPES
from pipeline.route.served import RoutedModule
from pipeline.config.schema import InputSpec, register_configs

DTYPE_NAMES = {dtype: name for name, dtype in DTYPES.items()}

Example = Union[torch.Tensor, Sequence[torch.Tensor], Mapping[str, torch.Tensor]]


def compose_config(overrides: Sequence[str] = ()) -> DictConfig:
    """The shipped ``config.yaml`` composed with command-line style overrides, as ``python -m pipeline`` would."""
    register_configs()
    with initialize_config_dir(config_dir=str(SHIPPED_CONF), version_base="1.3", job_name="tweakpipe_api"):
        return compose(config_name="config", overrides=list(overrides))


def named_inputs(model: nn.Module, example_inputs: Example) -> Dict[str, torch.Tensor]:
    """Example inputs by name: a dict as given, else matched to ``model.forward``'s parameters in order."""
    if isinstance(example_inputs, Mapping):
        named = dict(example_inputs)
    else:
        args: Tuple[Any, ...] = (example_inputs,) if isinstance(example_inputs, torch.Tensor) else tuple(example_inputs)
        params = list(inspect.signature(model.forward).parameters.values())
        if any(p.kind is p.VAR_POSITIONAL for p in params[:len(args)]) or len(args) > len(params):
            raise TypeError(f"{type(model).__name__}.forward cannot name {len(args)} positional inputs; "
                            f"pass example_inputs as a dict of input name -> tensor")
        named = {p.name: a for p, a in zip(params, args)}
    params = inspect.signature(model.forward).parameters.values()
    if any(p.kind is p.POSITIONAL_ONLY and p.name in named for p in params):
        raise TypeError(f"{type(model).__name__}.forward has positional-only parameters; tuned models are called "
                        f"with keyword inputs, so make them ordinary parameters")
    required = [p.name for p in params if p.default is p.empty and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    missing = [n for n in required if n not in named]
    if missing:
        raise TypeError(f"{type(model).__name__}.forward needs {missing}, which example_inputs do not give")
    return named


def input_spec(model: nn.Module, example_inputs: Example) -> Dict[str, Dict[str, Any]]:
    """The config's ``model.inputs`` for example tensors: per-sample shape, dtype and how to fill samples."""
    named = named_inputs(model, example_inputs)
    if not named:
        raise ValueError("example_inputs is empty; give at least one batch-first tensor")
    spec: Dict[str, Dict[str, Any]] = {}
    batch = {}
    for name, t in named.items():
        if not isinstance(t, torch.Tensor) or t.dim() < 1:
            raise TypeError(f"example input {name!r} must be a batch-first tensor, got {type(t).__name__}"
                            + (" with no batch dimension" if isinstance(t, torch.Tensor) else ""))
        if t.dtype not in DTYPE_NAMES:
            raise TypeError(f"example input {name!r} has dtype {t.dtype}; use one of {sorted(DTYPES)}")
        batch[name] = t.shape[0]
        entry: Dict[str, Any] = {"shape": list(t.shape[1:]), "dtype": DTYPE_NAMES[t.dtype]}
        if t.dtype.is_floating_point:
            entry["fill"] = "randn"
        elif t.numel() and bool((t == 1).all()):
            entry["fill"] = "ones"  # masks of all ones stay all ones
        else:
            entry.update(fill="randint", high=max(int(t.max()) + 1, 1) if t.numel() else 2)  # draws in [0, high)
        spec[name] = entry
    if len(set(batch.values())) > 1:
        raise ValueError(f"example inputs disagree on the batch size (first dimension): {batch}")
    return spec


def default_run_dir(name: str) -> Path:
    """``outputs/api/<timestamp>_<name>``, made unique if two runs start in the same second."""
    base = Path("outputs/api") / f"{datetime.datetime.now():%Y-%m-%d_%H-%M-%S}_{name}"
    path, n = base, 1
    while path.exists():
        path, n = base.with_name(f"{base.name}-{n}"), n + 1
    return path


def own_copy(model: nn.Module) -> nn.Module:
    """A deep copy to tune, so nothing the stages do (eval mode, device moves, buffers advanced by
    thousands of timed calls) reaches the caller's model."""
    try:
        return copy.deepcopy(model)
    except Exception as exc:
        raise TypeError(f"tune works on a copy of the model so that yours stays exactly as it was, but "
                        f"copy.deepcopy({type(model).__name__}) failed: {exc}; make the model deep-copyable "
                        f"(no open files, locks or generators in its attributes)") from exc


def tune(model: nn.Module, example_inputs: Example, overrides: Sequence[str] = (),
         run_dir: Optional[Union[str, Path]] = None) -> RoutedModule:
    """Run the configured stages on ``model`` in-process and return the routed module.

    ``overrides`` are the strings the command line takes (``"backends=[eager,inductor]"``,
    ``"profile=quick"``, ``"tracking=off"``, ``"model.batch_sizes=[1,8,32]"``). The input spec
    comes from ``example_inputs``; the batch sizes from the overrides or the config's default.
    ``model`` itself is left exactly as it was (its device, mode, weights and buffers): tuning works
    on a copy, which the returned module serves. The run directory (default
    ``outputs/api/<timestamp>_<name>``) holds the same files as a command-line run, ``model.tweak``
    included.
    """
    cfg = compose_config(overrides)
    if "route" not in cfg.stages:
        raise ConfigError(f"tune returns the routed model, so stages must include route; got {list(cfg.stages)}")
    cfg.model.inputs = {name: InputSpec(**entry) for name, entry in input_spec(model, example_inputs).items()}
    if not any(o.lstrip("+").startswith("model.name=") for o in overrides):
        cfg.model.name = type(model).__name__
    cfg.model.build = {"_target_": f"{type(model).__module__}.{type(model).__qualname__}"}
    ctx = runner.run(cfg, Path(run_dir) if run_dir is not None else default_run_dir(cfg.model.name),
                     model=own_copy(model))
    return ctx.routed


__all__ = ["tune", "save", "load", "compose_config", "input_spec"]
