"""Compile ahead: the candidates' Inductor programs compiled in worker processes, into the shared cache.

Inductor's compile is CPU-bound and mostly single-threaded Python, and capture builds candidates one
after another: on a 16-core host, 16 candidates' compiles ran back to back. Here, worker processes
(spawned fresh: their own CUDA context, Dynamo state and memory) build each compiling candidate exactly
as capture will (the same model, sample inputs, batch sizes and numerics), so its programs land in the
on-disk, content-addressed cache (``pipeline.compile.cache``); capture waits for a candidate's job,
then builds and checks it itself, loading its programs instead of compiling them. Nothing a worker
compiled is timed or served: only the cache is shared, and every backend still traces its own program
(the isolation rule). Candidates that compile one program (``inductor.X`` and ``graph_inductor.X`` at
one precision and weights) share one job. Workers stop when capture ends, so no compile runs while
the profile times a window.

Where the model cannot be sent to a worker (it does not pickle) or a worker fails, capture compiles in
its own process as before; the log says why, and nothing else changes.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any, Dict, Iterator, List, Mapping, Optional

import torch

from pipeline import backends
from pipeline.backends.candidate import Candidate
from pipeline.backends.inductor import InductorBackend
from pipeline.compile import cache as compile_cache
from pipeline.compile.build import BuildSpec, build_and_warm
from pipeline.compile.cost import BuildCost, Stopwatch

log = logging.getLogger(__name__)

# Seconds capture waits for one job before compiling the candidate itself.
JOB_TIMEOUT_S = 1800.0
CORES_PER_WORKER = 4
MIN_CORES = 8  # below this, workers would only take cores from the run's own compiles


def worker_count(requested: Optional[int], jobs: int, cores: Optional[int] = None) -> int:
    """``compile_cache.workers`` (null: one per CORES_PER_WORKER cores, none below MIN_CORES), at most one per job."""
    cores = cores or os.cpu_count() or 1
    wanted = requested if requested is not None else (cores // CORES_PER_WORKER if cores >= MIN_CORES else 0)
    return max(0, min(int(wanted), jobs))


def program_key(candidate: Candidate) -> str:
    """What decides the program a candidate compiles: its Inductor arguments and its numerics."""
    settings = candidate.settings
    numerics = {k: getattr(settings, k) for k in ("precision", "cast_weights", "autocast_enabled", "autocast_dtype")}
    inductor = InductorBackend(candidate)
    compile_args = {k: v for k, v in inductor.compile_kwargs().items() if k not in ("mode", "options")}
    return json.dumps({"compile": compile_args, "options": inductor.effective_options(), **numerics,
                       "per_length": candidate.per_length},
                      sort_keys=True, default=str)  # mode=default and no mode are one program


def plan(candidates: Mapping[str, Candidate]) -> Dict[str, str]:
    """Compiling candidate -> the candidate whose job compiles its program. A graph candidate runs the job of
    its group where there is one: it compiles at every recorded size, a superset of an inductor backend's."""
    groups: Dict[str, List[str]] = {}
    for name, candidate in candidates.items():
        if candidate.compiles:
            groups.setdefault(program_key(candidate), []).append(name)
    runner = {key: next((n for n in names if candidates[n].kind == "graph"), names[0])
              for key, names in groups.items()}
    return {name: runner[key] for key, names in groups.items() for name in names}


# --- in the worker process -------------------------------------------------------------------------------

_WORKER: Dict[str, Any] = {}


def _start_worker(setup_path: str, cache_cfg: Dict[str, Any], compile_threads: int) -> None:
    """Once per worker: Inductor's thread share and the run's caches, then the build spec and the tuned cells'
    inputs, on the run's device."""
    os.environ["TORCHINDUCTOR_COMPILE_THREADS"] = str(compile_threads)  # before Inductor reads its config
    compile_cache.apply(cache_cfg)  # for the worker's life
    setup = torch.load(setup_path, map_location="cpu", weights_only=False)  # written by this run a moment ago
    spec: BuildSpec = setup["spec"]
    if setup["threads"]:
        torch.set_num_threads(setup["threads"])
    on = lambda inputs: {n: t.to(spec.device) for n, t in inputs.items()}  # noqa: E731
    _WORKER.update(spec=replace(spec, model=spec.model.eval().to(spec.device), sample=on(spec.sample)),
                   cells=[on(cell) for cell in setup["cells"].values()])


def _compile(candidate: Candidate) -> Dict[str, Any]:
    """Build ``candidate`` as capture will and call it at every tuned cell: its programs enter the cache."""
    watch, counted = Stopwatch(), BuildCost()
    build_and_warm(backends.create(candidate), _WORKER["spec"], counted,
                   lambda backend: [backend(**cell) for cell in _WORKER["cells"]])
    return {"seconds": watch.seconds, "cache_hits": counted.cache_hits, "cache_misses": counted.cache_misses}


