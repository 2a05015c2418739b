"""Capture: build every competing backend, run it at every tuned batch size, compare with eager.

A backend that is unsupported on the device is recorded as skipped; one that fails to build,
crashes or does not match eager is recorded as failed with its reason. Either way it is excluded
and the run goes on.
"""

from __future__ import annotations

import json
import logging
import time
import traceback

import torch

from pipeline import backends as backend_registry
from pipeline import devices, progress
from pipeline.backends import BackendUnsupported
from pipeline.compare import check_informative, rel_error, tolerance
from pipeline.context import BackendOutcome, RunContext
from pipeline.models import make_inputs

log = logging.getLogger(__name__)


def reference_outputs(ctx: RunContext) -> dict:
    """Eager outputs at every tuned batch size: the truth every backend is held to."""
    with torch.inference_mode():
        reference = {bs: ctx.model(**make_inputs(ctx.inputs, bs, ctx.device, ctx.cfg.seed)) for bs in ctx.batch_sizes}
    check_informative(reference[max(reference)], f"of model {ctx.cfg.model.name} at batch size {max(reference)}")
    return reference


def capture_one(ctx: RunContext, name: str, cfg: dict, reference: dict) -> BackendOutcome:
    """Build and check one backend; never raises for the backend's own failures."""
    outcome = BackendOutcome(name=name, kind=str(cfg.get("kind")))
    backend = backend_registry.create(name, cfg)
    reason = backend.unsupported_reason(ctx.device)
    if reason:
        outcome.status, outcome.reason = "skipped", reason
        return outcome
    outcome.tolerance = tolerance(backend.compute_dtype, ctx.cfg.validate.tolerance_scale)
    devices.reset_peak_memory(ctx.device)
    start = time.perf_counter()
    try:
        largest = max(ctx.batch_sizes)
        # Every size up to the largest tuned one may be served, tuned or not.
        sample = make_inputs(ctx.inputs, largest, ctx.device, ctx.cfg.seed)
        backend.build(ctx.model, sample, ctx.device, list(range(1, largest + 1)), ctx.batch_sizes)
        with backend.watched():  # every compile is this backend's; a recompile limit hit fails it
            worst = backend.self_check(ctx.model, sample)  # variants the tuned sizes miss, e.g. each recorded graph
            for bs, ref in reference.items():
                worst = max(worst, rel_error(backend(**make_inputs(ctx.inputs, bs, ctx.device, ctx.cfg.seed)), ref))
            devices.synchronize(ctx.device)
    except BackendUnsupported as exc:
        outcome.status, outcome.reason = "skipped", str(exc)
        return outcome
    except Exception as exc:  # a backend's failure is an outcome, not a crash
        log.debug("backend %s failed:\n%s", name, traceback.format_exc())
        outcome.status, outcome.reason = "failed", f"{type(exc).__name__}: {exc}".strip()[:2000]
        return outcome
    outcome.build_seconds = time.perf_counter() - start
    outcome.peak_memory_bytes = devices.peak_memory_bytes(ctx.device)
    outcome.max_rel_error = worst
    outcome.compile = backend.compile_evidence()
    fallback = backend.fallback_reason()
    if fallback:
        outcome.status, outcome.reason = "failed", f"not timed: {fallback}"
        return outcome
    if worst > outcome.tolerance:
        outcome.status = "failed"
        outcome.reason = f"output differs from eager: max relative error {worst:.3g} > tolerance {outcome.tolerance:.3g}"
        return outcome
    outcome.status = "ok"
    ctx.backends[name] = backend
    return outcome


def run(ctx: RunContext) -> None:
    reference = reference_outputs(ctx)
    for name, cfg in progress.track(ctx.cfg.backends.items(), "capture", len(ctx.cfg.backends), label=lambda kv: kv[0]):
        outcome = capture_one(ctx, name, dict(cfg), reference)
        ctx.outcomes[name] = outcome
        level = logging.INFO if outcome.status == "ok" else logging.WARNING
        log.log(level, "capture %-28s %-7s %s", name, outcome.status,
                outcome.reason or f"built in {outcome.build_seconds:.2f}s, max rel err {outcome.max_rel_error:.2e}"
                + (f", {outcome.compile['graphs']} Dynamo graph(s), {outcome.compile['graph_breaks']} graph break(s)"
                   if outcome.compile else ""))
    path = ctx.run_dir / "capture.json"
    path.write_text(json.dumps({n: o.to_dict() for n, o in ctx.outcomes.items()}, indent=2))
    ctx.tracker.log_capture(ctx.outcomes, path)
    if not ctx.backends:
        raise RuntimeError("capture: no backend survived; see capture.json for each reason")
