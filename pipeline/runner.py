"""Runs the configured stages in order over one run context; checks the config before any work.

After each stage (and after each profile cell) the results go to the recorder, so a run that
fails or is killed keeps what it measured; every way out marks the MLflow run FINISHED, FAILED
(an error) or KILLED (Ctrl-C, SIGTERM). ``resume=True`` reuses an interrupted run's directory:
its failed and skipped backends and its measured cells. The run's CPU threads (``threads``) are in
force from the first build to the last check, for every backend alike, and the caller's count
comes back after.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, Optional, Sequence

import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from pipeline import compile_cache, cost, devices
from pipeline import inputs as model_inputs
from pipeline.config.checks import check_config
from pipeline.config.errors import ConfigError
from pipeline.config.schema import Config
from pipeline.context import Earlier, RunContext
from pipeline.cost import Stopwatch
from pipeline.record.recorder import Recorder, earlier_results
from pipeline.record.tracker import make_tracker

log = logging.getLogger(__name__)
LOG_FILE = "tweakpipe.log"
LOG_FORMAT = "[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"  # as Hydra's job log


class Terminated(BaseException):
    """SIGTERM arrived: the run stops as if interrupted and is recorded KILLED."""


def stage_functions() -> Dict[str, Callable[[RunContext], None]]:
    """The stage modules, imported here so that ``stages/`` never import each other."""
    from stages import capture, profile, route, validate

    return {"capture": capture.run, "profile": profile.run, "route": route.run, "validate": validate.run}


def resumed_config(run_dir: Path, overrides: Sequence[str] = ()) -> DictConfig:
    """The config an interrupted run in ``run_dir`` ran with (its ``config.yaml``), checked against the schema.

    A resumed run is the same run: other overrides would make its cells incomparable, so they are refused.
    """
    others = [o for o in overrides if not o.lstrip("+").startswith("resume=")]
    if others:
        raise ConfigError(f"resume={run_dir} continues that run with its own config.yaml; drop {others} "
                          f"(start a new run to change the config)")
    saved = run_dir / "config.yaml"
    if not saved.is_file():
        raise ConfigError(f"resume={run_dir}: no config.yaml there; resume takes the directory of an interrupted run, "
                          f"e.g. resume=outputs/runs/<time>_<model>_<pid>")
    cfg = OmegaConf.merge(OmegaConf.structured(Config), OmegaConf.load(saved))
    cfg.resume = str(run_dir)
    return cfg


def build_context(cfg: DictConfig, run_dir: Path, model: Optional[torch.nn.Module] = None,
                  earlier: Optional[Earlier] = None, examples: Optional[Dict[str, torch.Tensor]] = None) -> RunContext:
    """Resolve the device and build the model with random weights (or take the caller's), with the
    user's example inputs on the device."""
    device = devices.resolve(cfg.device)
    torch.manual_seed(cfg.seed)
    api = model is not None
    model = (instantiate(cfg.model.build) if model is None else model).eval().to(device)
    inputs = OmegaConf.to_container(cfg.model.inputs, resolve=True)
    return RunContext(cfg=cfg, run_dir=run_dir, device=device, model=model, inputs=inputs, api=api,
                      earlier=earlier or Earlier(), examples={n: t.to(device) for n, t in (examples or {}).items()})


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
    """``tweakpipe.log`` in the run directory: Hydra writes it for command-line runs; for API runs
    the run writes its own, at INFO, for its duration."""
    path = (run_dir / LOG_FILE).resolve()
    if any(getattr(h, "baseFilename", None) == str(path) for h in logging.getLogger().handlers):
        yield
        return
    with logging_to(logging.FileHandler(path)):
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


@contextlib.contextmanager
def sigterm_stops() -> Iterator[None]:
    """SIGTERM raises :class:`Terminated` in the main thread, so the run is recorded KILLED, not left RUNNING."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, frame: Any) -> None:
        raise Terminated(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def run(cfg: DictConfig, run_dir: Path, model: Optional[torch.nn.Module] = None, resume: bool = False,
        examples: Optional[Dict[str, torch.Tensor]] = None) -> RunContext:
    """Check, then run every configured stage, recording each one's results as it ends.

    ``model`` replaces building ``cfg.model.build`` (the Python API tunes the caller's model), and
    ``examples`` (input name -> rows) the config's ``model.examples``; without them, inputs the config
    leaves out are derived first (``pipeline.inputs``).
    """
    if examples is None:
        examples = model_inputs.complete(cfg)
    check_config(cfg, run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    with run_log(run_dir), sigterm_stops(), devices.cpu_threads(cfg.threads) as threads, \
            compile_cache.active(OmegaConf.to_container(cfg.compile_cache, resolve=True)):
        cfg.threads = threads  # the count in force, so that config.yaml and MLflow's params record it
        tuning = Stopwatch()
        ctx = build_context(cfg, run_dir, model, earlier_results(run_dir) if resume else None, examples)
        recorder = Recorder(cfg, run_dir, make_tracker(cfg.tracking))
        ctx.on_cell = recorder.cell
        log.info("tuning %s on %s (%s, %d CPU threads); run directory %s%s", cfg.model.name, ctx.device,
                 devices.name(ctx.device), threads, run_dir, " (resumed)" if resume else "")
        recorder.start(resume)
        status = "FAILED"
        try:
            functions = stage_functions()
            for stage in cfg.stages:
                start = time.perf_counter()
                try:
                    functions[stage](ctx)
                    ctx.stage_seconds[stage] = time.perf_counter() - start
                finally:
                    ctx.restore_model_state()
                    recorder.stage_ended(stage, ctx)
            status = "FINISHED"
            recorder.tuned(ctx, tuning.seconds)
            log.info("tune cost (seconds):\n%s", cost.table({n: o.cost for n, o in ctx.outcomes.items()},
                                                               ctx.stage_seconds, tuning.seconds))
        except (KeyboardInterrupt, Terminated):
            status = "KILLED"
            raise
        finally:
            recorder.finish(status)
    return ctx
