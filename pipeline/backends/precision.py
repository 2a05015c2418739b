"""Precision as a routed choice: every backend competes once per entry of ``precision``.

``fp32`` is the model as written. ``tf32`` keeps fp32 tensors and lets CUDA matmuls and convolutions
use TF32 tensor cores (``torch.backends.cuda.matmul.allow_tf32`` and ``torch.backends.cudnn.allow_tf32``,
set only around that candidate's calls and restored after). ``bf16`` and ``fp16`` give every PyTorch
backend two candidates (:class:`ReducedPrecision`): one under autocast of that dtype over the fp32
weights, and one on a copy of the model whose weights and buffers are cast to that dtype (no per-call
weight casts, no fp32 islands, channels-last where it convolves images), which is faster where the
weights dominate and further from fp32; the budget and the profile decide between them. ``int8_weight_only``,
``int8_dynamic`` and ``fp8`` are torchao's quantization recipes (:mod:`pipeline.backends.quantize`), each on
a bf16 copy of the model whose Linear layers it quantizes. All answer in the model's own dtype, as fp32
and tf32 do. The candidate's config carries its precision and ``cast_weights`` (backend keys), so a
checkpoint rebuilds it.

A candidate is named ``<backend>`` at fp32 (a run without ``precision`` is unchanged),
``<backend>.<precision>`` under autocast or quantized, and ``<backend>.<precision>-weights`` with cast
weights (MLflow allows no ``@`` in metric and tag names). Where lengths are tuned (``model.seq_lens``), an
Inductor backend that leaves ``per_length`` and ``dynamic`` unset competes twice more: with the length dynamic
under its own name, and compiled per tuned length as ``<candidate>.per_length``.
"""

from __future__ import annotations

import contextlib
import copy
from dataclasses import replace
from typing import Any, Collection, Dict, Iterator, Mapping, Optional, Sequence

import torch
from torch import nn
from torch.utils._pytree import tree_map_only

from pipeline.backends import quantize
from pipeline.backends.candidate import ATTENTION_SUFFIX, AUTOCAST, Candidate
from pipeline.config.attention import Kernel
from pipeline.config.precisions import Precision, Quantized
from pipeline.errors import ConfigError

SEPARATOR = "."
CAST_SUFFIX = "-weights"  # the candidate whose weights are cast to its precision's dtype
PER_LENGTH = ".per_length"  # the candidate compiled once per tuned length


def candidate_name(backend: str, precision: Precision, cast_weights: bool = False) -> str:
    if precision == "fp32":
        return backend
    return f"{backend}{SEPARATOR}{precision}{CAST_SUFFIX if cast_weights else ''}"


def name_problem(candidate: Candidate) -> Optional[str]:
    """Why a candidate named ``<backend>.<precision>[-weights][.per_length]`` does not run what its name says, or
    None (a name without the separator is a backend's own, whatever numerics it sets)."""
    name = candidate.name.removesuffix(PER_LENGTH) if candidate.per_length else candidate.name
    name = name.removesuffix(f"{ATTENTION_SUFFIX}{candidate.attention}") if candidate.attention else name
    backend, separator, _ = name.rpartition(SEPARATOR)
    if not separator:
        return None
    cast = candidate.runs_torch and candidate.settings.cast_weights
    says = candidate_name(backend, candidate.precision, cast)
    if says != name:
        return (f"backend {candidate.name!r} is named for another precision than it runs (precision="
                f"{candidate.precision}, cast_weights={cast}: it would be {says!r})")
    return None


