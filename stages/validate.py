"""Validate: the routed model against eager at tuned, untuned (padded) and above-maximum batch sizes; where
lengths are tuned, at each of them and at an untuned length in every band (padded where its owner pads)."""

from __future__ import annotations

import logging
from typing import Callable, Dict, List

import torch

from pipeline.backends.program import strict_compiles
from pipeline.errors import RunFailed
from pipeline.measure import accuracy
from pipeline.measure.compare import judge, tolerance
from pipeline.context import RunContext
from pipeline.measure.references import reference_at
from pipeline.route.policy import backend_for
from pipeline.route.table import backend_at
from pipeline.seqlen import Key, between, cells, label

log = logging.getLogger(__name__)


class ValidationFailed(RunFailed):
    """The routed model disagrees with eager somewhere, or could not be checked; validation.json says where."""


def check_sizes(ctx: RunContext) -> list:
    """Tuned sizes, the configured extra sizes, and one above the largest tuned size (chunked)."""
    extra = [int(b) for b in ctx.cfg.validate.extra_batch_sizes]
    return sorted(set(ctx.batch_sizes) | set(extra) | {max(ctx.batch_sizes) + 1})


def check_cells(ctx: RunContext) -> List[Key]:
    """The check sizes, at every tuned length and an untuned one in each band where lengths are tuned; only the
    cells the route serves (a length no backend may serve is refused, not checked)."""
    if not ctx.lengths:
        return check_sizes(ctx)
    keys = cells(check_sizes(ctx), sorted(set(ctx.lengths) | set(between(ctx.lengths))))
    return [key for key in keys if backend_at(ctx.route, *key) is not None]


def owner(ctx: RunContext, key: Key) -> str:
    return backend_for(ctx.route, key) if isinstance(key, int) else backend_at(ctx.route, *key)


def where(ctx: RunContext, key: Key) -> Dict[str, object]:
    """A row's cell: its batch size, and where lengths are tuned its length and whether its call was padded."""
    if isinstance(key, int):
        return {"batch_size": key}
    padded = key[1] not in ctx.lengths and owner(ctx, key) in ctx.routed.record.padded
    return {"batch_size": key[0], "seq_len": key[1], "padded": padded}


def row_cell(row: Dict[str, object]) -> str:
    """A row's cell in words: ``bs=8``, or ``bs=8 len=40`` (``padded`` where its call was)."""
    if "seq_len" not in row:
        return f"bs={row['batch_size']}"
    return f"bs={row['batch_size']} len={row['seq_len']}{' padded' if row['padded'] else ''}"


def check(ctx: RunContext, modules: Dict[str, torch.nn.Module], step: Callable[[str], None]) -> list:
    """One row per module and cell (batch size, and length where tuned): which backend served it, its error, how
    many tensors were compared and whether it is within tolerance. Eager's reference runs once per size (on inputs other
    than capture's: the user's rows from the second on, random fills at the next seed) and serves every
    module; an uninformative row passes only with validate.allow_unverified. ``step`` shows each size as
    it is checked (a new size may compile for a while). Every row is also held to route.accuracy_budget
    against fp32 eager."""
    vcfg, budget = ctx.cfg.validate, ctx.cfg.route.accuracy_budget
    sources = ctx.input_sources(seed_offset=1, start=1)
    rows: Dict[str, list] = {check: [] for check in modules}  # all of one check, then the next
    for key in check_cells(ctx):
        name = owner(ctx, key)
        step(f"{label(key)} ({name})")
        numerics = ctx.backends[name].candidate
        dtype, precision = numerics.compute_dtype, numerics.precision
        ref = reference_at(ctx.model, key, sources, dtype, vcfg.tolerance_scale)
        with torch.inference_mode():
            for check_name, module in modules.items():
                out = module(**ref.inputs)
                verdict = accuracy.relaxed(judge(out, ref.output, dtype, vcfg.tolerance_scale),
                                           numerics.judged_by_budget)
                value = accuracy.score(out, ref.output, budget.metric)
                within = accuracy.within(value, budget.metric, budget.bound)
                reason = verdict.reason if not verdict.ok else "" if within else (
                    f"{budget.metric} {value:.6g} outside the accuracy budget "
                    f"({accuracy.describe(budget.metric, budget.bound)})")
                rows[check_name].append({
                    "check": check_name, **where(ctx, key), "backend": name, "precision": precision,
                    "tuned": key in ctx.cells, "max_rel_error": verdict.error,
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
    with ctx.progress.steps("validate", int(reload) + len(check_cells(ctx))) as bar:
        if reload:
            from pipeline.route.checkpoint import load

            bar.next(f"reloading {ctx.checkpoint_path.name} (rebuilds the routed backends)")
            # The run's own checkpoint, written moments ago from its own config: its options are trusted.
            modules["reloaded"] = load(ctx.checkpoint_path, ctx.model, device=ctx.device, trust_options=True)
        with strict_compiles():  # a new size that recompiles past a limit fails here, not silently
            rows = check(ctx, modules, bar.next)
    fallbacks = {f"{check_name}:{name}": reason for check_name, module in modules.items()
                 for name, backend in module.backends.items() if (reason := backend.fallback_reason())}
    ctx.validation = {"ok": all(r["ok"] for r in rows) and not fallbacks, "rows": rows, "fallbacks": fallbacks}
    if "reloaded" in modules:  # how long the reload took, and where: the load report (compiled artifacts used?)
        ctx.validation["reload"] = modules["reloaded"].load_report.to_dict()
    for r in rows:  # each row is in validation.json; a failing one is also an error here
        log.log(logging.DEBUG if r["ok"] else logging.ERROR,
                "validate %-8s %-12s %-24s err %.2e (tol %.1e) %d tensors %s", r["check"], row_cell(r),
                r["backend"], r["max_rel_error"], r["tolerance"], r["tensors"],
                r["status"] if r["status"] == "ok" else f"{r['status'].upper()}: {r['reason']}")
    log.info("validate %s: %d of %d checks passed (%s at bs %s), worst err %.2e; rows in validation.json",
             "ok" if ctx.validation["ok"] else "FAILED", sum(r["ok"] for r in rows), len(rows),
             " and ".join(modules), ", ".join(str(b) for b in check_sizes(ctx)),
             max((r["max_rel_error"] for r in rows if r["max_rel_error"] == r["max_rel_error"]), default=0.0))
    if not ctx.validation["ok"]:
        bad = [f"{r['check']} {row_cell(r)} ({r['backend']}, {r['status']})" for r in rows if not r["ok"]]
        bad += [f"{at} ({reason})" for at, reason in fallbacks.items()]
        hint = "; validate.allow_unverified=true accepts checks eager's output cannot decide" if any(
            r["status"] == "uninformative" for r in rows if not r["ok"]) else ""
        raise ValidationFailed(f"routed model not shown to match eager at {', '.join(bad)}{hint}; see validation.json")
