"""The preparation of a run, in one place: what the runner, the sweep's job check and ``pipeline.tune`` all do
before any work, so that a sweep job is checked as it will run.

The inputs the config leaves out are filled in (``pipeline.inputs``), set at the longest tuned length (the
largest call, which the memory checks and the graph buffers are sized for), and every check runs
(``pipeline.preflight.checks``), which makes the run's candidates.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Optional

import torch
from omegaconf import DictConfig, OmegaConf

from pipeline import inputs as model_inputs
from pipeline.backends.candidate import Candidate
from pipeline.errors import ConfigError
from pipeline.preflight import checks, targets


@dataclass(frozen=True)
class Prepared:
    """A checked run: the user's example rows (input name -> rows on the CPU; empty without any) and its
    candidates, in order."""

    examples: Dict[str, torch.Tensor]
    candidates: Dict[str, Candidate]


def prepare(cfg: DictConfig, run_dir: Optional[Path] = None,
            examples: Optional[Dict[str, torch.Tensor]] = None, builds: bool = True) -> Prepared:
    """``cfg`` completed in place and checked (:class:`~pipeline.errors.ConfigError` for the first mistake,
    nothing written). ``examples`` are the caller's own rows (``pipeline.tune``), whose spec is already in
    ``cfg.model.inputs``; without them, the config's inputs are completed first. ``builds``: the run builds its
    model from ``model.build`` (not the caller's model), so its ``_target_`` must import
    (``pipeline.preflight.targets``)."""
    checks.check_required(cfg)
    if builds:
        problem = targets.model_problem(OmegaConf.to_container(cfg.model.build, resolve=False))
        if problem:
            raise ConfigError(problem)
    if examples is None:
        examples = model_inputs.complete(cfg)
    checks.check_lengths(cfg)
    model_inputs.at_longest(cfg)
    return Prepared(examples, checks.check_config(cfg, run_dir))
