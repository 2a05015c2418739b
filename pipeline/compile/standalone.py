"""The standalone program: a CUDA Inductor program saved ahead of time, loaded with no Dynamo trace.

Where torch 2.11's AOTInductor runtime faults on CUDA packages (``pipeline.compile.aoti``), a CUDA program is saved
in this form: its Dynamo graph (weights lifted as inputs, the batch size symbolic) compiled by
``torch._inductor.standalone_compile(aot=True)``, which bundles Inductor's Python wrapper and its kernels; a load
calls it with the recorded arguments and traces nothing, though it imports Inductor (on the H200: 6.2 s for
ResNet-50's route, 8.1 s for a 3-layer MLP's, in bench/results/load-h200.json).

With ``compile_cache.standalone``, capture uses the same form: a compile worker builds each candidate's program so
(:func:`compiled_here`), the run loads it with no trace (:func:`adopt`; where that program fails there or answers
outside the accuracy budget, capture traces the candidate instead), the profile times it, and the save keeps it
where it is the device's form (CUDA; a CPU checkpoint saves the AOTInductor package, which loads sooner).
"""

from __future__ import annotations

import base64
import tempfile
import time
import types
from pathlib import Path
from typing import Any, Callable, Dict, Mapping, Optional, Sequence

import torch
from torch import nn

from pipeline.backends import attention
from pipeline.compile import cache as compile_cache
from pipeline.compile import loads
from pipeline.compile.forms import NOT_AHEAD, InductorForm, reason
from pipeline.compile.manifest import Loaded, Package, bind, device_key, held_by, input_entries, spec_of, written
from pipeline.config import limits


def fresh_caller(module: nn.Module) -> Callable[[Dict[str, torch.Tensor]], Any]:
    """``module(**inputs)`` behind a code object of its own, so that Dynamo's capture of it at save time shares no
    cache entry or recompile budget with any other program (the isolation rule)."""
    def call(inputs: Dict[str, torch.Tensor]) -> Any:
        return module(**inputs)

    return types.FunctionType(call.__code__.replace(), call.__globals__, "saved_program", None, call.__closure__)


class Standalone(InductorForm):
    """A Dynamo graph compiled by Inductor's standalone_compile into one bundled AOTAutograd entry (Inductor's Python
    wrapper and its kernels): CUDA programs."""

    name = "standalone/1"

    def unfit(self, backend: Any) -> str:
        if not hasattr(torch._inductor, "standalone_compile"):
            return f"torch {torch.__version__} has no torch._inductor.standalone_compile"
        return super().unfit(backend)

    def build(self, backend: Any, sample: Mapping[str, torch.Tensor], largest: int, directory: Path) -> Package:
        """Capture ``backend``'s module with Dynamo at ``sample`` (the batch dimension of every input dynamic;
        weights are the graph's inputs) and compile that graph with ``torch._inductor.standalone_compile(aot=True)``
        into a file under ``directory``: what a load calls with the weights bound by name, with no Dynamo trace.
        Raises ValueError where the graph takes something other than the inputs, the weights and the batch size."""
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
        with torch.no_grad(), backend.autocast(), attention.held_around(backend.module):
            # the captured graph runs as it is (capture returns it): its outputs give the structure a load restores
            outputs = torch.compile(fresh_caller(attention.unwrapped(backend.module)), backend=capture,
                                    fullgraph=True)(inputs)
        args = []
        for arg in captured["inputs"]:
            if isinstance(arg, torch.Tensor):
                name = by_id.get(id(arg)) or next((f"input:{n}" for n in names if inputs[n] is arg), None)
                if name is None:
                    raise ValueError(f"its graph takes a tensor that is neither an input nor a weight "
                                     f"({tuple(arg.shape)})")
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
        with torch.no_grad(), backend.autocast(), attention.held_around(backend.module):
            artifact = torch._inductor.standalone_compile(captured["gm"], captured["inputs"],
                                                          dynamic_shapes="from_graph",
                                                          options={"config_patches": options}, aot=True)
        artifact.save(path=str(path), format="binary")
        manifest = {
            "format": self.name,
            "inputs": input_entries(backend, inputs),
            "largest": int(largest),
            "constants": {a: spec_of(weights[a].detach()) for a in dict.fromkeys(args) if a in weights},
            "args": args,
            "outputs": pytree.treespec_dumps(out_spec),
            "device": str(backend.device.type),
            **device_key(backend.device),
            "isa": "",
        }
        return Package(path.read_bytes(), manifest, time.perf_counter() - start, compile_cache.foreign_now() or "")

    def problem(self, manifest: Mapping[str, Any]) -> Optional[str]:
        names = {f"input:{i['name']}" for i in manifest["inputs"]}
        args = manifest.get("args")
        if not (isinstance(args, list) and all(a == "batch" or a in names or a in manifest["constants"] for a in args)):
            return "its arguments must each be the batch, an input or one of its constants"
        if not isinstance(manifest.get("outputs"), str):
            return "it must record its outputs' structure"
        return None

    def loader(self, data: bytes, manifest: Mapping[str, Any], where: Path, device: torch.device,
               single_threaded: bool) -> Callable[[nn.Module], Loaded]:
        """Inductor's own loader (``CompiledArtifact.load``, which refuses a file from another torch), called with the
        recorded arguments: inputs, bound weights, the batch.

        Loaded with Inductor's ``compile_threads`` at 1: its kernels come compiled from the file, yet with more
        threads the loader starts Inductor's compile-worker pool (a process that imports torch, then forks one worker
        per core) and loads them here anyway while the pool warms; the pool then outlived the load in every served
        process."""
        path, digest = written(data, where, ".bin")

        def program(module: nn.Module) -> Loaded:
            import torch._inductor.config as inductor_config
            import torch.utils._pytree as pytree

            bound = bind(module, manifest)
            with inductor_config.patch(compile_threads=1):
                artifact = torch._inductor.CompiledArtifact.load(path=str(loads.verified(path, digest)),
                                                                 format="binary")
            names = [i["name"] for i in manifest["inputs"]]
            args = manifest["args"]

            def run(flat: list, batch: int) -> Sequence[Any]:
                given = {f"input:{n}": t for n, t in zip(names, flat)}
                out = artifact(*[batch if a == "batch" else given[a] if a in given else bound[a] for a in args])
                return out if isinstance(out, (list, tuple)) else [out]

            return Loaded(run, manifest, bound, pytree.treespec_loads(manifest["outputs"]))

        return program


