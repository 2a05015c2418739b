"""Validate: the routed model against eager at tuned, untuned (padded) and above-maximum batch sizes."""

from __future__ import annotations

import logging
from typing import Dict

import torch

from pipeline.backends.program import strict_compiles
from pipeline.config.errors import RunFailed
from pipeline.measure import accuracy
from pipeline.measure.compare import judge, tolerance
from pipeline.context import RunContext
from pipeline.measure.references import reference_at
from pipeline.record import progress
from pipeline.route.policy import backend_for

log = logging.getLogger(__name__)


class ValidationFailed(RunFailed):
    """The routed model disagrees with eager somewhere, or could not be checked; validation.json says where."""


def check_sizes(ctx: RunContext) -> list:
    """Tuned sizes, the configured extra sizes, and one above the largest tuned size (chunked)."""
    extra = [int(b) for b in ctx.cfg.validate.extra_batch_sizes]
    return sorted(set(ctx.batch_sizes) | set(extra) | {max(ctx.batch_sizes) + 1})


def check(ctx: RunContext, modules: Dict[str, torch.nn.Module], bar: progress.Steps) -> list:
    """One row per module and batch size: which backend served it, its error, how many tensors were
    compared and whether it is within tolerance. Eager's reference runs once per size (on inputs other
    than capture's: the user's rows from the second on, random fills at the next seed) and serves every
    module; an uninformative row passes only with validate.allow_unverified. ``bar`` shows each size as
    it is checked (a new size may compile for a while). Every row is also held to route.accuracy_budget
    against fp32 eager."""
    vcfg, budget = ctx.cfg.validate, ctx.cfg.route.accuracy_budget
    sources = ctx.input_sources(seed_offset=1, start=1)
    rows: Dict[str, list] = {label: [] for label in modules}  # all of one check, then the next
    for bs in check_sizes(ctx):
        name = backend_for(ctx.route, bs)
        bar.next(f"bs={bs} ({name})")
        backend = ctx.backends[name]
        dtype, precision = backend.compute_dtype, backend.precision
        ref = reference_at(ctx.model, bs, sources, dtype, vcfg.tolerance_scale)
        with torch.inference_mode():
            for label, module in modules.items():
                out = module(**ref.inputs)
                verdict = accuracy.relaxed(judge(out, ref.output, dtype, vcfg.tolerance_scale),
                                           backend.judged_by_budget)
                value = accuracy.score(out, ref.output, budget.metric)
                within = accuracy.within(value, budget.metric, budget.bound)
                reason = verdict.reason if not verdict.ok else "" if within else (
                    f"{budget.metric} {value:.6g} outside the accuracy budget "
                    f"({accuracy.describe(budget.metric, budget.bound)})")
                rows[label].append({"check": label, "batch_size": bs, "backend": name, "precision": precision,
                                    "tuned": bs in ctx.batch_sizes, "max_rel_error": verdict.error,
                                    "tolerance": tolerance(dtype, vcfg.tolerance_scale), "tensors": verdict.tensors,
                                    "budget_value": value, "within_budget": within,
                                    "status": ("ok" if within else "outside_budget") if verdict.ok else verdict.status,
                                    "reason": reason,
                                    "ok": (verdict.ok or (verdict.uninformative and vcfg.allow_unverified)) and within})
    return [row for per_check in rows.values() for row in per_check]


def run(ctx: RunContext) -> None:
    if ctx.routed is None:
        raise RuntimeError("validate needs the route stage first: add route to stages")
    modules = {"routed": ctx.routed}
    reload = ctx.cfg.validate.check_reload and ctx.checkpoint_path is not None
    with progress.steps("validate", int(reload) + len(check_sizes(ctx))) as bar:
        if reload:
            from pipeline.route.checkpoint import load

            bar.next(f"reloading {ctx.checkpoint_path.name} (rebuilds the routed backends)")
            # The run's own checkpoint, written moments ago from its own config: its options are trusted.
            modules["reloaded"] = load(ctx.checkpoint_path, ctx.model, device=ctx.device, trust_options=True)
        with strict_compiles():  # a new size that recompiles past a limit fails here, not silently
            rows = check(ctx, modules, bar)
    fallbacks = {f"{label}:{name}": reason for label, module in modules.items()
                 for name, backend in module.backends.items() if (reason := backend.fallback_reason())}
    ctx.validation = {"ok": all(r["ok"] for r in rows) and not fallbacks, "rows": rows, "fallbacks": fallbacks}
    if "reloaded" in modules:  # how long the reload took, and where: the load report (compiled artifacts used?)
        ctx.validation["reload"] = modules["reloaded"].load_report.to_dict()
    for r in rows:  # each row is in validation.json; a failing one is also an error here
        log.log(logging.DEBUG if r["ok"] else logging.ERROR,
                "validate %-8s bs=%-4d %-24s err %.2e (tol %.1e) %d tensors %s", r["check"], r["batch_size"],
                r["backend"], r["max_rel_error"], r["tolerance"], r["tensors"],
                r["status"] if r["status"] == "ok" else f"{r['status'].upper()}: {r['reason']}")
    log.info("validate %s: %d of %d checks passed (%s at bs %s), worst err %.2e; rows in validation.json",
             "ok" if ctx.validation["ok"] else "FAILED", sum(r["ok"] for r in rows), len(rows),
             " and ".join(modules), ", ".join(str(b) for b in check_sizes(ctx)),
             max((r["max_rel_error"] for r in rows if r["max_rel_error"] == r["max_rel_error"]), default=0.0))
    if not ctx.validation["ok"]:
        bad = [f"{r['check']} bs={r['batch_size']} ({r['backend']}, {r['status']})" for r in rows if not r["ok"]]
        bad += [f"{where} ({reason})" for where, reason in fallbacks.items()]
        hint = "; validate.allow_unverified=true accepts checks eager's output cannot decide" if any(
            r["status"] == "uninformative" for r in rows if not r["ok"]) else ""
        raise ValidationFailed(f"routed model not shown to match eager at {', '.join(bad)}{hint}; see validation.json")
