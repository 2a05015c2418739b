"""Ahead-of-time programs: a routed Inductor program saved as an AOTInductor package, loaded with no trace.

A checkpoint's mega-cache artifacts (``pipeline.compile.artifacts``) spare a load Inductor's compile, but
Dynamo still traces every program and Inductor still loads (seconds, on every replica's start). Here, at
save time and once per routed program, the backend's own module (the model as it compiles it: cast,
channels-last, under its precision's wrapper) is exported with its batch dimension dynamic and compiled
by AOTInductor into a package (a shared library and its metadata) that holds no weights; a load binds
the weights from the user's model, so the package is code and the checkpoint stays the data.

Loading constructs torch's package loader directly: ``torch._inductor.aoti_load_package`` would first
probe the CPU's vector instruction sets by compiling test programs with g++ (seconds; on torch 2.11
also one Python child per instruction set, with no timeout) and unpickle parts of the archive. The
probe's only use is a warning; what it would find is recorded at build (the package's ISA, torch's CPU
capability, and the CPU's model and flags digest the artifacts record already) and compared at load.
Nothing here imports Dynamo or Inductor at load.

The package is native code: it is used only where the artifacts file that carries it is trusted
(signed with the user's key, or ``trust_compiled=True``), after every check, and its layout is
checked before the loader sees it (a package without its library would make the loader run the
compiler command written in it). The generated code trusts shapes, dtypes and strides, so every
weight is checked against what the build recorded, and every call's inputs against the program's.

Packages are for CPU programs: on the H200 with torch 2.11, constructing torch's loader for any CUDA package
(weights in its library or not, single-threaded or not, any device index, in the building process or a fresh one)
ended the process with a segmentation fault (bench/results/raw/callP.sh), and so did constructing the container
runner directly over the package's extracted library (bench/results/raw/aot-h200-runner.log). A CUDA program is
saved instead in the ``standalone/1`` form: its Dynamo graph (weights lifted as inputs, the batch size symbolic)
compiled by ``torch._inductor.standalone_compile(aot=True)``, which bundles Inductor's Python wrapper and its
kernels; a load calls it with the recorded arguments and traces nothing, though it imports Inductor (on the H200:
6.2 s for ResNet-50's route, 8.1 s for a 3-layer MLP's, in bench/results/load-h200.json).

With ``compile_cache.standalone``, capture uses the same form: a compile worker builds each candidate's program so
(:func:`compiled_here`), the run loads it with no trace (:func:`adopt`; where that program fails there, capture
traces the candidate instead), the profile times it, and the save keeps it where it is the device's form (CUDA; a
CPU checkpoint saves the package, which loads sooner).
"""

from __future__ import annotations

import base64
import hashlib
import io
import logging
import os
import sys
import tempfile
import time
import types
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, Mapping, Optional, Sequence, Tuple

import torch
from torch import nn

from pipeline import devices
from pipeline.config import limits
from pipeline.compile import cache as compile_cache
from pipeline.compile import loads
from pipeline.models import dtype_of, make_inputs

log = logging.getLogger(__name__)

MODEL_NAME = "model"
# Every weight stays a bindable constant: none in the library, and none inlined as a literal (Inductor inlines
# small 1-D constants, such as an 8-wide bias, unless told to keep them).
INDUCTOR_CONFIGS = {"aot_inductor.package_constants_in_so": False, "always_keep_tensor_constants": True}
# Inductor options that cannot hold in a package (it records no CUDA graphs of its own: a graph backend records
# them over the loaded program); a backend setting one keeps its traced program.
NOT_AHEAD = ("triton.cudagraphs",)
FORMAT = "aoti/1"  # an AOTInductor package: CPU programs
# A Dynamo graph compiled by Inductor's standalone_compile into one bundled AOTAutograd entry (Inductor's Python
# wrapper and its kernels): CUDA programs, where torch 2.11's AOTInductor runtime faults.
STANDALONE = "standalone/1"
FORMATS = (FORMAT, STANDALONE)


