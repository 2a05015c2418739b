"""bench/suite.py on a CPU (issue 40), so that its GPU call cannot fail for a silly reason: every model's config
composes and passes the checks, GraphNet's scores follow their definition, and a smoke run writes the summary the
H200 table reports."""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys

import pytest
import torch

from bench import suite
from pipeline import inputs as model_inputs
from pipeline.api import compose_config
from pipeline.preflight.checks import candidates_of, check_config
from conftest import ROOT


@pytest.mark.parametrize("name", list(suite.SUITE))
def test_every_models_gpu_config_composes_and_passes_the_checks(name, tmp_path):
    args = argparse.Namespace(smoke=False, device="cpu", profile="quick", precision="[bf16]", tag="h200", runs=tmp_path,
                              overrides=["attention=[default,cudnn]"])
    cfg = compose_config(suite.overrides(suite.SUITE[name], args))
    model_inputs.complete(cfg)
    check_config(cfg)
    assert list(cfg.model.batch_sizes) == [1, suite.SUITE[name].batch_size]
    assert any(c.reference for c in candidates_of(cfg).values())  # the user's own compile competes
    on_gpu = candidates_of(cfg, torch.device("cuda"))
    assert {c.reference for c in on_gpu.values() if c.reference} == {"reduce-overhead", "max-autotune"}  # the best
    assert "inductor.bf16-weights.sdpa-cudnn" in on_gpu  # --overrides reach every model's run


def test_the_scores_are_graphnets():
    cells = [(2.0, None), (0.5, None), (math.nan, "crash"), (1.5, "accuracy")]
    # S(0): a failure counts b = 0.1, a slowdown itself (p = 0), a speed-up itself.
    assert suite.score(cells) == pytest.approx((2.0 * 0.5 * 0.1 * 0.1) ** 0.25)
    assert suite.score(cells, p=1.0) == pytest.approx((2.0 * 0.25 * 0.1 * 0.1) ** 0.25)
    # ES(t) forgives an accuracy failure from t = 1 and a crash from t = 3 (each then counts 1).
    assert suite.score(cells, forgiving=True) == suite.score(cells)
    assert suite.score(cells, 1, forgiving=True) == pytest.approx((2.0 * 0.5 * 0.1 * 1.0) ** 0.25)
    assert suite.score(cells, 3, forgiving=True) == pytest.approx((2.0 * 0.5) ** 0.25)
    assert math.isnan(suite.score([]))


