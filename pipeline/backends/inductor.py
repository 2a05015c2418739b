"""torch.compile with Inductor, set up by exactly one of mode, options or a named template.

Options reach torch only through ``torch.compile(options=...)``, which patches Inductor's config
for this model's compiles alone; the global ``torch._inductor.config`` is never touched. A
template is resolved to its options when the backend is created, and ``describe()`` stores those
options, so a checkpoint rebuilds the same backend without the config tree.

Where lengths are tuned (:mod:`pipeline.seqlen`), ``per_length`` picks between one program with the length
dynamic too, which also runs untuned lengths unpadded, and one program per tuned length (``PerLength``).
"""

from __future__ import annotations

import logging
from typing import Any, Dict, Optional

import torch
from torch import nn
from torch.utils._pytree import tree_map_only

from pipeline.config import inductor_options
from pipeline.backends import regions, rules
from pipeline.backends.base import Backend, BackendUnsupported
from pipeline.backends.candidate import Candidate
from pipeline.backends.program import PerLength, Program
from pipeline.batching import BatchDims

log = logging.getLogger(__name__)


class InductorBackend(Backend):
    kind = "inductor"

    def __init__(self, candidate: Candidate) -> None:
        super().__init__(candidate)
        self.options = rules.resolved_options(self.name, self.settings)
        self._graphs = False  # set by build: CUDA graphs recorded on this device
        self._clone = False

    def effective_options(self) -> Dict[str, Any]:
        """The options torch applies: the explicit or template options, or those the mode implies."""
        return rules.effective_options(self.settings, self.options)

    @property
    def records_cuda_graphs(self) -> bool:
        """Whether Inductor records CUDA graphs for this backend (mode or triton.cudagraphs)."""
        return bool(self.effective_options().get("triton.cudagraphs"))

    @property
    def per_length(self) -> bool:
        """One program per tuned length (``per_length: true``, where lengths are tuned)."""
        return self.candidate.per_length and bool(self.batch_dims.seq)

    @property
    def any_length(self) -> bool:
        """A program of a dynamic length serves untuned lengths unpadded; programs per length or of static shapes
        (``dynamic: false``) would compile again at each."""
        return not self.candidate.per_length and self.settings.dynamic is not False

    def program_for(self, model: nn.Module, records_cuda_graphs: bool = False) -> Any:
        """The compiled program: one :class:`Program`, or one per tuned length (:class:`PerLength`); with
        ``regional: true``, of the model's regional view (:mod:`pipeline.backends.regions`)."""
        kwargs = self.compile_kwargs()
        if self.settings.regional:
            try:
                model = regions.regional_view(model)
            except regions.NoRegions as exc:
                raise BackendUnsupported(f"regional: {exc}; the whole-model backends compile it") from None
            log.info("backend %s: regional program over %s", self.name, regions.describe(model))
        if not self.per_length:
            return Program(model, self.name, kwargs, self.device, records_cuda_graphs)
        seq = self.batch_dims.seq
        return PerLength({n: Program(model, f"{self.name}@len{n}", kwargs, self.device, records_cuda_graphs)
                          for n in seq.lengths}, seq.length)

    def mark_dynamic(self, inputs: Dict[str, torch.Tensor]) -> None:
        """With ``dynamic: null``: the batch dimension dynamic from the first compile (one program for every
        size but 1, Dynamo specialises 1), and the length too unless compiled per length."""
        if self.settings.dynamic is not None:
            return
        seq = self.batch_dims.seq
        for name, t in inputs.items():
            torch._dynamo.maybe_mark_dynamic(t, self.batch_dims.input(name))
            if name in seq.inputs and not self.per_length:
                torch._dynamo.maybe_mark_dynamic(t, seq.inputs[name])

    def unsupported_reason(self, device: torch.device) -> Optional[str]:
        numerics = super().unsupported_reason(device)
        if numerics:
            return numerics
        reason = inductor_options.unsupported_reason(self.effective_options(), device)
        if reason is None:
            return None
        if self.settings.mode:
            return f"mode={self.settings.mode} sets {reason}"
        if self.settings.template:
            return f"template {self.settings.template!r} sets {reason}"
        return f"options set {reason}"

    def compile_kwargs(self) -> Dict[str, Any]:
        """Arguments for torch.compile; options go per compile, never into global Inductor config."""
        kwargs: Dict[str, Any] = {"backend": "inductor", "fullgraph": self.settings.fullgraph,
                                  "dynamic": self.settings.dynamic}
        if self.options:
            kwargs["options"] = dict(self.options)
        elif self.settings.mode:
            kwargs["mode"] = self.settings.mode
        return kwargs

    def inductor_options(self) -> Dict[str, Any]:
        return self.effective_options()

    def _build(self, model: nn.Module, sample: Dict[str, torch.Tensor], batch_sizes: list) -> None:
        if self.prebuilt is not None:  # a program built ahead of time (a load): nothing to trace or compile
            self._fn = self.prebuilt(model)
            return
        if self.options:
            unused = inductor_options.ineffective(self.options, self.device)
            if unused:
                log.warning("backend %s: options without effect on %s: %s", self.name, self.device.type,
                            "; ".join(f"{k} ({why})" for k, why in unused.items()))
            pins = inductor_options.pinned(self.options)
            if pins:
                log.info("backend %s: %s already at Inductor's current value (kept as pins)", self.name, pins)
        self._graphs = self.records_cuda_graphs and self.device.type == "cuda"
        self._clone = self._graphs and self.settings.clone_outputs
        self.program = self._fn = self.program_for(model, self._graphs)
        seq = self.batch_dims.seq
        # the mark stays on this backend's tensors; per length, the sample cut to each length compiles its program
        samples = [seq.resized(sample, n) for n in seq.lengths] if self.per_length else [sample]
        with self.program.watched():
            for one in samples:
                one = {name: t.detach() for name, t in one.items()}
                self.mark_dynamic(one)
                self(**one)  # compile now, so build_seconds holds the compile time

    def __call__(self, **inputs: torch.Tensor) -> Any:
        if not self._graphs:
            return super().__call__(**inputs)
        # CUDA graphs: a new step per call; the next replay overwrites static outputs, so clone them.
        torch.compiler.cudagraph_mark_step_begin()
        out = super().__call__(**inputs)
        return tree_map_only(torch.Tensor, torch.clone, out) if self._clone else out

    def describe(self) -> Dict[str, Any]:
        """The config with a template replaced by its resolved options: rebuilds without conf/."""
        described = super().describe()
        if self.settings.template:
            described.update(template=None, options=dict(self.options or {}),
                             description=f"{self.settings.description} [template {self.settings.template}]".strip())
        return described
