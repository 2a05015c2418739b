"""A candidate: one competitor of a run, its name and its kind's typed settings, the config object that the
rooms after the checks dispatch on by type (torchao's lesson: a config is a typed object, not a dict).

A backend config becomes one when it is held to its kind's schema (:meth:`Candidate.of`,
``pipeline.config.backend_schema``): its settings are then that kind's dataclass, every key present. Each entry
of the ``precision`` list makes candidates of every backend (``pipeline.backends.precision.candidates``), once
per run; the run context holds the map, ``backends.create`` builds a backend of one, and the checkpoint stores
:meth:`Candidate.config`, which becomes a candidate again at one place, :meth:`Candidate.stored` (a checkpoint's
backends, a compile worker's jobs). What every room used to derive again from a plain dict (its precision, its weights,
whether it compiles, why a device cannot run it) is a property here.

Settings are values: a candidate is never changed, a variant is a new one (``dataclasses.replace``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional

import torch

from pipeline.backends import quantize
from pipeline.config import attention as kernels, backend_schema
from pipeline.config.attention import Kernel
from pipeline.config.backend_schema import BackendSettings, InductorSettings, TorchSettings
from pipeline.config.precisions import Precision
from pipeline.models import dtype_of

AUTOCAST: Dict[Precision, str] = {"bf16": "bfloat16", "fp16": "float16"}  # precision -> autocast dtype name
ATTENTION_SUFFIX = ".sdpa-"  # a candidate forcing an attention kernel: <candidate>.sdpa-<kernel>


@dataclass(frozen=True)
class Candidate:
    name: str
    settings: BackendSettings
    # The torch.compile mode (as the user writes it) of the user's own compile it plays (pipeline.backends.reference),
    # '' where it plays none: kept through the screen, a floor of the route, which is reported against the best of
    # them. A run's fact, not a setting: checkpoints do not store it.
    reference: str = ""

    @classmethod
    def of(cls, name: str, cfg: Mapping[str, Any]) -> "Candidate":
        """``cfg`` held to its kind's schema, defaults filled (a one-line ConfigError naming the key otherwise);
        the rules between its settings are ``rules.check``'s, asked where a backend is built."""
        return cls(name, backend_schema.settings(name, cfg))

    @classmethod
    def stored(cls, name: str, cfg: Mapping[str, Any]) -> "Candidate":
        """A stored backend (:meth:`config`, or ``Backend.describe``: its name beside its settings) as its candidate,
        held to its kind's schema; settings added to a kind since it was written take their defaults."""
        return cls.of(name, {k: v for k, v in cfg.items() if k != "name"})

    def config(self) -> Dict[str, Any]:
        """The settings as plain data: what the checkpoint, the run's fingerprint and a compile worker get."""
        return self.settings.plain()

    @property
    def kind(self) -> str:
        return self.settings.kind

    @property
    def runs_torch(self) -> bool:
        """Whether its kind runs the PyTorch model itself, so a copy with cast weights can compete (exported
        runtimes set their own inference precision)."""
        return isinstance(self.settings, TorchSettings)

    @property
    def precision(self) -> Precision:
        """fp32, tf32, bf16, fp16 or a quantization recipe: its ``precision``, or the autocast it sets itself
        (older configs)."""
        own = self.settings.precision
        if own == "fp32" and self.runs_torch and self.settings.autocast_enabled:
            return {v: k for k, v in AUTOCAST.items()}.get(self.settings.autocast_dtype, "fp32")
        return own

    @property
    def quantizes(self) -> bool:
        """A candidate of a quantized precision (``int8_weight_only``, ``int8_dynamic``, ``fp8``): it runs a bf16
        copy of the model whose Linear layers torchao quantizes (``pipeline.backends.quantize``)."""
        return self.precision in quantize.RECIPES

    @property
    def compute_dtype(self) -> Optional[torch.dtype]:
        """The reduced precision it computes in besides fp32, if any (drives tolerances): autocast's, or the
        quantized recipes' bf16 copy; None at fp32 and tf32."""
        name = AUTOCAST.get(self.precision) or (quantize.BASE_DTYPE if self.quantizes else None)
        return dtype_of(name) if name else None

    @property
    def casts_weights(self) -> bool:
        """Whether it runs a copy of the model with weights cast to its precision's dtype (``cast_weights``, set
        by the ``precision`` list; always where it quantizes)."""
        cast = self.runs_torch and self.settings.cast_weights
        return (cast or self.quantizes) and self.compute_dtype is not None

    @property
    def weights(self) -> str:
        """The precision its weights run in: fp32, bf16/fp16 for a -weights candidate, int8 or fp8 quantized."""
        if self.quantizes:
            return quantize.RECIPES[self.precision]
        return self.precision if self.casts_weights else "fp32"

    @property
    def attention(self) -> Optional[Kernel]:
        """The attention kernel it forces (``pipeline.backends.attention``), or None: PyTorch's own choice."""
        return getattr(self.settings, "attention", None)

    @property
    def numerics(self) -> str:
        """Its precision with its weights as candidate names spell it: ``bf16`` (autocast), ``bf16-weights`` (a cast
        copy), ``fp32``, and a forced attention kernel after it (``bf16-weights.sdpa-cudnn``): what the
        precision-first screen groups candidates by (``stages/capture.py``), so a kernel slower than PyTorch's own
        choice where nothing is compiled gets no compiling candidate built either."""
        own = f"{self.precision}-weights" if self.casts_weights and not self.quantizes else self.precision
        return f"{own}{ATTENTION_SUFFIX}{self.attention}" if self.attention else own

    @property
    def judged_by_budget(self) -> bool:
        """A reduced-precision candidate of the ``precision`` list: its outputs answer to the accuracy budget
        alone, not to judge()'s tolerance (a backend setting ``autocast_*`` itself is held to both)."""
        return self.settings.precision != "fp32"

    @property
    def reduces_in_model(self) -> bool:
        """A PyTorch candidate at precision bf16/fp16 or quantized: it runs the model wrapped in
        :class:`~pipeline.backends.precision.ReducedPrecision` (autocast, cast or quantized weights inside the
        call, outputs in the model's dtype). A backend's own ``autocast_*`` settings keep the call-wide context."""
        return (self.settings.precision in AUTOCAST or self.quantizes) and self.runs_torch

    @property
    def compiles(self) -> bool:
        """Whether its build runs Inductor (an inductor backend, or a graph backend of Inductor's kernels)."""
        return self.kind == "inductor" or (self.kind == "graph" and self.settings.compile_with_inductor)

    @property
    def regional(self) -> bool:
        """Compiled as a regional program: the model's repeated blocks once each (``pipeline.backends.regions``)."""
        return isinstance(self.settings, InductorSettings) and bool(self.settings.regional)

    @property
    def per_length(self) -> bool:
        """Compiled once per tuned length (``per_length: true``; where lengths are tuned)."""
        return isinstance(self.settings, InductorSettings) and bool(self.settings.per_length)

    @property
    def splits_by_length(self) -> bool:
        """Whether an Inductor backend competes twice where lengths are tuned: the length dynamic, and per length."""
        return self.kind == "inductor" and self.settings.per_length is None and self.settings.dynamic is None

    def unsupported_reason(self, device: torch.device) -> Optional[str]:
        """Why its numerics cannot run on ``device``: TF32 exists only in CUDA kernels; a quantized recipe needs
        torchao (and fp8 a GPU with float8 matmuls); the memory-efficient and cuDNN attention kernels run on CUDA
        alone. Its kind may add reasons of its own (``Backend``)."""
        if self.precision == "tf32" and device.type != "cuda":
            return f"tf32 changes only CUDA matmuls and convolutions; on {device.type} it would repeat fp32"
        if self.quantizes:
            return quantize.unsupported_reason(self.precision, device)
        return kernels.device_problem(self.attention, device.type)
