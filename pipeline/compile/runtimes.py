"""The runtime's own model: ONNX Runtime and OpenVINO backends saved ahead of time, loaded with nothing to export.

Rebuilding one of these backends at load exports the model with ``torch.export``, translates or converts the graph
and optimises or compiles it: 4.2-5.9 s for small models on a laptop, most of it ONNX Runtime's session build. The
backend keeps what its runtime built (``serialized``: ONNX Runtime's graph as its session optimised it, OpenVINO's
compiled model as it exports it); the checkpoint carries those bytes in its signed artifacts, with the runtime's
version, the inputs and the output structure in their signed manifest, and a load opens them directly
(``pipeline.backends.onnxruntime.runner_from``, ``pipeline.backends.openvino.runner_from``).

Both runtimes' models hold the weights, as the checkpoint does: the artifacts' record binds them to the checkpoint's
weights (``pipeline.compile.artifacts.usable``), and both are native input parsed by native code, so they are used
under the artifacts' trust only (signed with the user's key, or ``trust_compiled=True``). A model saved by another
version of its runtime, or for another CPU, is not used and the backend is rebuilt.
"""

from __future__ import annotations

import time
from importlib import metadata
from pathlib import Path
from typing import Any, Callable, Dict, Mapping, Optional

import torch
from torch import nn

from pipeline.compile.forms import Form
from pipeline.compile.manifest import Package, device_key, input_entries


class Opened:
    """A runtime's model loaded back, called as the backend calls its own (inputs by name, flat to the runtime, the
    model's output structure back). Unlike a native program's (``manifest.Loaded``), a call's inputs need no check
    here: both runtimes check every call's shapes and dtypes against their graph and refuse what it was not built
    for, and a check of ours would cost tiny models more than the runtime's call."""

    def __init__(self, run: Callable[[list], list], names: list, out_spec: Any) -> None:
        import torch.utils._pytree as pytree

        self.run, self.names, self.out_spec, self.unflatten = run, names, out_spec, pytree.tree_unflatten

    def __call__(self, **inputs: torch.Tensor) -> Any:
        return self.unflatten(self.run([inputs[n].contiguous() for n in self.names]), self.out_spec)


class RuntimeForm(Form):
    """A runtime's own model (``kind``: the backend kind it serves; ``package``: the runtime's distribution)."""

    kind = ""
    package = ""
    same_program = True  # the session's optimised graph or the compiled model, as the backend built and timed it

    def unfit(self, backend: Any) -> str:
        if backend.kind != self.kind:
            return f"{self.name} holds {self.kind} models, not {backend.kind}'s"
        return ""

    def build(self, backend: Any, sample: Mapping[str, torch.Tensor], largest: int, directory: Path) -> Package:
        import torch.utils._pytree as pytree

        start = time.perf_counter()
        data = backend.serialized()
        manifest = {
            "format": self.name,
            "inputs": input_entries(backend, sample),
            "largest": int(largest),
            "constants": {},  # its weights are in the model: the artifacts' record binds them to the checkpoint's
            "outputs": pytree.treespec_dumps(backend.out_spec),
            "runtime": {self.package: metadata.version(self.package)},
            "threads": int(backend.settings.threads or 0),  # 0: torch's count in the loading process
            "properties": self.properties(backend),
            "device": "cpu",
            **device_key(torch.device("cpu")),
            "isa": "",
        }
        return Package(data, manifest, time.perf_counter() - start)

    def properties(self, backend: Any) -> Dict[str, Any]:
        """What the runtime needs at load besides the bytes (none by default)."""
        return {}

    def problem(self, manifest: Mapping[str, Any]) -> Optional[str]:
        if not isinstance(manifest.get("outputs"), str):
            return "it must record its outputs' structure"
        runtime = manifest.get("runtime")
        if not (isinstance(runtime, dict) and list(runtime) == [self.package] and isinstance(runtime[self.package], str)):
            return f"it must name the {self.package} version it was saved by"
        threads = manifest.get("threads")
        if not (isinstance(threads, int) and not isinstance(threads, bool) and 0 <= threads <= 4096):
            return "its threads must be a count from 0 (torch's) to 4096"
        if not (isinstance(manifest.get("properties"), dict)
                and all(isinstance(k, str) and isinstance(v, (str, int)) for k, v in manifest["properties"].items())):
            return "its properties must map names to strings or integers"
        return None

    def loader(self, data: bytes, manifest: Mapping[str, Any], where: Path, device: torch.device,
               single_threaded: bool) -> Callable[[nn.Module], "Opened"]:
        """The runtime's model opened from ``data`` in memory (nothing is written), checked for its runtime's
        version first; the module is not read: the model holds its weights."""
        import torch.utils._pytree as pytree

        saved, here = manifest["runtime"][self.package], metadata.version(self.package)
        if saved != here:
            raise ValueError(f"it was saved by {self.package} {saved}, and {here} is installed here")

        def program(module: nn.Module) -> Opened:
            run = self.runner(data, manifest, int(manifest["threads"]) or torch.get_num_threads())
            return Opened(run, [i["name"] for i in manifest["inputs"]], pytree.treespec_loads(manifest["outputs"]))

        return program

    def runner(self, data: bytes, manifest: Mapping[str, Any], threads: int) -> Callable[[list], list]:
        """Flat tensors in, flat tensors out, over the runtime's model in ``data``."""
        raise NotImplementedError


class OnnxModel(RuntimeForm):
    """ONNX Runtime's graph as its session optimised it."""

    name, kind, package = "onnx/1", "onnxruntime", "onnxruntime"

    def properties(self, backend: Any) -> Dict[str, Any]:
        """The session's config entries it was built with (its threads' spinning), as the session reports them."""
        return backend.entries()

    def runner(self, data: bytes, manifest: Mapping[str, Any], threads: int) -> Callable[[list], list]:
        from pipeline.backends.onnxruntime import runner_from

        return runner_from(data, [i["name"] for i in manifest["inputs"]], threads,
                           {k: str(v) for k, v in manifest["properties"].items()})


class OpenVinoModel(RuntimeForm):
    """OpenVINO's compiled model as it exports itself."""

    name, kind, package = "openvino/1", "openvino", "openvino"

    def properties(self, backend: Any) -> Dict[str, Any]:
        """The properties it was compiled with but its threads (the loading process's count stands in for 0)."""
        return {k: v for k, v in backend.properties().items() if k != "INFERENCE_NUM_THREADS"}

    def runner(self, data: bytes, manifest: Mapping[str, Any], threads: int) -> Callable[[list], list]:
        from pipeline.backends.openvino import runner_from

        return runner_from(data, {**manifest["properties"], "INFERENCE_NUM_THREADS": threads})
