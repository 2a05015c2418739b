"""Runs the configured stages in order over one run context; checks the config before any work."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Callable, Dict, Optional

import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from pipeline import devices
from pipeline.config.checks import check_config
from pipeline.context import RunContext
from pipeline.record.tracker import make_tracker

log = logging.getLogger(__name__)


def stage_functions() -> Dict[str, Callable[[RunContext], None]]:
    """The stage modules, imported here so that ``stages/`` never import each other."""
    from stages import capture, profile, route, validate

    return {"capture": capture.run, "profile": profile.run, "route": route.run, "validate": validate.run}


def build_context(cfg: DictConfig, run_dir: Path, model: Optional[torch.nn.Module] = None) -> RunContext:
    """Resolve the device, build the model with random weights (or take the caller's), open the tracker."""
    device = devices.resolve(cfg.device)
    torch.manual_seed(cfg.seed)
    api = model is not None
    model = (instantiate(cfg.model.build) if model is None else model).eval().to(device)
    inputs = OmegaConf.to_container(cfg.model.inputs, resolve=True)
    return RunContext(cfg=cfg, run_dir=run_dir, device=device, model=model, inputs=inputs,
                      tracker=make_tracker(cfg.tracking), api=api)


def run(cfg: DictConfig, run_dir: Path, model: Optional[torch.nn.Module] = None) -> RunContext:
    """Check, then run every configured stage; each stage's results are logged as it ends.

    ``model`` replaces building ``cfg.model.build`` (the Python API tunes the caller's model).
    """
    check_config(cfg, run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
    ctx = build_context(cfg, run_dir, model)
    log.info("tuning %s on %s (%s); run directory %s", cfg.model.name, ctx.device, devices.name(ctx.device), run_dir)
    ctx.tracker.start(cfg, run_dir)
    status = "FAILED"
    try:
        functions = stage_functions()
        for stage in cfg.stages:
            start = time.perf_counter()
            try:
                functions[stage](ctx)
            finally:
                ctx.restore_model_state()
            ctx.stage_seconds[stage] = time.perf_counter() - start
            ctx.tracker.stage_done(stage, ctx.stage_seconds[stage])
        status = "FINISHED"
    finally:
        for log_file in run_dir.glob("*.log"):
            ctx.tracker.log_artifact(log_file)
        ctx.tracker.finish(status)
    return ctx
