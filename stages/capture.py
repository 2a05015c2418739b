"""Capture: build every competing backend, run it at every tuned batch size, compare with eager.

A backend that is unsupported on the device is recorded as skipped; one that fails to build,
crashes or does not match eager is recorded as failed with its reason. Either way it is excluded
and the run goes on. A resumed run keeps the earlier run's failed and skipped outcomes, and
rebuilds the others (compiled code does not outlive its process). Where eager's output cannot tell right from wrong
on any input tried, the backend is recorded as unverified, and profiled and routed only with
``validate.allow_unverified=true``.

Where lengths are tuned (``model.seq_lens``, :mod:`pipeline.seqlen`), every check runs at every (batch size,
length) cell, and padding is proved per backend (``pipeline.measure.padding``): calls at untuned lengths,
padded to the tuned one above and cut back, against eager at the exact length. A backend that fails it stays
ok for its tuned cells; ``padding`` in capture.json says why.

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
from typing import Any, Callable, Dict, Iterable, Iterator, List, Mapping, Optional

import torch
from torch import nn
from omegaconf import OmegaConf

from pipeline import backends as backend_registry
from pipeline import devices, disks
from pipeline.backends import Backend, BackendUnsupported, Candidate, attention, reference
from pipeline.compile import cache as compile_cache
from pipeline.batching import output_batch_dims, output_seq_dims
from pipeline.compile import ahead as compile_ahead
from pipeline.compile import standalone
from pipeline.compile.build import BuildSpec, build_and_warm
from pipeline.compile.cost import Stopwatch
from pipeline.context import ALLOW_HINT, BackendOutcome, RunContext
from pipeline.errors import ConfigError, RunFailed
from pipeline.measure import accuracy, padding
from pipeline.measure.compare import Verdict, combine, judge, tolerance
from pipeline.measure.interleaved import profile_cells
from pipeline.measure.references import Reference, reference_at
from pipeline.measure.screening import numerics_out, screen_settings, screen_sizes
from pipeline.route.decision import baseline
from pipeline.seqlen import PROBE_BATCH, Key, label, padding_probes, words

log = logging.getLogger(__name__)

# A verdict's status -> the outcome's status and the start of its reason.
OUTCOMES = {"ok": ("ok", ""), "mismatch": ("failed", "output differs from eager: "),
            "uninformative": ("unverified", "could not be checked against eager: ")}


def probe_cells(ctx: RunContext) -> List[Key]:
    """The untuned cells padding is proved at: every tuned batch size at each band's probe length (none
    without tuned lengths)."""
    return [(bs, probe) for bs in ctx.batch_sizes for probe in padding_probes(ctx.lengths).values()]


def reference_outputs(ctx: RunContext, compute_dtype: Optional[torch.dtype]) -> Dict[Key, Reference]:
    """Eager's outputs at every tuned cell (and every padding probe), each from the first inputs whose output
    can judge a backend computing in ``compute_dtype``: the truth every backend is held to."""
    sources = ctx.input_sources()
    with ctx.step("capture.eager_outputs"):
        references = {key: reference_at(ctx.model, key, sources, compute_dtype, ctx.cfg.validate.tolerance_scale)
                      for key in ctx.cells + probe_cells(ctx)}
    unproved = {key: ref.uninformative for key, ref in references.items() if ref.uninformative}
    if unproved:
        log.warning("capture: on every input tried, eager's output cannot tell a wrong backend from a right one at "
                    "%s (%s); backends will be recorded unverified",
                    ", ".join(map(label, unproved)), next(iter(unproved.values())))
    return references



def capture_one(ctx: RunContext, backend: Backend,
                references: Callable[[Optional[torch.dtype]], Dict[Key, Reference]]) -> BackendOutcome:
    """Build and check one backend; never raises for the backend's own failures."""
    name, candidate = backend.name, backend.candidate
    outcome = BackendOutcome(name=name, kind=candidate.kind, precision=candidate.precision, weights=candidate.weights)
    budget = ctx.cfg.route.accuracy_budget
    reason = backend.unsupported_reason(ctx.device)
    if reason:
        outcome.status, outcome.reason = "skipped", reason
        return outcome
    scale, dtype = ctx.cfg.validate.tolerance_scale, candidate.compute_dtype
    outcome.tolerance = tolerance(dtype, scale)
    refs = references(dtype)
    tuned, probes = {k: refs[k] for k in ctx.cells}, {k: refs[k] for k in probe_cells(ctx)}
    dims = ctx.dims()
    # Every size up to the largest tuned one may be served, tuned or not; the sample is the largest cell.
    spec = BuildSpec(ctx.model, refs[max(ctx.cells)].inputs, ctx.device, range(1, max(ctx.batch_sizes) + 1),
                     ctx.batch_sizes, dims)
    checks: Dict[str, Verdict] = {}
    scores: List[float] = []  # the accuracy budget's metric against fp32 eager, at each tuned cell

    def check(backend: Backend) -> None:
        """The warm-up is the check: variants the tuned sizes miss (e.g. each graph), then every tuned cell."""
        checks.update(backend.self_check(ctx.model, spec.sample, scale))
        for key, ref in tuned.items():
            out = backend(**ref.inputs)
            checks[words(key)] = judge(out, ref.output, dtype, scale)
            scores.append(accuracy.score(out, ref.output, budget.metric))
        if dims.seq:
            outcome.padding = padding.check(backend, probes, dims.seq, OmegaConf.to_container(budget, resolve=True),
                                            dtype, candidate.judged_by_budget, scale)

    devices.reset_peak_memory(ctx.device)
    held_before = devices.kept_bytes(ctx.device)
    start = time.perf_counter()
    try:
        outcome.cost.check_s = build_and_warm(backend, spec, outcome.cost, check)
    except BackendUnsupported as exc:
        outcome.status, outcome.reason = "skipped", str(exc)
        return outcome
    except Exception as exc:  # a backend's failure is an outcome, not a crash
        log.debug("backend %s failed:\n%s", name, traceback.format_exc())
        outcome.status, outcome.reason = "failed", f"{type(exc).__name__}: {exc}".strip()[:2000]
        if disks.is_full(exc):  # Inductor's own words would be a compile error, far from the cause
            cache = compile_cache.inductor_directory(OmegaConf.to_container(ctx.cfg.compile_cache, resolve=True))
            disks.sweep_temporaries(cache)
            said = " ".join(outcome.reason[:300].split())  # the compiler's command and output, on one line
            outcome.reason = f"{disks.full_reason(cache, 'compile_cache.dir')} ({said})"
        elif ran_out_of_memory(outcome):
            outcome.reason += memory_holders(o for n, o in ctx.outcomes.items() if n in ctx.backends)  # kept so far
        return outcome
    stats = backend.stats()
    outcome.graphs, outcome.pool_mb = int(stats.get("graphs", 0)), float(stats.get("pool_bytes", 0)) / 2**20
    outcome.any_length = backend.any_length
    outcome.build_seconds = time.perf_counter() - start
    outcome.peak_memory_bytes = devices.peak_memory_bytes(ctx.device)
    outcome.held_bytes = max(0, devices.kept_bytes(ctx.device) - held_before)
    outcome.compile = backend.compile_evidence()
    fallback = backend.fallback_reason()
    if fallback:
        outcome.status, outcome.reason = "failed", f"not timed: {fallback}"
        return outcome
    verdict = accuracy.relaxed(combine(checks), candidate.judged_by_budget)
    outcome.accuracy = accuracy.worst(scores, budget.metric)
    outcome.within_budget = accuracy.within(outcome.accuracy, budget.metric, budget.bound)
    outcome.status, start = OUTCOMES[verdict.status]
    outcome.reason, outcome.max_rel_error, outcome.tensors = start + verdict.reason, verdict.error, verdict.tensors
    if outcome.status == "ok" or ctx.cfg.validate.allow_unverified:
        ctx.backends[name] = backend
    return outcome


