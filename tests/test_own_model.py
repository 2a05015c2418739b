"""Your own model by config, as docs/config/model.md writes it: its files and commands run verbatim, the
``model=custom`` form, a model YAML of your own config directory, and each mistake in one line before any work."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Dict, List

import pytest
import torch
import yaml

from conftest import ROOT
from doc_blocks import commands, files, lines, section, write_files
from mlflow_helpers import clean_env
from pipeline import runner
from pipeline.api import compose_config
from pipeline.config.own_model import with_own_model
from pipeline.errors import ConfigError

PAGE = ROOT / "docs" / "config" / "model.md"
OWN = section(PAGE, "## Your own model and data")
OWN_YAML = section(PAGE, "### A model of your own config directory")
GETTING_STARTED = ROOT / "docs" / "getting-started.md"
QUICK = ["profile=quick", "backends=[eager]", "reference=false", "tracking=off"]


def run_in(folder: Path, argv: List[str]) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=folder, env=clean_env(), capture_output=True, text=True, timeout=300)


def run_dirs(folder: Path) -> List[Path]:
    return sorted((folder / "outputs" / "runs").glob("*")) if (folder / "outputs" / "runs").is_dir() else []


def saved_model(run_dir: Path) -> Dict:
    return yaml.safe_load((run_dir / "config.yaml").read_text())["model"]


# ---- composition: your target alone is an empty model ----------------------------------------------------------

def test_your_target_alone_starts_from_an_empty_model_and_a_chosen_option_keeps_its_own():
    cfg = compose_config(["model.build._target_=models_for_tests.GraphBreakMLP", "+model.build.width=8"])
    assert dict(cfg.model.build) == {"_target_": "models_for_tests.GraphBreakMLP", "width": 8}  # no mlp depth
    assert not cfg.model.inputs and cfg.model.examples is None  # no mlp x: the inputs come from the examples
    kept = compose_config(["model=tiny_mlp", "model.build._target_=models_for_tests.GraphBreakMLP"])
    assert set(kept.model.build) == {"_target_", "width", "depth"} and list(kept.model.inputs) == ["x"]
    # Options and their values are passed over; the option goes just before the target, among the overrides.
    assert with_own_model(["-m", "--config-dir", "c", "a=1", "model.build._target_=p.M", "b=2"]) == \
        ["-m", "--config-dir", "c", "a=1", "model=custom", "model.build._target_=p.M", "b=2"]
    assert with_own_model(["model@x=y", "model.build._target_=p.M"]) == ["model@x=y", "model.build._target_=p.M"]


def test_what_your_model_lacks_or_does_not_take_is_named_before_any_work(tmp_path):
    examples = tmp_path / "x.pt"
    torch.save({"x": torch.randn(4, 256)}, examples)
    cases = [  # overrides, what the one line names
        (["model=custom", f"model.examples={examples}"],
         r"^model\.build\._target_ is missing: name your model's class .* model\.build\._target_=mypkg\.model\.MyNet$"),
        (["model.build._target_=pipeline.models.MLP"],
         r"^model\.examples is missing, and model\.inputs names no input: .*model\.examples=my_inputs\.pt"),
        (["model.build._target_=pipeline.models.MLP", f"model.examples={examples}", "+model.build.widht=256"],
         r"^model\.build does not fit pipeline\.models\.MLP: got an unexpected keyword argument 'widht' "
         r"\(arguments given: widht; it takes width, depth\); give its arguments with \+model\.build\.NAME=VALUE"),
    ]
    for overrides, named in cases:
        with pytest.raises(ConfigError, match=named):
            runner.run(compose_config([*overrides, *QUICK]), tmp_path / "run")
        assert not (tmp_path / "run").exists()


# ---- the page's commands, verbatim --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """A folder holding the page's files (``mypkg/model.py``, ``save_inputs.py``) where its commands ran, in order
    (each must succeed): the inputs saved, the model tuned."""
    here = tmp_path_factory.mktemp("own_model")
    assert {p.relative_to(here).as_posix() for p in write_files(OWN, here)} == {"mypkg/model.py", "save_inputs.py"}
    argvs = commands(OWN)
    assert argvs[-1][1:4] == ["-m", "pipeline", "model.build._target_=mypkg.model.TwoInputNet"], argvs
    for argv in argvs:
        proc = run_in(here, argv)
        assert proc.returncode == 0, f"{argv}:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return here


def tuned_by_config(folder: Path) -> Path:
    (run_dir,) = [d for d in run_dirs(folder) if "_TwoInputNet_" in d.name]
    return run_dir


@pytest.mark.slow
def test_the_docs_own_model_command_tunes_a_two_input_net_as_written(folder):
    run_dir = tuned_by_config(folder)
    assert (run_dir / "model.tweak").is_file()
    model = saved_model(run_dir)
    assert model["build"] == {"_target_": "mypkg.model.TwoInputNet"}  # nothing of the default mlp
    assert {n: s["shape"] for n, s in model["inputs"].items()} == {"image": [3, 32, 32], "side": [4]}
    assert (folder / "outputs" / "mlflow.db").is_file()


@pytest.mark.slow
def test_the_docs_model_yaml_in_your_config_directory_runs_as_written(folder):
    assert [p.relative_to(folder).as_posix() for p in write_files(OWN_YAML, folder)] == ["my_conf/model/two_input.yaml"]
    (argv,) = commands(OWN_YAML)
    proc = run_in(folder, argv)
    assert proc.returncode == 0, f"{argv}:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    (run_dir,) = [d for d in run_dirs(folder) if "_two_input_" in d.name]
    model = saved_model(run_dir)
    assert model["build"] == {"_target_": "mypkg.model.TwoInputNet", "hidden": 64} and model["batch_sizes"] == [1, 8, 32]
    assert set(model["inputs"]) == {"image", "side"}


def test_getting_started_shows_the_own_model_files_and_command_this_file_runs():
    by_config = section(GETTING_STARTED, "## Your own model by config")
    assert files(by_config) == files(OWN) and commands(by_config) == commands(OWN)


@pytest.mark.slow
def test_getting_started_commands_run_as_written(folder):
    """The page's other commands, each line through bash in the folder where its own model was tuned: a first run,
    the Python API script, and reading the results (all but ``mlflow ui``, a server that runs until stopped)."""
    python = section(GETTING_STARTED, "## Your own model in Python")
    assert [p.relative_to(folder).as_posix() for p in write_files(python, folder)] == ["tune_mine.py"]
    env = {**clean_env(), "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    said = {}
    for heading in ("## A first run", "## Your own model in Python", "## Reading the results"):
        for line in lines(section(GETTING_STARTED, heading)):
            if line.startswith("mlflow ui "):
                continue
            proc = subprocess.run(line, shell=True, executable="/bin/bash", cwd=folder, env=env, capture_output=True,
                                  text=True, timeout=300)
            assert proc.returncode == 0, f"{line}:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
            said[line.split()[0] if line.split()[0] != "python" else line] = proc.stdout
    assert any("_tiny_mlp_" in d.name for d in run_dirs(folder))  # the first run
    assert said["python tune_mine.py"].strip() == "torch.Size([5, 10])"
    assert {"config.yaml", "profile.csv", "route.json", "model.tweak", "latency.png"} <= set(said["ls"].split())
    assert "TwoInputNet" in said["tweakpipe"] and "tiny_mlp" in said["tweakpipe"]
    assert (folder / "outputs" / "reports" / "tweakpipe" / "report.md").is_file()


@pytest.mark.slow
def test_model_custom_and_each_mistake_on_the_command_line(tmp_path):
    """``model=custom`` with a build argument tunes; each mistake is one line, exit code 2, no run directory."""
    write_files(OWN, tmp_path)
    subprocess.run(commands(OWN)[0], cwd=tmp_path, check=True)
    pipeline = [sys.executable, "-m", "pipeline"]
    own = ["model.build._target_=mypkg.model.TwoInputNet", "model.examples=my_inputs.pt"]
    cases = {  # arguments: what the line names (None: the run succeeds)
        ("model=custom", *own, "+model.build.hidden=8", *QUICK): None,
        ("model=custom", "model.examples=my_inputs.pt"): r"model\.build\._target_ is missing",
        (own[0],): r"model\.examples is missing",
        (own[0], "model.examples=their_inputs.pt"): r"model\.examples=their_inputs\.pt: no such file",
        ("model.build._target_=mypkg.model.TwoInputNett", own[1]): r"mypkg\.model has no 'TwoInputNett'; closest: "
                                                                   r"mypkg\.model\.TwoInputNet",
        (*own, "+model.build.hiden=64"): r"got an unexpected keyword argument 'hiden' .*it takes hidden\)",
        (*own, "model.build.hidden=64"): r"model\.build\.hidden is not in model\.build yet; add it with a \+: "
                                         r"\+model\.build\.hidden=",
    }
    with ThreadPoolExecutor(max_workers=2) as pool:
        procs = dict(zip(cases, pool.map(lambda args: run_in(tmp_path, [*pipeline, *args]), cases)))
    (tuned,) = run_dirs(tmp_path)  # the one run that was not a mistake
    assert saved_model(tuned)["build"] == {"_target_": "mypkg.model.TwoInputNet", "hidden": 8}
    for args, named in cases.items():
        proc = procs[args]
        if named is None:
            assert proc.returncode == 0, proc.stderr[-5000:]
            continue
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, (args, proc.stderr[-3000:])
        assert proc.stderr.startswith("error: ") and proc.stderr.count("\n") == 1, (args, proc.stderr)
        assert re.search(named, proc.stderr), (args, proc.stderr)
    assert not (tmp_path / "outputs" / "mlflow.db").exists()  # the mistakes stopped before the store