def format_for(device: torch.device) -> str:
    """The ahead-of-time form of a program for ``device`` ("" where it has none)."""
    return {"cpu": FORMAT, "cuda": STANDALONE}.get(device.type, "")


class ByName(nn.Module):
    """``module`` called with one dict of inputs by name: what is exported (a backend calls ``module(**inputs)``),
    so the package takes its inputs as the flat leaves of that dict, in the recorded order."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.inner = module

    def forward(self, inputs: Dict[str, torch.Tensor]) -> Any:
        return self.inner(**inputs)


def why_not(backend: Any, form: str = "") -> str:
    """Why ``backend``'s program cannot be saved ahead of time ("" where it can), in ``form`` (its device's form
    where not given: :func:`format_for`)."""
    reason = candidate_reason(backend)
    if reason:
        return reason
    if getattr(backend, "module", None) is None:
        return "it was not built"
    form = form or format_for(backend.device)
    if not form:
        return f"programs for {backend.device.type} have no ahead-of-time form here (CPU and CUDA have)"
    return form_reason(form, bool(backend.batch_dims.seq))


def form_reason(form: str, seq: bool) -> str:
    """Why no program can be saved in ``form`` here ("" where one can; ``seq``: lengths are tuned)."""
    if form == STANDALONE and not hasattr(torch._inductor, "standalone_compile"):
        return f"torch {torch.__version__} has no torch._inductor.standalone_compile"
    if seq:
        return "lengths are tuned (its length dimension stays traced)"
    return ""


def candidate_reason(backend: Any) -> str:
    """What keeps ``backend``'s program from any ahead-of-time form, known before it is built ("" where nothing)."""
    candidate = backend.candidate
    if not candidate.compiles:
        return "it compiles nothing"
    if candidate.quantizes:
        return f"{candidate.precision} weights are tensor subclasses a package cannot bind"
    held = [key for key in NOT_AHEAD if backend.inductor_options().get(key)]
    return f"its Inductor setting {held[0]} has no ahead-of-time form" if held else ""


@dataclass
class Package:
    """One routed program ahead of time: the package's bytes, and what a load must find to use it."""

    data: bytes
    manifest: Dict[str, Any]
    build_s: float
    foreign: str = ""  # as the mega-cache's (pipeline.compile.artifacts.Recorded): why it may not be signed


def device_key(device: torch.device) -> Dict[str, str]:
    """What the package's code was compiled for, beyond the artifacts' record (torch, CUDA, CPU model and flags):
    torch's CPU capability (the vector ISA its kernels use), and the GPU's compute capability."""
    key = {"cpu_capability": str(torch.backends.cpu.get_cpu_capability())}
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        key["compute_capability"] = f"{major}.{minor}"
    return key


def _spec(t: torch.Tensor) -> Dict[str, Any]:
    return {"shape": list(t.shape), "stride": list(t.stride()), "dtype": str(t.dtype).removeprefix("torch.")}


def held_by(module: nn.Module) -> Dict[str, torch.Tensor]:
    """Every tensor ``module`` holds by qualified name (parameters, buffers, non-persistent ones too), with
    :class:`ByName`'s prefix: the very objects (Dynamo hands them to its backend as graph inputs)."""
    named = {**dict(module.named_parameters(remove_duplicate=False)),
             **dict(module.named_buffers(remove_duplicate=False))}
    return {f"inner.{k}": v for k, v in named.items()}


def constants_of(module: nn.Module) -> Dict[str, torch.Tensor]:
    """:func:`held_by`, detached: what a program's constants are bound from."""
    return {k: v.detach() for k, v in held_by(module).items()}


def build(backend: Any, sample: Mapping[str, torch.Tensor], largest: int, directory: Path) -> Package:
    """``backend``'s program ahead of time, in its device's form (:func:`format_for`)."""
    form = build_package if format_for(backend.device) == FORMAT else build_standalone
    return form(backend, sample, largest, directory)


