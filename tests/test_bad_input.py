"""Bad input that never costs work: each mistake fails before any model is built, in one line naming the
problem and the fix, and leaves nothing behind (no run directory, no changed store, no changed model).

The config checks are called in-process (``pipeline.preflight.checks.check_config``, what every run calls first);
a batch of real ``python -m pipeline`` runs, started together, shows the command line's side: exit
code 2, one line on stderr, no traceback, no run directory.
"""

from __future__ import annotations

import hashlib
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Dict, List

import numpy as np
import pytest
import torch

import pipeline
from conftest import ROOT
from mlflow_helpers import clean_env, free_port
from pipeline.route import checkpoint
from pipeline.backends import create
from pipeline.preflight.checks import check_config
from pipeline.preflight.targets import target_problem
from pipeline.preflight.versions import unmet_torch_requirements
from pipeline.errors import ConfigError
from pipeline.models import MLP
from pipeline.route.served import RoutedModule, TuneRecord
from pipeline.route.policy import Range
from pipeline.record.store import MLFLOW_TABLES, StoreGuard, open_experiment
from pipeline.backends.candidate import Candidate

CPU = torch.device("cpu")
HAS_CUDA = torch.cuda.is_available()
# The quick setting every case starts from; a case's own choice of a group replaces the default's.
BASE = {"model": "tiny_mlp", "backends": "[eager]", "profile": "quick", "tracking": "off"}


def overrides(*extra: str) -> List[str]:
    """The base's choices that ``extra`` leaves as they are, then ``extra``; flags (``-m``) first, where Hydra's
    command line takes them."""
    chosen = {o.split("=", 1)[0] for o in extra}
    flags = [o for o in extra if o.startswith("-")]
    return flags + [f"{k}={v}" for k, v in BASE.items() if k not in chosen] + [o for o in extra if o not in flags]


def one_line_naming(message: str, *patterns: str) -> None:
    assert "\n" not in message.strip(), message
    for pattern in patterns:
        assert re.search(pattern, message), f"{pattern!r} not in: {message}"


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# ---- the config: every mistake before any work -----------------------------------------------------------