def memory_holders(kept: Iterable[BackendOutcome], shown: int = 4) -> str:
    """The end of an out-of-memory failure's reason: what the candidates built before it keep of device memory,
    largest first, and what leaves room ("" where none counts: the CPU). A built candidate keeps its memory through
    the profile; on an H100, DistilBERT at batch 256 held 76 GiB by its last candidate, 44 GiB of it in device
    graph pools and CUDA-graph trees, and that candidate failed for want of 2.5 GiB (the suite's run of
    2026-12-06)."""
    holders = sorted((o for o in kept if o.held_bytes), key=lambda o: -o.held_bytes)
    if not holders:
        return ""
    named = ", ".join(f"{o.name} {disks.size(o.held_bytes)}" for o in holders[:shown])
    more = f" and {len(holders) - shown} more" if len(holders) > shown else ""
    return (f"; the candidates built before it hold {disks.size(sum(o.held_bytes for o in holders))} of device "
            f"memory ({named}{more}): fewer backends or precisions, a smaller model.batch_sizes or a cap on the device "
            f"graphs' pools (backends.<graph backend>.max_pool_mb) leave room for it")


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


def capture_order(candidates: Mapping[str, Candidate]) -> List[str]:
    """The order capture builds candidates in: those that do not compile first (eager at each precision among
    them, so :func:`budget_skip` knows its score, and the precision-first screen its numbers), then the compiling
    ones in the order compile workers take their jobs (``compile.ahead.priority``: likely winners and cheap
    programs first)."""
    return sorted(candidates, key=lambda n: (candidates[n].compiles,
                                             compile_ahead.priority(candidates[n]) if candidates[n].compiles else ()))


