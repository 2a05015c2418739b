"""Checkpoints tried as an attacker would: each crafted file (with a valid checksum, as anyone can write
one) is refused with an error naming the problem and the fix, runs nothing, and leaves the caller's
model as it was: its weights and buffers byte for byte, the same tensor objects, its device and mode.
So does every refusal found only once the backends are built: a precision the device cannot run, a
missing package, a failed export."""

from __future__ import annotations

import re
import resource
import signal
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict

import pytest
import torch

import pipeline
from pipeline.route import checkpoint
from pipeline.config import inductor_options
from pipeline.backends import create
from pipeline.route.checkpoint import CheckpointError, StateDictMismatch, UntrustedOptions
from pipeline.config.limits import MAX_BATCH_SIZE
from models_for_tests import buffered_mlp
from pipeline.route.served import RoutedModule, TuneRecord
from pipeline.route.policy import Range
from pipeline.backends.candidate import Candidate

CPU = torch.device("cpu")
HUGE = 1_000_000_000


@pytest.fixture
def ckpt(tmp_path) -> Path:
    """An honest eager checkpoint of a tiny MLP with buffers (no compile), to be edited into a crafted one."""
    model = buffered_mlp(1)
    backend = create(Candidate.of("eager", {"kind": "eager"}))
    backend.build(model, {}, CPU, [1, 2, 3])
    record = TuneRecord("tiny_mlp", model, {"x": {"shape": [16], "dtype": "float32"}}, [1, 3], CPU)
    return checkpoint.save(RoutedModule({"eager": backend}, [Range(1, None, "eager")], record), tmp_path / "m.tweak")


def craft(path: Path, edit: Callable[[Dict[str, Any]], None]) -> Path:
    """Edit the payload and write it back with a fresh, valid checksum: what an attacker would do."""
    payload = checkpoint.read(path)
    edit(payload)
    checkpoint.write(payload, path)
    return path


def route_to(payload: Dict[str, Any], name: str, cfg: Dict[str, Any]) -> None:
    payload["backends"][name] = {"name": name, **cfg}
    payload["route"] = [{"lo": 1, "hi": None, "backend": name}]


def as_bytes(t: torch.Tensor) -> bytes:
    return bytes(t.detach().cpu().reshape(-1).contiguous().view(torch.uint8).numpy())


def refused(path: Path, error: type, *patterns: str, model: torch.nn.Module = None, **load_kwargs: Any) -> str:
    """Load into a fresh model: ``error`` is raised, its message matches every pattern, and the model is as
    it was: every weight and buffer byte for byte and the same tensor object, its device and its mode."""
    model = buffered_mlp(7) if model is None else model
    before = {k: (v, v.dtype, as_bytes(v)) for k, v in model.state_dict(keep_vars=True).items()}
    mode = [m.training for m in model.modules()]
    with pytest.raises(error) as err:
        pipeline.load(path, model, **load_kwargs)
    message = str(err.value)
    for pattern in patterns:
        assert re.search(pattern, message), f"{pattern!r} not in: {message}"
    assert "\n" not in message
    after = model.state_dict(keep_vars=True)
    assert after.keys() == before.keys()
    for key, (tensor, dtype, data) in before.items():
        assert after[key] is tensor and tensor.dtype == dtype and tensor.device.type == "cpu", key
        assert as_bytes(tensor) == data, f"the caller's {key} changed before the refusal"
    assert [m.training for m in model.modules()] == mode
    return message


def compiler_that_leaves_a_marker(tmp_path: Path) -> tuple:
    """A 'compiler' that would prove it ran: it creates a marker file, then compiles with g++."""
    marker = tmp_path / "compiler-ran"
    script = tmp_path / "cxx.sh"
    script.write_text(f"#!/bin/sh\ntouch {marker}\nexec g++ \"$@\"\n")
    script.chmod(0o755)
    return script, marker


# ---- code execution -----------------------------------------------------------------------------------


def test_a_compiler_named_in_a_checkpoint_is_refused_and_runs_nothing(ckpt, tmp_path):
    script, marker = compiler_that_leaves_a_marker(tmp_path)
    craft(ckpt, lambda p: route_to(p, "inductor", {"kind": "inductor", "options": {"cpp.cxx": [None, str(script)]}}))
    refused(ckpt, UntrustedOptions, r"backend 'inductor' sets cpp\.cxx", r"trust_options=True")
    assert not marker.exists()