def input_entries(backend: Any, inputs: Mapping[str, torch.Tensor]) -> list:
    """The manifest's inputs: name, batch dimension, shape, strides, dtype and memory format (a channels-last
    program is called with channels-last inputs)."""
    def layout(t: torch.Tensor) -> str:
        return "channels_last" if t.dim() == 4 and not t.is_contiguous() and \
            t.is_contiguous(memory_format=torch.channels_last) else "contiguous"

    return [{"name": n, "batch_dim": backend.batch_dims.input(n), "layout": layout(t), **_spec(t)}
            for n, t in inputs.items()]


def fresh_caller(module: nn.Module) -> Callable[[Dict[str, torch.Tensor]], Any]:
    """``module(**inputs)`` behind a code object of its own, so that Dynamo's capture of it at save time shares no
    cache entry or recompile budget with any other program (the isolation rule)."""
    def call(inputs: Dict[str, torch.Tensor]) -> Any:
        return module(**inputs)

    return types.FunctionType(call.__code__.replace(), call.__globals__, "saved_program", None, call.__closure__)


def build_standalone(backend: Any, sample: Mapping[str, torch.Tensor], largest: int, directory: Path) -> Package:
    """Capture ``backend``'s module with Dynamo at ``sample`` (the batch dimension of every input dynamic; weights
    are the graph's inputs) and compile that graph with ``torch._inductor.standalone_compile(aot=True)`` into a
    file under ``directory``: what a load calls with the weights bound by name, with no Dynamo trace. Raises
    ValueError where the graph takes something other than the inputs, the weights and the batch size."""
    import torch.utils._pytree as pytree

    start = time.perf_counter()
    names = sorted(sample)
    inputs = {n: sample[n].clone(memory_format=torch.preserve_format) for n in names}
    for n in names:
        torch._dynamo.mark_dynamic(inputs[n], backend.batch_dims.input(n))
    batch = int(inputs[names[0]].shape[backend.batch_dims.input(names[0])])
    captured: Dict[str, Any] = {}

    def capture(gm: Any, example_inputs: Sequence[Any]) -> Callable[..., Any]:
        captured["gm"], captured["inputs"] = gm, list(example_inputs)
        return gm.forward

    weights = held_by(backend.module)
    by_id = {id(t): fqn for fqn, t in weights.items()}
    with torch.no_grad(), backend.autocast():
        # the captured graph runs as it is (capture returns it): its outputs give the structure a load restores
        outputs = torch.compile(fresh_caller(backend.module), backend=capture, fullgraph=True)(inputs)
    args = []
    for arg in captured["inputs"]:
        if isinstance(arg, torch.Tensor):
            name = by_id.get(id(arg)) or next((f"input:{n}" for n in names if inputs[n] is arg), None)
            if name is None:
                raise ValueError(f"its graph takes a tensor that is neither an input nor a weight ({tuple(arg.shape)})")
            args.append(name)
        else:
            hint = arg.node.hint if isinstance(arg, torch.SymInt) else arg
            if hint != batch:
                raise ValueError(f"its graph takes a size other than the batch ({arg})")
            args.append("batch")
    leaves, out_spec = pytree.tree_flatten(outputs)
    graph_outputs = next(n for n in captured["gm"].graph.nodes if n.op == "output").args[0]
    if len(leaves) != len(graph_outputs):
        raise ValueError(f"its graph returns {len(graph_outputs)} values for {len(leaves)} output leaves")
    options = {k: v for k, v in backend.inductor_options().items() if k not in NOT_AHEAD}
    path = directory / "program.bin"
    with torch.no_grad(), backend.autocast():
        artifact = torch._inductor.standalone_compile(captured["gm"], captured["inputs"], dynamic_shapes="from_graph",
                                                      options={"config_patches": options}, aot=True)
    artifact.save(path=str(path), format="binary")
    manifest = {
        "format": STANDALONE,
        "inputs": input_entries(backend, inputs),
        "largest": int(largest),
        "constants": {a: _spec(weights[a].detach()) for a in dict.fromkeys(args) if a in weights},
        "args": args,
        "outputs": pytree.treespec_dumps(out_spec),
        "device": str(backend.device.type),
        **device_key(backend.device),
        "isa": "",
    }
    return Package(path.read_bytes(), manifest, time.perf_counter() - start, compile_cache.foreign_now() or "")