INDUCTOR_OPTIONS = ["backends=[inductor]", "backends.inductor.mode=null"]
CONFIG_CASES = {  # id: (overrides, what the message names: the problem, then the fix)
    "empty-backends": (["backends=[]"], r"no backends selected", r"backends=\[eager,inductor\]"),
    "negative-min-gain": (["route.min_gain=-0.5"], r"route\.min_gain=-0\.5 must be >= 0", r"route\.min_gain=0\.10"),
    "unknown-strategy": (["route.strategy=fastest"], r"unknown route\.strategy 'fastest'", r"route=router"),
    "no-samples": (["profile.max_samples=0"], r"min_samples <= max_samples, got min_samples=6, max_samples=0",
                   r"profile\.max_samples=200"),
    "zero-precision": (["profile.rel_precision=0"], r"rel_precision and noise_threshold must be > 0", r"got Settings"),
    "zero-passes": (["profile.passes=0"], r"profile\.passes=0: every cell needs at least one pass", r"profile\.passes=2"),
    "zero-extra-size": (["validate.extra_batch_sizes=[0]"], r"validate\.extra_batch_sizes\[0\]=0 is not a batch size",
                        r"validate\.extra_batch_sizes=\[1,8,64\]"),
    "zero-batch-size": (["model.batch_sizes=[0,4]"], r"model\.batch_sizes\[0\]=0 is not a batch size \(an integer from 1",
                        r"model\.batch_sizes=\[1,8,64\]"),
    "no-batch-sizes": (["model.batch_sizes=[]"], r"model\.batch_sizes holds 0 sizes, not 1 to 256",
                       r"model\.batch_sizes=\[1,8,64\]"),
    "too-many-batch-sizes": ([f"model.batch_sizes=[{','.join(map(str, range(1, 258)))}]"],
                             r"model\.batch_sizes holds 257 sizes, not 1 to 256", r"model\.batch_sizes=\[1,8,64\]"),
    "huge-batch-size": (["model.batch_sizes=[1,1000000000]"], r"model\.batch_sizes.*1000000000",
                        r"model\.batch_sizes=\[1,8,64\]"),
    "inputs-beyond-memory": (["model=resnet18", "model.inputs.x.shape=[3,2048,2048]", "model.batch_sizes=[1,65536]"],
                             r"at batch size 65536 the inputs alone take \d+\.\d GiB \(x: \[3, 2048, 2048\] float32 "
                             r"per sample\) and a run holds 2 such batches at once, more than the .* GiB cpu has",
                             r"lower the largest batch size, e\.g\. model\.batch_sizes=\[1,8,64\]"),
    "unknown-dtype": (["model.inputs.x.dtype=float8"], r"input 'x': unknown dtype 'float8'", r"use one of \['bfloat16'"),
    "unknown-fill": (["model.inputs.x.fill=zeros"], r"input 'x': unknown fill 'zeros'", r"use one of \['randn'"),
    "zero-tolerance": (["validate.tolerance_scale=0"], r"validate\.tolerance_scale=0\.0 must be > 0",
                       r"validate\.tolerance_scale=1\.0"),
    "checkpoint-outside": (["route.checkpoint_name=../model.tweak"], r"'\.\./model\.tweak' must be a file name",
                           r"route\.checkpoint_name=model\.tweak"),
    "unknown-device": (["device=tpu"], r"unknown device 'tpu'", r"use auto, cpu, cuda or xpu"),
    "absent-device": (["device=cuda"], r"sees no cuda device", r"use device=auto or device=cpu"),
    "stage-without-prerequisite": (["stages=[route]"], r"stage 'route' needs \['profile'\]",
                                   r"stages=\[capture,profile,route\]"),
    "unknown-stage": (["stages=[capture,tune]"], r"unknown stage 'tune'", r"stages run in this order"),
    "one-backend-unnamed": (["route=one_backend"], r"route=one_backend needs the backend", r"route\.backend=<name>"),
    "one-backend-unselected": (["route=one_backend", "route.backend=inductor"],
                               r"route\.backend=inductor is not among the selected backends", r"add it to backends"),
    "mode-and-options": (["backends=[inductor]", "+backends.inductor.options.max_autotune=true"],
                         r"sets mode and options; they are mutually exclusive", r"Keep one"),
    "unknown-template": ([*INDUCTOR_OPTIONS, "+backends.inductor.template=nope"], r"template 'nope' not found",
                         r"Add the file to conf/inductor_template/"),
    "option-typo": ([*INDUCTOR_OPTIONS, "+backends.inductor.options.freezin=true"],
                    r"unknown Inductor option 'freezin' \(closest valid names: freezing", r"list_options\(\)"),
    "option-type": ([*INDUCTOR_OPTIONS, "+backends.inductor.options.compile_threads=1.5"],
                    r"compile_threads=1\.5 does not fit int \| None, the type torch declares", r"list_options\(\)"),
    "unknown-on-busy": (["profile.on_busy=sometimes"], r"profile\.on_busy='sometimes' is not one of \['warn', 'wait'",
                        r"e\.g\. profile\.on_busy=warn"),
    "negative-busy-wait": (["profile.on_busy_wait_s=-1"], r"profile\.on_busy_wait_s=-1\.0 must be >= 0 seconds",
                           r"profile\.on_busy_wait_s=300"),
    "zero-threads": (["threads=0"], r"threads=0 is not a thread count \(an integer from 1 to 1024", r"threads=2"),
    "backend-threads": (["backends=[onnxruntime]", "backends.onnxruntime.threads=-1"],
                        r"backend 'onnxruntime' threads=-1 is not a thread count", r"or null for the default"),
    "unknown-precision": (["backends=[openvino]", "backends.openvino.precision=f64"],
                          r"backend 'openvino': precision='f64' is unknown",
                          r"\['fp32', 'tf32', 'bf16', 'fp16', 'int8_weight_only', 'int8_dynamic', 'fp8'\]"),
    "unknown-attention": (["attention=[default,fast]"], r"attention 'fast' is unknown",
                          r"attention=\[default,cudnn\]"),
    "backend-attention": (["backends.eager.attention=fastest"], r"backend 'eager': attention='fastest' is unknown",
                          r"\['flash', 'efficient', 'cudnn', 'math'\]"),
    "own-attention-and-list": (["backends.eager.attention=math", "attention=[default,flash]"],
                               r"backend 'eager' sets attention=math itself", r"leave attention at \[default\]"),
    "plain-file-store": (["tracking=sqlite", "tracking.uri=file:///tmp/mlruns"], r"MLflow refuses the plain-file store",
                         r"use sqlite:///path/to/mlflow\.db"),
}