@pytest.mark.parametrize("option,value", [
    ("cuda.cuda_cxx", "/tmp/evil"),  # a program
    ("trace.debug_dir", "/tmp/evil"),  # a directory
    ("aot_inductor.output_path", "/tmp/evil.so"),  # a path
    ("max_autotune_gemm_backends", "ATEN"),  # free text, not a fixed choice
    ("triton.debug_dump_kernel_inputs", {"kernel": 1}),  # a container keyed by free text
], ids=["compiler", "directory", "path", "free-text", "keyed-container"])
def test_every_option_that_admits_free_text_is_refused(ckpt, option, value):
    craft(ckpt, lambda p: route_to(p, "inductor", {"kind": "inductor", "options": {option: value}}))
    refused(ckpt, UntrustedOptions, re.escape(option), "trust_options=True")


def test_the_nested_spelling_of_an_option_is_refused_too(ckpt):
    craft(ckpt, lambda p: route_to(p, "inductor", {"kind": "inductor", "options": {"cpp": {"cxx": [None, "sh"]}}}))
    refused(ckpt, UntrustedOptions, r"cpp\.cxx")


def test_the_refused_options_are_derived_from_the_types_torch_declares():
    import torch._inductor
    from torch._inductor import config

    names = sorted(torch._inductor.list_options())
    flagged = set(inductor_options.untrusted({name: None for name in names}))
    # Every option that names a program, path or directory and can hold a string is refused ...
    for name in names:
        if any(word in name for word in ("cxx", "_dir", "_path", "home", "root")) \
                and inductor_options.admits_free_text(config.get_type(name)):
            assert name in flagged
    assert {"cpp.cxx", "cuda.cuda_cxx", "trace.debug_dir", "global_cache_dir"} <= flagged
    # ... and no option of a number, a flag or a fixed choice is.
    for name in flagged:
        assert config.get_type(name) not in (bool, int, float)
    assert not {"freezing", "max_autotune", "triton.cudagraphs", "compile_threads", "cpu_backend"} & flagged


@pytest.mark.slow
def test_trust_options_is_the_explicit_opt_in(ckpt, tmp_path):
    script, marker = compiler_that_leaves_a_marker(tmp_path)
    craft(ckpt, lambda p: route_to(p, "inductor", {"kind": "inductor", "options": {"cpp.cxx": [None, str(script)]}}))
    loaded = pipeline.load(ckpt, buffered_mlp(7), trust_options=True)
    assert list(loaded.backends) == ["inductor"] and marker.exists()  # trusted: Inductor compiled with it


@pytest.mark.parametrize("options,named", [
    ({"cpp.cxx": [1, 2]}, r"cpp\.cxx=\[1, 2\] does not fit tuple\[None, str\]"),  # a tuple's elements
    ({"compile_threads": 1.5}, r"compile_threads=1\.5 does not fit int \| None"),  # an Optional
    ({"cpu_backend": "cuda"}, r"cpu_backend='cuda' is not one of"),  # a Literal
    ({"freezing": "yes"}, r"freezing='yes' is str, torch expects bool"),  # a plain type
], ids=["tuple", "optional", "literal", "plain"])
def test_option_types_are_checked_whole(ckpt, options, named):
    craft(ckpt, lambda p: route_to(p, "inductor", {"kind": "inductor", "options": options}))
    refused(ckpt, CheckpointError, named, "re-save it with pipeline.save or re-tune", trust_options=True)


# ---- resource exhaustion: refused within seconds --------------------------------------------------------


@pytest.mark.parametrize("edit,named", [
    (lambda p: p.update(max_batch_size=HUGE), r"max_batch_size=1000000000 must be the largest of batch_sizes"),
    (lambda p: p.update(batch_sizes=[1, HUGE], max_batch_size=HUGE), r"batch_sizes\[1\]=1000000000 is not a batch size"),
    (lambda p: p.update(route=[{"lo": 1, "hi": HUGE, "backend": "eager"}, {"lo": HUGE + 1, "hi": None, "backend": "eager"}]),
     r"route\[0\]\.hi=1000000000 is not a batch size"),
    (lambda p: p["inputs"]["x"].update(shape=[HUGE, HUGE]), r"the inputs alone take .* GiB .* more than the .* GiB cpu has"),
    (lambda p: route_to(p, "graph", {"kind": "graph", "grid": [1, HUGE]}), r"backend 'graph' grid\[1\]=1000000000 is not a batch size"),
], ids=["max-batch-size", "batch-sizes", "range-bound", "input-shape", "graph-grid"])
def test_numbers_beyond_the_format_are_refused_within_seconds(ckpt, edit, named):
    craft(ckpt, edit)
    start = time.monotonic()
    refused(ckpt, CheckpointError, named)
    assert time.monotonic() - start < 5