# --- in the run's process --------------------------------------------------------------------------------

class CompileAhead:
    """Jobs for the compiling candidates, run by worker processes while capture builds the others."""

    def __init__(self, jobs: Dict[str, str], futures: Dict[str, Future], pool: Optional[ProcessPoolExecutor]) -> None:
        self.jobs, self.futures, self.pool = jobs, futures, pool
        self.seen: Dict[str, Dict[str, Any]] = {}

    def wait(self, name: str) -> Optional[Dict[str, Any]]:
        """Block until the job that compiles ``name``'s program is done; its figures, or None (no job, or it
        failed: capture then compiles the candidate itself)."""
        runner = self.jobs.get(name)
        if runner is None or runner not in self.futures:
            return None
        if runner in self.seen:
            return {**self.seen[runner], "shared_with": runner} if runner != name else self.seen[runner]
        try:
            result = self.futures[runner].result(timeout=JOB_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001 -- a worker's failure only costs the head start
            log.info("compile ahead: %s's job failed (%s: %s); capture compiles it itself", runner,
                     type(exc).__name__, str(exc).splitlines()[0] if str(exc) else "")
            self.futures.pop(runner)
            return None
        self.seen[runner] = result
        return result if runner == name else {**result, "shared_with": runner}

    def drop(self, name: str) -> None:
        """``name`` will not be built (skipped): its job is cancelled unless another candidate shares it."""
        runner = self.jobs.pop(name, None)
        if runner is not None and runner not in self.jobs.values() and runner in self.futures:
            self.futures.pop(runner).cancel()

    def close(self) -> None:
        """Stop every worker now, running jobs too: the profile must not time beside a compile."""
        if self.pool is None:
            return
        processes = list(getattr(self.pool, "_processes", {}).values())
        self.pool.shutdown(wait=False, cancel_futures=True)
        for process in processes:
            process.terminate()
        for process in processes:
            process.join(timeout=10)
        self.pool = None


def model_file(spec: BuildSpec, cells: Mapping[Any, Mapping[str, Any]], directory: Path, **setup: Any
               ) -> Optional[str]:
    """The worker's setup file (the build spec, the inputs at every tuned cell, on the CPU), or None with the
    reason logged."""
    path = directory / "setup.pt"
    cpu = lambda inputs: {n: t.detach().cpu() for n, t in inputs.items()}  # noqa: E731
    try:
        torch.save({"spec": replace(spec, sample=cpu(spec.sample)),
                    "cells": {key: cpu(per) for key, per in cells.items()}, **setup}, path)
    except Exception as exc:  # noqa: BLE001 -- an unpicklable model only means no head start
        log.info("compile ahead: off, the model cannot be sent to a worker process (%s: %s); capture compiles "
                 "every candidate itself", type(exc).__name__, exc)
        return None
    return str(path)


@contextlib.contextmanager
def started(candidates: Mapping[str, Candidate], spec: BuildSpec, cells: Mapping[Any, Mapping[str, Any]],
            threads: Optional[int], cache_cfg: Mapping[str, Any], workers: Optional[int]) -> Iterator[CompileAhead]:
    """Workers compiling ``candidates``' programs for ``spec``, each called at every tuned cell (``cells``: their
    inputs), jobs submitted in the candidates' order (capture's); stopped on exit."""
    jobs = plan(candidates)
    runners = list(dict.fromkeys(jobs[n] for n in candidates if n in jobs))
    count = worker_count(workers, len(runners)) if cache_cfg.get("enabled", True) else 0
    if not count:
        yield CompileAhead({}, {}, None)
        return
    import multiprocessing

    with tempfile.TemporaryDirectory(prefix="tweakpipe-ahead-") as tmp:
        setup = model_file(spec, cells, Path(tmp), threads=threads)
        if setup is None:
            yield CompileAhead({}, {}, None)
            return
        threads_each = max(1, (os.cpu_count() or 1) // count)
        pool = ProcessPoolExecutor(count, mp_context=multiprocessing.get_context("spawn"), initializer=_start_worker,
                                   initargs=(setup, dict(cache_cfg), threads_each))
        futures = {name: pool.submit(_compile, candidates[name]) for name in runners}
        log.info("compile ahead: %d worker process(es) compile %d program(s) for %d candidate(s): %s", count,
                 len(runners), len(jobs), ", ".join(runners))
        ahead = CompileAhead(jobs, futures, pool)
        try:
            yield ahead
        finally:
            ahead.close()