def capture_sequence(order: List[str], candidates: Mapping[str, Candidate], ready: Callable[[str], bool]
                     ) -> Iterator[str]:
    """The order capture builds in: ``order`` (:func:`capture_order`), except that a candidate whose compile worker is
    still at it (``ready`` false: waiting for it would block) lets a later one whose job is done go first (the workers
    take jobs as they free up, so a short job queued later can end sooner); and a reference peer still compiling goes
    behind the later candidates, those ready first, then the others that are no reference, and is built after them
    unless its job ends before. The user's max-autotune compile takes minutes (131 s of deit_tiny's 206 s tune on the
    H100) while the jobs behind it end sooner, and capture waited for it with them ready (DistilBERT: 7 candidates,
    43 s of capture, built after it). Asked at every step, so a job that ends meanwhile is taken in its turn; a
    candidate that compiles nothing ahead, or whose job failed, is ready."""
    pending, said = list(order), set()
    while pending:
        first = pending[0]
        if not ready(first):
            rest = pending[1:]
            later = next((n for n in rest if ready(n)), None)
            if later is None and candidates[first].reference:
                later = next((n for n in rest if not candidates[n].reference), None)
            if later is not None:
                if first not in said:
                    said.add(first)
                    log.info("capture: %s's worker still compiles it; the candidates after it are built first", first)
                pending.remove(later)
                yield later
                continue
        yield pending.pop(0)


