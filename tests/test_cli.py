"""The command a new user runs: ``python -m pipeline``, end to end in a subprocess, into a real MLflow store."""

from __future__ import annotations

import re
import subprocess
import sys

import mlflow
import pytest

from conftest import ROOT

pytestmark = pytest.mark.slow


def run_cli(*overrides: str, cwd=ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pipeline", *overrides], cwd=cwd, capture_output=True,
                          text=True, timeout=600)


def test_cli_tunes_logs_and_prints_the_run_directory(tmp_path):
    db = tmp_path / "mlflow.db"
    sizes = [1, 3, 8]
    proc = run_cli("model=tiny_mlp", "profile=quick", "backends=[eager,inductor]", f"tracking.uri=sqlite:///{db}",
                   f"hydra.run.dir={tmp_path}/run")
    assert proc.returncode == 0, proc.stderr[-3000:]
    printed = re.search(r"run directory: (\S+)", proc.stdout)
    assert printed and printed.group(1) == str(tmp_path / "run")
    run_dir = tmp_path / "run"
    for name in ("config.yaml", "capture.json", "profile.csv", "route.json", "validation.json", "tweakpipe.log"):
        assert (run_dir / name).is_file(), name

    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{db}")
    exp = client.get_experiment_by_name("tweakpipe")
    (run,) = client.search_runs([exp.experiment_id])
    assert run.info.status == "FINISHED"
    for backend in ("eager", "inductor"):
        for bs in sizes:
            assert run.data.metrics[f"latency_ms/{backend}/bs{bs}"] > 0
        assert f"compile_s/{backend}" in run.data.metrics
    assert run.data.params["model.name"] == "tiny_mlp"
    assert all(run.data.metrics[f"stage_s/{s}"] > 0 for s in ("capture", "profile", "route", "validate"))
    for bs in sizes:  # each cell's interval and noisy flag, which the report marks
        assert run.data.metrics[f"latency_lo_ms/eager/bs{bs}"] <= run.data.metrics[f"latency_ms/eager/bs{bs}"]
        assert run.data.metrics[f"noisy/eager/bs{bs}"] in (0.0, 1.0)
    assert run.data.tags["route.rests_on_noisy"] in ("true", "false")
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"config.yaml", "profile.csv", "route.json", "validation.json", "capture.json"} <= artifacts


def test_cli_refuses_a_route_resting_on_noise_in_one_line_when_confidence_is_required(tmp_path):
    proc = run_cli("model=tiny_mlp", "profile=quick", "backends=[eager]", "reference=false", "tracking=off", "model.batch_sizes=[1]",
                   "profile.noise_threshold=1e-9", "route.require_confident=true", f"hydra.run.dir={tmp_path}")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("error: the route rests on 1 cell(s) the profile flagged noisy (eager bs=1; ")
    assert proc.stderr.count("\n") == 1 and (tmp_path / "route.json").is_file()


def test_cli_names_an_unknown_backend_and_what_exists(tmp_path):
    proc = run_cli("model=tiny_mlp", "backends=[eager,indcutor]", "tracking=off", f"hydra.run.dir={tmp_path}")
    assert proc.returncode != 0
    assert "unknown backends 'indcutor'; available:" in proc.stderr and "inductor" in proc.stderr


def test_cli_rejects_cuda_on_a_machine_without_it(tmp_path):
    pytest.importorskip("torch")
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    proc = run_cli("model=tiny_mlp", "device=cuda", "tracking=off", f"hydra.run.dir={tmp_path}")
    assert proc.returncode != 0
    assert "sees no cuda device" in proc.stderr
