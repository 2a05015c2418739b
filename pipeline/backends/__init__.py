"""The backend registry: config ``kind`` -> implementation.

Checkpoints name backends by kind, never by import path, so loading one cannot import or run
arbitrary code.
"""

from __future__ import annotations

from typing import Any, Dict, Mapping, Type

from pipeline.backends.base import Backend, BackendUnsupported
from pipeline.backends.eager import EagerBackend
from pipeline.backends.graph import GraphBackend
from pipeline.backends.inductor import InductorBackend

KINDS: Dict[str, Type[Backend]] = {cls.kind: cls for cls in (EagerBackend, InductorBackend, GraphBackend)}


def backend_class(name: str, cfg: Mapping[str, Any]) -> Type[Backend]:
    """The class for a backend config, with an error listing the kinds that exist."""
    kind = cfg.get("kind")
    if kind not in KINDS:
        raise ValueError(f"backend {name!r}: unknown kind {kind!r}; use one of {sorted(KINDS)}")
    return KINDS[kind]


def create(name: str, cfg: Mapping[str, Any]) -> Backend:
    """Check a backend's config and construct it (no torch work yet)."""
    cls = backend_class(name, cfg)
    cls.check_config(name, cfg)
    return cls(name, cfg)


__all__ = ["Backend", "BackendUnsupported", "KINDS", "backend_class", "create"]
