"""tweakpipe: tune a PyTorch model for inference by routing each batch size to its fastest backend.

``tune``, ``save``, ``load`` and ``load_logged_model`` (a routed model a run logged to MLflow) are imported on
first use, so ``import pipeline`` stays light (no torch, Hydra or MLflow until they are needed); ``dir(pipeline)``
lists them.
"""

import importlib as _importlib

_LAZY = {"tune": "pipeline.api", "save": "pipeline.route.checkpoint", "load": "pipeline.api",
         "load_logged_model": "pipeline.api"}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> object:
    if name in _LAZY:
        return getattr(_importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'pipeline' has no attribute {name!r}")


def __dir__() -> list:
    """The API, not this module's helpers (PEP 562); subpackages are imported by name (``pipeline.record.report``)."""
    return list(__all__)
