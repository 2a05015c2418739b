"""The routed model: a module that sends each call to the backend that owns its batch size, or, where
lengths are tuned (:mod:`pipeline.seqlen`), its (batch size, length): a call at an untuned length is padded to
the tuned length above it and its outputs cut back, where its owner's padding was proved, or served
unpadded by an owner that runs any length."""

from __future__ import annotations

import functools
import threading
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import torch
from torch import nn
from torch.nn.modules import module as nn_module

from pipeline.backends import Backend
from pipeline.batching import layout
from pipeline.errors import RouteError
from pipeline.models import dtype_of
from pipeline.route.policy import Range, backend_for
from pipeline.route.table import describe
from pipeline.seqlen import SeqDims, per_sample_index


@dataclass
class TuneRecord:
    """What a checkpoint needs besides the backends. The eager model is kept here rather than as a
    submodule, so ``routed.train()`` or ``routed.to()`` cannot change what the backends were built on.
    """

    name: str
    model: nn.Module
    inputs: Dict[str, Dict[str, Any]]  # input name -> {shape (per sample), dtype, fill, high, batch_dim}
    batch_sizes: List[int]  # the tuned (profiled) sizes
    device: torch.device
    api: bool = False  # tuned by pipeline.tune or loaded by pipeline.load: messages name example_inputs
    output_batch_dims: Dict[str, Optional[int]] = field(default_factory=dict)  # found by capture (pipeline.batching)
    seq: SeqDims = field(default_factory=SeqDims)  # tuned lengths and length dimensions; empty without them
    padded: List[str] = field(default_factory=list)  # backends whose padded calls capture proved right


CHECKED_SHAPES = 4096  # input shapes a one-input model remembers as checked; calls with others are checked each time


def module_hooks_active() -> bool:
    """Whether global nn.Module hooks are registered (``nn.modules.module.register_module_forward_hook``)."""
    return bool(nn_module._global_forward_hooks or nn_module._global_forward_pre_hooks)


