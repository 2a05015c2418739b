"""The routed model against the reference peers (the user's best by-hand ``torch.compile``) at every tuned cell.
Pure.

The router's promise is that each batch size goes to the fastest thing on offer, and the best copy the user would have
written by hand (in any of the modes they would try) is the honest check of it (``pipeline.backends.reference``). The
router keeps the promise by rule (a servable reference is a floor, ``policy.owners_with``); this says, cell by cell,
which reference mode was best, how far auto is ahead of it, and names every cell where it is slower beyond both
intervals with the reason (the reference cannot serve there, or the strategy does not apply the rule). Route.json's
``reference``, the log, MLflow's ``speedup_vs_compile/bs<N>`` and the report come from it.

A cell where auto's or the reference's median was measured on a busy host (``contended``) measures the other jobs as
much as either: it is kept, marked ``contended``, and left out of the worst and the geometric mean, which are None
where every cell is contended.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Collection, Dict, List, Mapping, Optional, Sequence, Tuple

from pipeline.route.policy import clearly_below

Cell = Any  # a batch size, or a (batch size, length) pair


def comparison(owners: Mapping[Cell, str], medians: Mapping[str, Mapping[Cell, float]],
               intervals: Mapping[str, Mapping[Cell, Tuple[float, float]]], references: Mapping[str, str],
               failures: Mapping[str, str], strategy: str,
               named: Callable[[Cell], Dict[str, Any]] = lambda cell: {"cell": cell},
               contended: Collection[Tuple[str, Cell]] = ()) -> Optional[Dict[str, Any]]:
    """Per tuned cell (its keys ``named(cell)``: route.json names a cell by its batch size and length): the backend
    serving it (``owners``) and its median, the best reference (``references``: candidate -> its torch.compile mode),
    its mode and median, the speed-up of auto over it, and whether auto is slower beyond both intervals (with the
    reason). The best reference is the fastest one that may serve (outside the accuracy budget, it would not be the
    same model); where none may, the fastest measured. None where no reference was measured."""
    cells: List[Dict[str, Any]] = []
    for cell in sorted(owners):
        owner = owners[cell]
        measured = [r for r in references if cell in medians.get(r, {})]
        if cell not in medians.get(owner, {}) or not measured:
            continue
        servable = [r for r in measured if r not in failures]
        best = min(servable or measured, key=lambda r: medians[r][cell])
        auto_ms, ref_ms = medians[owner][cell], medians[best][cell]
        slower = clearly_below(best, owner, cell, {owner: medians[owner], best: medians[best]}, intervals)
        entry = {**named(cell), "auto": owner, "auto_ms": auto_ms, "reference": best,
                 "reference_mode": references[best], "reference_ms": ref_ms, "speedup": ref_ms / auto_ms,
                 "slower": slower, "contended": (owner, cell) in contended or (best, cell) in contended}
        if slower:
            entry["reason"] = (f"{best} cannot serve: {failures[best]}" if best in failures else
                               f"route.strategy={strategy} does not hold the route to the reference (the router does)")
        cells.append(entry)
    if not cells:
        return None
    speedups = [c["speedup"] for c in cells if not c["contended"]]
    return {"candidates": list(references), "modes": dict(references), "cells": cells,
            "worst_speedup": min(speedups) if speedups else None, "geomean_speedup": geomean(speedups),
            "contended_cells": len(cells) - len(speedups),
            "slower_cells": [c for c in cells if c["slower"]]}


def geomean(values: Sequence[float]) -> Optional[float]:
    """The geometric mean of ``values``, None where there are none."""
    return math.exp(sum(map(math.log, values)) / len(values)) if values else None
