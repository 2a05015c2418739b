"""Capture: build every competing backend, run it at every tuned batch size, compare with eager.

A backend that is unsupported on the device is recorded as skipped; one that fails to build,
crashes or does not match eager is recorded as failed with its reason. Either way it is excluded
and the run goes on. A resumed run keeps the earlier run's failed and skipped outcomes, and
rebuilds the others (compiled code does not outlive its process). Where eager's output cannot tell right from wrong on any input tried, the
backend is recorded as unverified, and profiled and routed only with ``validate.allow_unverified=true``.

Every backend competes once per entry of ``precision`` (``pipeline.backends.precision``), and every candidate's
output is scored against fp32 eager's by ``route.accuracy_budget`` at each tuned size (``pipeline.measure.accuracy``):
one outside the budget stays ok and is profiled, but the route never serves it. Reduced-precision candidates
answer to the budget alone, not to judge()'s tolerance, once their outputs' structure matches.
"""

from __future__ import annotations

import functools
import logging
import math
import time
import traceback
from typing import Callable, Dict, Optional

import torch

from pipeline import backends as backend_registry
from pipeline import devices
from pipeline.record import progress
from pipeline.backends import BackendUnsupported
from pipeline.measure import accuracy
from pipeline.measure.compare import combine, judge, tolerance
from pipeline.context import ALLOW_HINT, BackendOutcome, RunContext
from pipeline.batching import BatchDims, output_batch_dims
from pipeline.config.errors import ConfigError, RunFailed
from pipeline.measure.references import Reference, reference_at

log = logging.getLogger(__name__)

# A verdict's status -> the outcome's status and the start of its reason.
OUTCOMES = {"ok": ("ok", ""), "mismatch": ("failed", "output differs from eager: "),
            "uninformative": ("unverified", "could not be checked against eager: ")}


def reference_outputs(ctx: RunContext, compute_dtype: Optional[torch.dtype]) -> Dict[int, Reference]:
    """Eager's outputs at every tuned batch size, each from the first inputs whose output can judge a
    backend computing in ``compute_dtype``: the truth every backend is held to."""
    sources = ctx.input_sources()
    references = {bs: reference_at(ctx.model, bs, sources, compute_dtype, ctx.cfg.validate.tolerance_scale)
                  for bs in ctx.batch_sizes}
    unproved = {bs: ref.uninformative for bs, ref in references.items() if ref.uninformative}
    if unproved:
        log.warning("capture: on every input tried, eager's output cannot tell a wrong backend from a right one at "
                    "batch size %s (%s); backends will be recorded unverified",
                    ", ".join(map(str, unproved)), next(iter(unproved.values())))
    return references


def capture_one(ctx: RunContext, name: str, cfg: dict,
                references: Callable[[Optional[torch.dtype]], Dict[int, Reference]]) -> BackendOutcome:
    """Build and check one backend; never raises for the backend's own failures."""
    backend = backend_registry.create(name, cfg)
    outcome = BackendOutcome(name=name, kind=str(cfg.get("kind")), precision=backend.precision,
                             weights=backend.precision if backend.casts_weights else "fp32")
    budget = ctx.cfg.route.accuracy_budget
    reason = backend.unsupported_reason(ctx.device)
    if reason:
        outcome.status, outcome.reason = "skipped", reason
        return outcome
    scale = ctx.cfg.validate.tolerance_scale
    outcome.tolerance = tolerance(backend.compute_dtype, scale)
    refs = references(backend.compute_dtype)
    devices.reset_peak_memory(ctx.device)
    start = time.perf_counter()
    try:
        largest = max(ctx.batch_sizes)
        # Every size up to the largest tuned one may be served, tuned or not.
        sample = refs[largest].inputs
        backend.build(ctx.model, sample, ctx.device, list(range(1, largest + 1)), ctx.batch_sizes,
                      BatchDims.of(ctx.inputs, ctx.output_batch_dims))
        scores = []  # the accuracy budget's metric against fp32 eager, at each tuned size
        with backend.watched():  # every compile is this backend's; a recompile limit hit fails it
            checks = backend.self_check(ctx.model, sample, scale)  # variants the tuned sizes miss, e.g. each graph
            for bs, ref in refs.items():
                out = backend(**ref.inputs)
                checks[f"batch size {bs}"] = judge(out, ref.output, backend.compute_dtype, scale)
                scores.append(accuracy.score(out, ref.output, budget.metric))
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
    outcome.compile = backend.compile_evidence()
    fallback = backend.fallback_reason()
    if fallback:
        outcome.status, outcome.reason = "failed", f"not timed: {fallback}"
        return outcome
    verdict = accuracy.relaxed(combine(checks), backend.judged_by_budget)
    outcome.accuracy = accuracy.worst(scores, budget.metric)
    outcome.within_budget = accuracy.within(outcome.accuracy, budget.metric, budget.bound)
    outcome.status, start = OUTCOMES[verdict.status]
    outcome.reason, outcome.max_rel_error, outcome.tensors = start + verdict.reason, verdict.error, verdict.tensors
    if outcome.status == "ok" or ctx.cfg.validate.allow_unverified:
        ctx.backends[name] = backend
    return outcome


