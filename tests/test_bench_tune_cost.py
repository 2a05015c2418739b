"""bench/tune_cost.py on a CPU (issue 27), so that its GPU call cannot fail for a silly reason: the smoke run tunes
cold and warm in fresh processes, reads each run's cost account and times the route against a 'before' route."""

from __future__ import annotations

import json

import pytest

from bench import tune_cost


@pytest.mark.slow
def test_the_smoke_run_writes_cold_warm_and_the_route_against_before(tmp_path):
    tune_cost.main(["--out", str(tmp_path / "out"), "--tag", "cpu", "--device", "cpu", "--smoke",
                    "--runs", str(tmp_path / "runs")])
    result = json.loads((tmp_path / "out" / "tune-cost-cpu.json").read_text())
    assert "--runs RUNS" in result["command"] and str(tmp_path) not in result["command"]  # no machine paths
    summary = result["summary"]["tiny_mlp"]
    assert summary["cold_s"] > summary["cold_tune_s"] > 0 and summary["warm_s"] > 0
    assert summary["auto_vs_before"] > 0
    row = result["rows"][0]
    cold, warm = row["cold"]["candidates"]["inductor"], row["warm"]["candidates"]["inductor"]
    assert cold["cache_misses"] >= 1 and (warm["cache_hits"], warm["cache_misses"]) == (cold["cache_misses"], 0)
    assert [c["batch_size"] for c in row["cells"]] == [1, 3, 8]


def test_the_before_routes_are_the_committed_ones_for_the_gpu_models():
    routes = tune_cost.before_routes(tune_cost.BEFORE_FILE)
    assert routes["resnet50"] == [{"lo": 1, "hi": None, "backend": "graph_inductor.bf16-weights"}]
    assert routes["vit_b_16"] == [{"lo": 1, "hi": None, "backend": "graph.bf16-weights"}]
    assert [r["backend"] for r in routes["mlp"]] == ["graph_inductor.tf32", "graph_inductor.bf16-weights"]