# ---- the payload's schema, checked whole before the model is touched --------------------------------------


@pytest.mark.parametrize("edit,named", [
    (lambda p: p.update(route=[{"lo": 1, "hi": None, "backend": "nope"}]),
     r"route\[0\] routes to backend 'nope', which the checkpoint does not hold \(\['eager'\]\)"),
    (lambda p: p.update(route=[{"lo": 1, "hi": 2, "backend": "eager"}, {"lo": 4, "hi": None, "backend": "eager"}]),
     r"route\[1\] starts at 4, not 3: the ranges must cover 1\.\.inf without gaps"),
    (lambda p: p.update(route=[{"lo": 1, "hi": 8, "backend": "eager"}]), r"last range of route must be open-ended"),
    (lambda p: p.update(route=[{"lo": 1, "hi": None, "backend": "eager"}, {"lo": 2, "hi": None, "backend": "eager"}]),
     r"route\[0\] is open-ended \(hi: null\) but not the last range"),
    (lambda p: route_to(p, "x", {"kind": "pickle"}), r"backend 'x': unknown kind 'pickle'; use one of"),
    (lambda p: route_to(p, "x", {"kind": "eager", "import": "os"}), r"backend 'x' \(kind eager\) sets 'import'"),
    (lambda p: route_to(p, "x", {"kind": "eager", "mode": "default"}),
     r"backend 'x' \(kind eager\) sets 'mode', which eager backends do not take \(a setting of inductor and graph"),
    (lambda p: route_to(p, "x", {"kind": "inductor", "mode": "fastest"}), r"unknown Inductor mode 'fastest'"),
    (lambda p: route_to(p, "x", {"kind": "inductor", "template": "freezing"}),
     r"names template 'freezing'; a checkpoint holds a template's resolved options"),
    (lambda p: p["inputs"]["x"].update(dtype="float8"), r"input 'x': unknown dtype 'float8'; use one of"),
    (lambda p: p["inputs"]["x"].update(fill="os.system"), r"input 'x': unknown fill 'os\.system'; use one of"),
    (lambda p: p["inputs"]["x"].update(shape="16"), r"input 'x': shape='16' must be a list"),
    (lambda p: p.update(backdoor=1), r"unknown fields \['backdoor'\]"),
    (lambda p: p.update(max_batch_size=True), r"max_batch_size is a bool, not a int"),
    (lambda p: p.update(name=["tiny"]), r"name is a list, not a str"),
    (lambda p: p.update(route=[{"lo": i, "hi": i, "backend": "eager"} for i in range(1, 4)]
                        + [{"lo": 4, "hi": None, "backend": "eager"}]),
     r"route has 4 ranges, more than its 2 tuned batch sizes can give"),
    (lambda p: p["backends"].update({f"e{i}": {"name": f"e{i}", "kind": "eager"} for i in range(64)}),
     r"65 backends, more than 64"),
    (lambda p: p.update(device={"type": "tpu", "name": "x"}), r"device=.* must be \{type: one of \['cpu', 'cuda', 'xpu'\]"),
    (lambda p: p.update(format=9), rf"format {checkpoint.FORMAT} in its header but 9 in its body"),
], ids=["unknown-backend", "route-gap", "route-closed", "route-open-early", "unknown-kind", "unknown-backend-key", "another-kinds-key",
        "unknown-mode", "template", "dtype", "fill", "shape", "unknown-field", "bool-size", "name-type",
        "too-many-ranges", "too-many-backends", "device", "format"])
def test_a_payload_outside_the_format_is_refused_before_the_model_is_touched(ckpt, edit, named):
    craft(ckpt, edit)
    refused(ckpt, CheckpointError, named)


def test_weights_of_another_dtype_or_not_tensors_are_refused(ckpt):
    craft(ckpt, lambda p: p["state_dict"].update({"a.weight": p["state_dict"]["a.weight"].double()}))
    refused(ckpt, StateDictMismatch, r"dtype mismatches \(checkpoint vs model\): a\.weight torch\.float64 vs "
                                     r"torch\.float32", "Pass a model built like the one that was tuned")
    craft(ckpt, lambda p: p["state_dict"].update({"a.weight": [1.0]}))
    refused(ckpt, CheckpointError, r"state_dict entries a\.weight are not dense CPU tensors")


