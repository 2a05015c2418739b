"""Copies of the caller's model: tuning and loading work on one, so the caller's stays exactly as it was.

``tune`` tunes a deep copy (eval mode, device moves and buffers advanced by thousands of timed calls
never reach the caller's model). ``load`` builds its backends on a copy that holds the checkpoint's
own tensors in place of the caller's weights, so a file refused while its backends are built (a
precision the device cannot run, a failed export, a missing package) leaves the caller's model
untouched, and the served backends never point at a half-updated one.
"""

from __future__ import annotations

import copy
from typing import Any, Dict, Mapping

import torch
from torch import nn


def own_copy(model: nn.Module, memo: Dict[int, Any] | None = None, purpose: str = "tune works on a copy of the "
             "model so that yours stays exactly as it was") -> nn.Module:
    """``copy.deepcopy(model, memo)``, or a one-line TypeError saying how to make the model copyable."""
    try:
        return copy.deepcopy(model, memo)
    except Exception as exc:
        raise TypeError(f"{purpose}, but copy.deepcopy({type(model).__name__}) failed: {exc}; make the model "
                        f"deep-copyable (no open files, locks or generators in its attributes)") from exc


def holding(model: nn.Module, state: Mapping[str, torch.Tensor]) -> nn.Module:
    """A deep copy of ``model`` whose weights and buffers are ``state``'s tensors themselves (checked to fit
    beforehand): the caller's tensors are neither copied nor changed, and tied weights stay tied."""
    memo: Dict[int, Any] = {}
    for key, own in model.state_dict(keep_vars=True).items():
        if key in state and id(own) not in memo:
            given = state[key].detach()
            memo[id(own)] = nn.Parameter(given, requires_grad=own.requires_grad) if isinstance(own, nn.Parameter) \
                else given
    return own_copy(model, memo, "load builds on a copy of the model so that yours stays as it was until the "
                                 "checkpoint has loaded")
