"""The MLflow UI, in headless Chromium, shows a sweep's experiment and its child runs.

A real ``mlflow server`` (the suite's shared one, docs/scaling-out.md's command) serves a real 2-job sweep; Debian's
``/usr/bin/chromium`` renders the pages (``--dump-dom`` after a virtual time budget) and keeps screenshots under
``outputs/test-artifacts/browser/``.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from mlflow_helpers import ROOT, SWEEP, SharedServer, run_pipeline, sweep_runs

CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = ROOT / "outputs" / "test-artifacts" / "browser"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium: apt-get install -y chromium"),
]


def chromium(url: str, profile: Path, *args: str) -> str:
    """Run headless Chromium on ``url`` with a fresh profile; returns its stdout."""
    shutil.rmtree(profile, ignore_errors=True)
    proc = subprocess.run([str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                           "--no-first-run", "--disable-background-networking", "--disable-component-update",
                           "--disable-sync", f"--user-data-dir={profile}", "--window-size=1600,1000",
                           "--virtual-time-budget=20000", *args, url],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def page_text(url: str, profile: Path) -> str:
    """The rendered page's visible text (scripts and styles dropped, whitespace collapsed)."""
    dom = chromium(url, profile, "--dump-dom")
    dom = re.sub(r"<(script|style)\b.*?</\1>", " ", dom, flags=re.S)
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", dom))


def test_mlflow_ui_shows_the_sweep(shared_server: SharedServer, tmp_path: Path) -> None:
    url, name = shared_server.url, "tweakpipe-browser"  # an experiment of its own on the shared server
    proc = run_pipeline(["-m", *SWEEP, "tracking=server", f"tracking.uri={url}", f"tracking.experiment={name}",
                         f"hydra.sweep.dir={tmp_path / 'browser_sweep'}"])
    parent, children = sweep_runs(url, name)
    experiment = parent.info.experiment_id
    profile = tmp_path / "chromium"

    # A model-runs experiment by MLflow's own tag; the link the run prints opens its runs table, not the
    # GenAI traces MLflow 3.17's UI starts on (its GenAI / Model training switch decides, not the tag).
    kind = MlflowClient(tracking_uri=url).get_experiment(experiment).tags.get("mlflow.experimentKind")
    assert kind == "custom_model_development"
    links = set(re.findall(r"runs table: (\S+)", proc.stdout))
    assert links == {f"{url}/#/experiments/{experiment}/runs?workflowType=machine_learning"}, proc.stdout[-3000:]
    landing = page_text(links.pop(), profile)
    assert parent.info.run_name in landing and "Run Name" in landing and "Traces 0" not in landing, landing[:3000]

    runs_page = page_text(f"{url}/#/experiments/{experiment}/runs", profile)
    assert name in runs_page and parent.info.run_name in runs_page, runs_page[:3000]
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shot = ARTIFACTS / "experiment_runs.png"
    chromium(f"{url}/#/experiments/{experiment}/runs", profile, f"--screenshot={shot}")
    assert shot.read_bytes()[:4] == b"\x89PNG" and shot.stat().st_size > 20_000

    for child in children:
        child_page = page_text(f"{url}/#/experiments/{experiment}/runs/{child.info.run_id}", profile)
        assert child.info.run_name in child_page, child_page[:3000]
        assert f"Parent run {parent.info.run_name}" in child_page, child_page[:3000]
        assert "latency_ms/eager/bs1" in child_page
    shot = ARTIFACTS / "child_run.png"
    chromium(f"{url}/#/experiments/{experiment}/runs/{children[0].info.run_id}", profile, f"--screenshot={shot}")
    assert shot.stat().st_size > 20_000
