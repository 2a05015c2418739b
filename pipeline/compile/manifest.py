"""What every form of a program saved ahead of time shares: its bytes and manifest, and the checks a load makes.

A program saved ahead of time (``pipeline.compile.forms``) is native code, or a runtime's model, that trusts what it
is called with: the shapes, strides and dtypes of its inputs and of the weights it binds, and the sizes it was built
for. Its manifest records all of that; the signed header of the artifacts file carries it (the checkpoint's copy is
only a claim: :func:`claims_problem`), every weight is checked against it before it is bound (:func:`bind`), and
every call's inputs before the program sees them (:class:`Loaded`).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, Mapping, Optional, Sequence, Tuple

import torch
from torch import nn

from pipeline.compile import loads
from pipeline.models import dtype_of

LAYOUTS = {"contiguous": torch.contiguous_format, "channels_last": torch.channels_last}


@dataclass
class Package:
    """One routed program ahead of time: its bytes, and what a load must find to use it."""

    data: bytes
    manifest: Dict[str, Any]
    build_s: float
    foreign: str = ""  # as the mega-cache's (pipeline.compile.artifacts.Recorded): why it may not be signed


def device_key(device: torch.device) -> Dict[str, str]:
    """What a program's code was compiled for, beyond the artifacts' record (torch, CUDA, CPU model and flags):
    torch's CPU capability (the vector ISA its kernels use), and the GPU's compute capability."""
    key = {"cpu_capability": str(torch.backends.cpu.get_cpu_capability())}
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        key["compute_capability"] = f"{major}.{minor}"
    return key


def spec_of(t: torch.Tensor) -> Dict[str, Any]:
    return {"shape": list(t.shape), "stride": list(t.stride()), "dtype": str(t.dtype).removeprefix("torch.")}


def spec_ok(spec: Any) -> bool:
    dims = lambda v: isinstance(v, list) and all(isinstance(x, int) and not isinstance(x, bool) for x in v)  # noqa: E731
    return isinstance(spec, dict) and dims(spec.get("shape")) and dims(spec.get("stride")) and \
        isinstance(spec.get("dtype"), str) and isinstance(getattr(torch, spec["dtype"], None), torch.dtype)


def held_by(module: nn.Module) -> Dict[str, torch.Tensor]:
    """Every tensor ``module`` holds by qualified name (parameters, buffers, non-persistent ones too), with the
    prefix ``inner.`` of the module a program is built from (``ByName``): the very objects (Dynamo hands them to its
    backend as graph inputs)."""
    named = {**dict(module.named_parameters(remove_duplicate=False)),
             **dict(module.named_buffers(remove_duplicate=False))}
    return {f"inner.{k}": v for k, v in named.items()}


def constants_of(module: nn.Module) -> Dict[str, torch.Tensor]:
    """:func:`held_by`, detached: what a program's constants are bound from."""
    return {k: v.detach() for k, v in held_by(module).items()}


def input_entries(backend: Any, inputs: Mapping[str, torch.Tensor]) -> list:
    """The manifest's inputs: name, batch dimension, shape, strides, dtype and memory format (a channels-last
    program is called with channels-last inputs)."""
    def layout(t: torch.Tensor) -> str:
        return "channels_last" if t.dim() == 4 and not t.is_contiguous() and \
            t.is_contiguous(memory_format=torch.channels_last) else "contiguous"

    return [{"name": n, "batch_dim": backend.batch_dims.input(n), "layout": layout(t), **spec_of(t)}
            for n, t in inputs.items()]


def common_problem(manifest: Any, formats: Sequence[str]) -> Optional[str]:
    """Why a manifest (from a checkpoint or an artifacts file, so anyone's) is not one any form allows, or None: what
    every form records (its own records are its form's to check)."""
    if not isinstance(manifest, dict) or manifest.get("format") not in formats:
        return f"an ahead-of-time program must be of a format in {list(formats)}"
    inputs, constants = manifest.get("inputs"), manifest.get("constants")
    if not (isinstance(inputs, list) and inputs and all(isinstance(i, dict) and isinstance(i.get("name"), str)
                                                        and spec_ok(i) and isinstance(i.get("batch_dim"), int)
                                                        for i in inputs)):
        return "its inputs must list names, shapes, strides, dtypes and batch dimensions"
    if not (isinstance(constants, dict) and all(isinstance(k, str) and spec_ok(v) for k, v in constants.items())):
        return "its constants must map names to shapes, strides and dtypes"
    if not (isinstance(manifest.get("largest"), int) and not isinstance(manifest["largest"], bool)
            and 1 <= manifest["largest"] <= 1 << 20):
        return "its largest batch size must be an integer from 1 to 2**20"
    if not all(isinstance(manifest.get(k), str) for k in ("device", "cpu_capability", "isa")):
        return "it must name its device, CPU capability and ISA"
    if any(i.get("layout", "contiguous") not in LAYOUTS for i in inputs):
        return f"its inputs' layouts must be in {list(LAYOUTS)}"
    return None


def mismatch(manifest: Mapping[str, Any], device: torch.device) -> str:
    """Why this machine is not the one the program was compiled for ("" where it is): no probe, a comparison."""
    here = device_key(device)
    if manifest["device"] != device.type:
        return f"it was compiled for {manifest['device']}, not {device.type}"
    differ = [f"{k} {manifest.get(k)!r} (here {v!r})" for k, v in here.items() if manifest.get(k) != v]
    return "it was compiled for " + ", ".join(differ) if differ else ""


