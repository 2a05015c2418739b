"""bench/cpu_table.py's runs: every model's CPU config composes and passes the run's checks, with the table's four
backends at its sizes and threads, and the overrides a lane adds reach each run (the table itself runs on the GPU
host's 16 cores: bench/results/README.md)."""

from __future__ import annotations

import argparse
import sys

import pytest
import torch

from conftest import ROOT
from pipeline import inputs as model_inputs
from pipeline.api import compose_config
from pipeline.preflight.checks import candidates_of, check_config

sys.path.insert(0, str(ROOT))
from bench import cpu_table  # noqa: E402


@pytest.mark.parametrize("name", list(cpu_table.MODELS))
def test_every_models_cpu_config_composes_and_passes_the_checks(name, tmp_path):
    args = argparse.Namespace(profile="default", threads=4, tracking="off", runs=tmp_path,
                              overrides=["attention=[default,math]"])
    cfg = compose_config(cpu_table.overrides_for(name, args))
    model_inputs.complete(cfg)
    check_config(cfg)
    assert list(cfg.backends) == cpu_table.CPU.backends and cfg.threads == 4
    assert list(cfg.model.batch_sizes) == list(cpu_table.CPU.sizes) and cfg.device == "cpu"
    made = candidates_of(cfg, torch.device("cpu"))
    assert {"eager.sdpa-math", "inductor.sdpa-math"} <= set(made)  # the lane's overrides reach the run
