"""What every backend is: built from its config for one model and device, callable like the model."""

from __future__ import annotations

import contextlib
import time
from typing import Callable, Any, ClassVar, Dict, List, Optional, Sequence

import torch
from torch import nn

from pipeline.backends import attention, precision, quantize
from pipeline.backends.candidate import Candidate
from pipeline.backends.program import Program
from pipeline.batching import BatchDims
from pipeline.measure.compare import Verdict

class BackendUnsupported(RuntimeError):
    """Raised when a backend cannot run on the chosen device: recorded as skipped, not failed."""


class Backend:
    """A way of running one model. Subclasses set ``kind`` and implement ``_build``.

    Life cycle: ``backends.create(candidate)`` checks the rules between its settings (``rules.check``, no torch
    work) and constructs it -> ``unsupported_reason(device)`` (before any work) -> ``build(model, sample,
    device, batch_sizes)`` -> ``__call__(**inputs)``. Its numerics (precision, weights, compute dtype) are its
    candidate's (:class:`~pipeline.backends.candidate.Candidate`); its settings, its kind's dataclass, are
    read as attributes.
    """

    kind: ClassVar[str] = ""

    def __init__(self, candidate: Candidate) -> None:
        self.candidate = candidate
        self.name = candidate.name
        self.settings: Any = candidate.settings  # the kind's dataclass (pipeline.config.backend_schema)
        self.device: Optional[torch.device] = None
        self.exact_sizes: List[int] = []  # set by build
        self.batch_dims = BatchDims()  # set by build
        self.build_seconds = 0.0
        self.program: Optional[Program] = None  # set by build where the backend compiles the model
        # Inductor's cache entries of its programs, as its build and checks made or loaded them (compiled artifacts
        # a checkpoint may carry beside it: pipeline.compile.artifacts.Recorded); empty where nothing compiled.
        self.artifacts: Any = b""
        # The module as the backend runs it (the model, or its reduced-precision copy), set by build: what an
        # ahead-of-time program is exported from (pipeline.compile.aot), and whose weights a loaded one binds.
        self.module: Optional[nn.Module] = None
        # Where a load hands over a program built ahead of time: module -> the callable to run instead of compiling
        # (pipeline.compile.aot.loader_for).
        self.prebuilt: Optional[Callable[[nn.Module], Any]] = None
        # The standalone program (pipeline.compile.manifest.Package) a compile worker built and ``prebuilt`` loads in
        # capture: the very program the profile times, which the save then keeps instead of compiling another.
        self.ahead: Any = None
        self._fn: Any = None

    def inductor_options(self) -> Dict[str, Any]:
        """The Inductor options its program compiles with ({} for a backend that compiles nothing)."""
        return {}

    def unsupported_reason(self, device: torch.device) -> Optional[str]:
        """Why this backend cannot run on ``device``, or None if it can. Answered before any work."""
        return self.candidate.unsupported_reason(device)

    @property
    def records_cuda_graphs(self) -> bool:
        """Whether a call replays a device graph: it cannot be captured again (profile's cross-check)."""
        return False

    @property
    def any_length(self) -> bool:
        """Where lengths are tuned: whether it runs untuned lengths as they are (unpadded), as the model does;
        backends that record or compile per tuned length serve those alone."""
        return True

    def autocast(self) -> contextlib.AbstractContextManager:
        """The numerics of a call: autocast (a backend's own ``autocast_*``), TF32 matmuls (tf32, restored
        after), or a no-op (fp32, and bf16/fp16, which the wrapped model applies itself)."""
        numerics = self.candidate
        dtype = numerics.compute_dtype
        if self.device is None or numerics.reduces_in_model:
            return contextlib.nullcontext()
        if dtype is None:
            return precision.tf32(numerics.precision == "tf32")
        return torch.autocast(device_type=self.device.type, dtype=dtype)

    def build(self, model: nn.Module, sample: Dict[str, torch.Tensor], device: torch.device,
              batch_sizes: Sequence[int], exact_sizes: Sequence[int] = (),
              batch_dims: Optional[BatchDims] = None) -> None:
        """Prepare to serve ``batch_sizes``; times the work into ``build_seconds``.

        ``exact_sizes`` (the tuned sizes among them) must be served without padding: a graph backend
        records a graph at each, besides its grid, so a call there costs what the profile measured.
        ``batch_dims`` says where the batch lies in each input and output (first, unless given).
        """
        reason = self.unsupported_reason(device)
        if reason:
            raise BackendUnsupported(reason)
        self.device = device
        self.exact_sizes = sorted({int(b) for b in exact_sizes})
        self.batch_dims = batch_dims or BatchDims()
        start = time.perf_counter()
        numerics = self.candidate
        if numerics.reduces_in_model:  # cast copies are made outside inference mode; the user's model is untouched
            with torch.no_grad():
                model = precision.ReducedPrecision(model, numerics.compute_dtype, device.type, numerics.casts_weights,
                                                   numerics.casts_weights and precision.convolves_images(model, sample),
                                                   numerics.precision if numerics.quantizes else None,
                                                   bool(self.settings.large_linears_only))
            if numerics.quantizes and not model.quantized:
                raise BackendUnsupported(quantize.nothing_quantized(numerics.precision, model.inner,
                                                                   bool(self.settings.large_linears_only)))
        if numerics.attention:
            with self.autocast():
                why = attention.problem(model, sample, numerics.attention)
            if why:
                raise BackendUnsupported(why)
            model = attention.AttentionKernel(model, numerics.attention)
        self.module = model
        with torch.inference_mode():
            self._build(model, sample, list(batch_sizes))
        self.build_seconds = time.perf_counter() - start

    def _build(self, model: nn.Module, sample: Dict[str, torch.Tensor], batch_sizes: list) -> None:
        raise NotImplementedError

    def __call__(self, **inputs: torch.Tensor) -> Any:
        with torch.inference_mode(), self.autocast():
            return self._fn(**inputs)

    def own_program(self) -> Callable[..., Any]:
        """What a program saved ahead of time replaces, and is held to (``pipeline.compile.aot.package_for``): the
        compiled program without the device graphs a graph backend records around it, where there is one, else the
        backend itself (a runtime's model)."""
        return self.program or self._fn or self

    def self_check(self, model: nn.Module, sample: Dict[str, torch.Tensor],
                   tolerance_scale: float = 1.0) -> Dict[str, Verdict]:
        """Verdicts against eager, by label, over variants that calls at the tuned sizes do not all reach
        (the graph backend: every recorded graph, full and padded); none where there are none."""
        return {}

    def watched(self) -> contextlib.AbstractContextManager:
        """Wrap calls whose compiles must be accounted to this backend (build, capture, validate, load):
        a Dynamo recompile limit hit inside raises instead of silently running eager code."""
        return self.program.watched() if self.program is not None else contextlib.nullcontext()

    def fallback_reason(self) -> Optional[str]:
        """Why this backend served other code than it names (its compiled program fell back to eager), or None."""
        return self.program.fallback_reason() if self.program is not None else None

    def compile_evidence(self) -> Dict[str, int]:
        """Dynamo graphs, graph breaks, frames and eager calls of this backend's program ({} without one)."""
        return self.program.evidence.to_dict() if self.program is not None else {}

    def stats(self) -> Dict[str, Any]:
        """Build figures beyond build_seconds (e.g. compile and record seconds, pool memory), for logs."""
        return {}

    def describe(self) -> Dict[str, Any]:
        """The config that rebuilds this backend (stored in checkpoints and logs)."""
        return {"name": self.name, **self.candidate.config()}