def test_a_config_and_a_checkpoint_share_one_bound_on_batch_sizes(ckpt, compose_cfg):
    from pipeline.preflight.checks import check_config
    from pipeline.errors import ConfigError

    bound = rf"={MAX_BATCH_SIZE + 1} is not a batch size \(an integer from 1 to {MAX_BATCH_SIZE}\)"
    with pytest.raises(ConfigError, match=rf"model\.batch_sizes\[1\]{bound}"):
        check_config(compose_cfg(["model=tiny_mlp", "backends=[eager]", "reference=false", "tracking=off",
                                  f"model.batch_sizes=[1,{MAX_BATCH_SIZE + 1}]"]))
    craft(ckpt, lambda p: p.update(batch_sizes=[1, MAX_BATCH_SIZE + 1], max_batch_size=MAX_BATCH_SIZE + 1))
    refused(ckpt, CheckpointError, rf"batch_sizes\[1\]{bound}")


# ---- refused only once the backends are built: the caller's model is touched last --------------------------


def test_a_precision_the_device_cannot_run_is_refused_before_anything_is_built(ckpt):
    craft(ckpt, lambda p: route_to(p, "eager.tf32", {"kind": "eager", "precision": "tf32"}))
    refused(ckpt, CheckpointError, r"backend 'eager\.tf32' cannot run on cpu: tf32 changes only CUDA matmuls",
            r"nothing was loaded")


def test_a_candidate_named_for_another_precision_than_it_runs_is_refused(ckpt):
    craft(ckpt, lambda p: route_to(p, "eager.fp16", {"kind": "eager", "precision": "bf16"}))
    refused(ckpt, CheckpointError, r"backend 'eager\.fp16' is named for another precision than it runs "
                                   r"\(precision=bf16, cast_weights=False: it would be 'eager\.bf16'\)")


def test_a_backend_whose_package_is_missing_is_refused(ckpt, monkeypatch):
    craft(ckpt, lambda p: route_to(p, "onnxruntime", {"kind": "onnxruntime"}))
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # what Python does for a package that is not installed
    refused(ckpt, CheckpointError, r"backend 'onnxruntime' cannot run on cpu: onnxruntime cannot be imported",
            r"pip install -e '\.\[onnxruntime\]'")


def test_a_backend_that_fails_to_build_leaves_the_callers_model_as_it_was(ckpt):
    pytest.importorskip("onnxruntime")
    craft(ckpt, lambda p: route_to(p, "onnxruntime", {"kind": "onnxruntime"}))
    refused(ckpt, CheckpointError, r"backend 'onnxruntime' could not be rebuilt on cpu \(", r"your model is as it was",
            model=buffered_mlp(7, branch=True))  # its data-dependent branch fails torch.export


def test_the_loaded_model_serves_its_own_copy_and_the_callers_gets_the_weights_last(ckpt):
    model = buffered_mlp(7)
    params = {k: v for k, v in model.state_dict(keep_vars=True).items()}
    loaded = pipeline.load(ckpt, model.train())
    saved = checkpoint.read(ckpt)["state_dict"]
    assert loaded.record.model is not model and model.training  # the caller's mode stays, its weights are the file's
    for key, tensor in model.state_dict(keep_vars=True).items():
        assert tensor is params[key] and as_bytes(tensor) == as_bytes(saved[key])
    x = torch.randn(3, 16)
    before = loaded(x)
    with torch.no_grad():
        model.a.weight.zero_()  # the caller changes its own model: nothing served changes
    assert torch.equal(loaded(x), before)


# ---- writing: a failed save leaves nothing half-written ---------------------------------------------------


def test_a_full_disk_while_saving_names_the_path_and_leaves_no_partial_file(ckpt, tmp_path):
    payload = checkpoint.read(ckpt)
    target = tmp_path / "out" / "model.tweak"
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails like a full disk
    resource.setrlimit(resource.RLIMIT_FSIZE, (1024, hard))
    try:
        with pytest.raises(OSError, match=rf"could not write the checkpoint {re.escape(str(target))} .*free space"):
            checkpoint.write(payload, target)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, previous)
    assert list(target.parent.iterdir()) == []  # no model.tweak.tmp left behind
