"""The AOTInductor package: a CPU Inductor program saved ahead of time, loaded with no trace, no compile and no g++.

At save, the backend's own module (the model as it compiles it: cast, channels-last, under its precision's wrapper)
is exported with its batch dimension dynamic and compiled by AOTInductor into a package (a shared library and its
metadata) that holds no weights; a load binds the weights from the user's model, so the package is code and the
checkpoint stays the data.

Loading constructs torch's package loader directly: ``torch._inductor.aoti_load_package`` would first probe the
CPU's vector instruction sets by compiling test programs with g++ (seconds; on torch 2.11 also one Python child per
instruction set, with no timeout) and unpickle parts of the archive. The probe's only use is a warning; what it
would find is recorded at build (the package's ISA, torch's CPU capability, and the CPU's model and flags digest the
artifacts record already) and compared at load. Nothing here imports Dynamo or Inductor at load. The package's
layout is checked before the loader sees it (a package without its library would make the loader run the compiler
command written in it).

Packages are for CPU programs: on the H200 with torch 2.11, constructing torch's loader for any CUDA package
(weights in its library or not, single-threaded or not, any device index, in the building process or a fresh one)
ended the process with a segmentation fault (device call P of 2026-12-02), and so did constructing the container
runner directly over the package's extracted library: CUDA programs take the standalone form
(``pipeline.compile.standalone``).
"""

from __future__ import annotations

import io
import time
import zipfile
from pathlib import Path
from typing import Any, Callable, Dict, Mapping

import torch
from torch import nn

from pipeline.backends import attention
from pipeline.compile import cache as compile_cache
from pipeline.compile import loads
from pipeline.compile.forms import NOT_AHEAD, InductorForm
from pipeline.compile.manifest import Loaded, Package, bind, constants_of, device_key, input_entries, spec_of, written

MODEL_NAME = "model"
# Every weight stays a bindable constant: none in the library, and none inlined as a literal (Inductor inlines
# small 1-D constants, such as an 8-wide bias, unless told to keep them).
INDUCTOR_CONFIGS = {"aot_inductor.package_constants_in_so": False, "always_keep_tensor_constants": True}


class ByName(nn.Module):
    """``module`` called with one dict of inputs by name: what is exported (a backend calls ``module(**inputs)``),
    so the package takes its inputs as the flat leaves of that dict, in the recorded order."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.inner = module

    def forward(self, inputs: Dict[str, torch.Tensor]) -> Any:
        return self.inner(**inputs)


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


# Inductor settings whose CPU programs hold constants of their own: max-autotune's C++ GEMM templates pack each
# weight into a new constant (``constant4``...) at compile time, which a package holding no weights cannot bind, and
# which would go stale where the user's weights change. Refused before the build (a max-autotune package of a small
# convolution net took 172 s to build on 4 cores of the device host, then failed at its check, call BI).
PACKS_WEIGHTS = ("max_autotune", "max_autotune_gemm")


class AotiPackage(InductorForm):
    """An AOTInductor package: CPU programs."""

    name = "aoti/1"
    refused = {**InductorForm.refused, **{key: "packs the weights into constants of the program's own, which a "
                                               "package holding no weights cannot bind" for key in PACKS_WEIGHTS}}

    def build(self, backend: Any, sample: Mapping[str, torch.Tensor], largest: int, directory: Path) -> Package:
        """Export ``backend``'s module at ``sample`` (the batch dimension of every input dynamic, 1 to ``largest``)
        and compile it into an AOTInductor package under ``directory``; raises what export or Inductor raise."""
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
        with torch.no_grad(), backend.autocast(), attention.held_around(backend.module), \
                torch._inductor.config.patch({"aot_inductor.metadata": {}}):
            exported = torch.export.export(module, (inputs,), dynamic_shapes=dims)
            torch._inductor.aoti_compile_and_package(exported, package_path=str(path),
                                                     inductor_configs={**options, **INDUCTOR_CONFIGS})
        signature, held = exported.graph_signature, constants_of(backend.module)
        bound = [*signature.parameters, *signature.buffers, *signature.lifted_tensor_constants]  # what a load binds
        metadata = torch._C._aoti.AOTIModelPackageLoader.load_metadata_from_package(str(path), MODEL_NAME)
        manifest = {
            "format": self.name,
            "inputs": input_entries(backend, inputs),
            "largest": int(largest),
            "constants": {fqn: spec_of(held[fqn]) for fqn in bound},
            "device": str(backend.device.type),
            **device_key(backend.device),
            "isa": str(metadata.get("AOTI_CPU_ISA", "")),
        }
        return Package(path.read_bytes(), manifest, time.perf_counter() - start, compile_cache.foreign_now() or "")

    def loader(self, data: bytes, manifest: Mapping[str, Any], where: Path, device: torch.device,
               single_threaded: bool) -> Callable[[nn.Module], Loaded]:
        """Torch's package loader constructed directly over the package written under ``where`` (no probe, no
        compile), its weights bound from the module after every check. ``single_threaded``: AOTInductor's threaded
        runner forbids recording device graphs over it."""
        check_layout(data)
        path, digest = written(data, where, ".pt2")

        def program(module: nn.Module) -> Loaded:
            import torch.utils._pytree as pytree

            bound = bind(module, manifest)
            index = device.index if device.index is not None else (torch.cuda.current_device()
                                                                   if device.type == "cuda" else -1)
            loader = torch._C._aoti.AOTIModelPackageLoader(str(loads.verified(path, digest)), MODEL_NAME,
                                                           single_threaded, 1, index)
            fqns = set(loader.get_constant_fqns())
            if fqns != set(manifest["constants"]):
                raise ValueError(f"the program's weights {sorted(fqns)[:3]} are not the ones it records")
            loader.load_constants(bound, False, True, True)  # the model's own tensors, checked above: no copy
            return Loaded(lambda flat, batch: loader.boxed_run(flat), manifest, bound,
                          pytree.treespec_loads(loader.get_call_spec()[1]))

        return program