def precision_first(ctx: RunContext, ahead: compile_ahead.CompileAhead) -> Dict[str, str]:
    """Numerics (``Candidate.numerics``) -> why its compiling candidates are not built, from short windows of the
    candidates built so far, which compile nothing (``profile.precision_screen``; ``pipeline.measure.screening``).
    The compile workers are paused meanwhile (``ahead``), and the host watched as the profile watches it (a cell
    measured on a busy host settles nothing); the cells are not kept: the profile's own screen times every
    candidate again, beside the compiled ones."""
    pcfg, candidates = ctx.cfg.profile, ctx.candidates
    compiling = {c.numerics for c in candidates.values() if c.compiles}
    timed = [n for n in ctx.backends if not candidates[n].compiles]
    numerics = {n: candidates[n].numerics for n in timed}
    if not (pcfg.screen and pcfg.precision_screen) or len(compiling) < 2 or len(set(numerics.values())) < 2:
        return {}
    sizes, lengths = screen_sizes(ctx.batch_sizes), screen_sizes(ctx.lengths) if ctx.lengths else []
    with ctx.progress.steps("precision screen", len(sizes) * max(1, len(lengths))) as bar, ahead.paused(), \
            ctx.step("capture.precision_screen"):
        cells = profile_cells(lambda key: ctx.calls(key, timed), sizes, lengths, ctx.device, screen_settings(pcfg),
                              on_step=lambda p, key: bar.next(f"{label(key)} ({len(timed)} candidates)"),
                              watch=ctx.watch())
    contended = sum(m.contended for per in cells.values() for m in per.values())
    if contended:
        log.warning("capture: precision screen: %d of %d cells were measured on a busy host and settle nothing "
                    "(a precision is screened out on a quiet host's cells alone)", contended,
                    sum(len(per) for per in cells.values()))
    failures = ctx.failures()
    out = numerics_out(cells, numerics, [n for n in timed if n not in failures], pcfg.screen_margin)
    return {group: why for group, why in out.items() if group in compiling}


def autotuning_reference_said(ctx: RunContext, names: List[str]) -> None:
    """One line where the references left to their default (``reference_modes`` null) include the user's
    ``torch.compile(mode="max-autotune")``: it benchmarks Inductor's templates for every matrix multiply and
    convolution at each tuned size and precision, the longest compile of a tune (on an H100, EfficientNet-B0's was
    still autotuning after 5.5 min, bench/results/plain-script-h100.md; ResNet-50's at three precisions did not end
    in 9 min, bench/results/README.md's tune-scale-h100 row), and a user who did not ask for it should know what
    leaves it out."""
    if ctx.cfg.get("reference_modes") is not None:
        return
    tuning = [n for n in names if ctx.candidates[n].reference == "max-autotune"]
    if tuning:
        first = reference.default_modes(ctx.device.type)[0]
        log.info("capture: %s %s your torch.compile(mode=\"max-autotune\"), a default reference: it benchmarks "
                 "Inductor's templates for every matrix multiply and convolution at each tuned size, minutes on a "
                 "convolution net; reference_modes=[%s] leaves it out", ", ".join(tuning),
                 "plays" if len(tuning) == 1 else "play", first)


def budget_skip(ctx: RunContext, candidate: Candidate) -> Optional[str]:
    """Why ``candidate`` is not worth building: eager at its precision and weights is outside the accuracy budget,
    and it could not score differently (a graph of eager's kernels), or is far outside; None otherwise."""
    name = candidate.name
    if candidate.kind == "eager" or candidate.precision == "fp32":
        return None
    eager = next((o for o in ctx.outcomes.values() if o.kind == "eager" and o.status == "ok"
                  and o.precision == candidate.precision and o.weights == candidate.weights), None)
    if eager is None or eager.within_budget:
        return None
    budget = ctx.cfg.route.accuracy_budget
    why = (f"not built: {eager.name} is outside the accuracy budget ({budget.metric} {eager.accuracy:.6g}, the "
           f"budget is {accuracy.describe(budget.metric, budget.bound)})")
    if not candidate.compiles:
        return f"{why}, and {name} replays eager's kernels at the same precision, so its outputs are eager's"
    if accuracy.far_outside(eager.accuracy, budget.metric, budget.bound):
        return f"{why} by more than {accuracy.FAR:g}x the budget's margin, which a compiler's fusions do not recover"
    log.info("capture %s: built although %s is outside the accuracy budget: Inductor fuses and keeps fp32 "
             "intermediates, so its score may differ", name, eager.name)
    return None


def precision_skip(screened: Mapping[str, str], candidate: Candidate) -> Optional[str]:
    """Why a compiling ``candidate`` is not built after the precision-first screen (:func:`precision_first`)."""
    why = screened.get(candidate.numerics) if candidate.compiles else None
    return (f"not built: precision screen: {why}; its Inductor program would have to gain more over "
            f"{candidate.numerics}'s own kernels than the margin (profile.precision_screen=false builds it)"
            ) if why else None