def standalone_wanted(setting: Optional[bool], device: torch.device) -> bool:
    """Whether compile workers build standalone programs (``compile_cache.standalone``): as set, and where it is
    null, on CUDA only. There the run times, and the checkpoint saves, the very program a worker built; on the CPU
    a checkpoint saves an AOTInductor package instead, so the standalone program would be timed but not served."""
    return bool(setting) if setting is not None else torch.device(device).type == "cuda"


def standalone_unfit(backend: Any, seq: bool) -> str:
    """Why a compile worker cannot build ``backend``'s program in the :data:`STANDALONE` form for capture ("" where
    it can), known before it is built (``seq``: lengths are tuned): what :func:`why_not` refuses, and the programs
    a single dynamic-batch graph would not be (regional, one per length, or compiled per size)."""
    candidate = backend.candidate
    reason = candidate_reason(backend) or form_reason(STANDALONE, seq or bool(candidate.per_length))
    if reason:
        return reason
    if candidate.regional:
        return "it is a regional program (its blocks are compiled once and traced)"
    if getattr(candidate.settings, "dynamic", None) is False:
        return "it compiles a program per size (dynamic: false)"
    return ""


def compiled_here(backend: Any, sample: Mapping[str, torch.Tensor], directory: Path,
                  keep: Callable[[Package], None]) -> Callable[[nn.Module], Loaded]:
    """What a compile worker sets as ``backend.prebuilt``: when the backend builds, its program compiled in the
    :data:`STANDALONE` form at ``sample`` (two rows of it: the batch is symbolic, and Dynamo specialises 1), handed
    to ``keep``, and loaded back as capture will load it, so the worker's warm-up runs the very program. Raises
    ValueError where the built backend has no such form (:func:`why_not`)."""
    def program(module: nn.Module) -> Loaded:
        reason = why_not(backend, STANDALONE)
        if reason:
            raise ValueError(f"no standalone program: {reason}")
        rows = {}
        for name, t in sample.items():
            dim = backend.batch_dims.input(name)
            while t.shape[dim] < 2:
                t = torch.cat([t, t], dim)
            rows[name] = t.narrow(dim, 0, 2).to(backend.device)
        # Dynamo captures, and Inductor compiles, outside the build's mode; in a folder of this build's own (the
        # workers share ``directory``, and each writes its program under one name before reading it back)
        with torch.inference_mode(False), tempfile.TemporaryDirectory(dir=directory) as own:
            package = build_standalone(backend, rows, limits.MAX_BATCH_SIZE, Path(own))
        keep(package)
        return standalone_loader(package.data, package.manifest, directory)(module)

    return program


def adopt(backend: Any, built: Mapping[str, Any], directory: Path) -> None:
    """In capture: load the standalone program a worker built for ``backend`` (its answer's ``standalone``: the
    bytes in base64, the manifest, the build's seconds and why it may not be signed) instead of tracing."""
    data = base64.b64decode(built["data"])
    backend.ahead = Package(data, dict(built["manifest"]), float(built["build_s"]), str(built.get("foreign", "")))
    backend.prebuilt = standalone_loader(data, backend.ahead.manifest, directory)


def answer_of(package: Package) -> Dict[str, Any]:
    """A worker's report of the standalone program it built (what :func:`adopt` reads)."""
    return {"data": base64.b64encode(package.data).decode("ascii"), "manifest": package.manifest,
            "build_s": round(package.build_s, 3), "foreign": package.foreign}


