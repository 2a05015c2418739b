"""The user's own example inputs: named, checked, pooled into rows, and described as ``model.inputs``.

``pipeline.tune(model, example_inputs)`` and ``model.examples=<file.pt>`` hand over real data, and
every tuned batch is built from its rows (cycled), so capture, profile and validate run the model
on what it will see. A model valid only on its data (a square root of positive features, token
ids within a vocabulary, masks with padding) fails on random fills it never sees.

Inputs are one tensor per name with the batch along one dimension (``batch_dims``, the first by
default). ``example_inputs`` is one batch (a tensor, a tuple or list of tensors in ``forward``'s
order, or a dict) or a list of batches (dicts or tuples), whose rows are pooled.
"""

from __future__ import annotations

import collections.abc
import inspect
import re
import typing
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import torch
from torch import nn

from pipeline.errors import ConfigError
from pipeline.models import DTYPES

DTYPE_NAMES = {dtype: name for name, dtype in DTYPES.items()}
SUPPORTED = ("tweakpipe tunes inputs that are one tensor per name, batched along one dimension (batch_dims): "
             "stack same-size samples into one tensor (images as one (N, C, H, W) tensor), or wrap the model "
             "so that it takes one")

Example = Union[torch.Tensor, Sequence[torch.Tensor], Mapping[str, torch.Tensor]]
Examples = Union[Example, List[Union[Mapping[str, torch.Tensor], Tuple[torch.Tensor, ...]]]]


