"""The routed model's own figures: what tweakpipe ships, beside the figures of each backend it chose among.

Per-backend metrics (``latency_ms/<backend>/bs<N>``) say how each candidate did; a compare view of runs needs the
model a run ships. Per tuned cell (``bs<N>``, or ``bs<N>/len<L>`` where lengths are tuned):

- ``latency_ms/auto/<cell>``: the profiled median of the backend the route serves that cell with;
- ``speedup_vs_eager/<cell>``: plain eager's median over it (``pipeline.route.decision.baseline``);
- ``speedup_vs_best_single/<cell>``: the median of the one backend ``route=highest_throughput`` would deploy for every
  cell, over it: what routing per cell gains over deploying the single best backend (1.0 where the route is that).

``speedup_vs_eager/geomean`` and ``speedup_vs_best_single/geomean``: the geometric mean over the cells, one figure per
run whatever its cells (the experiment's primary metric, ``pipeline.record.store.PRIMARY_METRIC``); and, where
validate reloaded the checkpoint, ``load_s``: how long that load took (``pipeline.load``'s report).
"""

from __future__ import annotations

import math
from typing import Dict, Optional

from omegaconf import OmegaConf

from pipeline.context import RunContext
from pipeline.errors import RouteError
from pipeline.record.report import AUTO
from pipeline.route.decision import baseline, decide
from pipeline.route.policy import backend_for
from pipeline.route.table import backend_at
from pipeline.seqlen import Key, metric_suffix


def served_by(ctx: RunContext, key: Key) -> Optional[str]:
    """The backend the route serves ``key`` with (None where lengths are tuned and no tile holds it)."""
    return backend_for(ctx.route, key) if isinstance(key, int) else backend_at(ctx.route, *key)


def best_single(ctx: RunContext) -> Optional[str]:
    """The backend ``route=highest_throughput`` picks over this run's profile: the best one to deploy alone."""
    try:
        decision = decide(ctx.race(), OmegaConf.merge(ctx.cfg.route, {"strategy": "highest_throughput"}))
    except RouteError:  # nothing the route could serve from; the run's own route then says why
        return None
    return decision.route[0].backend


def routed_metrics(ctx: RunContext) -> Dict[str, float]:
    """The routed model's latency and speed-ups per tuned cell, and ``load_s`` where it was measured; {} without a
    route."""
    if ctx.routed is None:
        return {}
    medians, eager, single = ctx.medians(), baseline(ctx.candidates), best_single(ctx)
    metrics: Dict[str, float] = {}
    for key in ctx.cells:
        owner = served_by(ctx, key)
        if key not in medians.get(owner, {}):
            continue
        cell, ms = metric_suffix(key), medians[owner][key]
        metrics[f"latency_ms/{AUTO}/{cell}"] = ms
        for figure, other in (("speedup_vs_eager", eager), ("speedup_vs_best_single", single)):
            if key in medians.get(other, {}):
                metrics[f"{figure}/{cell}"] = medians[other][key] / ms
    for figure in ("speedup_vs_eager", "speedup_vs_best_single"):  # one figure per run, whatever its cells
        ratios = [v for k, v in metrics.items() if k.startswith(figure + "/")]
        if ratios:
            metrics[f"{figure}/geomean"] = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
    if "reload" in ctx.validation:
        metrics["load_s"] = float(ctx.validation["reload"]["total_s"])
    return metrics