def build_package(backend: Any, sample: Mapping[str, torch.Tensor], largest: int, directory: Path) -> Package:
    """Export ``backend``'s module at ``sample`` (the batch dimension of every input dynamic, 1 to ``largest``) and
    compile it into an AOTInductor package under ``directory``; raises what export or Inductor raise."""
    from torch.export import Dim

    start = time.perf_counter()
    names = sorted(sample)
    inputs = {n: sample[n] for n in names}
    batch = Dim("batch", min=1, max=max(2, int(largest)))
    dims = ({n: {backend.batch_dims.input(n): batch} for n in names},)
    module = ByName(backend.module).eval()
    options = {k: v for k, v in backend.inductor_options().items() if k not in NOT_AHEAD}
    path = directory / "program.pt2"
    # Its numerics (TF32) hold while Inductor picks kernels; AOTInductor writes its package's metadata into the
    # process-wide aot_inductor.metadata dict, so it gets a fresh one, and the user's process keeps its own.
    with torch.no_grad(), backend.autocast(), torch._inductor.config.patch({"aot_inductor.metadata": {}}):
        exported = torch.export.export(module, (inputs,), dynamic_shapes=dims)
        torch._inductor.aoti_compile_and_package(exported, package_path=str(path),
                                                 inductor_configs={**options, **INDUCTOR_CONFIGS})
    signature, held = exported.graph_signature, constants_of(backend.module)
    bound = [*signature.parameters, *signature.buffers, *signature.lifted_tensor_constants]  # what a load binds
    metadata = torch._C._aoti.AOTIModelPackageLoader.load_metadata_from_package(str(path), MODEL_NAME)
    manifest = {
        "format": FORMAT,
        "inputs": input_entries(backend, inputs),
        "largest": int(largest),
        "constants": {fqn: _spec(held[fqn]) for fqn in bound},
        "device": str(backend.device.type),
        **device_key(backend.device),
        "isa": str(metadata.get("AOTI_CPU_ISA", "")),
    }
    return Package(path.read_bytes(), manifest, time.perf_counter() - start, compile_cache.foreign_now() or "")


def manifest_problem(manifest: Any) -> Optional[str]:
    """Why a package's manifest (from a checkpoint, so anyone's) is not one this format allows, or None."""
    if not isinstance(manifest, dict) or manifest.get("format") not in FORMATS:
        return f"an ahead-of-time program must be of a format in {list(FORMATS)}"
    inputs, constants = manifest.get("inputs"), manifest.get("constants")
    if not (isinstance(inputs, list) and inputs and all(isinstance(i, dict) and isinstance(i.get("name"), str)
                                                        and _spec_ok(i) and isinstance(i.get("batch_dim"), int)
                                                        for i in inputs)):
        return "its inputs must list names, shapes, strides, dtypes and batch dimensions"
    if not (isinstance(constants, dict) and all(isinstance(k, str) and _spec_ok(v) for k, v in constants.items())):
        return "its constants must map names to shapes, strides and dtypes"
    if not (isinstance(manifest.get("largest"), int) and not isinstance(manifest["largest"], bool)
            and 1 <= manifest["largest"] <= 1 << 20):
        return "its largest batch size must be an integer from 1 to 2**20"
    if not all(isinstance(manifest.get(k), str) for k in ("device", "cpu_capability", "isa")):
        return "it must name its device, CPU capability and ISA"
    if any(i.get("layout", "contiguous") not in LAYOUTS for i in inputs):
        return f"its inputs' layouts must be in {list(LAYOUTS)}"
    if manifest["format"] == STANDALONE:
        names = {f"input:{i['name']}" for i in inputs}
        args = manifest.get("args")
        if not (isinstance(args, list) and all(a == "batch" or a in names or a in constants for a in args)):
            return "its arguments must each be the batch, an input or one of its constants"
        if not isinstance(manifest.get("outputs"), str):
            return "it must record its outputs' structure"
    return None


def _spec_ok(spec: Any) -> bool:
    dims = lambda v: isinstance(v, list) and all(isinstance(x, int) and not isinstance(x, bool) for x in v)  # noqa: E731
    return isinstance(spec, dict) and dims(spec.get("shape")) and dims(spec.get("stride")) and \
        isinstance(spec.get("dtype"), str) and isinstance(getattr(torch, spec["dtype"], None), torch.dtype)


def mismatch(manifest: Mapping[str, Any], device: torch.device) -> str:
    """Why this machine is not the one the package was compiled for ("" where it is): no probe, a comparison."""
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