def test_the_smoke_run_writes_the_summary_of_the_h200_table(tmp_path):
    proc = subprocess.run([sys.executable, "bench/suite.py", "--out", str(tmp_path), "--tag", "cpu", "--device", "cpu",
                           "--smoke", "--models", "lennard_jones", "--runs", str(tmp_path / "runs")],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((tmp_path / "suite-cpu.json").read_text())
    summary = result["summary"]
    assert set(summary) >= {"models", "cells", "worst_auto_over_reference", "geomean_speedup_over_reference", "S0",
                            "ES0"}
    assert summary["models"] == 1 and summary["cells"] == 2 and summary["S0"] > 0
    [row] = result["rows"]
    # on a CPU the run's own inductor plays the default-mode reference, and max-autotune's is a candidate of its own
    # (with cast weights only: pipeline.backends.reference.one_form_each)
    assert row["reference_modes"] == {"inductor.bf16": "default", "inductor.bf16-weights": "default",
                                      "reference_max_autotune.bf16-weights": "max-autotune"}
    assert row["references"] == list(row["reference_modes"]) and row["references_not_measured"] == {}
    cells = {int(bs): per for bs, per in row["cells"].items()}  # JSON turned the batch sizes into strings
    for c in suite.ratios({**row, "cells": cells}):  # the best of them per cell, and its mode
        cell = cells[c["batch_size"]]
        assert c["reference"] == min(row["references"], key=lambda n: cell[n]["median_ms"])
        assert c["reference_mode"] == row["reference_modes"][c["reference"]]
    assert set(summary["best_reference_modes"]) <= {"default", "max-autotune"}
    assert sum(summary["best_reference_modes"].values()) == summary["cells"]
    assert row["route_reference"]["cells"] and row["load_seconds"] > 0 and row["tune_seconds"] > 0
    # what the user's own compiles cost: each reference's seconds, the slowest in the table with its mode
    assert set(row["reference_compile_seconds"]) == set(row["references"])
    slowest = max(row["reference_compile_seconds"].values())
    md = (tmp_path / "suite-cpu.md").read_text()
    assert 0 < slowest < row["tune_seconds"] and f"| {slowest:.0f} (" in md
    # a warm tune's seconds are told from a cold one's: the programs it compiled, in its process and its workers
    costs = json.loads((tmp_path / "runs" / "cpu-lennard_jones" / "cost.json").read_text())["candidates"]
    assert row["programs_compiled"] == sum(c["cache_misses"] + c["ahead_compiled"] for c in costs.values())
    assert f"| {row['tune_seconds']:.0f} ({row['programs_compiled']} compiled) |" in md
    assert result["command"].startswith("python bench/suite.py --out OUT")
    # each candidate's accuracy against fp32 eager is kept; a model held to another bound than the default says so
    # with what its served candidates and references read (GPT-Neo's bf16 drift: the SUITE entry's comment)
    assert row["accuracy_budget"] == {"metric": "cosine", "bound": 0.999} and "held to" not in md
    served = sorted({r["backend"] for r in row["route"]})  # one or more: where each was faster (noisy here)
    assert all(row["outcomes"][n]["accuracy"] >= 0.999 for n in served)
    assert all(row["outcomes"][n]["held_mb"] == 0 for n in served)  # device memory kept: none torch counts on a CPU
    held = suite.markdown([{**row, "cells": cells, "accuracy_budget": {"metric": "cosine", "bound": 0.96}}], result)
    assert f"lennard_jones: held to cosine 0.96 against fp32 eager (the default: 0.999); read: {served[0]} " in held
    assert all(f"{n} 1.0000" in held or f"{n} 0.9" in held for n in served)
    assert "reference_max_autotune.bf16-weights 0." in held or "reference_max_autotune.bf16-weights 1." in held

    # lanes joined: a model a later lane ran again (after a fix) is that lane's row; one it left for later is not
    lanes = []
    for tag, route in (("a", "first"), ("b", "again")):
        lane = json.loads(json.dumps(result))
        lane["rows"][0]["route"] = [{"lo": 1, "hi": None, "backend": route}]
        lane["rows"].append({"model": "phlippe_resnet", "not_run": "past the budget"} if tag == "b" else
                            {**lane["rows"][0], "model": "phlippe_resnet"})
        lanes.append(tmp_path / f"lane-{tag}.json")
        lanes[-1].write_text(json.dumps(lane))
    suite.combine(lanes, tmp_path, "joined")
    joined = json.loads((tmp_path / "suite-joined.json").read_text())
    kept = {r["model"]: r["route"][0]["backend"] for r in joined["rows"]}
    assert kept == {"lennard_jones": "again", "phlippe_resnet": "first"} and joined["run_again"] == ["lennard_jones"]
    assert "Run again in a later lane, whose row is kept: lennard_jones." in (tmp_path / "suite-joined.md").read_text()
    # a lane measured on another GPU does not join (call AO's lane ran on an H100 beside H200 ones)
    other = json.loads(lanes[1].read_text())
    lanes[1].write_text(json.dumps({**other, "device": "NVIDIA H100 80GB HBM3"}))
    with pytest.raises(SystemExit, match=r"the lanes differ in device: lane-a\.json: .*lane-b\.json: .*H100"):
        suite.combine(lanes, tmp_path, "mixed")
    # nor one whose runs had other overrides; a lane written before --overrides existed ran none
    lanes[1].write_text(json.dumps({**other, "overrides": ["attention=[default,math]"]}))
    with pytest.raises(SystemExit, match=r"the lanes differ in overrides"):
        suite.combine(lanes, tmp_path, "mixed")
    lanes[1].write_text(json.dumps({k: v for k, v in other.items() if k != "overrides"}))
    suite.combine(lanes, tmp_path, "older")
