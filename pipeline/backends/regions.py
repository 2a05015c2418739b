"""Regional programs: a model's repeated blocks compiled once and reused for the others.

Transformer layers, ViT encoder blocks and ResNet bottlenecks repeat one module many times. Compiled whole,
Dynamo traces and Inductor compiles every repetition again; compiled regionally, each block's ``forward`` is
a nested compile region (``torch.compiler.nested_compile_region``): traced once, stamped out for the blocks
after it, and compiled once (published: 2-5.5x less compile time; measured here: ``bench/tune_scale.py``).
The program may be slower, since no fusion crosses a block's edge, so a regional backend (``regional: true``)
competes as a candidate of its own and the router decides per range.

What counts as a region: among the children of one module, two or more of one class whose structure is the
same (their submodules' classes and names, their weights' shapes and dtypes, their plain attributes), with
submodules of their own (a repeated ``Linear`` is a kernel, not a block). The outermost such children win;
their insides are not searched. The model itself is never changed: the program runs a *view* of it, shallow
copies of the modules on the way to each region holding the same parameters and buffers, whose regions' class
is a subclass made for this view alone (so no two programs share a region's wrapper).
"""

from __future__ import annotations

import copy
from typing import Any, Dict, List, Tuple

import torch
from torch import nn

CONTAINERS = (nn.Sequential, nn.ModuleList, nn.ModuleDict)
# Instance attributes every module has, whose values say nothing about what its forward computes.
BOOKKEEPING = {"training", "_is_full_backward_hook", "_compiled_call_impl"}


class NoRegions(ValueError):
    """The model repeats no block: a regional program would be the whole model's."""


def telling(module: nn.Module, value: Any) -> bool:
    """Whether a plain attribute may change what ``module`` computes. A torch.nn module's all do (a convolution's
    stride, a norm's eps); another's integers are left out, since a layer's index (``layer_idx``) differs between
    blocks that compute alike, while its flags, strings, floats and None (``is_causal``, a layer type, a scale, an
    absent sliding window) stay in. Torch's own reuse check and capture's check against eager hold the rest."""
    if type(module).__module__.startswith("torch.nn"):
        return True
    return isinstance(value, bool) or not isinstance(value, int)


def signature(module: nn.Module) -> Tuple[Any, ...]:
    """What must be equal for two modules to trace to one region: class, plain attributes that may change what it
    computes (:func:`telling`), weights' shapes and dtypes, and the same for every submodule by name."""
    plain = tuple(sorted((k, repr(v)) for k, v in vars(module).items()
                         if not k.startswith("_") and k not in BOOKKEEPING
                         and not isinstance(v, (nn.Module, torch.Tensor)) and telling(module, v)))
    tensors = tuple((name, tuple(t.shape), t.dtype) for name, t in [*module._parameters.items(), *module._buffers.items()]
                    if t is not None)
    return (type(module), plain, tensors,
            tuple((name, signature(child)) for name, child in module._modules.items() if child is not None))


def repeated(parent: nn.Module) -> List[str]:
    """The names of ``parent``'s children that are regions: blocks with submodules, two or more of one structure."""
    groups: Dict[Tuple[Any, ...], List[str]] = {}
    for name, child in parent._modules.items():
        if child is not None and not isinstance(child, CONTAINERS) and any(True for _ in child.children()):
            groups.setdefault(signature(child), []).append(name)
    return [name for names in groups.values() if len(names) >= 2 for name in names]


def find(model: nn.Module, prefix: str = "") -> List[str]:
    """Every region's qualified name, outermost first (a region's insides are not searched)."""
    regions = repeated(model)
    found = [f"{prefix}{name}" for name in regions]
    for name, child in model._modules.items():
        if child is not None and name not in regions:
            found += find(child, f"{prefix}{name}.")
    return found


def describe(model: nn.Module) -> str:
    """The regions in words: ``24 x GPT2Block (h.0..h.23)``, one entry per class."""
    by_class: Dict[str, List[str]] = {}
    for name in find(model):
        by_class.setdefault(type(model.get_submodule(name)).__name__, []).append(name)
    return ", ".join(f"{len(names)} x {cls} ({names[0]}..{names[-1]})" for cls, names in by_class.items())


def regional_view(model: nn.Module) -> nn.Module:
    """``model`` with each region's ``forward`` a nested compile region: shallow copies down to the regions (the
    same parameters and buffers), ``model`` itself untouched. Raises :class:`NoRegions` where it repeats no block."""
    regions = find(model)
    if not regions:
        raise NoRegions(f"{type(model).__name__} repeats no block (two or more children of one structure with "
                        "submodules of their own), so a regional program would compile it whole")
    wrappers: Dict[type, type] = {}

    def region_class(cls: type) -> type:
        if cls not in wrappers:  # one wrapper per class and view: its blocks share it, other programs do not
            wrappers[cls] = type(cls.__name__, (cls,), {"forward": torch.compiler.nested_compile_region(cls.forward),
                                                        "__module__": cls.__module__, "__qualname__": cls.__qualname__})
        return wrappers[cls]

    def view(module: nn.Module, prefix: str) -> nn.Module:
        inside = [r for r in regions if f"{r}.".startswith(prefix)]
        if not inside:
            return module
        copied = copy.copy(module)  # shares _parameters and _buffers; gets its own table of children
        copied._modules = dict(module._modules)
        if prefix.rstrip(".") in regions:
            copied.__class__ = region_class(type(module))
            return copied
        for name, child in module._modules.items():
            if child is not None:
                copied._modules[name] = view(child, f"{prefix}{name}.")
        return copied

    return view(model, "")
