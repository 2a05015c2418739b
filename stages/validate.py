"""Validate: the routed model against eager at tuned, untuned (padded) and above-maximum batch sizes."""

from __future__ import annotations

import json
import logging
from typing import Dict

import torch

from pipeline.compare import rel_error, tolerance
from pipeline.context import RunContext
from pipeline.models import make_inputs
from pipeline.routing import backend_for

log = logging.getLogger(__name__)


class ValidationFailed(RuntimeError):
    """The routed model disagrees with eager somewhere; validation.json says where."""


def check_sizes(ctx: RunContext) -> list:
    """Tuned sizes, the configured extra sizes, and one above the largest tuned size (chunked)."""
    extra = [int(b) for b in ctx.cfg.validate.extra_batch_sizes]
    return sorted(set(ctx.batch_sizes) | set(extra) | {max(ctx.batch_sizes) + 1})


def check(ctx: RunContext, modules: Dict[str, torch.nn.Module]) -> list:
    """One row per module and batch size: which backend served it, its error and whether it is within
    tolerance. Eager's reference runs once per size and serves every module."""
    rows: Dict[str, list] = {label: [] for label in modules}  # all of one check, then the next
    for bs in check_sizes(ctx):
        inputs = make_inputs(ctx.inputs, bs, ctx.device, ctx.cfg.seed + 1)
        name = backend_for(ctx.route, bs)
        tol = tolerance(ctx.backends[name].compute_dtype, ctx.cfg.validate.tolerance_scale)
        with torch.inference_mode():
            ref = ctx.model(**inputs)
            for label, module in modules.items():
                err = rel_error(module(**inputs), ref)
                rows[label].append({"check": label, "batch_size": bs, "backend": name, "tuned": bs in ctx.batch_sizes,
                                    "max_rel_error": err, "tolerance": tol, "ok": err <= tol})
    return [row for per_check in rows.values() for row in per_check]


def run(ctx: RunContext) -> None:
    if ctx.routed is None:
        raise RuntimeError("validate needs the route stage first: add route to stages")
    modules = {"routed": ctx.routed}
    if ctx.cfg.validate.check_reload and ctx.checkpoint_path is not None:
        from pipeline.checkpoint import load

        # The run's own checkpoint, written moments ago from its own config: its options are trusted.
        modules["reloaded"] = load(ctx.checkpoint_path, ctx.model, device=ctx.device, trust_options=True)
    rows = check(ctx, modules)
    ctx.validation = {"ok": all(r["ok"] for r in rows), "rows": rows}
    for r in rows:
        log.log(logging.INFO if r["ok"] else logging.ERROR, "validate %-8s bs=%-4d %-24s err %.2e (tol %.1e) %s",
                r["check"], r["batch_size"], r["backend"], r["max_rel_error"], r["tolerance"],
                "ok" if r["ok"] else "MISMATCH")
    path = ctx.run_dir / "validation.json"
    path.write_text(json.dumps(ctx.validation, indent=2))
    ctx.tracker.log_validation(ctx.validation, path)
    if not ctx.validation["ok"]:
        bad = [f"{r['check']} bs={r['batch_size']} ({r['backend']})" for r in rows if not r["ok"]]
        raise ValidationFailed(f"routed model disagrees with eager at {', '.join(bad)}; see {path}")