def check_layout(data: bytes) -> None:
    """The package's layout, before the loader sees it: exactly one library and no compiler flags (without its
    library the loader runs the compiler command a package names), no path that climbs out; ValueError else."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            names = archive.namelist()
    except (zipfile.BadZipFile, EOFError) as exc:
        raise ValueError(f"its package is damaged: not a whole zip archive ({exc})") from None
    climbing = [n for n in names if n.startswith("/") or ".." in n.split("/") or "\\" in n]
    libraries = [n for n in names if n.endswith(".so")]
    flags = [n for n in names if n.endswith(("_compile_flags.json", "_linker_flags.json"))]
    if climbing or flags or len(libraries) != 1 or f"/data/aotinductor/{MODEL_NAME}/" not in "/" + libraries[0]:
        raise ValueError(f"its package is not one tweakpipe builds (libraries {libraries[:3]}, compiler flags "
                         f"{flags[:3]}, paths out of it {climbing[:3]})")


LAYOUTS = {"contiguous": torch.contiguous_format, "channels_last": torch.channels_last}


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
        if _spec(t) != dict(spec):
            t = t.contiguous() if spec["stride"] == list(torch.empty(spec["shape"], device="meta").stride()) else t
            if _spec(t) != dict(spec):
                raise ValueError(f"weight {fqn!r} is {_spec(held[fqn])}, the program was compiled for {spec}")
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


def loader_for(data: bytes, manifest: Mapping[str, Any], where: Path, device: torch.device,
               single_threaded: bool) -> Callable[[nn.Module], Loaded]:
    """What builds the backend's program from its module at load: the program written under ``where`` (the load's
    own cache), loaded directly (no probe, no compile), its weights bound from the module after every check.
    ``single_threaded``: a graph backend records device graphs over it, which AOTInductor's threaded runner
    forbids."""
    if manifest["format"] == STANDALONE:
        return standalone_loader(data, manifest, where)
    check_layout(data)
    path, digest = written(data, where, ".pt2")

    def program(module: nn.Module) -> Loaded:
        import torch.utils._pytree as pytree

        bound = bind(module, manifest)
        index = device.index if device.index is not None else (torch.cuda.current_device()
                                                               if device.type == "cuda" else -1)
        loader = torch._C._aoti.AOTIModelPackageLoader(str(loads.verified(path, digest)), MODEL_NAME, single_threaded,
                                                       1, index)
        fqns = set(loader.get_constant_fqns())
        if fqns != set(manifest["constants"]):
            raise ValueError(f"the program's weights {sorted(fqns)[:3]} are not the ones it records")
        loader.load_constants(bound, False, True, True)  # the model's own tensors, checked above: no copy
        return Loaded(lambda flat, batch: loader.boxed_run(flat), manifest, bound,
                      pytree.treespec_loads(loader.get_call_spec()[1]))

    return program


def standalone_loader(data: bytes, manifest: Mapping[str, Any], where: Path) -> Callable[[nn.Module], Loaded]:
    """:func:`loader_for` of a :data:`STANDALONE` program: Inductor's own loader (``CompiledArtifact.load``, which
    refuses a file from another torch), called with the recorded arguments: inputs, bound weights, the batch.

    Loaded with Inductor's ``compile_threads`` at 1: its kernels come compiled from the file, yet with more threads
    the loader starts Inductor's compile-worker pool (a process that imports torch, then forks one worker per core)
    and loads them here anyway while the pool warms; the pool then outlived the load in every served process."""
    path, digest = written(data, where, ".bin")

    def program(module: nn.Module) -> Loaded:
        import torch._inductor.config as inductor_config
        import torch.utils._pytree as pytree

        bound = bind(module, manifest)
        with inductor_config.patch(compile_threads=1):
            artifact = torch._inductor.CompiledArtifact.load(path=str(loads.verified(path, digest)), format="binary")
        names = [i["name"] for i in manifest["inputs"]]
        args = manifest["args"]

        def run(flat: list, batch: int) -> Sequence[Any]:
            given = {f"input:{n}": t for n, t in zip(names, flat)}
            out = artifact(*[batch if a == "batch" else given[a] if a in given else bound[a] for a in args])
            return out if isinstance(out, (list, tuple)) else [out]

        return Loaded(run, manifest, bound, pytree.treespec_loads(manifest["outputs"]))

    return program


# Rounds of the comparison at save time, and how much slower than the traced program a package may be at a tuned
# size before the traced program is kept (a faster load never buys a slower route).
ROUNDS = 21
SLACK = 0.05


def _timed(fn: Callable[[], Any], device: torch.device, times: list) -> None:
    devices.synchronize(device)
    start = time.perf_counter()
    fn()
    devices.synchronize(device)
    times.append((time.perf_counter() - start) * 1e3)


def package_for(backend: Any, spec: Mapping[str, Any], sizes: Sequence[int], largest: int) -> Tuple[Optional[Package], Dict]:
    """``backend``'s program ahead of time, or None, and why: built, loaded here, and held to the traced program it
    replaces at each tuned size ``sizes`` it serves (``spec``: the inputs' spec): the same outputs (within its
    precision's tolerance) and no slower beyond SLACK in interleaved rounds, else the traced program stays."""
    from pipeline.measure.compare import judge

    reason = why_not(backend)
    if reason:
        return None, {"used": False, "why": reason}
    device, traced = backend.device, backend.program or backend._fn
    with scratch() as tmp:
        try:
            package = build(backend, make_inputs(spec, 2, device, 0), largest, Path(tmp))
            program = loader_for(package.data, package.manifest, Path(tmp), device, False)(backend.module)
        except Exception as exc:  # noqa: BLE001 -- export or AOTInductor cannot take it: the traced program stays
            first = (str(exc).strip().splitlines() or [""])[0][:300]
            return None, {"used": False, "why": f"it could not be built ahead of time ({type(exc).__name__}: {first})"}
        report: Dict[str, Any] = {"build_s": round(package.build_s, 3), "aot_ms": {}, "traced_ms": {}}
        with torch.inference_mode(), backend.autocast():
            for bs in sorted({1, *sizes}):  # batch 1 too: a size a dynamic program may treat apart
                inputs = make_inputs(spec, bs, device, 1)
                verdict = judge(program(**inputs), traced(**inputs), backend.candidate.compute_dtype)
                if not verdict.ok:
                    return None, {**report, "used": False, "why": f"its outputs differ at batch {bs}: {verdict.reason}"}
                if bs not in sizes:
                    continue
                times: Dict[str, list] = {"aot": [], "traced": []}
                for i in range(ROUNDS):
                    for name in (("aot", "traced") if i % 2 else ("traced", "aot")):
                        _timed(lambda: (program if name == "aot" else traced)(**inputs), device, times[name])
                for name, values in times.items():
                    report[f"{name}_ms"][bs] = round(sorted(values)[len(values) // 2], 4)
        slower = [bs for bs in sizes if report["aot_ms"][bs] > report["traced_ms"][bs] * (1 + SLACK)]
        if slower:
            return None, {**report, "used": False, "why": f"it is slower than the traced program at batch {slower}"}
        return package, {**report, "used": True, "why": ""}


def activity() -> Dict[str, int]:
    """Dynamo's frames and Inductor's cache lookups so far (zeros while neither was imported): a load that
    differs in none of them traced and compiled nothing."""
    if "torch._dynamo.utils" not in sys.modules:
        return {"frames": 0, "compiles": 0}
    from torch._dynamo.utils import counters

    return {"frames": int(counters["frames"]["total"]),
            "compiles": int(counters["inductor"]["fxgraph_cache_hit"] + counters["inductor"]["fxgraph_cache_miss"])}


def scratch() -> tempfile.TemporaryDirectory:
    """A private directory for one build's package (removed after)."""
    return tempfile.TemporaryDirectory(prefix="tweakpipe-aot-")


__all__ = ["Package", "build", "why_not", "candidate_reason", "standalone_wanted", "standalone_unfit", "compiled_here",
           "adopt", "answer_of", "written", "loader_for", "manifest_problem", "mismatch", "claims_problem", "activity",
           "scratch"]
