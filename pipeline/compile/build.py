"""Build a backend, then warm it up, one way wherever it happens: capture, the compile workers and a checkpoint load.

Each builds a backend for a :class:`BuildSpec` and then calls it where its compiles must happen before anything
is timed or served (capture's checks against eager at every tuned cell, a worker's calls at the same cells, a
load's at the tuned sizes each backend owns). :func:`build_and_warm` does both while every compile is accounted
(``pipeline.compile.cost``) and recorded (the Inductor cache entries a checkpoint carries beside it:
``pipeline.compile.artifacts``), so the three cannot drift apart: a worker that built otherwise than capture would
fill the cache with programs capture never loads.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, Sequence

import torch
from torch import nn

from pipeline import devices
from pipeline.backends import Backend
from pipeline.batching import BatchDims
from pipeline.compile import artifacts
from pipeline.compile.cost import BuildCost, compiles_into


@dataclass(frozen=True)
class BuildSpec:
    """What a backend is built for: the model, the sample it is built on (its largest call), the device, the batch
    sizes it serves (``sizes``) and the tuned ones among them, served unpadded (``exact``), and where the batch
    and the length lie in every input and output (``dims``)."""

    model: nn.Module
    sample: Dict[str, torch.Tensor]
    device: torch.device
    sizes: Sequence[int]
    exact: Sequence[int]
    dims: BatchDims


def build_and_warm(backend: Backend, spec: BuildSpec, cost: BuildCost, warm: Callable[[Backend], Any]) -> float:
    """Build ``backend`` for ``spec``, then run ``warm(backend)`` with every compile accounted to it (a Dynamo
    recompile limit hit raises: ``Backend.watched``); the build's figures go into ``cost``, its Inductor cache
    entries onto ``backend.artifacts``. Returns the seconds ``warm`` took, the device synchronised."""
    # a program built ahead of time compiles nothing here: no cache entries to record (nor Inductor to import)
    with compiles_into(cost), artifacts.recorded(backend.candidate.compiles and backend.prebuilt is None) as recorded:
        start = time.perf_counter()
        backend.build(spec.model, spec.sample, spec.device, list(spec.sizes), spec.exact, spec.dims)
        cost.build_s, start = time.perf_counter() - start, time.perf_counter()
        with backend.watched():
            warm(backend)
        devices.synchronize(spec.device)
        warm_s = time.perf_counter() - start
    stats = backend.stats()
    cost.record_s = float(stats.get("record_seconds", 0.0))
    cost.first_calls_s = float(stats.get("first_calls_seconds", 0.0))
    backend.artifacts = recorded
    return warm_s
