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


def test_a_disagreement_says_whether_the_tune_already_showed_the_winner_or_the_cells_moved():
    """Call BF (2026-12-06): the table's note named mobilenet_v3_small at 8 the route's bug (the tune had OpenVINO 18%
    ahead by median; the route then kept ONNX Runtime at every size), and that was so (fixed in ae9183e); mlp at 17
    in call BD, 8% apart in the tune, was the cells moving."""
    from bench import seed_table

    table = seed_table.Table(backends=["openvino", "onnxruntime"], sizes=[8, 17], peer="openvino")
    cell = lambda ms: {"median_ms": ms}  # noqa: E731
    tuned = lambda ms, lo, hi: {"median_ms": ms, "interval_ms": [lo, hi], "noisy": True, "contended": False}  # noqa
    row = {"model": "m", "route": [{"lo": 1, "hi": None, "backend": "onnxruntime"}], "min_gain": 0.1,
           "cells": {"auto": {8: cell(2.70), 17: cell(0.677)}, "openvino": {8: cell(2.19), 17: cell(0.594)},
                     "onnxruntime": {8: cell(2.47), 17: cell(0.70)}},
           "tune_cells": {"openvino": {"8": tuned(2.36, 2.18, 2.48), "17": tuned(0.703, 0.571, 0.863)},
                          "onnxruntime": {"8": tuned(2.79, 2.40, 3.14), "17": tuned(0.762, 0.657, 0.897)}}}
    found = seed_table.disagreements([row], table)
    assert len(found) == 2
    assert found[0].startswith("m bs=8: openvino") and found[0].endswith("the route's bug")
    assert found[1].startswith("m bs=17: openvino") and found[1].endswith("the cells moved between tune and table")
