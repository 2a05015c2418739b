"""tweakpipe: tune a PyTorch model for inference by routing each batch size to its fastest backend.

``tune``, ``save`` and ``load`` are imported on first use, so ``import pipeline`` stays light
(no torch, Hydra or MLflow until they are needed).
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {"tune": "pipeline.api", "save": "pipeline.route.checkpoint", "load": "pipeline.route.checkpoint"}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'pipeline' has no attribute {name!r}")