class RoutedModule(nn.Module):
    """Serves calls by batch size. Calls into one backend are serialised (graph replay shares
    static buffers), so several threads may call one module; different backends run concurrently.
    """

    def __init__(self, backends: Mapping[str, Backend], route: Sequence[Any], record: TuneRecord) -> None:
        super().__init__()
        missing = {r.backend for r in route} - set(backends)
        if missing:
            raise RouteError(f"route names backends that were not built: {sorted(missing)}")
        self.backends: Dict[str, Backend] = dict(backends)
        self.route: List[Any] = list(route)  # Range, or Tile where lengths are tuned
        self.record = record
        # Per compiling backend, once saved: whether its program was built ahead of time, why not, what it cost
        # (pipeline.route.checkpoint.ahead_of_time).
        self.aot: Dict[str, Dict[str, Any]] = {}
        self.input_names = list(record.inputs)
        # Hot-path tables, so a call costs a few dict and list lookups: per-sample shapes and dtypes to
        # check, and for every size up to the last range's start the owner's lock and backend.
        self._shapes = {n: torch.Size(spec["shape"]) for n, spec in record.inputs.items()}
        self._dims = {n: int(spec.get("batch_dim", 0)) for n, spec in record.inputs.items()}
        self._dtypes = {n: dtype_of(spec["dtype"]) for n, spec in record.inputs.items()}
        self._device = torch.empty(0, device=record.device).device  # with its index: cuda is cuda:0
        serve = {name: (threading.Lock(), backend) for name, backend in self.backends.items()}
        self._seq = record.seq
        if self._seq:  # where the length sits in each per-sample shape, and each length's band of ranges
            self._seq_pos = {n: per_sample_index(d, self._dims[n]) for n, d in self._seq.inputs.items()}
            self._bands = self.length_bands(serve)
        else:
            self._serve = [None] + [serve[backend_for(self.route, bs)] for bs in range(1, self.route[-1].lo + 1)]
            self._serve_above = serve[self.route[-1].backend]
        # A model with one input skips the checks for a tensor whose shape, dtype and device passed them
        # before: its owner is looked up by those alone (for the first CHECKED_SHAPES, so the table is bounded).
        self._single = self.input_names[0] if len(self.input_names) == 1 else None
        self._checked: Dict[Tuple[torch.Size, torch.dtype, torch.device], Any] = {}

    def length_bands(self, serve: Mapping[str, Tuple[threading.Lock, Backend]]) -> List[Optional[tuple]]:
        """For every length up to the largest tuned one: its band's (owner per batch size up to the last range's
        start, owner above), or None for a length no tile serves."""
        bands: Dict[Tuple[int, int], List[Range]] = {}
        for t in self.route:
            bands.setdefault((t.len_lo, t.len_hi), []).append(Range(t.lo, t.hi, t.backend))
        rows: List[Optional[tuple]] = [None] * (self._seq.lengths[-1] + 1)
        for (lo, hi), ranges in bands.items():
            row = ([None] + [serve[backend_for(ranges, bs)] for bs in range(1, ranges[-1].lo + 1)],
                   serve[ranges[-1].backend])
            for n in range(lo, hi + 1):
                rows[n] = row
        return rows

    def served_at(self, batch: int, length: int) -> Tuple[threading.Lock, Any]:
        """The owner's lock and the call that serves ``(batch, length)``: its backend, or the backend on the inputs
        padded to the tuned length above ``length`` (outputs cut back) where its padding was proved."""
        row = self._bands[length]
        if row is None:
            raise ValueError(f"no backend serves length {length}: this model was tuned at lengths "
                             f"{list(self._seq.lengths)}, and none it routes between them was proved to answer as "
                             f"eager does when padded, or runs untuned lengths (capture.json: padding); call it at "
                             f"a tuned length")
        lock, backend = row[0][batch] if batch < len(row[0]) else row[1]
        target = self._seq.target(length)
        if target == length or backend.name not in self.record.padded:
            return lock, backend
        return lock, functools.partial(self.pad_and_cut, backend, target, length)

    def pad_and_cut(self, backend: Backend, target: int, length: int, **inputs: torch.Tensor) -> Any:
        """``backend`` on the inputs padded to ``target``, its outputs cut back to ``length`` (views)."""
        return self._seq.cut(backend(**self._seq.resized(inputs, target)), length)

    def bind(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Dict[str, torch.Tensor]:
        """Positional and keyword arguments as the model's named inputs."""
        if len(args) > len(self.input_names):
            raise TypeError(f"expected at most {len(self.input_names)} positional inputs {self.input_names}, got {len(args)}")
        inputs = dict(zip(self.input_names, args))
        inputs.update(kwargs)
        unknown = set(inputs) - set(self.input_names)
        missing = set(self.input_names) - set(inputs)
        if unknown or missing:
            raise TypeError(f"inputs must be {self.input_names}; unknown {sorted(unknown)}, missing {sorted(missing)}")
        return inputs

    def retune_hint(self) -> str:
        """How to tune for other inputs, in the words of whoever tuned: the API or the config tree."""
        return ("pipeline.tune again with example_inputs of that shape" if self.record.api
                else "tune again with that shape in model.inputs")

    def check_inputs(self, inputs: Mapping[str, Any]) -> int:
        """The batch size, after checking every input's type, dtype, device and per-sample shape."""
        return self.check_shapes(inputs)[0]

    def check_shapes(self, inputs: Mapping[str, Any]) -> Tuple[int, Optional[int]]:
        """The batch size and the length (None without tuned lengths), after checking every input's type, dtype,
        device and per-sample shape (its length free up to the largest tuned one)."""
        batch, lengths = None, {}
        for name, t in inputs.items():
            dtype = self._dtypes[name]
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"input {name!r} is a {type(t).__module__}.{type(t).__name__}; pass a torch.Tensor "
                                f"of {dtype} on {self._device}, e.g. torch.as_tensor(x, dtype={dtype}, "
                                f"device='{self._device}')")
            if t.dtype is not dtype:
                raise TypeError(f"input {name!r} has dtype {t.dtype}, but this model was tuned for {dtype}; "
                                f"convert it: x.to({dtype})")
            if t.device != self._device:
                raise ValueError(f"input {name!r} is on {t.device}, but this model was tuned on {self._device}; "
                                 f"move it: x.to('{self._device}')")
            shape, dim, tuned = t.shape, self._dims[name], self._shapes[name]
            if len(shape) != len(tuned) + 1:
                where = "inputs are batch-first" if not dim else f"its batch is dimension {dim}"
                what = "is a 0-dim tensor" if not shape else f"has shape {tuple(shape)}"
                raise ValueError(f"input {name!r} {what}; {where}, here {layout(tuned, dim)}: " + (
                    f"add the batch dimension, x.unsqueeze({dim})" if len(shape) == len(tuned) else self.retune_hint()))
            sample = shape[1:] if not dim else shape[:dim] + shape[dim + 1:]
            free = ""
            if self._seq and name in self._seq_pos:  # its length may be any up to the largest tuned one
                pos = self._seq_pos[name]
                lengths[name] = sample[pos]
                tuned, free = tuned[:pos] + sample[pos:pos + 1] + tuned[pos + 1:], f", its length free in {pos}"
            if sample != tuned:
                where = "inputs are batch-first" if not dim else f"batch in dimension {dim}"
                raise ValueError(f"input {name!r} has per-sample shape {tuple(sample)}, but this model was tuned "
                                 f"for {tuple(tuned)} ({where}{free}); {self.retune_hint()}")
            if batch is not None and shape[dim] != batch:
                raise ValueError(f"inputs disagree on the batch size: {name!r} has {shape[dim]}, others {batch}")
            batch = shape[dim]
        if batch < 1:
            raise ValueError(f"batch size must be at least 1, got {batch}")
        return batch, self.check_length(lengths) if self._seq else None

    def check_length(self, lengths: Mapping[str, int]) -> int:
        """The call's length: its inputs agree on it, and it is from 1 to the largest tuned length."""
        if len(set(lengths.values())) > 1:
            raise ValueError(f"inputs disagree on the length: {dict(lengths)}")
        name, length = next(iter(lengths.items()))
        largest = self._seq.lengths[-1]
        if length > largest:
            how = ("pipeline.tune again with it in seq_lens" if self.record.api
                   else "tune again with it in model.seq_lens")
            raise ValueError(f"input {name!r} has length {length}, above the largest tuned length {largest}; pad "
                             f"or cut it to at most {largest}, or {how}")
        if length < 1:
            raise ValueError(f"input {name!r} has length {length}; the length must be at least 1")
        return length

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Straight to the owner unless hooks are registered: nn.Module's hook dispatch and the
        checks in ``forward`` cost microseconds, which a graph replay of a tenth of a millisecond notices."""
        if self._forward_hooks or self._forward_pre_hooks or module_hooks_active():
            return super().__call__(*args, **kwargs)
        if self._single is not None and len(args) + len(kwargs) == 1:
            x = args[0] if args else kwargs.get(self._single)
            served = self._checked.get((x.shape, x.dtype, x.device)) if isinstance(x, torch.Tensor) else None
            if served is not None:
                lock, backend = served
                with lock:
                    return backend(**{self._single: x})
        return self.forward(*args, **kwargs)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        inputs = kwargs if not args and kwargs.keys() == self._shapes.keys() else self.bind(args, kwargs)
        batch_size, length = self.check_shapes(inputs)
        if self._seq:
            served = self.served_at(batch_size, length)
        else:
            served = self._serve[batch_size] if batch_size < len(self._serve) else self._serve_above
        if self._single is not None and len(self._checked) < CHECKED_SHAPES:
            x = inputs[self._single]
            self._checked[(x.shape, x.dtype, x.device)] = served
        lock, backend = served
        with lock:
            return backend(**inputs)

    def extra_repr(self) -> str:
        if self._seq:
            return describe(self.route)
        return ", ".join(f"{r.lo}..{r.hi if r.hi is not None else 'inf'}: {r.backend}" for r in self.route)
