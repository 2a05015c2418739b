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


def test_the_summary_tells_the_routes_choices_from_one_instance_of_the_served_backend_against_another():
    """Issue 56: the 16-core table's worst cell (1.21, resnet18 at 8) was the checkpoint's ONNX Runtime session
    against the table's own session of the same graph; the summary now says which cells measure the route's
    choice (another backend fastest) and which one instance of the served backend against another."""
    from bench import seed_table

    table = seed_table.Table(backends=["eager", "openvino", "onnxruntime"], sizes=[1, 8], peer="eager")
    cell = lambda ms: {"median_ms": ms}  # noqa: E731
    row = {"model": "m", "route": [{"lo": 1, "hi": None, "backend": "onnxruntime"}],
           "cells": {"auto": {1: cell(1.21), 8: cell(8.4)}, "eager": {1: cell(3.0), 8: cell(12.0)},
                     "openvino": {1: cell(1.5), 8: cell(8.0)}, "onnxruntime": {1: cell(1.0), 8: cell(8.3)}}}
    summary = seed_table.summary([row], table)
    assert summary["worst_auto_over_best"] == pytest.approx(1.21) and summary["worst_cell"] == "m bs=1"
    assert summary["worst_auto_over_its_own_backend"] == pytest.approx(1.21)  # onnxruntime against onnxruntime
    assert summary["worst_auto_over_another_backend"] == pytest.approx(8.4 / 8.0)  # openvino fastest at 8
