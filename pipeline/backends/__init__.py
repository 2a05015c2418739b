"""The backend registry: a candidate's ``kind`` -> implementation.

Checkpoints name backends by kind, never by import path, so loading one cannot import or run
arbitrary code. Each kind's keys are its schema's (``pipeline.config.backend_schema.KINDS``), which a
:class:`~pipeline.backends.candidate.Candidate` holds as its settings.
"""

from __future__ import annotations

from typing import Dict, Type

from pipeline.backends import rules
from pipeline.backends.base import Backend, BackendUnsupported
from pipeline.backends.candidate import Candidate
from pipeline.backends.eager import EagerBackend
from pipeline.backends.graph import GraphBackend
from pipeline.backends.inductor import InductorBackend
from pipeline.backends.onnxruntime import OnnxRuntimeBackend
from pipeline.backends.openvino import OpenVinoBackend

KINDS: Dict[str, Type[Backend]] = {cls.kind: cls for cls in (EagerBackend, InductorBackend, GraphBackend,
                                                             OpenVinoBackend, OnnxRuntimeBackend)}


def create(candidate: Candidate) -> Backend:
    """Check the rules between a candidate's settings (``rules.check``) and construct its backend (no torch work
    yet)."""
    rules.check(candidate)
    return KINDS[candidate.kind](candidate)


__all__ = ["Backend", "BackendUnsupported", "Candidate", "KINDS", "create"]
