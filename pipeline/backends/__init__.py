"""The backend registry: config ``kind`` -> implementation.

Checkpoints name backends by kind, never by import path, so loading one cannot import or run
arbitrary code. Each kind's keys are its schema's (``pipeline.config.backend_schema.KINDS``).
"""

from __future__ import annotations

from typing import Any, Dict, Mapping, Type

from pipeline.backends import rules
from pipeline.backends.base import Backend, BackendUnsupported
from pipeline.backends.eager import EagerBackend
from pipeline.backends.graph import GraphBackend
from pipeline.backends.inductor import InductorBackend
from pipeline.backends.onnxruntime import OnnxRuntimeBackend
from pipeline.backends.openvino import OpenVinoBackend

KINDS: Dict[str, Type[Backend]] = {cls.kind: cls for cls in (EagerBackend, InductorBackend, GraphBackend,
                                                             OpenVinoBackend, OnnxRuntimeBackend)}


def create(name: str, cfg: Mapping[str, Any]) -> Backend:
    """Check a backend's config (``rules.check``) and construct it with every key of its kind (no torch work yet)."""
    settings = rules.check(name, cfg)
    return KINDS[settings["kind"]](name, settings)


__all__ = ["Backend", "BackendUnsupported", "KINDS", "create"]