def candidates(backends: Mapping[str, Mapping[str, Any]], precisions: Sequence[Precision],
               lengths: bool = False, references: Optional[Mapping[str, str]] = None,
               kernels: Sequence[Optional[Kernel]] = (None,), as_written: Collection[str] = ()) -> Dict[str, Candidate]:
    """Candidate name -> candidate, precision by precision (in the order given), backend by backend; at bf16 and
    fp16 the autocast candidates, then those with cast weights; with tuned ``lengths``, an Inductor backend's two
    (:attr:`Candidate.splits_by_length`); each PyTorch backend once more per attention kernel of ``kernels``
    besides None (PyTorch's own choice), ``<candidate>.sdpa-<kernel>``, except the backends ``as_written`` (the
    reference peers: the user's compile calls what PyTorch picks); such a candidate plays no reference. Each backend
    is held to its kind's schema once, here.

    A backend that sets its own autocast, precision or cast weights keeps them when ``precision`` is
    ``[fp32]`` (the default); beside a longer list it is an error (:func:`conflict`). So is a backend
    named like another's candidate (``eager.bf16`` beside ``eager``): a ConfigError. The candidates of a backend of
    ``references`` (name -> torch.compile mode) play that reference peer (:mod:`pipeline.backends.reference`)."""
    bases = [Candidate.of(str(name), cfg) for name, cfg in backends.items()]
    plays = references or {}
    own = next((b for b in bases if b.attention), None)
    if own and list(kernels) != [None]:
        raise ConfigError(f"backend {own.name!r} sets attention={own.attention} itself, which conflicts with the "
                          f"attention list; drop it from the backend (each kernel of the list runs every backend), "
                          f"or leave attention at [default]")
    out: Dict[str, Candidate] = {}
    for precision in precisions:
        for cast in (False, True) if precision in AUTOCAST else (False,):
            for base in bases:
                if cast and not base.runs_torch:
                    continue
                settings = base.settings
                if list(precisions) != ["fp32"]:
                    settings = replace(settings, precision=precision, **({"cast_weights": True} if cast else {}))
                if precision in quantize.RECIPES and base.runs_torch and settings.large_linears_only is None:
                    settings = replace(settings, large_linears_only=True)  # only where int8 / fp8 can gain
                split = lengths and base.splits_by_length
                for kernel in kernels if base.runs_torch and base.name not in as_written else (None,):
                    name = candidate_name(base.name, precision, cast) + (ATTENTION_SUFFIX + kernel if kernel else "")
                    forced = replace(settings, attention=kernel) if kernel else settings
                    named = ({name: replace(forced, per_length=False),
                              name + PER_LENGTH: replace(forced, per_length=True)} if split else {name: forced})
                    taken = [n for n in named if n in out]
                    if taken:
                        raise ConfigError(f"backend {taken[0]!r} has the name of a {SEPARATOR}<precision> candidate"
                                          f"{f' or a {PER_LENGTH} one' if split else ''}; rename it")
                    # a forced kernel is not the user's compile as written: it plays no reference
                    role = "" if getattr(forced, "attention", None) else plays.get(base.name, "")
                    out.update({n: Candidate(n, s, role) for n, s in named.items()})
    return out


def conflict(candidate: Candidate, precisions: Sequence[Precision]) -> Optional[str]:
    """Why the backend ``candidate`` cannot compete across ``precisions``: it fixes its own numerics."""
    if list(precisions) == ["fp32"]:
        return None
    settings = candidate.settings
    own = [k for k in ("autocast_enabled", "precision", "cast_weights")
           if getattr(settings, k, None) not in (None, False, "fp32")]
    if own:
        return (f"backend {candidate.name!r} sets {own[0]}={getattr(settings, own[0])} itself, which conflicts with "
                f"precision={list(precisions)}; drop it from the backend (each precision runs every backend), "
                f"or leave precision at [fp32]")
    return None


