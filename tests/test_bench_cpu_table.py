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


def test_a_model_measured_again_in_a_later_lane_keeps_that_row_and_the_table_still_shows_the_first(tmp_path):
    """Session 2026-12-06 (eleventh): distilbert_small read 1.17 at 64 on CPUs 0-3 with every backend's interval
    +-7-15% wide, then 1.04 measured again on 4-7; the joined table keeps the later row and names the first with
    what it read, in its notes and whole in the JSON, rather than leaving two rows or dropping one silently."""
    import json

    cell = lambda ms: {"median_ms": ms}  # noqa: E731
    sizes = cpu_table.CPU.sizes

    def row(model: str, auto_ms: float) -> dict:
        return {"model": model, "route": [{"lo": 1, "hi": None, "backend": "openvino"}], "tune_seconds": 1.0,
                "stage_seconds": {}, "outcomes": {"openvino": {"build_seconds": 1.0}}, "backend_stats": {},
                "cells": {"auto": {str(bs): cell(auto_ms) for bs in sizes},
                          **{b: {str(bs): cell(1.0) for bs in sizes} for b in cpu_table.CPU.backends}}}

    meta = {"device": "cpu x", "cores": 16, "torch": "2.11", "python": "3.12", "dtype": "float32", "threads": 4,
            "overrides": [], "runtimes": {}}
    lanes = []
    for name, cpus, rows in (("first.json", [0, 1, 2, 3], [row("mlp", 1.0), row("distilbert_small", 1.17)]),
                             ("again.json", [4, 5, 6, 7], [row("distilbert_small", 1.04)])):
        lanes.append(tmp_path / name)
        lanes[-1].write_text(json.dumps({**meta, "command": f"python bench/cpu_table.py {name}", "cpus": cpus,
                                         "rows": rows}))
    cpu_table.combine(lanes, argparse.Namespace(out=tmp_path, threads=4, profile="default"))
    joined = json.loads((tmp_path / "cpu-table.json").read_text())
    assert [r["model"] for r in joined["rows"]] == ["mlp", "distilbert_small"]
    assert joined["summary"]["worst_auto_over_best"] == pytest.approx(1.04)
    again = joined["measured_again"]
    assert [(a["model"], a["lane"], a["part"]) for a in again] == [("distilbert_small", "first.json", 0)]
    assert again[0]["row"]["cells"]["auto"]["64"]["median_ms"] == 1.17
    notes = (tmp_path / "cpu-table.md").read_text()
    assert "distilbert_small was measured again; the row replaced (first.json, CPUs 0-3) read auto / best single " \
           "1.17 1.17 1.17 1.17 1.17" in notes and "pinned to CPUs 0-3; 4-7" in notes