class NoBackendSurvived(RunFailed):
    """Every candidate failed, was skipped, or could not be checked; capture.json says why each."""


def budget_problem(ctx: RunContext) -> Optional[str]:
    """Why no candidate that capture kept can serve under ``route.accuracy_budget``, or None: known now,
    before the profile times candidates the route could never use."""
    if "route" not in ctx.cfg.stages or not ctx.backends:
        return None
    kept = {n: ctx.outcomes[n] for n in ctx.backends}
    if any(o.within_budget for o in kept.values()):
        return None
    budget = ctx.cfg.route.accuracy_budget
    higher = accuracy.METRICS[budget.metric]["higher_is_better"]
    best = (max if higher else min)(kept.values(), key=lambda o: o.accuracy)
    admits = (math.floor if higher else math.ceil)(best.accuracy * 1e4) / 1e4
    return (f"no candidate meets route.accuracy_budget ({accuracy.describe(budget.metric, budget.bound)} against fp32 "
            f"eager): the closest is {best.name} at {budget.metric} {best.accuracy:.6g}; loosen the bound "
            f"(route.accuracy_budget.bound={admits:g} admits it) or add fp32 to precision")


def run(ctx: RunContext) -> None:
    label, inputs_at = ctx.input_sources()[0]
    log.info("capture: batches are made of %s", label)
    ctx.output_batch_dims = output_batch_dims(ctx.model, inputs_at)
    references = functools.lru_cache(maxsize=None)(functools.partial(reference_outputs, ctx))  # per compute dtype
    candidates = ctx.candidates
    for name, cfg in progress.track(candidates.items(), "capture", len(candidates), label=lambda kv: kv[0]):
        earlier = ctx.earlier.outcomes.get(name)
        if earlier is not None and earlier.status in ("failed", "skipped"):
            outcome = earlier  # the interrupted run's verdict; building it again would fail again
        else:
            outcome = capture_one(ctx, name, cfg, references)
        ctx.outcomes[name] = outcome
        level = logging.INFO if outcome.status == "ok" else logging.WARNING
        log.log(level, "capture %-28s %-10s %s", name, outcome.status,
                outcome.reason or f"built in {outcome.build_seconds:.2f}s, max rel err {outcome.max_rel_error:.2e} "
                                  f"over {outcome.tensors} tensors, {ctx.cfg.route.accuracy_budget.metric} "
                                  f"{outcome.accuracy:.6g}{'' if outcome.within_budget else ' (OUTSIDE the budget)'}"
                + (f", {outcome.compile['graphs']} Dynamo graph(s), {outcome.compile['graph_breaks']} graph break(s)"
                   if outcome.compile else ""))
    if not ctx.backends:
        unverified = ctx.unverified()
        hint = (f"; unverified: {', '.join(unverified)}{ALLOW_HINT}, or tune on inputs on which its output varies: "
                + ("real data in example_inputs" if ctx.api else "model.examples=<a .pt file of them>")
                + f" ({unverified[0]} {ctx.outcomes[unverified[0]].reason[:300]})" if unverified else "")
        raise NoBackendSurvived(f"capture: no backend survived{hint}; see capture.json for each reason")
    problem = budget_problem(ctx)
    if problem:
        raise ConfigError(problem)
