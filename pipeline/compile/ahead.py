"""Compile ahead: the candidates' Inductor programs compiled in worker processes, into the shared cache.

Inductor's compile is CPU-bound and mostly single-threaded Python, and capture builds candidates one after another:
on a 16-core host, 16 candidates' compiles ran back to back. Here, worker processes (fresh processes of
``pipeline.compile.worker``: their own CUDA context, Dynamo state and memory, never the user's script, which
multiprocessing's ``spawn`` would import again, and never a module of the current directory) build each compiling
candidate exactly as capture will (the same model, sample inputs, batch sizes and numerics), so its programs land in
the on-disk, content-addressed cache (``pipeline.compile.cache``); capture waits for a candidate's job, then builds and
checks it itself, loading its programs instead of compiling them. Nothing a worker compiled is timed or served: only
the cache is shared, and every backend still traces its own program (the isolation rule). Candidates that compile one
program (``inductor.X`` and ``graph_inductor.X`` at one precision and weights) share one job. Jobs wait in one queue,
in priority order, and each worker takes the next as it frees up (:class:`JobQueue`). Workers stop when capture ends,
so no compile runs while the profile times a window; a worker whose running job was dropped (the precision screen,
the budget) with no job left that it could take stops at once.

Where the model cannot be sent to a worker (it does not pickle, or its classes live in the user's script) or a worker
fails, capture compiles in its own process as before; the log says why, and nothing else changes. A worker cannot
hang a run: one whose processes use no CPU for STALL_S seconds (stopped, deadlocked) is stopped and named, the other
workers take the jobs still queued, and capture compiles the stopped one's candidate itself; one whose running job
passes ``compile_cache.job_timeout_s`` is stopped too, and that job's candidates fail with the reason: the same
compile in the run's process would take as long, or hang as it did. Workers die with their run, also when it is
killed outright (``pipeline.compile.worker``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Set, Tuple

import torch

from pipeline.backends import regions
from pipeline.backends.candidate import Candidate
from pipeline.backends.inductor import InductorBackend
from pipeline.compile import state as process_state
from pipeline.compile import worker as worker_process
from pipeline.compile.build import BuildSpec
from pipeline.compile.cost import Stopwatch
from pipeline.measure.contention import usable_cores

log = logging.getLogger(__name__)

# A worker whose processes use no CPU for STALL_S seconds is stopped (a SIGSTOP, a deadlock) and capture compiles
# its candidates itself (a job's own bound is compile_cache.job_timeout_s). POLL_S: how often it is asked.
STALL_S = 60.0
POLL_S = 2.0
CORES_PER_WORKER = 4
MIN_CORES = 8  # below this, workers would only take cores from the run's own compiles


def worker_count(requested: Optional[int], jobs: int, cores: Optional[int] = None) -> int:
    """``compile_cache.workers`` (null: one per CORES_PER_WORKER cores, none below MIN_CORES), at most one per job.
    The cores are the ones this process may use (its affinity, its cgroup's quota): a container given 2 CPUs of a
    64-core host, or a run under ``taskset``, starts no workers rather than 16 that share two cores."""
    cores = cores or usable_cores()
    wanted = requested if requested is not None else (cores // CORES_PER_WORKER if cores >= MIN_CORES else 0)
    return max(0, min(int(wanted), jobs))


def autotunes(candidate: Candidate) -> bool:
    """Whether its compile benchmarks Inductor's GEMM/conv templates (max-autotune): hundreds of Triton builds that
    spread over every compile thread they are given (deit_tiny's max-autotune reference: 187 s in a worker of 4
    threads on the H200's 16 cores, beside 15-24 s for every other job, in
    ``bench/results/references-max-autotune.md``)."""
    options = InductorBackend(candidate).effective_options()
    return any(options.get(k) for k in ("max_autotune", "max_autotune_gemm", "max_autotune_pointwise"))


def heavy_count(autotuning: int, count: int) -> int:
    """How many of ``count`` workers compile on every core, for ``autotuning`` autotuning jobs (:func:`autotunes`): one,
    which takes them one after another, so that the other workers keep the candidates likely to win from waiting
    minutes behind a max-autotune compile, and no two autotuning compiles benchmark their templates on the device at
    once (each would time its choices beside the other's: the user's own compile, a reference, runs alone)."""
    return min(autotuning, count, 1)


def compile_threads(heavy: int, count: int, cores: Optional[int] = None) -> List[int]:
    """Inductor's compile threads for each of ``count`` workers, the first ``heavy`` of them the ones autotuning jobs
    go to: every core for those (an autotuning compile outlasts the other jobs by minutes and would otherwise build
    its templates on a share while the rest of the host sits idle), an equal share of the cores for the others."""
    cores = cores or usable_cores()
    return [cores if i < heavy else max(1, cores // count) for i in range(count)]


def program_key(candidate: Candidate) -> str:
    """What decides the program a candidate compiles: its Inductor arguments, its numerics, its attention kernel
    and whether it is regional."""
    settings = candidate.settings
    numerics = {k: getattr(settings, k) for k in ("precision", "cast_weights", "autocast_enabled", "autocast_dtype",
                                                  "attention", "regional")}
    inductor = InductorBackend(candidate)
    compile_args = {k: v for k, v in inductor.compile_kwargs().items() if k not in ("mode", "options")}
    return json.dumps({"compile": compile_args, "options": inductor.effective_options(), **numerics,
                       "per_length": candidate.per_length},
                      sort_keys=True, default=str)  # mode=default and no mode are one program


def priority(candidate: Candidate) -> Tuple[int, int, int]:
    """The order compile jobs run in (and capture builds compiling candidates in): likely winners first, by numerics
    (weights cast to a reduced precision, then autocast, tf32, fp32, and the quantized recipes, whose compiles are the
    slowest), then cheap programs first (regional before whole), the reference peer last at each."""
    if candidate.quantizes:
        rank = 4
    elif candidate.compute_dtype is not None:
        rank = 0 if candidate.casts_weights else 1
    else:
        rank = 2 if candidate.precision == "tf32" else 3
    return rank, 0 if candidate.regional else 1, int(bool(candidate.reference))


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


# --- in the run's process --------------------------------------------------------------------------------

def process_tree_cpu_s(pid: int) -> Optional[float]:
    """CPU seconds used so far by ``pid`` and every process below it (Inductor's own compile pool), from /proc;
    None where /proc cannot tell (not Linux, or the process is gone). Children that ended count too (their seconds
    pass to their parent's ``cutime`` once waited for): a compile that runs one short process after another
    (``ptxas`` for each kernel, the benchmarks of max-autotune) makes progress that a snapshot of the living tree
    misses, and a worker waiting on them is not stalled."""
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    parents, cpu = {}, {}
    for entry in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = entry.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        child = int(entry.parent.name)
        parents[child], cpu[child] = int(fields[1]), sum(map(int, fields[11:15])) / tick  # utime stime cutime cstime
    if pid not in cpu:
        return None
    tree, frontier = {pid}, [pid]
    while frontier:
        below = [p for p, parent in parents.items() if parent in frontier and p not in tree]
        tree.update(below)
        frontier = below
    return sum(cpu[p] for p in tree)


class JobLost(RuntimeError):
    """A job whose answer will not come: its worker stalled, exited or was stopped, or no worker is left that may take
    it; ``timed_out``: it ran past ``compile_cache.job_timeout_s`` itself."""

    def __init__(self, why: str, timed_out: bool = False) -> None:
        super().__init__(why)
        self.timed_out = timed_out


class Worker:
    """One compile worker process (``pipeline.compile.worker``), the job it runs, and what came back. ``heavy``: it
    compiles on every core, and autotuning jobs go to it (:class:`JobQueue`)."""

    def __init__(self, index: int, setup: str, threads: int, log_dir: Path, job_timeout_s: float,
                 queue: "JobQueue", heavy: bool = False) -> None:
        import subprocess

        self.index, self.log, self.queue, self.heavy = index, log_dir / f"worker{index}.log", queue, heavy
        read_end, write_end = os.pipe()
        env = {**os.environ, "TORCHINDUCTOR_COMPILE_THREADS": str(threads)}
        with self.log.open("w") as log_file:
            self.process = subprocess.Popen(
                worker_process.command(setup, str(write_end), str(os.getpid())),
                stdin=subprocess.PIPE, stdout=log_file, stderr=subprocess.STDOUT, pass_fds=(write_end,), env=env,
                text=True, start_new_session=True)  # its own session: a Ctrl-C reaches the run, which stops it
        os.close(write_end)
        self.results: Dict[str, Dict[str, Any]] = {}
        self.done = queue.lock  # one lock for every worker and the queue: a worker freed takes the next job under it
        self.gone = ""  # why the worker is no longer to be waited for ("" while it works)
        # Jobs are handed over one at a time, so that one dropped before its turn is never compiled.
        self.running: Optional[str] = None
        self.since = time.monotonic()  # when the running job was handed over: its bound counts from here
        self.job_timeout_s = job_timeout_s
        self.timed_out: Optional[str] = None  # the job that ran past its bound, where one did
        self.stopped: List[str] = []  # jobs dropped while they ran, their worker stopped with them
        self.progress = (time.monotonic(), 0.0)  # when its process tree last used CPU, and how much by then
        self.reader = threading.Thread(target=self._read, args=(os.fdopen(read_end),), daemon=True,
                                       name=f"compile-worker-{index}")
        self.reader.start()

    def _read(self, stream: Any) -> None:
        for line in stream:
            answer = json.loads(line)
            with self.done:
                if "name" in answer:
                    self.results[answer["name"]] = answer
                    self.running = None
                    self.queue.dispatch()
                self.done.notify_all()
        with self.done:
            self.gone = self.gone or f"worker {self.index} exited: {self.last_words()}"
            self.queue.dispatch()  # an autotuning job left for it may now go to any worker
            self.done.notify_all()

    def last_words(self) -> str:
        """The last line the worker wrote to its log (its error, where it died of one)."""
        try:
            lines = [line for line in self.log.read_text(errors="replace").splitlines() if line.strip()]
        except OSError:
            lines = []
        return lines[-1][:300] if lines else "it wrote nothing"

    def run(self, candidate: Candidate) -> bool:
        """Hand ``candidate``'s job to the worker (the caller holds ``self.done``); False where it would not take it."""
        self.running, self.since = candidate.name, time.monotonic()
        self.progress = (self.since, self.progress[1])  # its idle seconds before the job are no stall
        try:
            self.process.stdin.write(json.dumps({"name": candidate.name, "cfg": candidate.config()}) + "\n")
            self.process.stdin.flush()
        except (OSError, ValueError):
            self.running = None
            self.gone = self.gone or f"worker {self.index} would not take jobs: {self.last_words()}"
            return False
        return True

    def stalled(self, now: float) -> bool:
        """Whether its process tree used no CPU for STALL_S seconds (stopped, or deadlocked)."""
        used = process_tree_cpu_s(self.process.pid)
        if used is None:
            return False  # gone, or no /proc: the reader thread or the job's bound says so
        if used > self.progress[1]:
            self.progress = (now, used)
        return now - self.progress[0] > STALL_S

    def check(self, now: float) -> bool:
        """Give the worker up where its processes stalled or its running job passed its bound: stopped and named in
        ``gone`` (the caller holds ``self.done``). Returns whether it was given up now. An idle worker (no job left
        that it may take) is not stalled."""
        if self.gone or self.running is None:
            return False
        if self.stalled(now):
            self.gone = (f"worker {self.index} made no progress for {STALL_S:.0f} s (its processes used no "
                         f"CPU: stopped or deadlocked)")
        elif now - self.since > self.job_timeout_s:
            self.timed_out = self.running
            self.gone = (f"worker {self.index} ran {self.running}'s job past "
                         f"compile_cache.job_timeout_s={self.job_timeout_s:g} s")
        else:
            return False
        self.stop()
        return True

    def signal(self, signum: int) -> None:
        """Send ``signum`` to the worker and everything it started (its session), where it still runs."""
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signum)

    def stop(self) -> None:
        """End the worker and everything it started (its session), now."""
        self.signal(signal.SIGKILL)
        self.process.wait()
        if self.process.stdin:
            with contextlib.suppress(OSError):
                self.process.stdin.close()


class JobQueue:
    """The compile jobs no worker has taken yet, in priority order (:func:`priority`), and the workers that take them:
    each takes the next as it frees up, one at a time. Dealt out in turn, a job waited minutes behind a max-autotune
    compile while other workers sat idle (DistilBERT, 2026-12-06: ``reference.bf16`` behind
    ``reference_max_autotune.bf16-weights`` on one worker). Autotuning jobs go to the ``heavy`` worker (every core,
    :func:`heavy_count`), which takes them first where another worker is there for the rest; to any worker once no
    heavy one is left."""

    def __init__(self, runners: Sequence[Candidate], autotuning: Set[str]) -> None:
        self.lock = threading.Condition()
        self.pending = list(runners)
        self.autotuning = set(autotuning)
        self.workers: List[Worker] = []
        self.taken: Dict[str, Worker] = {}
        self.cancelled: List[str] = []  # jobs dropped before any worker took them

    def start(self, workers: Sequence[Worker]) -> None:
        """Give ``workers`` (their processes started) their first jobs."""
        with self.lock:
            self.workers = list(workers)
            self.dispatch()

    def may_take(self, worker: Worker, name: str) -> bool:
        """Whether ``worker`` may take job ``name``: none for a worker given up, and an autotuning job for a heavy
        worker only while one is left."""
        if worker.gone:
            return False
        return worker.heavy or name not in self.autotuning or not any(w.heavy and not w.gone for w in self.workers)

    def dispatch(self) -> None:
        """Hand a job to every idle worker that may take one (the caller holds ``lock``)."""
        for worker in self.workers:
            if worker.running is not None or worker.gone:
                continue
            allowed = [c for c in self.pending if self.may_take(worker, c.name)]
            if worker.heavy and any(not w.heavy and not w.gone for w in self.workers):
                allowed = [c for c in allowed if c.name in self.autotuning] or allowed
            if allowed and worker.run(allowed[0]):
                self.pending.remove(allowed[0])
                self.taken[allowed[0].name] = worker
                log.info("compile ahead: worker %d takes %s", worker.index, allowed[0].name)

    def knows(self, name: str) -> bool:
        """Whether ``name`` is a job of this queue still queued or taken (not one cancelled, nor none)."""
        return name in self.taken or any(c.name == name for c in self.pending)

    def untakeable(self, name: str) -> bool:
        """Whether no worker left may take job ``name`` (the caller holds ``lock``)."""
        return not any(self.may_take(w, name) for w in self.workers)

    def answered(self, name: str) -> bool:
        """Whether :meth:`result` for ``name`` would return at once (the caller holds ``lock``)."""
        worker = self.taken.get(name)
        if worker is not None:
            return name in worker.results or bool(worker.gone)
        return self.untakeable(name)

    def result(self, name: str, deadline: Optional[float] = None) -> Optional[Dict[str, Any]]:
        """Wait for ``name``'s answer until ``deadline`` (``time.monotonic``; None: as long as it takes), then None
        with the job left queued or running; raises :class:`JobLost` where it will not come. Every worker is checked
        while it waits (:meth:`Worker.check`): one given up leaves its queued jobs to the others."""
        with self.lock:
            while True:
                worker = self.taken.get(name)
                if worker is not None and name in worker.results:
                    answer = worker.results[name]
                    break
                if worker is not None and worker.gone:
                    raise JobLost(worker.gone, worker.timed_out == name)
                if worker is None and self.untakeable(name):
                    gone = "; ".join(w.gone for w in self.workers if w.gone) or "none started"
                    raise JobLost(f"no compile worker left to take it ({gone})")
                now = time.monotonic()
                if any([w.check(now) for w in self.workers]):
                    self.dispatch()
                    continue
                if deadline is not None and now >= deadline:
                    return None
                self.lock.wait(POLL_S if deadline is None else min(POLL_S, max(deadline - now, 0.01)))
        if "error" in answer:
            raise JobLost(answer["error"])
        return answer

    def cancel(self, name: str) -> Optional[Worker]:
        """Take a job no worker has taken off the queue; a running one whose worker has no job left that it could
        take is stopped with its worker, so that the compiles still wanted get the host's cores (a worker stopped
        here is not started again: its compile would only fill the cache for a run that screens the same way).
        Returns the worker stopped, if one was."""
        with self.lock:
            queued = [c for c in self.pending if c.name == name]
            if queued:
                self.pending.remove(queued[0])
                self.cancelled.append(name)
                return None
            worker = self.taken.get(name)
            if worker is None or worker.running != name or worker.gone:
                return None
            if any(self.may_take(worker, c.name) for c in self.pending):
                return None  # it finishes, and the worker goes on to the next job
            worker.gone = f"worker {worker.index} stopped: its only job left, {name}, was dropped"
            worker.stopped.append(name)
        worker.stop()
        return worker


class CompileAhead:
    """Jobs for the compiling candidates, run by worker processes while capture builds the others."""

    def __init__(self, jobs: Dict[str, str], queue: Optional[JobQueue] = None,
                 directory: Optional[Path] = None) -> None:
        self.jobs, self.queue = jobs, queue
        self.directory = directory  # private to the run (its setup file; standalone programs are loaded from here)
        self.seen: Dict[str, Dict[str, Any]] = {}
        self.given_up: Set[str] = set()  # jobs not to be waited for: failed, or dropped
        self.counted: Set[str] = set()  # the jobs whose compiled programs a built candidate already carries
        self.setup_s = 0.0  # the run's seconds starting the workers (the model written for them, the processes)
        self.close_s = 0.0  # and stopping them

    @property
    def workers(self) -> List[Worker]:
        """The queue's workers (none once closed)."""
        return self.queue.workers if self.queue else []

    def queued(self, runner: str) -> bool:
        """Whether ``runner``'s job is the workers' to answer (not given up)."""
        return self.queue is not None and runner not in self.given_up and self.queue.knows(runner)

    def wait(self, name: str, within: Optional[float] = None) -> Optional[Dict[str, Any]]:
        """Block until the job that compiles ``name``'s program is done, or ``within`` seconds have passed (None: no
        bound; the tune's budget left, in capture); its figures, or ``{"timed_out": reason}`` (the job ran past
        ``compile_cache.job_timeout_s``: its candidates fail), or None (no job, it failed: capture then compiles the
        candidate itself, and the log says why; or it still runs, left to the caller to drop)."""
        runner = self.jobs.get(name)
        if runner is None or (runner not in self.seen and not self.queued(runner)):
            return None
        if runner not in self.seen:
            try:
                answer = self.queue.result(runner, None if within is None else time.monotonic() + within)
                if answer is None:
                    return None
                self.seen[runner] = answer
            except JobLost as exc:
                why = str(exc).splitlines()[0] if str(exc) else ""
                self.given_up.add(runner)
                if not exc.timed_out:
                    log.warning("compile ahead: %s's job did not finish (%s); capture compiles it itself", runner, why)
                    return None
                log.warning("compile ahead: %s; its candidates fail, not compiled again in the run's process", why)
                self.seen[runner] = {"timed_out": (
                    f"not built: compile {why}; not compiled again in the run's process, where it would take as long "
                    f"or hang as it did (a larger compile_cache.job_timeout_s waits longer)")}
        result = self.seen[runner]
        return result if runner == name else {**result, "shared_with": runner}

    def compiled_for(self, name: str, head_start: Dict[str, Any]) -> int:
        """The programs the job behind ``head_start`` (``name``'s answer from :meth:`wait`) compiled, counted once:
        on the first of its candidates built, so that a job whose runner was skipped or failed still counts on the
        candidate sharing it, and one shared by several counts once in the tune's total."""
        runner = head_start.get("shared_with", name)
        if runner in self.counted:
            return 0
        self.counted.add(runner)
        return int(head_start.get("compiled", 0))

    def ready(self, name: str) -> bool:
        """Whether :meth:`wait` for ``name`` would return at once: it has no job (none, dropped, or failed), or its
        job's answer is in, or its worker is gone, or no worker is left to take it."""
        runner = self.jobs.get(name)
        if runner is None or runner in self.seen or not self.queued(runner):
            return True
        with self.queue.lock:
            return self.queue.answered(runner)

    def drop(self, name: str) -> None:
        """``name`` will not be built (skipped): its job is not waited for unless another candidate shares it, is
        never compiled where no worker took it, and is stopped where it runs and its worker has no job left that it
        could take (:meth:`JobQueue.cancel`)."""
        runner = self.jobs.pop(name, None)
        if runner is not None and runner not in self.jobs.values() and self.queued(runner):
            self.given_up.add(runner)
            worker = self.queue.cancel(runner)
            if worker is not None:
                log.info("compile ahead: worker %d stopped, its running job (%s) dropped and none left for it",
                         worker.index, runner)

    def working(self) -> bool:
        """Whether a worker still runs (and may hold device memory)."""
        return any(worker.process.poll() is None for worker in self.workers)

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """The workers stopped (SIGSTOP) for the block and resumed after it, so that what the block times runs on
        a quiet host; the pause counts towards neither a worker's stall (``STALL_S``) nor its job's bound
        (``job_timeout_s``)."""
        if not self.workers:
            yield
            return
        for worker in self.workers:
            worker.signal(signal.SIGSTOP)
        start = time.monotonic()
        try:
            yield
        finally:
            for worker in self.workers:
                worker.signal(signal.SIGCONT)
                with worker.done:  # as stalled() and result() read them: under the worker's lock
                    worker.progress = (time.monotonic(), worker.progress[1])
                    worker.since += time.monotonic() - start
            log.info("compile ahead: %d worker(s) paused %.1f s while the host was timed", len(self.workers),
                     time.monotonic() - start)

    def close(self) -> None:
        """Stop every worker now, running jobs too: the profile must not time beside a compile. Says which jobs were
        never started because their candidates were dropped first (the precision screen, the tune's budget)."""
        if self.queue is None:
            return
        with self.queue.lock:  # taken out of the queue first: a worker stopped below hands nothing to the others
            workers, self.queue.workers, self.queue.pending = self.queue.workers, [], []
        if self.queue.cancelled:
            log.info("compile ahead: %d job(s) never started, their candidates dropped first: %s",
                     len(self.queue.cancelled), ", ".join(self.queue.cancelled))
        for worker in workers:
            worker.stop()


def main_module_classes(setup: Path) -> List[str]:
    """The classes and functions of ``__main__`` (the user's script) that the setup file refers to: a worker
    would have to run that script to import them."""
    import pickletools
    import zipfile

    with zipfile.ZipFile(setup) as archive:
        data = archive.read(next(n for n in archive.namelist() if n.endswith("data.pkl")))
    names = []
    for opcode, arg, _ in pickletools.genops(data):
        if opcode.name == "GLOBAL" and str(arg).split(" ")[0] == "__main__":
            names.append(str(arg).split(" ", 1)[1])
    return sorted(set(names))


def model_file(spec: BuildSpec, cells: Mapping[Any, Mapping[str, Any]], directory: Path, **setup: Any
               ) -> Optional[str]:
    """The workers' setup file (the build spec, the inputs at every tuned cell, on the CPU, and ``setup``: the
    threads, the cache settings and the run's process state), or None with the reason
    logged: the model does not pickle, or needs the user's script (``__main__``) to be imported."""
    path = directory / "setup.pt"
    cpu = lambda inputs: {n: t.detach().cpu() for n, t in inputs.items()}  # noqa: E731
    try:
        torch.save({"spec": replace(spec, sample=cpu(spec.sample)),
                    "cells": {key: cpu(per) for key, per in cells.items()}, **setup}, path)
    except Exception as exc:  # noqa: BLE001 -- an unpicklable model only means no head start
        log.info("compile ahead: off, the model cannot be sent to a worker process (%s: %s); capture compiles "
                 "every candidate itself", type(exc).__name__, exc)
        return None
    in_main = main_module_classes(path)
    if in_main:
        log.info("compile ahead: off, the model uses %s from your script (__main__), which a worker would have to "
                 "run again to import; capture compiles every candidate itself (define it in a module to compile "
                 "ahead)", ", ".join(in_main[:3]))
        return None
    return str(path)


@contextlib.contextmanager
def started(candidates: Mapping[str, Candidate], spec: BuildSpec, cells: Mapping[Any, Mapping[str, Any]],
            threads: Optional[int], cache_cfg: Mapping[str, Any], workers: Optional[int]) -> Iterator[CompileAhead]:
    """Workers compiling ``candidates``' programs for ``spec``, each called at every tuned cell (``cells``: their
    inputs), jobs run in :func:`priority` order; stopped on exit. A regional candidate of a model that repeats no block
    gets no job (capture skips it, with the reason)."""
    if any(c.regional for c in candidates.values()) and not regions.find(spec.model):
        candidates = {n: c for n, c in candidates.items() if not c.regional}
    jobs = plan(candidates)
    runners = sorted(dict.fromkeys(jobs[n] for n in candidates if n in jobs), key=lambda n: priority(candidates[n]))
    count = worker_count(workers, len(runners)) if cache_cfg.get("enabled", True) else 0
    if not count:
        yield CompileAhead({})
        return
    begun = Stopwatch()
    with tempfile.TemporaryDirectory(prefix="tweakpipe-ahead-") as tmp:
        setup = model_file(spec, cells, Path(tmp), threads=threads, cache=dict(cache_cfg), state=process_state.taken())
        if setup is None:
            yield CompileAhead({})
            return
        autotuning = {name for name in runners if autotunes(candidates[name])}
        heavy = heavy_count(len(autotuning), count)
        threads = compile_threads(heavy, count)
        queue = JobQueue([candidates[name] for name in runners], autotuning)
        pool = [Worker(i, setup, threads[i], Path(tmp), float(cache_cfg["job_timeout_s"]), queue, heavy=i < heavy)
                for i in range(count)]
        log.info("compile ahead: %d worker process(es) compile %d program(s) for %d candidate(s): %s (each worker "
                 "takes the next as it frees up; compile threads: %s%s)", count, len(runners), len(jobs),
                 ", ".join(runners), ", ".join(map(str, threads)),
                 f"; autotuning jobs to the first {heavy}" if heavy else "")
        queue.start(pool)
        ahead = CompileAhead(jobs, queue, Path(tmp))
        ahead.setup_s = begun.seconds
        try:
            yield ahead
        finally:
            stopping = Stopwatch()
            ahead.close()
            ahead.close_s = stopping.seconds