@pytest.mark.parametrize("case", list(CONFIG_CASES))
def test_a_config_mistake_fails_the_checks_in_one_line(compose_cfg, tmp_path, case):
    extra, problem, fix = CONFIG_CASES[case]
    if case == "absent-device" and HAS_CUDA:
        pytest.skip("this machine has CUDA")
    cfg = compose_cfg(overrides(*extra))
    with pytest.raises(ConfigError) as err:
        check_config(cfg, tmp_path / "run")
    one_line_naming(str(err.value), problem, fix)
    assert not (tmp_path / "run").exists()


def test_schemas_are_no_options(compose_cfg):
    from hydra.errors import MissingConfigException

    with pytest.raises(MissingConfigException) as err:  # --help lists the same options
        compose_cfg(overrides("model=base_model"))
    available = str(err.value).split("Available options in 'model':")[1].split("Config search path")[0]
    assert "tiny_mlp" in available and "base" not in available and "schema" not in available


# ---- where the run writes ----------------------------------------------------------------------------------


def unwritable_dir(tmp_path: Path) -> Path:
    """A directory nothing may be created in: read-only by its mode, or (root ignores modes) under /proc."""
    folder = tmp_path / "read-only"
    folder.mkdir()
    folder.chmod(0o555)
    return folder / "run" if not os.access(folder, os.W_OK) else Path("/proc/self/tweakpipe-run")