def named_inputs(model: nn.Module, example_inputs: Example) -> Dict[str, Any]:
    """One batch by name: a dict as given, else matched to ``model.forward``'s parameters in order."""
    if isinstance(example_inputs, Mapping):
        named = dict(example_inputs)
    else:
        args: Tuple[Any, ...] = (example_inputs,) if isinstance(example_inputs, torch.Tensor) else tuple(example_inputs)
        params = list(inspect.signature(model.forward).parameters.values())
        if any(p.kind is p.VAR_POSITIONAL for p in params[:len(args)]) or len(args) > len(params):
            raise TypeError(f"{type(model).__name__}.forward cannot name {len(args)} positional inputs; "
                            f"pass example_inputs as a dict of input name -> tensor")
        named = {p.name: a for p, a in zip(params, args)}
    params = inspect.signature(model.forward).parameters.values()
    if any(p.kind is p.POSITIONAL_ONLY and p.name in named for p in params):
        raise TypeError(f"{type(model).__name__}.forward has positional-only parameters; tuned models are called "
                        f"with keyword inputs, so make them ordinary parameters")
    required = [p.name for p in params if p.default is p.empty and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    missing = [n for n in required if n not in named]
    if missing:
        raise TypeError(f"{type(model).__name__}.forward needs {missing}, which example_inputs do not give")
    listed = [p for p in params if p.name in named and takes_a_sequence(p.annotation)]
    if listed:
        raise TypeError(f"{type(model).__name__}.forward takes {listed[0].name!r} as {listed[0].annotation}, not one "
                        f"tensor; {SUPPORTED}")
    return named


def takes_a_sequence(annotation: Any) -> bool:
    """Whether a ``forward`` parameter is declared a list, tuple or sequence (of images, say)."""
    if isinstance(annotation, str):  # postponed annotations
        return re.match(r"(typing\.)?(List|Tuple|Sequence|list|tuple)\[", annotation) is not None
    return typing.get_origin(annotation) in (list, tuple, collections.abc.Sequence)


def batches(example_inputs: Examples) -> List[Example]:
    """A list of dicts or tuples is a list of batches; anything else (a list of tensors too) is one batch."""
    if isinstance(example_inputs, list) and example_inputs and all(
            isinstance(b, (Mapping, tuple)) for b in example_inputs):
        return list(example_inputs)
    return [example_inputs]


def checked(named: Mapping[str, Any], dims: Mapping[str, int], where: str) -> Dict[str, torch.Tensor]:
    """One batch's tensors, each with a batch dimension at ``dims`` (0 unless named) and a dtype we
    know; they agree on the batch size."""
    unknown = sorted(set(dims) - set(named))
    if unknown:
        raise ValueError(f"batch_dims names {unknown}, which are not inputs; the inputs are {sorted(named)}")
    odd = {name: dim for name, dim in dims.items() if isinstance(dim, bool) or not isinstance(dim, int)}
    if odd:
        name, dim = next(iter(odd.items()))
        raise TypeError(f"batch_dims[{name!r}]={dim!r} is a {type(dim).__name__}; a batch dimension is an int, "
                        f"e.g. batch_dims={{{name!r}: 1}}")
    sizes = {}
    for name, t in named.items():
        if not isinstance(t, torch.Tensor):
            kind = (f"{type(t).__name__} of {len(t)} {type(t[0]).__name__ if len(t) else 'item'}s"
                    if isinstance(t, (list, tuple)) else type(t).__name__)
            raise TypeError(f"{where} {name!r} is a {kind}, not a tensor; {SUPPORTED}")
        dim = dims.get(name, 0)
        if not 0 <= dim < t.dim():
            raise TypeError(f"{where} {name!r} has shape {tuple(t.shape)}, with no batch dimension {dim}; give it "
                            f"one (x.unsqueeze({dim})), or name the batch dimension in batch_dims")
        if t.dtype not in DTYPE_NAMES:
            raise TypeError(f"{where} {name!r} has dtype {t.dtype}; use one of {sorted(DTYPES)}")
        if not t.shape[dim]:
            raise ValueError(f"{where} {name!r} has shape {tuple(t.shape)}: no rows along its batch dimension {dim}; "
                             f"give at least one example")
        sizes[name] = t.shape[dim]
    if len(set(sizes.values())) > 1:
        raise ValueError(f"{where}s disagree on the batch size (along their batch dimensions): {sizes}")
    return dict(named)


def pooled(model: nn.Module, example_inputs: Examples, batch_dims: Optional[Mapping[str, int]] = None
           ) -> Dict[str, torch.Tensor]:
    """Every row of ``example_inputs`` by input name, the batches joined along each input's batch dimension."""
    dims = dict(batch_dims or {})
    parts = [checked(named_inputs(model, b), dims, "example input") for b in batches(example_inputs)]
    first = parts[0]
    if not first:
        raise ValueError("example_inputs is empty; give at least one tensor with a batch dimension")
    for i, part in enumerate(parts[1:], 1):
        if part.keys() != first.keys():
            raise ValueError(f"example batch {i} gives inputs {sorted(part)}, batch 0 gives {sorted(first)}")
        for name, t in part.items():
            dim, ref = dims.get(name, 0), first[name]
            if t.dtype != ref.dtype or t.dim() != ref.dim() or any(
                    a != b for d, (a, b) in enumerate(zip(t.shape, ref.shape)) if d != dim):
                raise ValueError(f"example batch {i}: input {name!r} is {tuple(t.shape)} {t.dtype}, batch 0's is "
                                 f"{tuple(ref.shape)} {ref.dtype}; batches may differ only in their batch size "
                                 f"(pad sequences to one length)")
    return {name: torch.cat([p[name].to(first[name].device) for p in parts], dims.get(name, 0)) for name in first}


def seq_spec(examples: Mapping[str, torch.Tensor], batch_dims: Mapping[str, int], seq_dims: Mapping[str, int],
             pad_values: Mapping[str, float]) -> Dict[str, Dict[str, Any]]:
    """Each input's length dimension (``seq_dims``, in the full tensor) and pad value (``pad_values``, 0 where
    not given), checked against the examples."""
    unknown = sorted((set(seq_dims) | set(pad_values)) - set(examples))
    if unknown:
        raise ValueError(f"seq_dims or pad_values name {unknown}, which are not inputs; the inputs are "
                         f"{sorted(examples)}")
    out = {}
    for name, dim in seq_dims.items():
        t, batch = examples[name], batch_dims.get(name, 0)
        if isinstance(dim, bool) or not isinstance(dim, int) or not 0 <= dim < t.dim() or dim == batch:
            raise ValueError(f"seq_dims[{name!r}]={dim!r} is not a dimension of its {tuple(t.shape)} tensor other than "
                             f"its batch dimension {batch}; e.g. seq_dims={{{name!r}: 1}} for batch-first token ids")
        out[name] = {"seq_dim": dim, "pad": pad_values.get(name, 0)}
    missing = sorted(set(pad_values) - set(seq_dims))
    if missing:
        raise ValueError(f"pad_values names {missing}, which seq_dims gives no length dimension")
    return out


def spec_of(examples: Mapping[str, torch.Tensor], batch_dims: Optional[Mapping[str, int]] = None,
            seq_dims: Optional[Mapping[str, int]] = None, pad_values: Optional[Mapping[str, float]] = None
            ) -> Dict[str, Dict[str, Any]]:
    """The ``model.inputs`` entries examples imply: per-sample shape, dtype, the random fill that resembles
    them (for warming up a loaded checkpoint), the batch dimension where it is not the first, and the length
    dimension and pad value of each input ``seq_dims`` names."""
    lengths = seq_spec(examples, batch_dims or {}, seq_dims or {}, pad_values or {})
    spec: Dict[str, Dict[str, Any]] = {}
    for name, t in examples.items():
        dim = (batch_dims or {}).get(name, 0)
        entry: Dict[str, Any] = {"shape": [s for d, s in enumerate(t.shape) if d != dim], "dtype": DTYPE_NAMES[t.dtype]}
        if t.dtype.is_floating_point:
            entry["fill"] = "randn"
        elif t.numel() and bool((t == 1).all()):
            entry["fill"] = "ones"  # masks of all ones stay all ones
        else:
            entry.update(fill="randint", high=max(int(t.max()) + 1, 1) if t.numel() else 2)  # draws in [0, high)
        if dim:
            entry["batch_dim"] = dim
        spec[name] = {**entry, **lengths.get(name, {})}
    return spec


def input_spec(model: nn.Module, example_inputs: Examples,
               batch_dims: Optional[Mapping[str, int]] = None) -> Dict[str, Dict[str, Any]]:
    """The config's ``model.inputs`` for example tensors: per-sample shape, dtype, fill and batch dimension."""
    return spec_of(pooled(model, example_inputs, batch_dims), batch_dims)


def from_file(path: str, given: Optional[Mapping[str, Mapping[str, Any]]]) -> Tuple[Dict[str, torch.Tensor],
                                                                                 Dict[str, Dict[str, Any]]]:
    """``model.examples``: the tensors in ``path`` and the input spec they imply, checked against the
    ``model.inputs`` the config gives (``given``, None when left out), whose batch dimensions they follow."""
    where = f"model.examples={path}"
    if not Path(path).is_file():
        raise ConfigError(f"{where}: no such file; save your inputs as torch.save({{'x': x}}, '{path}')")
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # a pickle that is not plain tensors, or not a torch file at all
        raise ConfigError(f"{where} cannot be read with torch.load(weights_only=True) "
                          f"({str(exc).splitlines()[0][:200]}); save a dict of input name -> tensor with torch.save") from None
    if not isinstance(data, Mapping) or not data or not all(isinstance(k, str) for k in data):
        what = (f"a {type(data).__name__}" if not isinstance(data, Mapping) else "an empty dict" if not data else
                f"a dict keyed by {type(next(k for k in data if not isinstance(k, str))).__name__}s, not input names")
        raise ConfigError(f"{where} holds {what}; save a dict of input name -> tensor, "
                          f"torch.save({{'x': x}}, '{path}')")
    dims = {name: int(s.get("batch_dim", 0)) for name, s in (given or {}).items()}
    try:
        examples = checked(data, {n: d for n, d in dims.items() if n in data}, "example input")
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where}: {exc}") from None
    spec = spec_of(examples, dims)
    if given:
        if set(given) != set(spec):
            raise ConfigError(f"{where} holds inputs {sorted(spec)}, but model.inputs names {sorted(given)}; "
                              f"make them agree, or leave model.inputs out to take them from the file")
        for name, entry in spec.items():
            shape, dtype = given[name].get("shape"), given[name].get("dtype", "float32")
            if (isinstance(shape, list) and entry["shape"] != shape) or entry["dtype"] != dtype:
                raise ConfigError(f"{where}: input {name!r} is per-sample {entry['shape']} {entry['dtype']}, but "
                                  f"model.inputs says {shape} {dtype}; make them agree")
    return examples, spec
