"""Shared fixtures: Hydra composition of the real config tree, a tiny, fast model, the docs' MLflow server."""

from __future__ import annotations

import contextlib
import os
import subprocess
from pathlib import Path
from typing import Callable, Iterator, List

from pipeline.config import SHIPPED_CONF
import pytest
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

from pipeline.config.schema import register_configs
from mlflow_helpers import SharedServer, docs_server

ROOT = Path(__file__).resolve().parents[1]
CONF = SHIPPED_CONF
# Overrides for runs that must be quick on 2 CPU cores.
TINY = ["model=tiny_mlp", "profile=quick", "tracking=off"]
# The Inductor cache every run of the suite started from the checkout uses (compile_cache.dir's default, made 0700 by
# the first run): a run in another folder that does not test the cache names it, so it loads the tiny programs the
# suite compiled before instead of compiling them cold (seconds each on 2 cores). A test of the cache keeps its own.
SUITE_CACHE = ROOT / "outputs" / "compile_cache"

register_configs()


@pytest.fixture
def compose_cfg() -> Callable[[List[str]], DictConfig]:
    """Compose ``conf/config.yaml`` with overrides, as the command line would."""

    def _compose(overrides: List[str]) -> DictConfig:
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
            return compose(config_name="config", overrides=overrides)

    return _compose


@pytest.fixture(scope="session")
def shared_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SharedServer]:
    """docs/scaling-out.md's ``mlflow server``, started once per test process for every test that runs against a
    server (a start takes 7-9 s on 2 cores); each test logs to an experiment of its own, so runs cannot mix."""
    with docs_server(tmp_path_factory.mktemp("shared_server")) as server:
        yield server


@contextlib.contextmanager
def tmpfs(where: Path, options: str) -> Iterator[Path]:
    """A tmpfs mounted at ``where`` with ``options`` (size=, nr_inodes=, ro) for the block: a real full or read-only
    disk (mounting needs root; elsewhere the test skips with the reason)."""
    where.mkdir(parents=True, exist_ok=True)
    if subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (needs root): a full disk cannot be made")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=True)


@contextlib.contextmanager
def read_only(path: Path) -> Iterator[None]:
    """``path`` made read-only for this process, root included (its mode, and the immutable flag where the
    mode does not stop root); skips the test where neither can."""
    mode = path.stat().st_mode
    path.chmod(0o444 if path.is_file() else 0o555)
    flagged = False
    if os.access(path, os.W_OK):
        flagged = subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode == 0
        if not flagged:
            path.chmod(mode)
            pytest.skip("cannot make a file read-only for root here (no chattr)")
    try:
        yield
    finally:
        if flagged:
            subprocess.run(["chattr", "-i", str(path)], check=True)
        path.chmod(mode)


@contextlib.contextmanager
def tweakpipe_home(path: Path) -> Iterator[None]:
    """TWEAKPIPE_HOME set to ``path`` (its key signs what a run saves) for a module-scoped fixture's run, which
    cannot use monkeypatch; the previous value is put back."""
    old = os.environ.get("TWEAKPIPE_HOME")
    os.environ["TWEAKPIPE_HOME"] = str(path)
    try:
        yield
    finally:
        os.environ.pop("TWEAKPIPE_HOME") if old is None else os.environ.update(TWEAKPIPE_HOME=old)


def pytest_configure(config: pytest.Config) -> None:
    """Each xdist worker's runs get their share of the cores (``OMP_NUM_THREADS``, which the runs it starts in
    fresh processes take as torch's thread count, and torch's own here), as a user's one run has its machine: two
    workers of two threads on two cores would oversubscribe every run, so that every profile measured the other
    worker (its cells marked contended, each host reading stalled for a scheduler slice). A test of threads sets
    its own; a count the environment gives is kept."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1 and "OMP_NUM_THREADS" not in os.environ:
        import torch

        from pipeline.measure.contention import usable_cores

        share = max(1, usable_cores() // workers)
        os.environ["OMP_NUM_THREADS"] = str(share)
        torch.set_num_threads(share)


def pytest_collection_modifyitems(config: pytest.Config, items: List[pytest.Item]) -> None:
    """Skip tests marked gpu where no CUDA/XPU device is present."""
    import torch

    has_gpu = torch.cuda.is_available() or (hasattr(torch, "xpu") and torch.xpu.is_available())
    if has_gpu:
        return
    skip = pytest.mark.skip(reason="needs a CUDA or XPU device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
