"""Checkpoints: tune, save, load in a fresh process; every way a checkpoint can be wrong; threads."""

from __future__ import annotations

import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

import pipeline
from conftest import ROOT, TINY
from pipeline.route import checkpoint
from pipeline.backends import create
from pipeline.route.checkpoint import ChecksumMismatch, CheckpointError, DeviceMismatch, NotACheckpoint, StateDictMismatch
from pipeline.models import MLP, make_inputs
from pipeline.route.served import RoutedModule, TuneRecord
from pipeline.route.policy import Range, backend_for
from pipeline.backends.candidate import Candidate

# tiny_mlp tunes batch sizes 1, 3, 8: 2 and 5 are untuned (padded toward 3 and 8), 20 is above the maximum.
SIZES = [1, 2, 3, 5, 8, 20]
CPU = torch.device("cpu")


def tiny_model(seed: int) -> MLP:
    torch.manual_seed(seed)
    return MLP(width=16, depth=2)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("tune")


@pytest.fixture(scope="module")
def tuned(run_dir) -> RoutedModule:
    """The tiny MLP tuned through the Python API, Inductor serving every size."""
    return pipeline.tune(tiny_model(0), {"x": torch.randn(4, 16)}, run_dir=run_dir,
                         overrides=[*TINY, "backends=[eager,inductor]", "route=one_backend", "route.backend=inductor"])


@pytest.fixture(scope="module")
def mixed(tuned) -> RoutedModule:
    """Two backends by range: eager for 1..3, Inductor above (tuned's compiled backend: no new compile)."""
    rec = tuned.record
    eager = create(Candidate.of("eager", {"kind": "eager"}))
    eager.build(rec.model, make_inputs(rec.inputs, 3, rec.device), rec.device, [1, 2, 3])
    return RoutedModule({"eager": eager, "inductor": tuned.backends["inductor"]},
                        [Range(1, 3, "eager"), Range(4, None, "inductor")], rec)


@pytest.fixture
def eager_ckpt(tmp_path) -> Path:
    """A cheap checkpoint (eager only) for the failure cases."""
    model = tiny_model(1).eval()
    backend = create(Candidate.of("eager", {"kind": "eager"}))
    backend.build(model, {}, CPU, [1, 2, 3])
    record = TuneRecord("tiny_mlp", model, {"x": {"shape": [16], "dtype": "float32"}}, [1, 3], CPU)
    return checkpoint.save(RoutedModule({"eager": backend}, [Range(1, None, "eager")], record), tmp_path / "m.tweak")


def test_the_route_stage_saves_only_the_routed_backends(tuned, run_dir):
    payload = checkpoint.read(run_dir / "model.tweak")
    assert list(payload["backends"]) == ["inductor"]
    assert payload["backends"]["inductor"]["kind"] == "inductor"
    assert payload["route"] == [{"lo": 1, "hi": None, "backend": "inductor"}]
    assert payload["inputs"] == {"x": {"shape": [16], "dtype": "float32", "fill": "randn", "high": 2, "batch_dim": 0}}
    assert payload["output_batch_dims"] == {"output": 0}  # found by running the model at two batch sizes
    assert payload["batch_sizes"] == [1, 3, 8] and payload["max_batch_size"] == 8
    assert payload["versions"]["torch"] == str(torch.__version__) and payload["versions"]["tweakpipe"]
    assert payload["device"]["type"] == "cpu"
    assert set(payload["state_dict"]) == set(tuned.record.model.state_dict())
    assert (run_dir / "validation.json").is_file()  # validate reloaded this checkpoint and passed


LOAD_IN_FRESH_PROCESS = """
import sys, torch, pipeline
from pipeline.models import MLP
from pipeline.route.policy import backend_for
torch.manual_seed(123)  # different weights: the checkpoint's must replace them
tuned = pipeline.load(sys.argv[1], MLP(width=16, depth=2))
inputs = torch.load(sys.argv[2], weights_only=True)
outs = {bs: tuned(**x) for bs, x in inputs.items()}
torch.save({"outputs": outs, "load_seconds": tuned.load_seconds,
            "backends": {bs: backend_for(tuned.route, bs) for bs in inputs}}, sys.argv[3])
"""