def device_problem(precision: Precision, device: torch.device) -> Optional[str]:
    """Why ``device`` cannot run ``precision`` (bf16/fp16 autocast), or None. tf32 is never a problem
    here: off CUDA its candidates are skipped (:meth:`Candidate.unsupported_reason`)."""
    dtype_name = AUTOCAST.get(precision)
    if dtype_name is None:
        return None
    dtype = getattr(torch, dtype_name)
    if device.type == "cuda" and dtype is torch.bfloat16 and not torch.cuda.is_bf16_supported():
        return (f"precision {precision}: {torch.cuda.get_device_name(device)} has no bf16 support; "
                f"use fp16 or tf32 instead, e.g. 'precision=[fp32,fp16]'")
    try:
        with torch.autocast(device.type, dtype=dtype):
            torch.mm(torch.ones(2, 2, device=device), torch.ones(2, 2, device=device))
    except Exception as exc:  # noqa: BLE001 -- any failure means the device cannot
        return (f"precision {precision}: autocast to {dtype_name} does not run on {device.type} ({exc}); "
                f"drop {precision} from precision")
    return None


@contextlib.contextmanager
def tf32(enabled: bool) -> Iterator[None]:
    """TF32 matmuls and convolutions on (``enabled``) for the block, the previous settings restored after."""
    if not enabled:
        yield
        return
    # torch >= 2.9 keeps the settings as fp32_precision ("none" = inherit); restoring those keeps them exact.
    new_api = hasattr(torch.backends.cuda.matmul, "fp32_precision")
    modules = (torch.backends.cuda.matmul, torch.backends.cudnn.conv) if new_api else ()
    saved = [m.fp32_precision for m in modules]
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before
        for module, value in zip(modules, saved):
            module.fp32_precision = value


def convolves_images(model: nn.Module, sample: Mapping[str, torch.Tensor]) -> bool:
    """Whether the model has 2-D convolutions and takes a 4-D floating input: channels-last pays there."""
    return (any(isinstance(m, nn.Conv2d) for m in model.modules())
            and any(t.dim() == 4 and t.is_floating_point() for t in sample.values()))


class ReducedPrecision(nn.Module):
    """``model`` at a reduced precision ``dtype``, answering in the model's own dtype.

    With ``cast_weights``, a copy of the model with its floating weights and buffers in ``dtype``
    (channels-last where ``channels_last``) and floating inputs cast on the way in, its layers then
    quantized by torchao's ``recipe`` where one is named (``quantized``: how many); otherwise the model
    itself under autocast to ``dtype``. Floating outputs go back to the model's dtype. All of it happens
    inside the call, so a compiler fuses the casts and a device graph records them, and a routed model
    answers in one dtype whichever candidate serves a batch size. The user's model is never touched."""

    def __init__(self, model: nn.Module, dtype: torch.dtype, device_type: str, cast_weights: bool,
                 channels_last: bool = False, recipe: Optional[Quantized] = None, large_only: bool = False) -> None:
        super().__init__()
        if recipe and not cast_weights:
            raise ValueError(f"recipe {recipe} quantizes a copy of the model: pass cast_weights=True")
        own = next((t.dtype for t in (*model.parameters(), *model.buffers()) if t.is_floating_point()),
                   torch.float32)
        if cast_weights:
            model = copy.deepcopy(model).to(dtype)
            model = model.to(memory_format=torch.channels_last) if channels_last else model
        self.quantized = quantize.quantize(model, recipe, large_only) if recipe else 0
        self.inner = model
        self.dtype, self.output_dtype, self.device_type = dtype, own, device_type
        self.cast_weights, self.channels_last = cast_weights, channels_last and cast_weights

    def _in(self, t: torch.Tensor) -> torch.Tensor:
        if not t.is_floating_point():
            return t
        if self.channels_last and t.dim() == 4:
            return t.to(self.dtype, memory_format=torch.channels_last)
        return t.to(self.dtype)

    def forward(self, **inputs: torch.Tensor) -> Any:
        if self.cast_weights:
            out = self.inner(**{name: self._in(t) for name, t in inputs.items()})
        else:
            with torch.autocast(self.device_type, dtype=self.dtype):
                out = self.inner(**inputs)
        return tree_map_only(torch.Tensor, lambda t: t.to(self.output_dtype) if t.is_floating_point() else t, out)
