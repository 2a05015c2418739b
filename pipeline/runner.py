"""Runs the configured stages in order over one run context; checks the config before any work."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional

import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from pipeline import backends as backend_registry
from pipeline import devices
from pipeline.context import RunContext
from pipeline.schema import STAGE_NAMES
from pipeline.tracking import make_tracker

log = logging.getLogger(__name__)

# A stage needs the ones named here to have run earlier in the same run.
NEEDS = {"capture": [], "profile": ["capture"], "route": ["profile"], "validate": ["route"]}


def stage_functions() -> Dict[str, Callable[[RunContext], None]]:
    """The stage modules, imported here so that ``stages/`` never import each other."""
    from stages import capture, profile, route, validate

    return {"capture": capture.run, "profile": profile.run, "route": route.run, "validate": validate.run}


def check_config(cfg: DictConfig) -> None:
    """Every early error: stages, batch sizes, backend settings. Raises before any model is built."""
    stages: List[str] = list(cfg.stages)
    for i, stage in enumerate(stages):
        if stage not in STAGE_NAMES:
            raise ValueError(f"unknown stage {stage!r}; stages run in this order: {list(STAGE_NAMES)}")
        missing = [n for n in NEEDS[stage] if n not in stages[:i]]
        if missing:
            raise ValueError(f"stage {stage!r} needs {missing} before it; e.g. stages=[capture,profile,route]")
    bad = [b for b in cfg.model.batch_sizes if int(b) < 1]
    if bad or not cfg.model.batch_sizes:
        raise ValueError(f"model.batch_sizes must be positive integers, got {list(cfg.model.batch_sizes)}; "
                         f"e.g. model.batch_sizes=[1,8,64]")
    if not cfg.backends:
        raise ValueError("no backends selected; e.g. 'backends=[eager,inductor]'")
    if cfg.route.strategy == "one_backend" and (OmegaConf.is_missing(cfg.route, "backend") or not cfg.route.backend):
        raise ValueError("route=one_backend needs the backend to deploy: route.backend=<name>")
    if cfg.route.strategy == "one_backend" and cfg.route.backend not in cfg.backends:
        raise ValueError(f"route.backend={cfg.route.backend} is not among the selected backends {list(cfg.backends)}; "
                         f"pick one of them or add it to backends")
    for name, bcfg in cfg.backends.items():
        backend_registry.create(name, OmegaConf.to_container(bcfg, resolve=True))


def build_context(cfg: DictConfig, run_dir: Path, model: Optional[torch.nn.Module] = None) -> RunContext:
    """Resolve the device, build the model with random weights (or take the caller's), open the tracker."""
    device = devices.resolve(cfg.device)
    torch.manual_seed(cfg.seed)
    model = (instantiate(cfg.model.build) if model is None else model).eval().to(device)
    inputs = OmegaConf.to_container(cfg.model.inputs, resolve=True)
    return RunContext(cfg=cfg, run_dir=run_dir, device=device, model=model, inputs=inputs,
                      tracker=make_tracker(cfg.tracking))


def run(cfg: DictConfig, run_dir: Path, model: Optional[torch.nn.Module] = None) -> RunContext:
    """Check, then run every configured stage; each stage's results are logged as it ends.

    ``model`` replaces building ``cfg.model.build`` (the Python API tunes the caller's model).
    """
    check_config(cfg)
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