def over_budget(ctx: RunContext, name: str, waited: float = 0.0) -> Optional[str]:
    """Why ``name`` is not built once ``tune.budget_s`` is spent (plain eager, the baseline, always is), or None;
    ``waited``: the seconds capture waited for its compile worker before the budget ran out (a user's max-autotune
    compile of GPT-Neo ran past 8 min on an H100: the suite's call BP, 2026-12-06)."""
    spent = ctx.budget_spent()
    if not spent or name == baseline(ctx.candidates):
        return None
    waiting = f", {waited:.0f} s of it waiting for its compile worker's job" if waited >= 1 else ""
    return (f"not built: {spent}{waiting}; the candidates built before it were the likelier winners (a larger "
            f"tune.budget_s builds it)")


def run(ctx: RunContext) -> None:
    source, inputs_at = ctx.input_sources()[0]
    log.info("capture: batches are made of %s", source)
    if ctx.lengths:  # batch dimensions at the shortest length, length dimensions at two batch rows
        shortest = ctx.lengths[0]
        ctx.output_batch_dims = output_batch_dims(ctx.model, lambda bs: inputs_at((bs, shortest)))
        ctx.output_seq_dims = output_seq_dims(ctx.model, lambda n: inputs_at((PROBE_BATCH, n)), ctx.lengths)
    else:
        ctx.output_batch_dims = output_batch_dims(ctx.model, inputs_at)
    references = functools.lru_cache(maxsize=None)(functools.partial(reference_outputs, ctx))  # per compute dtype
    candidates = ctx.candidates
    order = capture_order(candidates)
    pending = [n for n in order if not (ctx.earlier.outcomes.get(n) and ctx.earlier.outcomes[n].status
                                          in ("failed", "skipped"))]
    built = {n: backend_registry.create(candidates[n]) for n in pending}  # each candidate's backend, once
    cells = {k: references(None)[k].inputs for k in ctx.cells}  # what the workers build on and call at
    unattended = attention_unused(ctx.model, cells[min(cells)], [candidates[n] for n in pending])
    supported = [n for n in pending if not built[n].unsupported_reason(ctx.device) and n not in unattended]
    autotuning_reference_said(ctx, supported)
    spec = BuildSpec(ctx.model, cells[max(cells)], ctx.device, range(1, max(ctx.batch_sizes) + 1), ctx.batch_sizes,
                     ctx.dims())
    cache = ctx.cfg.compile_cache
    crowded: Dict[str, BackendOutcome] = {}  # out of device memory beside the workers: built again after them
    with compile_ahead.started({n: candidates[n] for n in supported}, spec, cells, ctx.cfg.threads,
                               OmegaConf.to_container(cache, resolve=True), cache.workers) as ahead:
        ctx.step_seconds["capture.workers_setup"] = ahead.setup_s
        screened: Optional[Dict[str, str]] = None
        for name in ctx.progress.track(capture_sequence(order, candidates, ahead.ready), "capture", len(order)):
            if screened is None and candidates[name].compiles:  # every candidate that compiles nothing is built
                screened = ctx.precision_screened = precision_first(ctx, ahead)
                for group, why in screened.items():
                    log.info("capture: precision screen: no compiling candidate at %s is built: %s", group, why)
                for n in order:
                    if candidates[n].compiles and candidates[n].numerics in screened:
                        ahead.drop(n)
            earlier = ctx.earlier.outcomes.get(name)
            outside = budget_skip(ctx, candidates[name])
            skip = outside or precision_skip(screened or {}, candidates[name]) or unattended.get(name)
            waiting, left = Stopwatch(), ctx.budget_left()  # its worker's job waited for no longer than the budget left
            head_start = None if skip or left == 0 else ahead.wait(name, left)
            waited = waiting.seconds
            over = over_budget(ctx, name, waited)
            skip = skip or over
            timed_out = (head_start or {}).get("timed_out")  # its worker's job ran past compile_cache.job_timeout_s
            if earlier is not None and earlier.status in ("failed", "skipped"):
                outcome = earlier  # the interrupted run's verdict; building it again would fail again
            elif skip or timed_out:
                ahead.drop(name)  # its job is stopped where nothing waits behind it
                if skip is over:
                    ctx.budget_skipped[name] = over
                outcome = BackendOutcome(name=name, kind=candidates[name].kind, status="skipped" if skip else "failed",
                                         reason=skip or timed_out, precision=candidates[name].precision,
                                         weights=candidates[name].weights, within_budget=outside is None)
                outcome.cost.wait_s = waited
            else:
                if head_start and head_start.get("standalone"):  # its worker's program, loaded with no trace
                    standalone.adopt(built[name], head_start["standalone"], ahead.directory)
                    log.info("capture: %s runs the standalone program its worker built (%.1f s): no trace here",
                             name, float(head_start["standalone"]["build_s"]))
                elif head_start and head_start.get("standalone_unfit"):
                    log.info("capture: %s is traced here: %s", name, head_start["standalone_unfit"])
                outcome = capture_one(ctx, built[name], references)
                off = standalone_off(outcome) if built[name].ahead is not None else ""
                if off:
                    log.warning("capture: %s's standalone program from its worker %s here (%s); it is traced "
                                "instead", name, off, outcome.reason[:300] or
                                f"{ctx.cfg.route.accuracy_budget.metric} {outcome.accuracy:.6g}")
                    ctx.backends.pop(name, None)  # kept where it answered: neither timed nor holding memory now
                    built[name] = backend_registry.create(candidates[name])
                    devices.release_memory(ctx.device)
                    outcome = capture_one(ctx, built[name], references)
                outcome.cost.ahead_s = float(head_start["seconds"]) if head_start else 0.0
                if head_start:
                    outcome.cost.ahead_compiled = ahead.compiled_for(name, head_start)
                outcome.cost.wait_s = waited
                warn_if_ahead_missed(outcome, head_start)
                if ran_out_of_memory(outcome) and ahead.working():
                    crowded[name] = outcome
                    built[name] = backend_registry.create(candidates[name])  # the failed build's memory goes
                    continue
            ctx.outcomes[name] = outcome
            log_outcome(ctx, outcome)
    ctx.step_seconds["capture.workers_stop"] = ahead.close_s
    for name, first in crowded.items():  # the workers are stopped now: their device memory is back
        log.info("capture: %s ran out of device memory while compile workers held theirs (%s); built again now that "
                 "they have stopped", name, first.reason[:200])
        devices.release_memory(ctx.device)
        outcome = ctx.outcomes[name] = capture_one(ctx, built[name], references)
        outcome.cost.ahead_s, outcome.cost.wait_s = first.cost.ahead_s, first.cost.wait_s  # spent for it all the same
        outcome.cost.ahead_compiled = first.cost.ahead_compiled
        log_outcome(ctx, outcome)
    ctx.outcomes = {n: ctx.outcomes[n] for n in candidates}  # capture.json, the profile and the route in config order
    ctx.backends = {n: ctx.backends[n] for n in candidates if n in ctx.backends}
    if not ctx.backends:
        unverified = ctx.unverified()
        hint = (f"; unverified: {', '.join(unverified)}{ALLOW_HINT}, or tune on inputs on which its output varies: "
                + ("real data in example_inputs" if ctx.api else "model.examples=<a .pt file of them>")
                + f" ({unverified[0]} {ctx.outcomes[unverified[0]].reason[:300]})" if unverified else "")
        raise NoBackendSurvived(f"capture: no backend survived{hint}; see capture.json for each reason")
    problem = budget_problem(ctx)
    if problem:
        raise ConfigError(problem)