def test_a_run_directory_that_cannot_be_written_fails_before_any_work(compose_cfg, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    for run_dir in (blocker / "run", unwritable_dir(tmp_path)):
        with pytest.raises(ConfigError) as err:
            check_config(compose_cfg(overrides()), run_dir)
        one_line_naming(str(err.value), rf"run directory {re.escape(str(run_dir))}: ", r"hydra\.run\.dir=")


def test_the_api_checks_before_touching_the_callers_model(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    model = MLP(width=16, depth=2).train()
    with pytest.raises(ConfigError, match=r"run_dir=\.\.\. in pipeline\.tune"):
        pipeline.tune(model, {"x": torch.randn(2, 16)}, run_dir=blocker / "run", overrides=["backends=[eager]", "reference=false",
                                                                                                "tracking=off"])
    assert model.training  # never put in eval mode: nothing ran


# ---- the MLflow store: refused before MLflow opens it, left as it was --------------------------------------


def check_tracking(compose_cfg, uri: str, *patterns: str) -> None:
    cfg = compose_cfg(overrides("tracking=sqlite", f"tracking.uri={uri}"))
    with pytest.raises(ConfigError) as err:
        check_config(cfg)
    one_line_naming(str(err.value), *patterns)


def test_a_text_file_as_the_store_is_refused_and_left_unchanged(compose_cfg, tmp_path):
    notes = tmp_path / "notes.db"
    notes.write_text("not a database\n" * 100)
    before = sha256(notes)
    check_tracking(compose_cfg, f"sqlite:///{notes}", r"notes\.db is not a SQLite database",
                   r"point tracking\.uri at a new file")
    assert sha256(notes) == before


def test_another_applications_database_is_left_byte_for_byte_unchanged(compose_cfg, tmp_path):
    app = tmp_path / "app.db"
    with sqlite3.connect(app) as con:
        con.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)")
        con.execute("INSERT INTO users (name) VALUES ('ada')")
    con.close()
    before = sha256(app)
    check_tracking(compose_cfg, f"sqlite:///{app}", r"app\.db is another application's SQLite database \(tables users\)",
                   r"it was left unchanged; point tracking\.uri at a new file")
    with pytest.raises(ConfigError, match="another application's"):  # the sweep's path to the store checks too
        open_experiment(f"sqlite:///{app}", "tweakpipe", StoreGuard(f"sqlite:///{app}"))
    assert sha256(app) == before


def test_a_half_migrated_store_is_refused_saying_exactly_what_to_do(compose_cfg, tmp_path):
    db = tmp_path / "mlflow.db"
    with sqlite3.connect(db) as con:
        for table in (*MLFLOW_TABLES, "_alembic_tmp_experiments"):
            con.execute(f"CREATE TABLE {table} (id INTEGER)")
    con.close()
    check_tracking(compose_cfg, f"sqlite:///{db}", r"holds _alembic_tmp_experiments, left by an interrupted MLflow migration",
                   rf"rm {re.escape(str(db))}", r"DROP TABLE _alembic_tmp_experiments", r"mlflow db upgrade sqlite:///")


def test_a_store_path_that_cannot_be_written_is_named(compose_cfg, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    check_tracking(compose_cfg, f"sqlite:///{blocker}/mlflow.db", rf"{re.escape(str(blocker))} is a file")


def test_a_tracking_server_that_is_down_fails_within_seconds(compose_cfg):
    port = free_port()  # nothing listens on it
    cfg = compose_cfg(overrides("tracking=server", f"tracking.uri=http://127.0.0.1:{port}"))
    start = time.monotonic()
    with pytest.raises(ConfigError) as err:
        check_config(cfg)
    assert time.monotonic() - start < 30
    one_line_naming(str(err.value), r"the tracking server is unreachable",
                    rf"mlflow server --backend-store-uri sqlite:///mlflow-server/mlflow\.db .*--host 127\.0\.0\.1 --port {port} ")


CREATE_STORE = """
import sys
from pipeline.record.store import StoreGuard, open_experiment
open_experiment(sys.argv[1], "tweakpipe", StoreGuard(sys.argv[1]))
"""


def test_ctrl_c_while_the_first_run_creates_the_store_leaves_no_broken_store(tmp_path):
    db = tmp_path / "mlflow.db"
    uri = f"sqlite:///{db}"
    proc = subprocess.Popen([sys.executable, "-c", CREATE_STORE, uri], cwd=ROOT, env=clean_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while not db.with_name("mlflow.db.creating").exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    proc.send_signal(signal.SIGINT)  # Ctrl-C while MLflow creates its tables
    proc.wait(timeout=60)
    assert not db.exists()  # half a store never takes the real name
    experiment_id = open_experiment(uri, "tweakpipe", StoreGuard(uri))  # the next run starts clean
    assert experiment_id and MLFLOW_TABLES <= {r[0] for r in sqlite3.connect(db).execute(
        "SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("mlflow.db")) == ["mlflow.db", "mlflow.db.lock"]


# ---- calling a tuned model ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> RoutedModule:
    """A checkpoint loaded through the API, as a user serves it (eager: no compile)."""
    torch.manual_seed(0)
    model = MLP(width=16, depth=2).eval()
    backend = create(Candidate.of("eager", {"kind": "eager"}))
    backend.build(model, {}, CPU, [1, 2, 3])
    record = TuneRecord("tiny_mlp", model, {"x": {"shape": [16], "dtype": "float32"}}, [1, 3], CPU)
    path = checkpoint.save(RoutedModule({"eager": backend}, [Range(1, None, "eager")], record),
                           tmp_path_factory.mktemp("served") / "m.tweak")
    return pipeline.load(path, MLP(width=16, depth=2))


CALL_CASES = {  # id: (input, error, what the message names)
    "list": ([[0.0] * 16], TypeError, r"input 'x' is a builtins\.list; pass a torch\.Tensor of torch\.float32 on cpu, "
                                      r"e\.g\. torch\.as_tensor\(x, dtype=torch\.float32, device='cpu'\)"),
    "numpy": (np.zeros((2, 16), dtype=np.float32), TypeError, r"is a numpy\.ndarray; pass a torch\.Tensor"),
    "dtype": (torch.zeros(2, 16, dtype=torch.float64), TypeError,
              r"dtype torch\.float64, but this model was tuned for torch\.float32; convert it: x\.to\(torch\.float32\)"),
    "device": (torch.zeros(2, 16, device="meta"), ValueError,
               r"input 'x' is on meta, but this model was tuned on cpu; move it: x\.to\('cpu'\)"),
    "no-batch-dim": (torch.zeros(()), ValueError, r"is a 0-dim tensor; inputs are batch-first"),
    "shape": (torch.zeros(2, 15), ValueError, r"per-sample shape \(15,\), but this model was tuned for \(16,\) "
                                              r"\(inputs are batch-first\); pipeline\.tune again with example_inputs"),
}


@pytest.mark.parametrize("case", list(CALL_CASES))
def test_a_wrong_input_names_what_the_model_expects(served, case):
    x, error, named = CALL_CASES[case]
    served(torch.zeros(2, 16))  # the right tensor of the same shape first: its checks are cached ...
    for call in (lambda: served(x), lambda: served(x=x)):  # ... and a wrong one is still checked, either way
        with pytest.raises(error) as err:
            call()
        one_line_naming(str(err.value), named)


def test_loading_on_a_device_that_is_not_one_names_the_devices(served, tmp_path):
    path = checkpoint.save(served, tmp_path / "m.tweak")
    with pytest.raises(ValueError) as err:
        pipeline.load(path, MLP(width=16, depth=2), device="foo")
    one_line_naming(str(err.value), r"device='foo' is not a device; pass 'cpu', 'cuda', 'cuda:1', 'xpu' or None")


def test_a_model_tuned_from_the_config_names_model_inputs(served):
    rec = served.record
    routed = RoutedModule(served.backends, served.route, TuneRecord(rec.name, rec.model, rec.inputs, rec.batch_sizes,
                                                                    rec.device))
    with pytest.raises(ValueError, match=r"tune again with that shape in model\.inputs"):
        routed(torch.zeros(2, 15))


# ---- the command line: exit code 2, one line, no traceback, no run directory --------------------------------

CLI_CASES: Dict[str, tuple] = {  # id: (arguments, what stderr names)
    "empty-backends": (["backends=[]"], r"no backends selected"),
    "negative-min-gain": (["route.min_gain=-0.5"], r"route\.min_gain=-0\.5 must be >= 0"),
    "unknown-strategy": (["route.strategy=fastest"], r"unknown route\.strategy 'fastest'"),
    "no-samples": (["profile.max_samples=0"], r"min_samples <= max_samples"),
    "zero-extra-size": (["validate.extra_batch_sizes=[0]"], r"validate\.extra_batch_sizes\[0\]=0 is not a batch size"),
    "huge-batch-size": (["model.batch_sizes=[1,1000000000]"], r"model\.batch_sizes.*1000000000"),
    "absent-device": (["device=cuda"], r"sees no cuda device"),
    "unknown-model": (["model=resnet1800"], r"unknown model 'resnet1800'; available: bert_tiny, custom, hf, mlp"),
    "wrong-type": (["profile.min_samples=many"], r"profile\.min_samples=many; Value 'many' of type 'str' could not"),
    "server-down": (["tracking=server", "tracking.uri=http://127.0.0.1:{port}"],
                    r"tracking server is unreachable.*mlflow server --backend-store-uri"),
    "run-dir-in-a-file": (["hydra.run.dir={tmp}/a-file/run"], r"Not a directory: .*a-file/run'; pick a writable run"),
    # Your own model, not importable from here: named with the two ways to make it importable, before the store.
    "unimportable-target": (["model.build._target_=my_pkg.MyModel", "tracking=sqlite",
                             "tracking.uri=sqlite:///{tmp}/unimportable-target.db"],
                            r"model\.build\._target_=my_pkg\.MyModel: no module 'my_pkg' can be imported from here; "
                            r".*PYTHONPATH=.*pip install -e"),
    # A misspelt option in every job of a sweep: every job is composed before the sweep directory or its parent run,
    # each is named, and nothing is made (a sweep whose other jobs can run runs them: tests/test_tracking.py).
    "sweep-misspelt-profile": (["-m", "model=tiny_mlp,mlp", "profile=quik,quikk", "tracking=sqlite",
                                "tracking.uri=sqlite:///{tmp}/sweep-misspelt-profile.db",
                                "hydra.sweep.dir={tmp}/sweep-misspelt-profile/run"],
                               r"sweep job 0 \(.*model=tiny_mlp profile=quik .*\): unknown profile 'quik'; "
                               r"available: default, quick, thorough; sweep job 1 \(.*profile=quikk.*\): unknown "
                               r"profile 'quikk'; .*sweep job 3 .*; no job of the sweep can run, so nothing was run"),
    "sweep-misspelt-model": (["-m", "model=resnt18,tiny_mpl", "tracking=sqlite",
                              "tracking.uri=sqlite:///{tmp}/sweep-misspelt-model.db",
                              "hydra.sweep.dir={tmp}/sweep-misspelt-model/run"],
                             r"sweep job 0 \(.*model=resnt18.*\): unknown model 'resnt18'; available: .*resnet18.*; "
                             r"sweep job 1 \(.*model=tiny_mpl.*\): unknown model 'tiny_mpl'; available: .*tiny_mlp"),
}


@pytest.fixture(scope="module")
def cli_runs(tmp_path_factory) -> Dict[str, tuple]:
    """Every CLI case run at once (they are independent): case -> (process, seconds, run directory)."""
    tmp = tmp_path_factory.mktemp("cli")
    (tmp / "a-file").write_text("")
    port = free_port()

    def run(case: str) -> tuple:
        args = [a.format(port=port, tmp=tmp) for a in CLI_CASES[case][0]]
        run_dir = tmp / case / "run"
        if not any(a.startswith("hydra.run.dir=") for a in args):
            args.append(f"hydra.run.dir={run_dir}")
        start = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "pipeline", *overrides(*args)], cwd=ROOT, env=clean_env(),
                              capture_output=True, text=True, timeout=120)
        return proc, time.monotonic() - start, run_dir

    with ThreadPoolExecutor(max_workers=4) as pool:
        return dict(zip(CLI_CASES, pool.map(run, CLI_CASES)))


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CLI_CASES))
def test_the_command_line_reports_a_mistake_in_one_line_and_exit_code_2(cli_runs, case):
    if case == "absent-device" and HAS_CUDA:
        pytest.skip("this machine has CUDA")
    proc, seconds, run_dir = cli_runs[case]
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr + proc.stdout
    assert proc.stderr.startswith("error: ") and proc.stderr.count("\n") == 1, proc.stderr
    assert re.search(CLI_CASES[case][1], proc.stderr), proc.stderr
    assert not run_dir.exists()  # failed before any stage: nothing was made
    if case == "server-down":  # MLflow's own client would retry a dead server for minutes
        assert seconds < 60, seconds


@pytest.mark.slow
@pytest.mark.parametrize("case", ["unimportable-target", "sweep-misspelt-profile", "sweep-misspelt-model"])
def test_a_mistake_found_before_the_run_leaves_no_mlflow_run(cli_runs, case):
    proc, _, run_dir = cli_runs[case]
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert not (run_dir.parents[1] / f"{case}.db").exists()  # not even the store: no run, no FAILED sweep parent


@pytest.mark.slow
@pytest.mark.parametrize("model", ["resnet18", "vit_b_16"])  # torchvision's own builder; ours, importing it to build
def test_a_torchvision_built_for_another_torch_is_named_at_start(tmp_path, model):
    """torchvision's import failing as a build for another torch fails it (its operators unregistered), before any
    work: one line naming both versions and the reinstall that pairs them."""
    fake = tmp_path / "site" / "torchvision"
    fake.mkdir(parents=True)  # ahead of site-packages on the path; the installed metadata still names its version
    (fake / "__init__.py").write_text('raise RuntimeError("operator torchvision::nms does not exist")\n')
    env = clean_env()
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(fake.parent), env.get("PYTHONPATH")]))
    args = overrides(f"model={model}", f"hydra.run.dir={tmp_path}/run")
    proc = subprocess.run([sys.executable, "-m", "pipeline", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2 and proc.stderr.startswith("error: "), proc.stderr[-3000:]
    one_line_naming(proc.stderr, r"torchvision \d\S* does not work with torch \d\S*: importing it fails "
                                 r"\(RuntimeError: operator torchvision::nms does not exist\)",
                    r"pip install --force-reinstall torch torchvision")
    assert not (tmp_path / "run").exists()


def test_a_torch_requirement_torchvision_declares_is_compared_without_the_local_build_tag():
    assert unmet_torch_requirements("2.7.1+cu126", ["torch==2.7.1", "numpy", 'torch==2.6; extra == "x"']) == []
    assert unmet_torch_requirements("2.8.0+cpu", ["torch (==2.7.1)", "pillow>=5"]) == ["torch==2.7.1"]


def test_a_target_that_cannot_be_imported_is_named_with_why(tmp_path, monkeypatch):
    package = tmp_path / "own_models"
    package.mkdir()
    (package / "__init__.py").write_text("import a_dependency_not_installed\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    one_line_naming(target_problem("own_models.Net"), r"importing own_models failed: ModuleNotFoundError: "
                                                      r"No module named 'a_dependency_not_installed'")
    one_line_naming(target_problem("pipeline.models.MPL"),
                    r"pipeline\.models has no 'MPL'; closest: pipeline\.models\.MLP")
    one_line_naming(target_problem("pipeline.models.DTYPES"), r"is a dict, not a class or function")
    assert target_problem("pipeline.models.MLP") is None and target_problem("torch.nn.Linear") is None