def claims_problem(signed: Mapping[str, Any], claimed: Mapping[str, Any], inputs: Mapping[str, Mapping[str, Any]],
                   largest: int) -> str:
    """Why a checkpoint's claims about a program differ from what its signed manifest records ("" where they do not):
    the program's manifest as the checkpoint keeps it (``claimed``), and the inputs (names, per-sample shapes,
    dtypes, batch dimensions) and the largest batch size the checkpoint serves. The checkpoint is anyone's to edit;
    the native program reads past its buffers when called with inputs it was not built for."""
    if dict(claimed) != dict(signed):
        differ = sorted(k for k in {*signed, *claimed} if signed.get(k) != claimed.get(k))
        return f"the checkpoint's record of it differs from the signed one in {', '.join(differ)}"
    built = {i["name"]: i for i in signed["inputs"]}
    if sorted(built) != sorted(inputs):
        return f"the checkpoint names inputs {sorted(inputs)}, the program was built for {sorted(built)}"
    for name, spec in inputs.items():
        entry, dim = built[name], built[name]["batch_dim"]
        per_sample = [n for i, n in enumerate(entry["shape"]) if i != dim]
        said = (list(spec["shape"]), int(spec.get("batch_dim", 0)), str(dtype_of(spec["dtype"])).removeprefix("torch."))
        if said != (per_sample, dim, entry["dtype"]):
            return (f"input {name!r}: the checkpoint claims per-sample shape {said[0]}, batch dimension {said[1]}, "
                    f"{said[2]}; the program was built for {per_sample}, {dim}, {entry['dtype']}")
    if largest > signed["largest"]:
        return f"the checkpoint serves batch sizes up to {largest}; the program was built for 1 to {signed['largest']}"
    return ""


class Loaded:
    """A loaded program, called as the backend's module is (``program(**inputs)``): each call's inputs are checked
    against the program's (the generated code reads out of bounds otherwise), laid out as it was compiled for, and
    handed to ``run`` as flat leaves with the batch size; ``out_spec`` gives its outputs their structure back."""

    def __init__(self, run: Callable[[list, int], Sequence[Any]], manifest: Mapping[str, Any],
                 bound: Dict[str, torch.Tensor], out_spec: Any) -> None:
        import torch.utils._pytree as pytree

        self.run, self.bound = run, bound  # the bound weights stay alive as long as the program
        self.inputs = [(i["name"], i["batch_dim"], tuple(i["shape"]), getattr(torch, i["dtype"]),
                        LAYOUTS[i.get("layout", "contiguous")]) for i in manifest["inputs"]]
        self.largest = int(manifest["largest"])
        self.out_spec, self.unflatten = out_spec, pytree.tree_unflatten

    def __call__(self, **inputs: torch.Tensor) -> Any:
        flat, batch = [], 0
        for name, dim, shape, dtype, layout in self.inputs:
            t = inputs[name]
            batch = t.shape[dim] if t.dim() == len(shape) else -1
            if (t.dtype != dtype or t.dim() != len(shape) or not 1 <= batch <= self.largest
                    or any(a != b for i, (a, b) in enumerate(zip(t.shape, shape)) if i != dim)):
                raise ValueError(f"input {name!r}: {tuple(t.shape)} {t.dtype}, the program takes batch 1 to "
                                 f"{self.largest} of {shape} {dtype} along dimension {dim}")
            flat.append(t if t.is_contiguous(memory_format=layout) else t.contiguous(memory_format=layout))
        return self.unflatten(list(self.run(flat, batch)), self.out_spec)


def bind(module: nn.Module, manifest: Mapping[str, Any]) -> Dict[str, torch.Tensor]:
    """The module's own tensors the program was compiled against, each checked against what the build recorded
    (the generated code trusts their shapes, strides and dtypes); ValueError names the first that differs."""
    held = constants_of(module)
    want = manifest["constants"]
    missing = sorted(set(want) - set(held))
    if missing:
        raise ValueError(f"the program binds weights the model lacks: {missing[:3]}")
    bound = {}
    for fqn, spec in want.items():
        t = held[fqn]
        if spec_of(t) != dict(spec):
            t = t.contiguous() if spec["stride"] == list(torch.empty(spec["shape"], device="meta").stride()) else t
            if spec_of(t) != dict(spec):
                raise ValueError(f"weight {fqn!r} is {spec_of(held[fqn])}, the program was compiled for {spec}")
        bound[fqn] = t
    return bound


def written(data: bytes, where: Path, suffix: str) -> Tuple[Path, str]:
    """``data`` as a new file under ``where`` that follows no link (``pipeline.compile.loads.create``), named by its
    content, and its SHA-256: loaders are made for every routed program before any is called (and several workers
    share a directory), so two programs must never share a name, as two of one byte length would. Where this process
    wrote the same program there already (two backends of one program), that file is kept once it is checked."""
    digest = hashlib.sha256(data).hexdigest()
    path = where / f"program-{digest[:32]}-{os.getpid()}{suffix}"
    try:
        loads.create(path, data)
    except FileExistsError:
        loads.verified(path, digest)
    return path, digest
