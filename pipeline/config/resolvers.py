"""Interpolations the config tree uses for run directories that no two runs share, named after the model.

``${tweakpipe.pid:}`` is this process's id: two runs started in the same second (the timestamp's
resolution) are two processes, so their directories differ. ``${tweakpipe.resume_or:A,B}`` is
``A`` when set (``resume=<run dir>`` continues in that directory), else ``B``.
``${tweakpipe.model_label:}`` is :func:`model_label` of the config it is in (its model, its overrides).
"""

from __future__ import annotations

import os
from typing import Any, Iterable

from omegaconf import DictConfig, OmegaConf

from pipeline.config.own_model import TARGET_KEY, override_key


def resume_or(resume: Any, fresh: Any) -> Any:
    return resume or fresh


def model_label(name: Any, target: Any, overrides: Iterable[Any] = ()) -> str:
    """The name a run carries (its directory, its MLflow run): the model config's ``name``, or the class (or
    function) name of ``_target_`` where the overrides set ``model.build._target_`` and not ``model.name``: the
    default model's ``mlp`` would name someone else's model."""
    keys = {override_key(str(o)) for o in overrides or ()}
    if TARGET_KEY in keys and "model.name" not in keys and target:
        return str(target).rsplit(".", 1)[-1]
    return str(name)


def config_model_label(*, _root_: DictConfig) -> str:
    """:func:`model_label` of the composed config (Hydra's node holds the command line's overrides)."""
    return model_label(_root_.model.name, OmegaConf.select(_root_, "model.build._target_", default=None),
                       OmegaConf.select(_root_, "hydra.overrides.task", default=()))


def register_resolvers() -> None:
    """Register the resolvers once per process (Hydra composes with them before any run starts)."""
    if not OmegaConf.has_resolver("tweakpipe.pid"):
        OmegaConf.register_new_resolver("tweakpipe.pid", os.getpid, use_cache=True)
    if not OmegaConf.has_resolver("tweakpipe.resume_or"):
        OmegaConf.register_new_resolver("tweakpipe.resume_or", resume_or)
    if not OmegaConf.has_resolver("tweakpipe.model_label"):
        OmegaConf.register_new_resolver("tweakpipe.model_label", config_model_label)
