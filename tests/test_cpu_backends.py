"""OpenVINO and ONNX Runtime compete on the CPU like every backend: checked against eager, timed, routed and
rebuilt from a checkpoint by exporting the caller's model again. A missing package skips them, naming the
extra to install; the run's CPU threads reach eager and both runtimes, and config.yaml and MLflow record them.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List, NamedTuple

import pytest
import torch
from omegaconf import OmegaConf

import pipeline
from conftest import ROOT, TINY
from mlflow_helpers import clean_env
from models_for_tests import CellGRU, ThreadCountingMLP, sequence_first
from pipeline.api import compose_config
from pipeline.backends import create
from pipeline.backends import onnxruntime as onnxruntime_backend
from pipeline.context import RunContext
from pipeline.measure.contention import usable_cores
from pipeline.measure.compare import judge
from pipeline.models import make_inputs
from pipeline.record.tracker import dotted_params
from pipeline.route import checkpoint
from pipeline.route.policy import Range, backend_for
from pipeline.route.served import RoutedModule
from pipeline.runner import run
from pipeline.backends.candidate import Candidate

RUNTIMES = ["openvino", "onnxruntime"]
BACKENDS = "backends=[eager,openvino,onnxruntime]"


class Tuned(NamedTuple):
    ctx: RunContext
    run_dir: Path
    threads_before: int
    threads_seen: List[int]


@pytest.fixture(scope="module")
def tuned(tmp_path_factory) -> Tuned:
    """One run of every stage: the run's threads 1, ONNX Runtime's own 2."""
    folder = tmp_path_factory.mktemp("cpu_backends")
    cfg = compose_config([*TINY, "model.build._target_=models_for_tests.ThreadCountingMLP", BACKENDS,
                          "model.batch_sizes=[1,4]", "threads=1", "backends.onnxruntime.threads=2", "reference=false",
                          "profile.screen=false"])  # every runtime is timed: none screened out
    ThreadCountingMLP.seen.clear()
    before = torch.get_num_threads()
    ctx = run(cfg, folder / "run")
    return Tuned(ctx, folder / "run", before, list(ThreadCountingMLP.seen))


def test_each_runtime_is_captured_timed_routed_and_validated(tuned):
    ctx = tuned.ctx
    for name in RUNTIMES:
        outcome = ctx.outcomes[name]
        assert outcome.status == "ok", outcome.reason
        assert outcome.tensors == 2 and outcome.max_rel_error < 1e-4  # one tensor at each tuned size
    assert {name: sorted(per) for name, per in ctx.profile.items()} == {n: [1, 4] for n in ["eager", *RUNTIMES]}
    assert ctx.validation["ok"] and {r["check"] for r in ctx.validation["rows"]} == {"routed", "reloaded"}


def test_the_runs_threads_reach_every_backend_and_are_recorded(tuned):
    ctx = tuned.ctx
    assert set(tuned.threads_seen) == {1}  # eager ran every call with the run's count
    assert torch.get_num_threads() == tuned.threads_before  # and the process got its own back
    assert ctx.backends["openvino"].stats()["inference_num_threads"] == "1"  # threads: null takes the run's
    assert ctx.backends["onnxruntime"].stats()["threads"] == 2  # its own setting wins
    # its threads spin between calls only where the cores hold them and as many again (2 threads: 4 cores); a
    # spinning session made the backend timed after it 2.5x slower on 2 cores
    spins = onnxruntime_backend.spins
    assert ctx.backends["onnxruntime"].stats()["allow_spinning"] == ("1" if usable_cores() >= 4 else "0")
    assert not spins(None, usable_cores()) and spins(None, 1) == (usable_cores() >= 2)
    assert spins(True, usable_cores()) and not spins(False, 1)  # a setting is kept as written
    spinning = Candidate.of("onnxruntime", {"kind": "onnxruntime", "allow_spinning": True})
    options = onnxruntime_backend.session_options(1, "all", onnxruntime_backend.entries_of(spinning.settings, 64))
    assert options.get_session_config_entry(onnxruntime_backend.SPINNING) == "1"
    # config.yaml is the resolved config, which the tracker logs as MLflow's params (test_tracking reads them back).
    params = dotted_params(OmegaConf.to_container(OmegaConf.load(tuned.run_dir / "config.yaml")))
    assert (params["threads"], params["backends.onnxruntime.threads"], params["backends.openvino.threads"]) == \
        (1, 2, None)


def test_a_checkpoint_rebuilds_both_runtimes_from_the_weights_alone(tuned, tmp_path):
    ctx = tuned.ctx
    route = [Range(1, 1, "openvino"), Range(2, None, "onnxruntime")]
    path = pipeline.save(RoutedModule(ctx.backends, route, ctx.routed.record), tmp_path / "m.tweak")
    assert {n: c["kind"] for n, c in checkpoint.read(path)["backends"].items()} == {n: n for n in RUNTIMES}

    model = ThreadCountingMLP(width=16, depth=2).eval()  # other random weights: load puts the tuned ones in
    loaded = pipeline.load(path, model)
    assert all(loaded.backends[n] is not ctx.backends[n] for n in RUNTIMES)
    spinning = loaded.backends["onnxruntime"].stats()["allow_spinning"]
    assert spinning == ctx.backends["onnxruntime"].stats()["allow_spinning"]  # opened as it was tuned
    for bs in (1, 3, 4, 9):
        x = torch.randn(bs, 16)
        out = loaded(x)
        assert type(out) is torch.Tensor and out.device.type == "cpu"
        verdict = judge(out, model(x))
        assert verdict.ok, f"bs={bs} via {backend_for(route, bs)}: {verdict.reason}"

    payload = checkpoint.read(path)
    payload["backends"]["openvino"]["precision"] = "f64"
    checkpoint.write(payload, tmp_path / "edited.tweak")
    with pytest.raises(checkpoint.CheckpointError, match=r"backend 'openvino': precision='f64' is unknown"):
        pipeline.load(tmp_path / "edited.tweak", model)


def test_onnx_runtime_builds_without_a_warning_on_stderr(tmp_path, capfd):
    """Its graph is saved optimised (the checkpoint's artifacts, bound to this CPU), and ONNX Runtime warned about it
    in native code on every run's stderr, in colour, between the run's own lines."""
    ctx = run(compose_config([*TINY, "backends=[eager,onnxruntime]", "stages=[capture]", "reference=false"]), tmp_path)
    assert ctx.outcomes["onnxruntime"].status == "ok", ctx.outcomes["onnxruntime"].reason
    assert ctx.backends["onnxruntime"].serialized()
    err = capfd.readouterr().err
    assert "[W:onnxruntime" not in err and "Serializing optimized model" not in err, err[-2000:]


def test_a_multi_input_model_with_a_dict_output_comes_back_by_field(tmp_path):
    cfg = compose_config(["model=hf", "model.hf.model_class=BertModel", "model.hf.seq_len=16",
                          "+model.hf.config={hidden_size: 32, intermediate_size: 64, num_hidden_layers: 1, "
                          "num_attention_heads: 2, vocab_size: 100}",
                          "model.batch_sizes=[1,3]", BACKENDS, "stages=[capture]", "profile=quick", "tracking=off"])
    ctx = run(cfg, tmp_path)
    inputs = make_inputs(ctx.inputs, 5, ctx.device, seed=1)  # input_ids, a padded attention_mask, token_type_ids
    with torch.inference_mode():
        expected = ctx.model(**inputs)
    for name in RUNTIMES:
        outcome = ctx.outcomes[name]
        assert outcome.status == "ok", outcome.reason
        assert outcome.tensors == 4  # last_hidden_state and pooler_output, at each tuned size
        out = ctx.backends[name](**inputs)
        assert type(out) is type(expected) and list(out.keys()) == ["last_hidden_state", "pooler_output"]
        assert judge(out, expected).ok


def test_an_input_batched_in_its_second_dimension_keeps_its_batch_dynamic_there(tmp_path):
    model = CellGRU().eval()
    ctx = run(compose_config([*TINY, "model.build._target_=models_for_tests.CellGRU", "~model.build.width",
                              "~model.build.depth", "model.inputs.x.shape=[3,5]",
                              "model.inputs.x.batch_dim=1", BACKENDS, "model.batch_sizes=[1,4]",
                              "stages=[capture]"]), tmp_path)
    model.load_state_dict(ctx.model.state_dict())
    for name in RUNTIMES:
        assert ctx.outcomes[name].status == "ok", ctx.outcomes[name].reason
        for bs in (1, 6):
            x = sequence_first(bs)
            with torch.inference_mode():
                torch.testing.assert_close(ctx.backends[name](x=x), model(x), rtol=1e-4, atol=1e-5)


# Makes importing the runtimes fail, as on a machine without them, before the pipeline starts.
# The runtimes as a machine without them has them: an import fails, a lookup (importlib.util.find_spec, which
# Dynamo's trace rules ask of every package they know) finds a spec of no file, so asking does not raise.
BLOCKED_RUN = """
import importlib.abc, importlib.machinery, runpy, sys
class Missing(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("openvino", "onnxruntime"):
            return importlib.machinery.ModuleSpec(name, self)
    def create_module(self, spec):
        raise ModuleNotFoundError(f"No module named {spec.name!r}", name=spec.name)
    def exec_module(self, module):
        pass
sys.meta_path.insert(0, Missing())
runpy.run_module("pipeline", run_name="__main__", alter_sys=True)
"""


def test_a_missing_runtime_is_skipped_naming_the_extra_that_installs_it(tmp_path):
    proc = subprocess.run([sys.executable, "-c", BLOCKED_RUN, *TINY, BACKENDS, "stages=[capture]",
                           f"hydra.run.dir={tmp_path}"], cwd=ROOT, env={**clean_env(), "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    capture: Dict[str, Any] = json.loads((tmp_path / "capture.json").read_text())
    assert capture["eager"]["status"] == "ok"
    for name in RUNTIMES:
        assert capture[name]["status"] == "skipped"
        assert f"{name} cannot be imported" in capture[name]["reason"]
        assert f"pip install -e '.[{name}]'" in capture[name]["reason"]


def test_a_runtime_is_skipped_off_the_cpu():
    for name in RUNTIMES:
        reason = create(Candidate.of(name, {"kind": name})).unsupported_reason(torch.device("cuda"))
        assert reason and "device=cpu" in reason


def test_precision_list_reaches_openvino_and_skips_what_a_runtime_cannot_run(tmp_path):
    """bf16 of the precision list is OpenVINO's bf16 inference hint, judged by the accuracy budget;
    ONNX Runtime runs fp32 only, so its bf16 candidate is skipped with the reason, and the run goes on."""
    cfg = compose_config([*TINY, BACKENDS, "model.batch_sizes=[1,4]", "precision=[fp32,bf16]", "stages=[capture]"])
    ctx = run(cfg, tmp_path / "run")
    assert ctx.outcomes["openvino.bf16"].status == "ok", ctx.outcomes["openvino.bf16"].reason
    assert ctx.backends["openvino.bf16"].candidate.compute_dtype is torch.bfloat16
    skipped = ctx.outcomes["onnxruntime.bf16"]
    assert skipped.status == "skipped" and "runs fp32 here, not bf16" in skipped.reason
    assert ctx.outcomes["onnxruntime"].status == "ok"
    tf32 = create(Candidate.of("openvino", {"kind": "openvino", "precision": "tf32"}))
    assert "tf32" in tf32.unsupported_reason(torch.device("cpu"))


TELEMETRY = """
import json, os, sys, tempfile
from pathlib import Path
forks = []
os.register_at_fork(before=lambda: forks.append(1))  # OpenVINO's telemetry sends each event from a fork
from pipeline.api import compose_config
from pipeline.runner import run

def capture():
    run(compose_config(["model=tiny_mlp", "profile=quick", "tracking=off", "backends=[eager,openvino]",
                        "model.batch_sizes=[1,4]", "stages=[capture]"]), Path(tempfile.mkdtemp()))

capture()  # OpenVINO imported and converting for the first time in this process, no consent file: it would send
first = {"forks": len(forks), "client_id": (Path.home() / "intel").exists(), "ci": os.environ.get("CI")}
# The user opted in (OpenVINO's consent file says 1) and converted a model of their own before the tune: the telemetry
# object is configured as the converter configures it, consenting.
(Path.home() / "intel").mkdir(exist_ok=True)
(Path.home() / "intel" / "openvino_telemetry").write_text("1")
from openvino.tools.ovc.telemetry_utils import get_tid
from openvino_telemetry import Telemetry
Telemetry().init(app_name="OVC", app_version="user", tid=get_tid(), backend="ga4", enable_opt_in_dialog=False,
                 disable_in_ci=True)
before = Telemetry().consent
capture()
print(json.dumps({"first": first, "consent_before": before, "forks": len(forks), "consent_after": Telemetry().consent}))
"""


@pytest.mark.slow
def test_openvino_sends_no_telemetry_from_a_run_and_leaves_the_users_consent_as_it_was(tmp_path):
    """OpenVINO's telemetry is on unless declined: ``import openvino`` writes a client id under ~/intel and each
    event is sent from a fork of the process. A run forks nothing for it, writes no client id, and leaves the
    environment and a user's own consent (opted in, a conversion of theirs before the run) as they were."""
    pytest.importorskip("openvino")
    env = {k: v for k, v in clean_env().items() if k not in ("CI", "TF_BUILD", "JENKINS_URL")}
    proc = subprocess.run([sys.executable, "-c", TELEMETRY], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**env, "HOME": str(tmp_path), "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    said = json.loads(proc.stdout.strip().splitlines()[-1])
    assert said["first"] == {"forks": 0, "client_id": False, "ci": None}
    assert said["consent_before"] is True and said["consent_after"] is True
    assert said["forks"] == 0
