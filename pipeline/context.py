"""The run context: what every stage reads from and writes to, in one place."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional

import torch
from omegaconf import DictConfig
from torch import nn

from pipeline.backends import Backend
from pipeline.routing import Range
from pipeline.timing import Measurement


@dataclass
class BackendOutcome:
    """What capture found for one backend: ok, failed (with the error) or skipped (unsupported)."""

    name: str
    kind: str
    status: str = "pending"  # ok | failed | skipped
    reason: str = ""
    build_seconds: float = 0.0
    max_rel_error: float = float("nan")
    tolerance: float = float("nan")
    peak_memory_bytes: int = 0

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)


@dataclass
class RunContext:
    """Data flows one way: config -> context -> capture -> profile -> route -> validate."""

    cfg: DictConfig
    run_dir: Path
    device: torch.device
    model: nn.Module
    inputs: Dict[str, Dict[str, Any]]
    tracker: Any
    api: bool = False  # the caller's model, tuned through pipeline.tune (not built from model.build)
    backends: Dict[str, Backend] = field(default_factory=dict)
    outcomes: Dict[str, BackendOutcome] = field(default_factory=dict)
    profile: Dict[str, Dict[int, Measurement]] = field(default_factory=dict)
    host_probe_ms: Dict[str, float] = field(default_factory=dict)  # host speed before/after the profile
    route: List[Range] = field(default_factory=list)
    routed: Optional[nn.Module] = None
    checkpoint_path: Optional[Path] = None
    validation: Dict[str, Any] = field(default_factory=dict)
    stage_seconds: Dict[str, float] = field(default_factory=dict)

    @property
    def batch_sizes(self) -> List[int]:
        return sorted(set(int(b) for b in self.cfg.model.batch_sizes))

    def failures(self) -> Dict[str, str]:
        """Excluded backends and why."""
        return {n: f"{o.status}: {o.reason}" for n, o in self.outcomes.items() if o.status != "ok"}

    def medians(self) -> Dict[str, Dict[int, float]]:
        """The profile as backend -> batch size -> median ms (the router's input)."""
        return {b: {bs: m.median for bs, m in per.items() if m.count} for b, per in self.profile.items()}
