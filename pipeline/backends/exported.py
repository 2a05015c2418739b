"""What the backends that serve the model outside PyTorch share: one ``torch.export`` of it with a
dynamic batch dimension, and the way back from a runtime's flat outputs to the model's own structure.

OpenVINO and ONNX Runtime compile a graph, not a module, and both take it from ``torch.export``:
OpenVINO converts an ExportedProgram, and ONNX's dynamo exporter (``torch.onnx.export(program,
dynamo=True)``) translates one. It is the tracer torch supports on 2.11 and 2.14 alike; the
TorchScript routes (``torch.jit.trace`` under OpenVINO's module conversion, the legacy ONNX exporter
with ``dynamic_axes``) are deprecated since torch 2.9 and warn on every export. The batch dimension
is ``Dim.DYNAMIC``, and so is every length dimension where lengths are tuned (:mod:`pipeline.seqlen`): an
export fails rather than yield a graph that runs only at the traced size, and the graph runs any length.

The model is exported behind :class:`FlatModel`: inputs positional in the config's order, the output
as the flat tuple of its tensors in pytree order. A runtime's outputs therefore map back one to one,
and ``tree_unflatten`` rebuilds tuples, dicts and ModelOutputs, whose fields ``judge`` compares by
name. A checkpoint saves the runtime's own model of a routed backend (``serialized``) in its signed artifacts
(``pipeline.compile.runtimes``); a load that trusts them hands it over as ``prebuilt``, with nothing to export or
compile, and otherwise exports the caller's model again.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any, Callable, ClassVar, Dict, List, Optional, Sequence, Tuple

import torch
import torch.utils._pytree as pytree
from torch import nn

from pipeline.backends.base import Backend
from pipeline.backends.candidate import Candidate
from pipeline.batching import BatchDims
from pipeline.config.precisions import Precision


class FlatModel(nn.Module):
    """``model`` called with positional inputs named in order, returning its output's tensors as a flat tuple."""

    def __init__(self, model: nn.Module, names: Sequence[str]) -> None:
        super().__init__()
        self.model = model
        self.names = tuple(names)

    def forward(self, *inputs: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        return tuple(pytree.tree_leaves(self.model(**dict(zip(self.names, inputs)))))


def output_spec(model: nn.Module, sample: Dict[str, torch.Tensor]) -> pytree.TreeSpec:
    """The structure of the model's output (tuples, dicts, ModelOutputs), whose leaves must all be tensors."""
    leaves, spec = pytree.tree_flatten(model(**sample))
    odd = sorted({type(leaf).__name__ for leaf in leaves if not isinstance(leaf, torch.Tensor)})
    if odd:
        raise TypeError(f"the model's output holds {', '.join(odd)} besides tensors; an exported graph returns "
                        f"tensors only")
    return spec


def export(model: nn.Module, sample: Dict[str, torch.Tensor], batch_dims: BatchDims = BatchDims()
           ) -> torch.export.ExportedProgram:
    """``model`` as a graph over its inputs in ``sample``'s order, each with a dynamic batch dimension
    (where ``batch_dims`` puts it), and a dynamic length where it has one (:func:`dynamic_dims`).

    A batch of one is doubled for tracing: torch.export specialises dimensions of size 1.
    """
    dims = [batch_dims.input(name) for name in sample]
    example = tuple(t if t.shape[d] > 1 else torch.cat([t, t], dim=d) for t, d in zip(sample.values(), dims))
    dynamic = tuple({d: torch.export.Dim.DYNAMIC for d in dynamic_dims(name, batch_dims)} for name in sample)
    return torch.export.export(FlatModel(model, list(sample)), example, dynamic_shapes=(dynamic,))


def dynamic_dims(name: str, batch_dims: BatchDims) -> List[int]:
    """The dimensions of input ``name`` an exported graph leaves dynamic: its batch, and its length if it has one."""
    seq = batch_dims.seq.inputs.get(name)
    return [batch_dims.input(name)] + ([seq] if seq is not None else [])


class ExportedBackend(Backend):
    """A backend whose calls run another runtime's compiled graph of the model, on the CPU.

    Subclasses name the packages they import (``packages``), the pyproject extra that installs them
    (``extra``) and the entries of the ``precision`` list they run (``precisions``; others are skipped),
    and implement ``_compile`` (from the exported program: it sets ``runner``, flat tensors in, flat tensors
    out) and ``serialized``. A missing package skips the backend, naming the extra. Inputs and outputs are
    CPU torch tensors; the runtime's thread pool gets ``threads``, or torch's count at build time.
    """

    packages: ClassVar[Tuple[str, ...]] = ()
    # needed only to export the model, not to run a saved one: found, not imported, until an export imports them
    # (a load of a saved model never pays their import)
    export_packages: ClassVar[Tuple[str, ...]] = ()
    extra: ClassVar[str] = ""
    precisions: ClassVar[Tuple[Precision, ...]] = ("fp32",)  # the entries of the precision list the runtime can run

    def __init__(self, candidate: Candidate) -> None:
        super().__init__(candidate)
        self.threads = 0  # set by build
        self.names: List[str] = []
        self.out_spec: Optional[pytree.TreeSpec] = None
        self.loaded: Optional[Callable[..., Any]] = None  # the runtime's saved model, where a load handed it over
        self.runner: Optional[Callable[[List[torch.Tensor]], List[torch.Tensor]]] = None  # flat tensors in and out

    def unsupported_reason(self, device: torch.device) -> Optional[str]:
        if device.type != "cpu":
            return f"{self.kind} serves on the CPU here, not on {device.type}; tune it with device=cpu"
        if self.candidate.precision not in self.precisions:
            return f"{self.kind} runs {', '.join(self.precisions)} here, not {self.candidate.precision}"
        for package in self.packages:
            try:
                self.import_package(package)
            except ImportError as exc:
                return f"{package} cannot be imported ({exc}); install it with pip install -e '.[{self.extra}]'"
        for package in self.export_packages:
            if importlib.util.find_spec(package) is None:
                return f"{package} is not installed; install it with pip install -e '.[{self.extra}]'"
        return None

    def import_package(self, package: str) -> None:
        """Import one of the runtime's packages (an ImportError where it cannot be)."""
        importlib.import_module(package)

    def _build(self, model: nn.Module, sample: Dict[str, torch.Tensor], batch_sizes: list) -> None:
        self.names = list(sample)
        self.threads = self.settings.threads or torch.get_num_threads()
        if self.prebuilt is not None:  # the runtime's model saved with the checkpoint (a load): nothing to export
            self.loaded = self.prebuilt(model)
            self.runner = self.loaded.run  # the runtime's own runner, which stats() reads
            return
        self.out_spec = output_spec(model, sample)
        self._compile(export(model, sample, self.batch_dims), sample)
        returned = len(self._run([sample[n].contiguous() for n in self.names]))
        if returned != self.out_spec.num_leaves:
            raise RuntimeError(f"{self.kind} returns {returned} outputs where the model returns "
                               f"{self.out_spec.num_leaves} tensors")

    def _compile(self, program: torch.export.ExportedProgram, sample: Dict[str, torch.Tensor]) -> None:
        raise NotImplementedError

    def _run(self, inputs: List[torch.Tensor]) -> List[torch.Tensor]:
        return self.runner(inputs)

    def serialized(self) -> bytes:
        """The runtime's own model as built, in bytes a load hands back (``pipeline.compile.runtimes``)."""
        raise NotImplementedError

    def __call__(self, **inputs: torch.Tensor) -> Any:
        if self.loaded is not None:
            return self.loaded(**inputs)
        return pytree.tree_unflatten(self._run([inputs[n].contiguous() for n in self.names]), self.out_spec)
