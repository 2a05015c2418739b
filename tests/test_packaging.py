"""The config tree lives at the top (``conf/``) and ships inside the installed package (``pipeline/conf``)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def listed_packages() -> list:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]


def test_every_package_in_the_tree_is_listed() -> None:
    """pyproject.toml names its packages (the conf mapping needs it): a new subpackage must be added there."""
    found = {".".join(p.parent.relative_to(ROOT).parts) for top in ("pipeline", "stages", "hydra_plugins")
             for p in (ROOT / top).rglob("__init__.py")}
    found |= {"hydra_plugins", "pipeline.conf"}
    assert found == set(listed_packages())


@pytest.mark.slow
def test_a_plain_install_ships_the_config_tree_and_runs_from_any_folder(tmp_path: Path) -> None:
    source = tmp_path / "source"  # a copy, so setuptools' build/ folder lands there, not in the checkout
    for name in ("pipeline", "stages", "hydra_plugins", "conf"):
        shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", str(source),
                    "-w", str(tmp_path / "dist")], check=True, capture_output=True)
    wheel = next((tmp_path / "dist").glob("tweakpipe-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    shipped = {f"pipeline/conf/{p.relative_to(ROOT / 'conf').as_posix()}" for p in (ROOT / "conf").rglob("*.yaml")}
    assert shipped and shipped <= names
    assert not any(n.startswith("conf/") for n in names)  # no second copy at the top of site-packages
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), str(wheel)],
                   check=True, capture_output=True)
    env = {**os.environ, "PYTHONPATH": str(target)}
    where = subprocess.run([sys.executable, "-c", "from pipeline.config import SHIPPED_CONF; print(SHIPPED_CONF)"],
                           cwd=tmp_path, env=env, check=True, capture_output=True, text=True).stdout.strip()
    assert Path(where) == target / "pipeline" / "conf"
    shown = subprocess.run([sys.executable, "-m", "pipeline", "model=tiny_mlp", "--cfg", "job"], cwd=tmp_path,
                           env=env, capture_output=True, text=True)
    assert shown.returncode == 0, shown.stderr
    assert "tiny_mlp" in shown.stdout
