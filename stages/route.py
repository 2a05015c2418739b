"""Route: pick the backend for each range of batch sizes from the profile, build the routed model, save it, and
hand on the route done (``pipeline.route.outcome.RouteReport``).

The stage decides, builds each routed program ahead of time and packs the checkpoint (``pipeline.route.checkpoint``),
and computes every figure of the routed model once (``pipeline.route.figures``: its speed-ups over eager, the best
single backend and the user's best own compile); the recorder writes ``route.json``, the checkpoint as an artifact and
MLflow's figures from the report and decides nothing. A route that rests on noisy cells is shipped with a warning, or
refused under ``route.require_confident``; so is one whose choice at some cell rests on cells measured on a busy host
(``contended_cells``: the route is then unsettled, whatever the noise flags say). Where lengths are tuned, the route
is a (batch range x length range) table (``pipeline.route.table``): route.json's ``table`` instead of ``ranges``, its
cells by length."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Dict, List, Optional

from omegaconf import OmegaConf

from pipeline.compile import artifacts as compiled
from pipeline.errors import RouteError, RunFailed
from pipeline.context import RunContext
from pipeline.route import checkpoint, table
from pipeline.route.figures import cell_fields, reference_figures, routed_figures
from pipeline.route.outcome import RouteReport, cell_names
from pipeline.route.served import RoutedModule, TuneRecord
from pipeline.measure.accuracy import budget_of
from pipeline.measure.padding import PROVED
from pipeline.route import versus
from pipeline.route.decision import contested, decide
from pipeline.route.policy import backend_for
from pipeline.route.table import backend_at
from pipeline.seqlen import Key, label

log = logging.getLogger(__name__)


class NoRoute(RunFailed):
    """No backend can serve as the route strategy asks (all excluded, or route.backend was)."""


class RouteNotConfident(RunFailed):
    """``route.require_confident`` is set and the route rests on cells the profile flagged noisy or contended."""


def by_cell(values: Dict[Key, Any]) -> Dict[str, Any]:
    """A backend's figures for route.json: by batch size, or by length and then batch size where lengths are tuned."""
    out: Dict[str, Any] = {}
    for key, value in sorted(values.items()):
        if isinstance(key, int):
            out[str(key)] = value
        else:
            out.setdefault(str(key[1]), {})[str(key[0])] = value
    return out


def screen_cells(ctx: RunContext, name: str) -> Dict[str, Any]:
    """A candidate's screen numbers by cell: median and interval in ms."""
    return by_cell({key: {"median": m.median, "interval": list(m.interval), "noisy": m.noisy}
                    for key, m in ctx.screen.get(name, {}).items()})


def warn_if_noise_could_change(ctx: RunContext, at: Dict[int, List[str]]) -> None:
    """One warning where noisy cells could change the route (a challenger within the owner's noise), with the
    next step; every noisy cell is in route.json and profile.csv, and a noisy owner that no one comes near is not
    worth the user's attention."""
    shaky = {key: names for key, names in at.items() if any(ctx.profile[n][key].noisy for n in names)}
    if not shaky:
        log.info("route   no noisy cell the route rests on has another candidate within its noise")
        return
    where = "; ".join(f"{label(key)}: {' vs '.join(names)}" for key, names in sorted(shaky.items()))
    log.warning("route   noise could change the choice at %d %s (%s): the cells are flagged noisy and "
                "within each other's intervals. To settle it: profile=thorough, a quieter host, or threads=N below "
                "the core count (route.json: noisy_cells)", len(shaky), "cell(s)" if ctx.lengths else "batch size(s)",
                where)


def unmeasured(ctx: RunContext) -> Dict[str, str]:
    """The references missing from the comparison at some tuned cell, and why: not built (``tune.budget_s``, the
    precision screen, ...), failed, or not profiled there. Auto is then compared with the best of the others, and
    route.json, the log and the report say so."""
    medians, out = ctx.medians(), {}
    for name in ctx.references():
        missing = [key for key in ctx.cells if key not in medians.get(name, {})]
        if not missing:
            continue
        outcome = ctx.outcomes.get(name)
        out[name] = (f"{outcome.status}: {outcome.reason}" if outcome is not None and outcome.status != "ok" else
                     f"not profiled at {', '.join(label(key) for key in missing)}")
    return out


