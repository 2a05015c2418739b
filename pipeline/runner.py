"""Runs the configured stages in order over one run context; checks the config before any work.

After each stage (and after each profile cell) the results go to the recorder, so a run that
fails or is killed keeps what it measured; every way out marks the MLflow run FINISHED, FAILED
(an error) or KILLED (Ctrl-C, SIGTERM: ``pipeline.stops``, logged in one line). One process at a
time runs in a run directory (``pipeline.record.claim``). ``resume=True`` reuses an interrupted
run's directory: its failed and skipped backends and its measured cells, where what they measured
is what this run would measure (``pipeline.record.fingerprint``). The run's CPU threads (``threads``) are in
force from the first build to the last check, for every backend alike, and the caller's count
comes back after. Before a run that profiles, one look at the host (``pipeline.measure.contention``) fits
threads left to torch to the free cores, and a busy host is the first line of the run's log.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import logging
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, Optional, Sequence, TypeVar

import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from pipeline import devices, stops
from pipeline.compile import cache as compile_cache
from pipeline.compile import cost
from pipeline.preflight.checks import advice, candidates_of
from pipeline.preflight import versions
from pipeline.preflight.prepare import Prepared, prepare
from pipeline.config.errors import one_line
from pipeline.errors import ConfigError
from pipeline.config.schema import Config
from pipeline.context import Earlier, RunContext
from pipeline.compile.cost import Stopwatch
from pipeline.measure import contention
from pipeline.measure.references import eager_problem
from pipeline.record import fingerprint
from pipeline import progress
from pipeline.record.claim import claimed
from pipeline.record.recorder import Recorder, earlier_record, earlier_results
from pipeline.record.tracker import make_tracker
from pipeline.redact import redact_log
from pipeline.seqlen import declared

log = logging.getLogger(__name__)
LOG_FILE = "tweakpipe.log"
LOG_FORMAT = "[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"  # as Hydra's job log
T = TypeVar("T")


def stage_functions() -> Dict[str, Callable[[RunContext], None]]:
    """The stage modules, imported here so that ``stages/`` never import each other."""
    from stages import capture, profile, route, validate

    return {"capture": capture.run, "profile": profile.run, "route": route.run, "validate": validate.run}


def rerun(ctx: RunContext, stage: str, precision: Optional[Sequence[str]] = None) -> RunContext:
    """``stage`` run again on a copy of a run's context, as the stages before it left it (``RunContext.before``):
    nothing is built again, nothing is recorded, and ``ctx`` is left as it was (what the stage writes itself, the
    route's checkpoint, goes to a folder of its own in the run directory, ``rerun-<stage>-<n>``, kept only where it
    wrote something). With ``precision``, over the candidates of that list alone: what a run of that list would
    choose from the same measurements. The benches ask it how far a profile moves on a re-run (``bench/timing.py``)
    and what a narrower race routes (``bench/quant.py``)."""
    cfg = copy.deepcopy(ctx.cfg)
    if precision is not None:
        cfg.precision = list(precision)
    folder = Path(tempfile.mkdtemp(prefix=f"rerun-{stage}-", dir=ctx.run_dir))
    again = replace(ctx.before(stage, candidates_of(cfg, ctx.device)), cfg=cfg, run_dir=folder)
    with devices.cpu_threads(cfg.threads), progress.scope():
        stage_functions()[stage](again)
    again.restore_model_state()
    if not any(folder.iterdir()):  # a stage that writes nothing (the profile) leaves no folder behind
        folder.rmdir()
    return again


def resumed_config(run_dir: Path, overrides: Sequence[str] = ()) -> DictConfig:
    """The config an interrupted run in ``run_dir`` ran with (its ``config.yaml``), checked against the schema.

    A resumed run is the same run: other overrides would make its cells incomparable, so they are refused,
    and so is a run that finished (there is nothing to continue).
    """
    others = [o for o in overrides if not o.lstrip("+").startswith("resume=")]
    if others:
        raise ConfigError(f"resume={run_dir} continues that run with its own config.yaml; drop {others} "
                          f"(start a new run to change the config)")
    saved = run_dir / "config.yaml"
    if not saved.is_file():
        what = "a file" if run_dir.is_file() else "no config.yaml there"
        raise ConfigError(f"resume={run_dir}: {what}; resume takes the directory of an interrupted run, "
                          f"e.g. resume=outputs/runs/<time>_<model>_<pid>")
    record = earlier_record(run_dir)
    if record.get("status") == "FINISHED":
        raise ConfigError(f"resume={run_dir}: that run finished (stages {', '.join(record.get('stages_done', []))} "
                          f"done); its results are there. Nothing to resume: start a new run to tune again")
    try:
        cfg = OmegaConf.merge(OmegaConf.structured(Config), OmegaConf.load(saved))
    except Exception as exc:  # noqa: BLE001 -- unreadable, not YAML, or not this schema's
        raise ConfigError(f"resume={run_dir}: its config.yaml cannot be read as a run's config "
                          f"({one_line(exc)[:300]}); restore it, or start a new run without resume=") from None
    cfg.resume = str(run_dir)
    return cfg


def check_resumed(run_dir: Path, now: Dict[str, Any]) -> None:
    """Refuse to resume where the run measured something else than this one would (``pipeline.record.fingerprint``)."""
    then = earlier_record(run_dir).get("fingerprint")
    if then is None:
        log.warning("resume: %s holds no run.json (an older run), so what its cells measured cannot be checked", run_dir)
        return
    problem = fingerprint.mismatch(then, now)
    if problem:
        raise ConfigError(f"resume={run_dir}: {problem} since that run measured its cells, so they cannot be "
                          f"reused; start a new run without resume=")


def built(build: DictConfig) -> torch.nn.Module:
    """The model ``model.build`` names. Where its build fails and torchvision does not work with this torch (a model
    that imports torchvision as it builds: ``vit_b_16``, timm's), that is the one-line :class:`ConfigError`."""
    try:
        return instantiate(build)
    except Exception:
        problem = versions.torchvision_problem()
        if problem:
            raise ConfigError(problem) from None
        raise


def build_context(cfg: DictConfig, run_dir: Path, prepared: Prepared, model: Optional[torch.nn.Module] = None,
                  earlier: Optional[Earlier] = None) -> RunContext:
    """Resolve the device and build the model with random weights (or take the caller's), with the
    user's example inputs on the device and the checked candidates."""
    device = devices.resolve(cfg.device)
    torch.manual_seed(cfg.seed)
    api = model is not None
    model = (built(cfg.model.build) if model is None else model).eval().to(device)
    inputs = declared(OmegaConf.to_container(cfg.model.inputs, resolve=True), list(cfg.model.seq_lens))
    return RunContext(cfg=cfg, run_dir=run_dir, device=device, model=model, inputs=inputs,
                      candidates=prepared.candidates, api=api, earlier=earlier or Earlier(),
                      examples={n: t.to(device) for n, t in prepared.examples.items()})


@contextlib.contextmanager
def logging_to(handler: logging.Handler) -> Iterator[None]:
    """``handler`` on the root logger, and tweakpipe's own loggers at INFO at least, for the duration."""
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    root = logging.getLogger()
    ours = [logging.getLogger(name) for name in ("pipeline", "stages")]
    levels = [logger.level for logger in ours]
    root.addHandler(handler)
    for logger in ours:
        if logger.getEffectiveLevel() > logging.INFO:
            logger.setLevel(logging.INFO)
    try:
        yield
    finally:
        root.removeHandler(handler)
        handler.close()
        for logger, level in zip(ours, levels):
            logger.setLevel(level)


@contextlib.contextmanager
def run_log(run_dir: Path) -> Iterator[None]:
    """``tweakpipe.log`` in the run directory, its lines redacted (``pipeline.redact``): Hydra writes it for
    command-line runs (its handler redacts from now on); for API runs the run writes its own, at INFO, for its
    duration."""
    path = (run_dir / LOG_FILE).resolve()
    hydras = [h for h in logging.getLogger().handlers if getattr(h, "baseFilename", None) == str(path)]
    for handler in hydras:
        redact_log(handler)
    if hydras:
        yield
        return
    handler = logging.FileHandler(path)
    with logging_to(handler):
        redact_log(handler)
        yield


@contextlib.contextmanager
def console_log() -> Iterator[None]:
    """tweakpipe's INFO lines (progress, the route, the run directory) on stderr for the duration,
    unless the program set up logging itself (the root logger has a handler): then they go there."""
    if logging.getLogger().handlers:
        yield
        return
    with logging_to(logging.StreamHandler(sys.stderr)):
        yield


def said(function: Callable[..., T]) -> Callable[..., T]:
    """``function`` with its INFO lines where a plain script sees them (:func:`console_log`), for the public
    functions whose line is the user's answer (``pipeline.load_logged_model``'s load, as ``pipeline.load``'s)."""

    @functools.wraps(function)
    def saying(*args: Any, **kwargs: Any) -> T:
        with console_log():
            return function(*args, **kwargs)

    return saying


def first_look(cfg: DictConfig) -> contention.Start:
    """The host before a run that profiles (``pipeline.measure.contention``): the threads it runs with and its line
    where the host is busy; it raises the one-line error under ``profile.on_busy=fail``. A run that does not
    profile keeps its threads and says nothing."""
    if "profile" not in cfg.stages:
        return contention.Start(cfg.threads, "", "")
    reading = contention.read_host(parallel=devices.resolve(cfg.device).type == "cpu")
    return contention.start(reading, cfg.profile.on_busy, cfg.threads, torch.get_num_threads())


def run(cfg: DictConfig, run_dir: Path, model: Optional[torch.nn.Module] = None, resume: bool = False,
        examples: Optional[Dict[str, torch.Tensor]] = None) -> RunContext:
    """Prepare and check (``pipeline.preflight.prepare``), then run every configured stage, recording each one's
    results as it ends.

    ``model`` replaces building ``cfg.model.build`` (the Python API tunes the caller's model), and
    ``examples`` (input name -> rows) the config's ``model.examples``; without them, inputs the config
    leaves out are derived first (``pipeline.inputs``).
    """
    prepared = prepare(cfg, run_dir, examples, builds=model is None)
    host = first_look(cfg)
    cfg.threads = host.threads
    run_dir.mkdir(parents=True, exist_ok=True)
    stage = "setup"
    # progress.watchdog: never silent for long, whether in a stage, between stages or while files are written
    with claimed(run_dir), run_log(run_dir), stops.stoppable() as stop, devices.cpu_threads(cfg.threads) as threads, \
            compile_cache.active(OmegaConf.to_container(cfg.compile_cache, resolve=True)), \
            progress.watchdog(lambda: stage):
        cfg.threads = threads  # the count in force, so that config.yaml and MLflow's params record it
        tuning = Stopwatch()
        status, recorder = "FAILED", None
        try:
            if host.busy:
                log.warning(host.busy)
            if host.note:
                log.info(host.note)
            for line in advice(cfg):
                log.warning(line)
            ctx = build_context(cfg, run_dir, prepared, model, earlier_results(run_dir) if resume else None)
            problem = eager_problem(ctx.model, ctx.inputs, ctx.input_sources()[0], ctx.lengths)
            ctx.restore_model_state()
            if problem:
                raise ConfigError(problem)
            now = fingerprint.fingerprint(ctx)
            if resume:
                check_resumed(run_dir, now)
            recorder = Recorder(cfg, run_dir, make_tracker(cfg.tracking))
            ctx.on_cell = recorder.cell
            log.info("tuning %s on %s (%s, %d CPU threads); run directory %s%s", cfg.model.name, ctx.device,
                     devices.name(ctx.device), threads, run_dir, " (resumed)" if resume else "")
            recorder.start(now, resume, host.busy or host.note)
            functions = stage_functions()
            for stage in cfg.stages:
                start = time.perf_counter()
                try:
                    with progress.scope():  # no progress line outlives its stage
                        functions[stage](ctx)
                    ctx.stage_seconds[stage] = time.perf_counter() - start
                except BaseException as exc:
                    stop.caught(exc)  # a stop that reached the run is not raised again while it is recorded
                    raise
                finally:
                    ctx.restore_model_state()
                    recorder.stage_ended(stage, ctx)
            status = "FINISHED"
            recorder.tuned(ctx, tuning.seconds)
            log.info("tune cost (seconds):\n%s", cost.table({n: o.cost for n, o in ctx.outcomes.items()},
                                                               ctx.stage_seconds, tuning.seconds, ctx.step_seconds))
        except BaseException as exc:
            stop.caught(exc)
            if stops.is_stop(exc):
                status = "KILLED"
                log.warning("stopped by %s during %s; what was measured is in %s; python -m pipeline resume=%s "
                            "continues the run", stops.described(exc), stage, run_dir, run_dir)
            raise
        finally:
            if recorder is not None:
                recorder.finish(status)
    return ctx
