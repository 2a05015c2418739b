"""The house's floors (issue 37): ``lint-imports`` keeps the contracts in ``pyproject.toml``, one way down from the
entry points to the ground floor, no circle, and the nevers; and it notices an import added back up."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from conftest import ROOT

LINT = "from importlinter.cli import lint_imports_command; lint_imports_command()"


def lint(tree: Path) -> subprocess.CompletedProcess:
    """``lint-imports`` over ``tree``'s packages (its own, first on the path), without a cache."""
    return subprocess.run([sys.executable, "-c", LINT, "--no-cache", "--no-logo"], cwd=tree, capture_output=True,
                          text=True, timeout=300)


def test_the_tree_keeps_every_contract():
    proc = lint(ROOT)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "0 broken" in proc.stdout and " kept, " in proc.stdout


def lint_with(tmp_path: Path, module: str, imports: str) -> subprocess.CompletedProcess:
    """``lint-imports`` over a copy of the tree in which ``module`` (a path under it) ends with ``imports``."""
    for name in ("pipeline", "stages", "bench"):
        shutil.copytree(ROOT / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__", "results"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    source = tmp_path / module
    source.write_text(source.read_text() + "\n" + imports)
    return lint(tmp_path)


def test_an_import_back_up_breaks_the_contract(tmp_path):
    proc = lint_with(tmp_path, "pipeline/measure/statistics.py",
                     "from pipeline.record import recorder  # noqa: E402,F401\n")
    assert proc.returncode == 1, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "one way down: no room imports a room above it BROKEN" in proc.stdout
    assert "measure knows no backend and no recorder BROKEN" in proc.stdout
    assert "pipeline.measure.statistics -> pipeline.record.recorder" in proc.stdout


def test_a_recorder_that_builds_a_route_breaks_the_contract(tmp_path):
    """Issue 55: the recorder saved and compiled the checkpoint and decided the route again for a metric; the route
    stage now hands it the route done (``pipeline.route.outcome.RouteReport``), and an import of route building or of
    compilation into ``pipeline/record/`` is refused."""
    proc = lint_with(tmp_path, "pipeline/record/recorder.py", "from pipeline.route import checkpoint  # noqa: E402,F401\n"
                     "from pipeline.compile import aot  # noqa: E402,F401\n")
    assert proc.returncode == 1, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "the recorder writes what it is handed, building nothing BROKEN" in proc.stdout
    assert "pipeline.record.recorder -> pipeline.route.checkpoint" in proc.stdout
    assert "pipeline.record.recorder -> pipeline.compile.aot" in proc.stdout