def against_reference(ctx: RunContext, owners: Dict[Key, Optional[str]], failures: Dict[str, str]
                      ) -> Optional[Dict[str, Any]]:
    """Auto (``owners``: the backend serving each tuned cell) against the best reference peer at every tuned cell
    (``pipeline.route.versus``), for route.json, with one
    log line of the figures, one naming each reference left out of the comparison and why (a warning where
    ``tune.budget_s`` left it unbuilt), and one warning naming every cell where auto is slower beyond both intervals,
    and why."""
    modes = ctx.reference_modes()
    if not modes:
        return None
    missing = unmeasured(ctx)
    if missing:
        (log.warning if set(missing) & set(ctx.budget_skipped) else log.info)(
            "route   auto is compared with the best of the references measured; not measured: %s",
            "; ".join(f"{n} ({modes[n]}): {why[:300]}" for n, why in missing.items()))
    found = versus.comparison({k: b for k, b in owners.items() if b is not None}, ctx.medians(), ctx.intervals(),
                              modes, failures, ctx.cfg.route.strategy, cell_fields, ctx.contended())
    if found is None:
        log.info("route   no reference was measured (%s), so auto is not compared with it", ", ".join(modes))
        return {"candidates": list(modes), "modes": modes, "cells": [], "unmeasured": missing}
    named = ", ".join(f"{n}: {m}" for n, m in modes.items())
    clean = [c["speedup"] for c in found["cells"] if not c["contended"]]
    busy = f"; {found['contended_cells']} cell(s) measured on a busy host left out" if found["contended_cells"] else ""
    if clean:
        log.info("route   against the user's best own compile (%s): auto is %.2fx-%.2fx as fast (geometric mean %.2fx "
                 "over %d cell(s)%s)", named, found["worst_speedup"], max(clean), found["geomean_speedup"], len(clean),
                 busy)
    else:
        log.info("route   against the user's best own compile (%s): no figure stands, every cell was measured on a "
                 "busy host (route.json: reference.cells, marked contended)", named)
    if found["slower_cells"]:
        log.warning("route   auto is slower than the best reference beyond both intervals at %s",
                    "; ".join(f"{label((c['batch_size'], c['seq_len']) if 'seq_len' in c else c['batch_size'])}: "
                              f"{c['auto']} {c['auto_ms']:.4g} ms vs {c['reference']} {c['reference_ms']:.4g} ms "
                              f"({c['reason']})" for c in found["slower_cells"]))
    return {**found, "unmeasured": missing}


def warn_unsettled(contended: List[Dict[str, Any]]) -> None:
    """One warning where the route's choice rests on cells measured on a busy host: a quiet host may choose
    otherwise, and no flag of the profile's says so (a host busy throughout makes every pass agree)."""
    log.warning("route   unsettled: the choice rests on %d cell(s) measured on a busy host (%s; route.json: "
                "contended_cells); profile again on a quiet machine, with threads=1, or with profile.on_busy=wait",
                len(contended), cell_names(contended))


def run(ctx: RunContext) -> None:
    rcfg = ctx.cfg.route
    try:
        decision = decide(ctx.race(), rcfg)
    except RouteError as exc:  # nothing to route on, or route.backend cannot serve
        raise NoRoute(f"route: {exc}; see capture.json and profile.csv") from None
    route, failures, cells = decision.route, decision.failures, decision.rests_on
    medians, intervals = ctx.medians(), ctx.intervals()
    noisy: List[Dict[str, Any]] = [{"backend": b, **cell_fields(key), "reason": ctx.profile[b][key].noise}
                                   for b, key in cells if ctx.profile[b][key].noisy]
    contended: List[Dict[str, Any]] = [{"backend": b, **cell_fields(key), "reason": ctx.profile[b][key].contention}
                                       for b, key in decision.unsettled]
    routed_names = {r.backend for r in route}
    unverified = sorted(routed_names & set(ctx.unverified()))
    lengths = {"seq_lens": ctx.lengths} if ctx.lengths else {}
    owners = {key: served_by(route, key) for key in ctx.cells}
    info: Dict[str, Any] = {
        "strategy": rcfg.strategy,
        "min_gain": rcfg.min_gain,
        "never_slower_than": decision.baseline if rcfg.strategy == "router" else None,  # only the router applies it
        **lengths,
        ("table" if ctx.lengths else "ranges"): [{**r.to_dict(), "precision": ctx.outcomes[r.backend].precision,
                                                  "weights": ctx.outcomes[r.backend].weights} for r in route],
        "accuracy_budget": budget_of(rcfg.accuracy_budget),
        # score: the budget's metric against fp32 eager at the worst tuned size (a cosine of 1.0 is a perfect match)
        "candidates": [{"backend": n, "precision": o.precision, "weights": o.weights,
                        "metric": rcfg.accuracy_budget.metric, "score": o.accuracy, "within_budget": o.within_budget,
                        "status": o.status, **({"padding": o.padding, "any_length": o.any_length} if ctx.lengths else {})}
                       for n, o in ctx.outcomes.items()],
        "profile_medians_ms": {b: by_cell(per) for b, per in medians.items()},
        "profile_intervals_ms": {b: by_cell({k: list(iv) for k, iv in per.items()}) for b, per in intervals.items()},
        "rests_on": [{"backend": b, **cell_fields(key)} for b, key in cells],
        "noisy_cells": noisy,
        "rests_on_noisy": bool(noisy),
        "contended_cells": contended,
        "settled": not contended,
        "excluded": failures,
        "unverified": unverified,
        "screened_out": {n: {"reason": why, "screen_ms": screen_cells(ctx, n)} for n, why in ctx.screened_out.items()},
        # precision first: numerics (precision and weights) whose compiling candidates capture did not build, and why
        "precision_screen": dict(ctx.precision_screened),
        "budget": {"budget_s": ctx.cfg.tune.budget_s, "skipped": dict(ctx.budget_skipped),
                   "profile": ctx.profile_reduced or None},
        "reference": against_reference(ctx, owners, failures),
        "cost": cost_block(ctx),
    }
    # route.json as decided, written whatever follows (a refusal, a save that fails)
    ctx.route_report = RouteReport(info, reference_figures=reference_figures(info["reference"]))
    for r in route:
        log.info("route   %sbatch %s..%s -> %s (%s)", f"length {r.len_lo}..{r.len_hi} " if ctx.lengths else "",
                 r.lo, r.hi if r.hi is not None else "inf", r.backend, ctx.outcomes[r.backend].precision)
    if contended and rcfg.require_confident:
        raise RouteNotConfident(
            f"the route's choice rests on {len(contended)} cell(s) measured on a busy host ({cell_names(contended)}; "
            "route.json says what was seen) and route.require_confident=true, so nothing was saved; profile again on "
            "a quiet machine, with threads=1 or with profile.on_busy=wait, or set route.require_confident=false to "
            "ship it unsettled")
    if contended:
        warn_unsettled(contended)
    if noisy:
        names = cell_names(noisy)
        if rcfg.require_confident:
            raise RouteNotConfident(
                f"the route rests on {len(noisy)} cell(s) the profile flagged noisy ({names}; route.json says why) "
                "and route.require_confident=true, so nothing was saved; profile again on a quieter machine or with "
                "profile=thorough, or set route.require_confident=false to ship it flagged")
        warn_if_noise_could_change(ctx, contested(cells))
    if unverified:
        log.warning("route   serves %s, which capture could not check against eager (validate.allow_unverified=true)",
                    ", ".join(unverified))
    ctx.route = route
    record = TuneRecord(ctx.cfg.model.name, ctx.model, ctx.inputs, ctx.batch_sizes, ctx.device, api=ctx.api,
                        output_batch_dims=ctx.output_batch_dims, seq=ctx.dims().seq,
                        padded=sorted(n for n in routed_names if ctx.outcomes[n].padding == PROVED))
    ctx.routed = RoutedModule({n: ctx.backends[n] for n in routed_names}, route, record)
    single = best_single(ctx)
    ctx.route_report = dataclasses.replace(
        ctx.route_report, text=route_text(ctx), tiles=[r.to_dict() for r in route], best_single=single,
        figures=routed_figures(owners, medians, ctx.baseline(), single, ctx.contended()))
    ctx.route_report = packed(ctx, ctx.route_report)


