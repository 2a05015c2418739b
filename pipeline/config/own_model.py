"""Your own model by config: ``model.build._target_=mypkg.MyNet model.examples=my_inputs.pt`` starts from an empty
model, not from the default one.

Hydra composes the defaults list first (``model: mlp``) and applies the command line's keys on top, so a target
named alone would inherit the default model's inputs and build arguments (``width``, ``depth``) and be built with
them. Where the overrides set ``model.build._target_`` and choose no ``model=<option>``, ``model=custom`` is added
beside it (``conf/model/custom.yaml``: a target and an examples file to give, nothing else), before Hydra composes:
the run, each job of a sweep and :func:`pipeline.api.compose_config` compose the same config, and the recorded
overrides say what was composed. A model option chosen on the command line (``model=resnet18
model.build._target_=...``) is kept, with its inputs and build arguments.
"""

from __future__ import annotations

from typing import List, Sequence

TARGET_KEY = "model.build._target_"
OWN_MODEL = "model=custom"


def override_key(override: str) -> str:
    """The key or group an override sets: ``+model.build.hidden=32`` sets ``model.build.hidden``, ``model=tiny_mlp``
    and ``model@x=y`` the group ``model``."""
    return override.lstrip("+~").split("=", 1)[0].split("@", 1)[0]


def with_own_model(overrides: Sequence[str]) -> List[str]:
    """``overrides`` with ``model=custom`` just before the one that sets ``model.build._target_``, where no override
    chooses a ``model`` option; else as they are. Options (``--config-dir``, ``-m``) and their values are passed
    over: none is an override of either key."""
    keys = [None if o.startswith(("-", "~")) else override_key(o) for o in overrides]
    if TARGET_KEY not in keys or "model" in keys:
        return list(overrides)
    at = keys.index(TARGET_KEY)
    return [*overrides[:at], OWN_MODEL, *overrides[at:]]
