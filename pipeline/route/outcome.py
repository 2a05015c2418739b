"""What the route stage hands on: the route done and every figure of it, typed.

The route stage decides the route, builds each routed program ahead of time, packs the checkpoint and computes the
routed model's figures (``pipeline.route.figures``); the recorder then writes what it is handed (``route.json``, the
checkpoint as an artifact, MLflow's metrics and tags, the logged model) and decides nothing. One place computes
each figure, so ``route.json`` and ``cost.json`` agree (the ahead-of-time seconds are in both).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional


@dataclass(frozen=True)
class RouteReport:
    """The route stage's result.

    ``info`` is ``route.json`` whole: the rule, the ranges (``table`` where lengths are tuned), the medians it was
    decided on, the reference comparison, the noisy and contended cells and whether the route is settled, the cost
    (the ahead-of-time builds included) and, once the checkpoint is packed, each routed program's ahead-of-time
    report (``aot``). ``text``: the route in one line; ``tiles``: its ranges or tiles as plain data.
    ``figures``: the routed model's latency and speed-ups per cell (``pipeline.route.figures.routed_figures``);
    ``reference_figures``: its speed-ups over the user's best own compile. ``best_single``: the backend
    ``route=highest_throughput`` would deploy alone. ``checkpoint`` and ``artifacts``: the files written (None where
    nothing ships: a route refused under ``route.require_confident``, or a save that failed), with the checkpoint's
    format."""

    info: Mapping[str, Any]
    text: str = ""
    tiles: List[Dict[str, Any]] = field(default_factory=list)
    figures: Mapping[str, float] = field(default_factory=dict)
    reference_figures: Mapping[str, float] = field(default_factory=dict)
    best_single: Optional[str] = None
    checkpoint: Optional[Path] = None
    artifacts: Optional[Path] = None
    checkpoint_format: Optional[int] = None

    @property
    def table(self) -> bool:
        """Whether the route is a (batch range x length range) table (lengths were tuned)."""
        return "table" in self.info

    @property
    def unmeasured(self) -> Dict[str, str]:
        """The references the comparison lacks, and why (route.json's ``reference.unmeasured``)."""
        return dict((self.info.get("reference") or {}).get("unmeasured", {}))

    def tags(self) -> Dict[str, str]:
        """What MLflow's tags say of the route: whether it rests on noisy cells, is settled, which cells are noisy,
        and, where a route was built, the route in one line and as JSON (the table has its own tag: the report's 1-D
        ``route_json`` stays away)."""
        tags = {"route.rests_on_noisy": str(self.info["rests_on_noisy"]).lower(),
                "route.settled": str(self.info["settled"]).lower(),
                "route.noisy_cells": cell_names(self.info["noisy_cells"])}
        if self.tiles:
            tags.update({"route": self.text,
                         ("route_table_json" if self.table else "route_json"): json.dumps(self.tiles)})
        return tags

    def to_json(self) -> str:
        """``route.json``."""
        return json.dumps(self.info, indent=2)


def cell_names(cells: List[Dict[str, Any]]) -> str:
    """Cells of route.json as a log line and a tag name them: ``eager bs=1, inductor bs=4 len=32``."""
    return ", ".join(f"{c['backend']} bs={c['batch_size']}" + (f" len={c['seq_len']}" if "seq_len" in c else "")
                     for c in cells)
