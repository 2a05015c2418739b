"""The routed model: a module that sends each call to the backend that owns its batch size."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Sequence

import torch
from torch import nn
from torch.nn.modules import module as nn_module

from pipeline.backends import Backend
from pipeline.routing import Range, backend_for


@dataclass
class TuneRecord:
    """What a checkpoint needs besides the backends. The eager model is kept here rather than as a
    submodule, so ``routed.train()`` or ``routed.to()`` cannot change what the backends were built on.
    """

    name: str
    model: nn.Module
    inputs: Dict[str, Dict[str, Any]]  # input name -> {shape (per sample), dtype, fill, high}
    batch_sizes: List[int]  # the tuned (profiled) sizes
    device: torch.device


CHECKED_SHAPES = 4096  # input shapes a one-input model remembers as checked; calls with others are checked each time


def module_hooks_active() -> bool:
    """Whether global nn.Module hooks are registered (``nn.modules.module.register_module_forward_hook``)."""
    return bool(nn_module._global_forward_hooks or nn_module._global_forward_pre_hooks)


class RoutedModule(nn.Module):
    """Serves calls by batch size. Calls into one backend are serialised (graph replay shares
    static buffers), so several threads may call one module; different backends run concurrently.
    """

    def __init__(self, backends: Mapping[str, Backend], route: Sequence[Range], record: TuneRecord) -> None:
        super().__init__()
        missing = {r.backend for r in route} - set(backends)
        if missing:
            raise ValueError(f"route names backends that were not built: {sorted(missing)}")
        self.backends: Dict[str, Backend] = dict(backends)
        self.route: List[Range] = list(route)
        self.record = record
        self.input_names = list(record.inputs)
        # Hot-path tables, so a call costs a few dict and list lookups: per-sample shapes to check, and
        # for every size up to the last range's start the owner's lock and backend.
        self._shapes = {n: torch.Size(spec["shape"]) for n, spec in record.inputs.items()}
        serve = {name: (threading.Lock(), backend) for name, backend in self.backends.items()}
        self._serve = [None] + [serve[backend_for(self.route, bs)] for bs in range(1, self.route[-1].lo + 1)]
        self._serve_above = serve[self.route[-1].backend]
        # A model with one input skips the checks for a full shape that passed them before: its owner
        # is looked up by the shape alone (for the first CHECKED_SHAPES shapes, so the table is bounded).
        self._single = self.input_names[0] if len(self.input_names) == 1 else None
        self._checked: Dict[torch.Size, Any] = {}

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

    def check_shapes(self, inputs: Mapping[str, torch.Tensor]) -> int:
        """The batch size, after checking every input against the per-sample shapes it was tuned for."""
        batch = None
        for name, t in inputs.items():
            if t.shape[1:] != self._shapes[name]:
                raise ValueError(f"input {name!r} has per-sample shape {tuple(t.shape[1:])}, but this model was tuned "
                                 f"for {tuple(self._shapes[name])}; tune again with that shape in model.inputs")
            if batch is not None and t.shape[0] != batch:
                raise ValueError(f"inputs disagree on the batch size: {name!r} has {t.shape[0]}, others {batch}")
            batch = t.shape[0]
        if batch < 1:
            raise ValueError(f"batch size must be at least 1, got {batch}")
        return batch

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Straight to the owner unless hooks are registered: nn.Module's hook dispatch and the
        checks in ``forward`` cost microseconds, which a graph replay of a tenth of a millisecond notices."""
        if self._forward_hooks or self._forward_pre_hooks or module_hooks_active():
            return super().__call__(*args, **kwargs)
        if self._single is not None and len(args) + len(kwargs) == 1:
            x = args[0] if args else kwargs.get(self._single)
            served = self._checked.get(x.shape) if isinstance(x, torch.Tensor) else None
            if served is not None:
                lock, backend = served
                with lock:
                    return backend(**{self._single: x})
        return self.forward(*args, **kwargs)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        inputs = kwargs if not args and kwargs.keys() == self._shapes.keys() else self.bind(args, kwargs)
        batch_size = self.check_shapes(inputs)
        served = self._serve[batch_size] if batch_size < len(self._serve) else self._serve_above
        if self._single is not None and len(self._checked) < CHECKED_SHAPES:
            self._checked[inputs[self._single].shape] = served
        lock, backend = served
        with lock:
            return backend(**inputs)

    def extra_repr(self) -> str:
        return ", ".join(f"{r.lo}..{r.hi if r.hi is not None else 'inf'}: {r.backend}" for r in self.route)
