"""Route: pick the backend for each range of batch sizes from the profile and build the routed model.

The route and what it rests on land on the context (``route_info``); the recorder writes
``route.json`` and the checkpoint."""

from __future__ import annotations

import logging

from pipeline.context import RunContext
from pipeline.route.served import RoutedModule, TuneRecord
from pipeline.route.policy import choose_route, eager_baseline

log = logging.getLogger(__name__)


def run(ctx: RunContext) -> None:
    rcfg = ctx.cfg.route
    medians = ctx.medians()
    eager = eager_baseline(ctx.cfg.backends)
    ctx.route = choose_route(medians, list(ctx.cfg.backends), rcfg.strategy, rcfg.min_gain,
                             rcfg.backend, ctx.failures(), baseline=eager)
    routed_names = {r.backend for r in ctx.route}
    unverified = sorted(routed_names & set(ctx.unverified()))
    if unverified:
        log.warning("route   serves %s, which capture could not check against eager (validate.allow_unverified=true)",
                    ", ".join(unverified))
    record = TuneRecord(ctx.cfg.model.name, ctx.model, ctx.inputs, ctx.batch_sizes, ctx.device, api=ctx.api,
                        output_batch_dims=ctx.output_batch_dims)
    ctx.routed = RoutedModule({n: ctx.backends[n] for n in routed_names}, ctx.route, record)
    for r in ctx.route:
        log.info("route   batch %s..%s -> %s", r.lo, r.hi if r.hi is not None else "inf", r.backend)
    ctx.route_info = {
        "strategy": rcfg.strategy,
        "min_gain": rcfg.min_gain,
        "never_slower_than": eager if rcfg.strategy == "router" else None,  # only the router applies it
        "ranges": [r.to_dict() for r in ctx.route],
        "profile_medians_ms": {b: {str(bs): ms for bs, ms in per.items()} for b, per in medians.items()},
        "excluded": ctx.failures(),
        "unverified": unverified,
    }