def packed(ctx: RunContext, report: RouteReport) -> RouteReport:
    """``report`` once the checkpoint is saved: each routed program built ahead of time (``route.aot``), its cost on
    the candidate's account and in route.json's ``cost`` (as in ``cost.json``), its report in route.json's ``aot``."""
    path = checkpoint.save(ctx.routed, ctx.run_dir / ctx.cfg.route.checkpoint_name, aot=ctx.cfg.route.aot)
    log.info("route   checkpoint %s", path)
    for name, aot in ctx.routed.aot.items():  # its program built ahead of time: what it cost, and whether
        ctx.outcomes[name].cost.aot_s = float(aot.get("build_s", 0.0))
    artifacts = compiled.path_for(path)
    return dataclasses.replace(report, info={**report.info, "aot": ctx.routed.aot, "cost": cost_block(ctx)},
                               checkpoint=path, artifacts=artifacts if artifacts.is_file() else None,
                               checkpoint_format=checkpoint.FORMAT)


def cost_block(ctx: RunContext) -> Dict[str, Any]:
    """route.json's ``cost``: each candidate's account (``cost.json`` holds the same), the stages' seconds and their
    steps that belong to no candidate."""
    return {"candidates": {n: o.cost.to_dict() for n, o in ctx.outcomes.items()}, "stage_s": dict(ctx.stage_seconds),
            "step_s": dict(ctx.step_seconds)}


def served_by(route: List[Any], key: Key) -> Optional[str]:
    """The backend ``route`` serves ``key`` with (None where lengths are tuned and no tile holds it)."""
    return backend_for(route, key) if isinstance(key, int) else backend_at(route, *key)


def best_single(ctx: RunContext) -> Optional[str]:
    """The backend ``route=highest_throughput`` picks over this run's profile: the best one to deploy alone."""
    try:
        decision = decide(ctx.race(), OmegaConf.merge(ctx.cfg.route, {"strategy": "highest_throughput"}))
    except RouteError:  # nothing the route could serve from; the run's own route then says why
        return None
    return decision.route[0].backend


def route_text(ctx: RunContext) -> str:
    """The route in one line: ``1-3:eager; 4-inf:inductor``, or the table's tiles where lengths are tuned."""
    if ctx.lengths:
        return table.describe(ctx.route)
    return "; ".join(f"{r.lo}-{r.hi or 'inf'}:{r.backend}" for r in ctx.route)