def attention_unused(model: nn.Module, inputs: Dict[str, torch.Tensor], pending: List[Candidate]) -> Dict[str, str]:
    """The candidates that force an attention kernel (``attention`` list) -> why none is built, where one eager call
    of the model shows it calls no scaled_dot_product_attention: asked once, before any compile job starts."""
    forced = [c for c in pending if c.attention]
    if not forced or attention.calls(model, inputs):
        return {}
    return {c.name: attention.no_calls(c.attention) for c in forced}


def standalone_off(outcome: BackendOutcome) -> str:
    """How a candidate that ran its worker's standalone program went wrong in capture ("" where it did not): it
    failed (a file cut short, a loader that refuses it; out of device memory aside, which says as much about the
    workers), or it answered outside the accuracy budget. Either is the program's, not the candidate's, until a trace
    says otherwise: on the H100 and H200 torch 2.11's standalone program of deit_tiny under bf16 autocast, built at a
    symbolic batch, answered at cosine 0.88 at batch 128 and right at batch 1, where the traced program is right
    (``bench/results/references-max-autotune.md``)."""
    if outcome.status == "failed" and not ran_out_of_memory(outcome):
        return "failed"
    return "" if outcome.within_budget else "answered outside the accuracy budget"


def ran_out_of_memory(outcome: BackendOutcome) -> bool:
    """Whether the candidate failed for want of device memory (``capture_one`` names the exception first): while
    compile workers run, that says as much about their jobs' memory as about the candidate's, so it is built again
    once they have stopped, and fails only then."""
    return outcome.status == "failed" and outcome.reason.startswith(f"{torch.OutOfMemoryError.__name__}:")