@pytest.mark.slow
def test_load_in_a_fresh_process_serves_the_tuned_outputs(mixed, tmp_path):
    path = pipeline.save(mixed, tmp_path / "mixed.tweak")
    inputs = {bs: make_inputs(mixed.record.inputs, bs, CPU, seed=7) for bs in SIZES}
    torch.save(inputs, tmp_path / "inputs.pt")
    proc = subprocess.run([sys.executable, "-c", LOAD_IN_FRESH_PROCESS, str(path), str(tmp_path / "inputs.pt"),
                           str(tmp_path / "out.pt")], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = torch.load(tmp_path / "out.pt", weights_only=True)
    assert got["backends"] == {1: "eager", 2: "eager", 3: "eager", 5: "inductor", 8: "inductor", 20: "inductor"}
    assert got["load_seconds"] > 0
    with torch.inference_mode():
        for bs in SIZES:
            torch.testing.assert_close(got["outputs"][bs], mixed(**inputs[bs]), msg=f"batch size {bs}")


class Recording:
    """A backend stand-in that notes its name, then calls the real backend."""

    def __init__(self, name, backend, log):
        self.name, self.backend, self.log = name, backend, log

    def __call__(self, **inputs):
        self.log.append(self.name)
        return self.backend(**inputs)


def test_each_size_goes_to_its_ranges_backend_and_hooks_still_run(mixed):
    served, hooked = [], []
    routed = RoutedModule({n: Recording(n, b, served) for n, b in mixed.backends.items()}, mixed.route, mixed.record)
    handle = routed.register_forward_hook(lambda module, args, out: hooked.append(out.shape[0]))
    for bs in (1, 3, 4, 9):
        x = torch.randn(bs, 16)
        assert torch.allclose(routed(x), mixed.record.model(x), rtol=1e-4, atol=1e-5)  # positional input
    handle.remove()
    routed(x=torch.randn(2, 16))
    assert served == ["eager", "eager", "inductor", "inductor", "eager"]
    assert hooked == [1, 3, 4, 9]  # registered hooks run; once removed, calls skip nn.Module's dispatch


def test_a_shape_that_passed_the_checks_skips_them_and_a_bad_one_still_fails(mixed):
    served = []
    routed = RoutedModule({n: Recording(n, b, served) for n, b in mixed.backends.items()}, mixed.route, mixed.record)
    for bs in (2, 2, 9, 9):
        x = torch.randn(bs, 16)
        out = routed(x) if bs == 2 else routed(x=x)  # positional and keyword calls share the table
        assert torch.allclose(out, mixed.record.model(x), rtol=1e-4, atol=1e-5)
    assert served == ["eager", "eager", "inductor", "inductor"]
    assert set(routed._checked) == {(torch.Size([bs, 16]), torch.float32, CPU) for bs in (2, 9)}
    with pytest.raises(ValueError, match="per-sample shape"):
        routed(torch.randn(2, 15))
    with pytest.raises(TypeError, match="unknown"):
        routed(y=torch.randn(2, 16))
    assert set(routed._checked) == {(torch.Size([bs, 16]), torch.float32, CPU) for bs in (2, 9)}


def test_eight_threads_calling_one_loaded_module_agree_with_eager(mixed, tmp_path):
    model = tiny_model(5)
    loaded = pipeline.load(pipeline.save(mixed, tmp_path / "mixed.tweak"), model)
    inputs = {bs: make_inputs(loaded.record.inputs, bs, CPU, seed=3) for bs in SIZES}
    with torch.inference_mode():
        expected = {bs: model(**x) for bs, x in inputs.items()}

    def worker(i: int) -> float:
        worst = 0.0
        for j in range(30):
            bs = SIZES[(i + j) % len(SIZES)]
            out = loaded(**inputs[bs])
            worst = max(worst, (out - expected[bs]).abs().max().item())
        return worst

    with ThreadPoolExecutor(max_workers=8) as pool:
        errors = list(pool.map(worker, range(8)))
    assert max(errors) < 1e-5, errors


def test_load_reports_time_and_rebuilds_the_route(eager_ckpt):
    loaded = pipeline.load(eager_ckpt, tiny_model(2))
    assert loaded.load_seconds > 0 and list(loaded.backends) == ["eager"]
    assert loaded.backends["eager"].exact_sizes == [1, 3]  # its tuned sizes, recorded exactly by a graph backend
    assert backend_for(loaded.route, 1000) == "eager"


def flip_byte(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


def test_a_changed_byte_fails_the_checksum(eager_ckpt):
    size = eager_ckpt.stat().st_size
    flip_byte(eager_ckpt, size // 2)
    with pytest.raises(ChecksumMismatch, match="changed after it was written: its SHA-256 is"):
        pipeline.load(eager_ckpt, tiny_model(2))


def test_a_changed_recorded_checksum_or_a_truncated_file_fails_the_checksum(eager_ckpt, tmp_path):
    data = eager_ckpt.read_bytes()
    cut = tmp_path / "cut.tweak"
    cut.write_bytes(data[: len(data) - 100])
    with pytest.raises(ChecksumMismatch):
        checkpoint.read(cut)
    flip_byte(eager_ckpt, data.index(b"sha256:") + 10)
    with pytest.raises(ChecksumMismatch):
        checkpoint.read(eager_ckpt)


def test_a_state_dict_that_does_not_fit_names_the_keys(eager_ckpt):
    with pytest.raises(StateDictMismatch, match=r"missing keys: layers\.4\.weight, layers\.4\.bias"):
        pipeline.load(eager_ckpt, MLP(width=16, depth=3))
    with pytest.raises(StateDictMismatch, match=r"unexpected keys: layers\.2\.weight, layers\.2\.bias"):
        pipeline.load(eager_ckpt, MLP(width=16, depth=1))
    with pytest.raises(StateDictMismatch, match=r"shape mismatches .*layers\.0\.weight \(16, 16\) vs \(32, 32\)"):
        pipeline.load(eager_ckpt, MLP(width=32, depth=2))


def test_a_checkpoint_for_another_device_type_says_how_to_load_it(eager_ckpt):
    payload = checkpoint.read(eager_ckpt)
    payload["device"] = {"type": "cuda", "name": "NVIDIA H200"}
    checkpoint.write(payload, eager_ckpt)
    with pytest.raises(DeviceMismatch, match=r"tuned on cuda \(NVIDIA H200\), not cpu.*Pass device='cuda'"):
        pipeline.load(eager_ckpt, tiny_model(2), device="cpu")
    if not torch.cuda.is_available():
        with pytest.raises(DeviceMismatch, match="sees no cuda device.*overrides=\\['device=cpu'\\]"):
            pipeline.load(eager_ckpt, tiny_model(2))


def test_a_file_that_is_not_a_checkpoint(tmp_path):
    text = tmp_path / "notes.tweak"
    text.write_text("hello\n")
    weights = tmp_path / "weights.pt"
    torch.save(tiny_model(0).state_dict(), weights)
    empty = tmp_path / "empty.tweak"
    empty.write_bytes(b"")
    for path in (text, weights, empty):
        with pytest.raises(NotACheckpoint, match="is not a tweakpipe checkpoint"):
            pipeline.load(path, tiny_model(0))
    with pytest.raises(FileNotFoundError):
        pipeline.load(tmp_path / "absent.tweak", tiny_model(0))


class RunsCode:
    """Pickles as a call to os.system: a weights-only load must refuse it."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        import os

        return os.system, (f"touch {self.marker}",)


def test_loading_executes_nothing_even_with_a_valid_checksum(eager_ckpt, tmp_path):
    marker = tmp_path / "ran"
    payload = checkpoint.read(eager_ckpt)
    payload["name"] = RunsCode(marker)
    checkpoint.write(payload, eager_ckpt)
    with pytest.raises(CheckpointError, match="weights-only load refuses"):
        pipeline.load(eager_ckpt, tiny_model(0))
    assert not marker.exists()


def test_a_payload_missing_fields_or_of_another_format(eager_ckpt):
    payload = checkpoint.read(eager_ckpt)
    del payload["route"]
    checkpoint.write(payload, eager_ckpt)
    with pytest.raises(CheckpointError, match=r"lacks \['route'\]"):
        checkpoint.read(eager_ckpt)
    data = eager_ckpt.read_bytes()
    eager_ckpt.write_bytes(data.replace(f"TWEAKPIPE-CHECKPOINT {checkpoint.FORMAT}\n".encode(), b"TWEAKPIPE-CHECKPOINT 9\n", 1))
    with pytest.raises(CheckpointError, match="format '9'"):
        checkpoint.read(eager_ckpt)


@pytest.mark.gpu
def test_a_graph_backend_records_only_the_grid_and_tuned_sizes_in_its_ranges(tmp_path):
    device = torch.device("cuda")
    model = tiny_model(0).eval().to(device)
    eager = create(Candidate.of("eager", {"kind": "eager"}))
    eager.build(model, {}, device, [1])
    record = TuneRecord("tiny_mlp", model, {"x": {"shape": [16], "dtype": "float32"}}, [1, 3, 64], device)
    path = pipeline.save(RoutedModule({"eager": eager}, [Range(1, None, "eager")], record), tmp_path / "g.tweak")
    payload = checkpoint.read(path)
    payload["backends"]["graph"] = {"name": "graph", "kind": "graph"}
    payload["route"] = [{"lo": 1, "hi": 4, "backend": "graph"}, {"lo": 5, "hi": None, "backend": "eager"}]
    checkpoint.write(payload, path)
    loaded = pipeline.load(path, tiny_model(9))
    assert loaded.backends["graph"].stats()["recorded_sizes"] == [1, 2, 3, 4]
    for bs in (1, 3, 4, 5, 64, 65):
        x = make_inputs(record.inputs, bs, device, seed=1)
        with torch.inference_mode():
            torch.testing.assert_close(loaded(**x), loaded.record.model(**x))
