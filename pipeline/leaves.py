"""Every tensor of a model's output, named by its path (``output.logits``, ``output.cache.layers[3].values``).

A check that misses a tensor passes a backend that corrupts it, so outputs are walked through
PyTorch pytrees (tensors, tuples, lists, dicts, namedtuples and any registered node), mappings
that are not registered (transformers' ``ModelOutput`` in older releases) and transformers cache
objects, whose key/value tensors sit in attributes of their layers rather than in a pytree.
"""

from __future__ import annotations

import sys
import copy
from typing import Any, Callable, Dict, List, Mapping, Optional, Set, Tuple

import torch
import torch.utils._pytree as pytree

ROOT = "output"


def cache_class() -> Optional[type]:
    """transformers' ``Cache`` base class if transformers is loaded. Never imports it: an output can only
    hold a transformers cache once transformers has been imported."""
    return getattr(sys.modules.get("transformers.cache_utils"), "Cache", None)


def key_name(key: Any) -> str:
    """One pytree key as a path segment: ``.name`` for attributes and string keys, ``[i]`` otherwise."""
    if isinstance(key, pytree.SequenceKey):
        return f"[{key.idx}]"
    if isinstance(key, pytree.GetAttrKey):
        return f".{key.name}"
    if isinstance(key, pytree.MappingKey):
        return f".{key.key}" if isinstance(key.key, str) and key.key.isidentifier() else f"[{key.key!r}]"
    return str(key)


def public_state(obj: Any) -> Dict[str, Any]:
    """An object's public instance attributes; ``{}`` for objects without any (or for classes)."""
    if isinstance(obj, type) or not hasattr(obj, "__dict__"):
        return {}
    return {name: value for name, value in vars(obj).items() if not name.startswith("_")}


def children(obj: Any) -> Optional[List[Tuple[str, Any]]]:
    """A pytree node's direct children with their path segments; None for a pytree leaf."""
    def one_level(x: Any) -> bool:
        return x is not obj

    try:
        pairs, _ = pytree.tree_flatten_with_path(obj, is_leaf=one_level)
        named = [("".join(key_name(k) for k in keys), child) for keys, child in pairs]
    except ValueError:  # a node registered without key paths: its children by position
        flat, _ = pytree.tree_flatten(obj, is_leaf=one_level)
        named = [(f"[{i}]", child) for i, child in enumerate(flat)]
    return None if len(named) == 1 and named[0][1] is obj else named


def tensor_leaves(out: Any) -> Dict[str, torch.Tensor]:
    """Every tensor in ``out``, by path, in output order. Other leaves (None, numbers, strings) are skipped."""
    found: Dict[str, torch.Tensor] = {}
    walk(out, ROOT, found, in_cache=False, seen=set())
    return found


def walk(obj: Any, path: str, found: Dict[str, torch.Tensor], in_cache: bool, seen: Set[int]) -> None:
    """Add the tensors under ``obj`` to ``found``. A cache, and every plain object inside one (its layers),
    is walked through its public attributes; ``seen`` stops reference cycles there."""
    if isinstance(obj, torch.Tensor):
        found[path] = obj
        return
    nodes = children(obj)
    if nodes is None and isinstance(obj, Mapping):
        nodes = [(key_name(pytree.MappingKey(key)), value) for key, value in obj.items()]
    if nodes is not None:
        for segment, child in nodes:
            walk(child, path + segment, found, in_cache, seen)
        return
    cache = cache_class()
    if (in_cache or (cache is not None and isinstance(obj, cache))) and id(obj) not in seen:
        seen.add(id(obj))
        for name, value in public_state(obj).items():
            walk(value, f"{path}.{name}", found, True, seen)


def map_outputs(fn: Callable[..., torch.Tensor], *outs: Any, path: str = ROOT) -> Any:
    """Apply ``fn(path, *tensors)`` to the matching tensors of parallel outputs, keeping their structure: a
    tensor, tuple (named too), list, or mapping (dict, transformers ModelOutput). ``path`` names each tensor
    as :func:`tensor_leaves` does. Other leaves pass through."""
    first = outs[0]
    if isinstance(first, torch.Tensor):
        return fn(path, *outs)
    if isinstance(first, Mapping):
        new = copy.copy(first)
        for key in first.keys():
            new[key] = map_outputs(fn, *(o[key] for o in outs), path=path + key_name(pytree.MappingKey(key)))
        return new
    if isinstance(first, (tuple, list)):
        fields = getattr(first, "_fields", None)
        segments = [f".{f}" for f in fields] if fields else [f"[{i}]" for i in range(len(first))]
        items = [map_outputs(fn, *parts, path=path + seg) for seg, parts in zip(segments, zip(*outs))]
        return type(first)(*items) if fields else type(first)(items)
    return first