STANDALONE = Standalone()


def standalone_wanted(setting: Optional[bool], device: torch.device) -> bool:
    """Whether compile workers build standalone programs (``compile_cache.standalone``): as set, and where it is
    null, on CUDA only. There the run times, and the checkpoint saves, the very program a worker built; on the CPU
    a checkpoint saves an AOTInductor package instead, so the standalone program would be timed but not served."""
    return bool(setting) if setting is not None else torch.device(device).type == "cuda"


def standalone_unfit(backend: Any, seq: bool) -> str:
    """Why a compile worker cannot build ``backend``'s program in the standalone form for capture ("" where it can),
    known before it is built (``seq``: lengths are tuned): what the form refuses, and the programs a single
    dynamic-batch graph would not be (regional, one per length, or compiled per size)."""
    candidate = backend.candidate
    why = STANDALONE.unfit(backend)
    if why:
        return why
    if seq or candidate.per_length:
        return "lengths are tuned (its length dimension stays traced)"
    if candidate.regional:
        return "it is a regional program (its blocks are compiled once and traced)"
    if getattr(candidate.settings, "dynamic", None) is False:
        return "it compiles a program per size (dynamic: false)"
    return ""


def compiled_here(backend: Any, sample: Mapping[str, torch.Tensor], directory: Path,
                  keep: Callable[[Package], None]) -> Callable[[nn.Module], Loaded]:
    """What a compile worker sets as ``backend.prebuilt``: when the backend builds, its program compiled in the
    standalone form at ``sample`` (two rows of it: the batch is symbolic, and Dynamo specialises 1), handed to
    ``keep``, and loaded back as capture will load it, so the worker's warm-up runs the very program. Raises
    ValueError where the built backend has no such form (``pipeline.compile.forms.reason``)."""
    def program(module: nn.Module) -> Loaded:
        why = reason(STANDALONE, backend)
        if why:
            raise ValueError(f"no standalone program: {why}")
        rows = {}
        for name, t in sample.items():
            dim = backend.batch_dims.input(name)
            while t.shape[dim] < 2:
                t = torch.cat([t, t], dim)
            rows[name] = t.narrow(dim, 0, 2).to(backend.device)
        # Dynamo captures, and Inductor compiles, outside the build's mode; in a folder of this build's own (the
        # workers share ``directory``, and each writes its program under one name before reading it back)
        with torch.inference_mode(False), tempfile.TemporaryDirectory(dir=directory) as own:
            package = STANDALONE.build(backend, rows, limits.MAX_BATCH_SIZE, Path(own))
        keep(package)
        return STANDALONE.loader(package.data, package.manifest, directory, backend.device, False)(module)

    return program


def adopt(backend: Any, built: Mapping[str, Any], directory: Path) -> None:
    """In capture: load the standalone program a worker built for ``backend`` (its answer's ``standalone``: the
    bytes in base64, the manifest, the build's seconds and why it may not be signed) instead of tracing."""
    data = base64.b64decode(built["data"])
    backend.ahead = Package(data, dict(built["manifest"]), float(built["build_s"]), str(built.get("foreign", "")))
    backend.prebuilt = STANDALONE.loader(data, backend.ahead.manifest, directory, backend.device, False)


def answer_of(package: Package) -> Dict[str, Any]:
    """A worker's report of the standalone program it built (what :func:`adopt` reads)."""
    return {"data": base64.b64encode(package.data).decode("ascii"), "manifest": package.manifest,
            "build_s": round(package.build_s, 3), "foreign": package.foreign}