def warn_if_ahead_missed(outcome: BackendOutcome, head_start: Optional[Dict[str, Any]]) -> None:
    """Say so when a worker compiled a candidate's programs and the run's own build still missed the cache: the
    run paid for both compiles, and the cost table alone would not tell why (the worker's programs differed). A
    worker that built the standalone program filled no cache for a trace: a candidate traced after all (that program
    failed here) has its own warning."""
    if head_start and not head_start.get("standalone") and outcome.status == "ok" and outcome.cost.cache_misses:
        log.warning("compile ahead: %s missed the cache %d time(s) after its worker compiled for %.1f s (the worker: "
                    "%d miss(es)), so this run compiled it twice: the worker's program differed from this process's "
                    "(Inductor's cache key holds its config, the matmul precision flags and the graph); "
                    "compile_cache.workers=0 compiles here only", outcome.name, outcome.cost.cache_misses,
                    float(head_start["seconds"]), int(head_start.get("cache_misses", 0)))


def log_outcome(ctx: RunContext, outcome: BackendOutcome) -> None:
    """One line per candidate: its status and reason, or its build figures and score."""
    level = logging.INFO if outcome.status == "ok" else logging.WARNING
    cost = outcome.cost
    log.log(level, "capture %-28s %-10s %s", outcome.name, outcome.status,
            outcome.reason or f"built in {outcome.build_seconds:.2f}s, max rel err {outcome.max_rel_error:.2e} "
                              f"over {outcome.tensors} tensors, {ctx.cfg.route.accuracy_budget.metric} "
                              f"{outcome.accuracy:.6g}{'' if outcome.within_budget else ' (OUTSIDE the budget)'}"
            + (f", {outcome.compile['graphs']} Dynamo graph(s), {outcome.compile['graph_breaks']} graph break(s), "
               f"compile cache {cost.cache_hits} hit(s) {cost.cache_misses} miss(es)"
               if outcome.compile else "")
            + (f", {outcome.graphs} device graphs in {outcome.pool_mb:.0f} MB" if outcome.graphs else "")
            + (f", holds {disks.size(outcome.held_bytes)} of device memory" if outcome.held_bytes else "")
            + ("" if outcome.padding in ("", padding.PROVED) or outcome.status != "ok" else
               f"; padding NOT proved, so untuned lengths go to "
               f"{'it unpadded' if outcome.any_length else 'others'}: {outcome.padding}"))
