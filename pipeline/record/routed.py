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

A speed-up that rests on a cell measured on a busy host (either side's: ``pipeline.measure.contention``) is logged
as ``contended_<figure>/<cell>`` and is in no geometric mean: where every cell is contended the run logs no
``geomean``, so the primary metric never shows a busy machine's number as the model's.
"""

from __future__ import annotations

from typing import Dict, Optional

from omegaconf import OmegaConf

from pipeline.context import RunContext
from pipeline.errors import RouteError
from pipeline.record.report import AUTO
from pipeline.route.decision import baseline, decide
from pipeline.route.policy import backend_for
from pipeline.route.table import backend_at
from pipeline.route.versus import geomean
from pipeline.seqlen import Key, metric_suffix


CONTENDED = "contended_"  # the prefix of a speed-up metric that rests on a cell measured on a busy host


def figure_name(figure: str, contended: bool) -> str:
    """A speed-up's metric name: ``contended_<figure>`` where it rests on a cell measured on a busy host, so that no
    figure a compare view, the primary metric or the report reads as a result stands on one
    (``pipeline.measure.contention``)."""
    return f"{CONTENDED}{figure}" if contended else figure


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
    medians, eager, single, busy = ctx.medians(), baseline(ctx.candidates), best_single(ctx), ctx.contended()
    metrics: Dict[str, float] = {}
    for key in ctx.cells:
        owner = served_by(ctx, key)
        if key not in medians.get(owner, {}):
            continue
        cell, ms = metric_suffix(key), medians[owner][key]
        metrics[f"latency_ms/{AUTO}/{cell}"] = ms
        for figure, other in (("speedup_vs_eager", eager), ("speedup_vs_best_single", single)):
            if key in medians.get(other, {}):
                contended = (owner, key) in busy or (other, key) in busy
                metrics[f"{figure_name(figure, contended)}/{cell}"] = medians[other][key] / ms
    for figure in ("speedup_vs_eager", "speedup_vs_best_single"):  # one figure per run, whatever its cells
        ratio = geomean([v for k, v in metrics.items() if k.startswith(figure + "/")])
        if ratio is not None:
            metrics[f"{figure}/geomean"] = ratio
    if "reload" in ctx.validation:
        metrics["load_s"] = float(ctx.validation["reload"]["total_s"])
    return metrics
