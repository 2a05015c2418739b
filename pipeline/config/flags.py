"""Boolean settings that hold what was written: true or false, never "yes".

OmegaConf reads the strings "yes", "on", "1" (and the integer 1) into a ``bool`` field as true, so a
``cast_weights: "yes"`` or ``compile_cache.shared=on`` would pass composition as a decision nobody wrote in
those words. Hydra therefore composes from :func:`loose` copies of the schemas, whose boolean fields take
any value, and :func:`problem` (the early checks, and every backend's settings, checkpoints included)
refuses anything but a real boolean there, in one line naming the key. The same copies hold two types OmegaConf
cannot (:func:`composable`): a ``Literal`` (a precision) as the type of its values, a read-only ``Mapping`` as a dict.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import functools
import sys
import typing
from typing import Any, Mapping, Optional

FLAG_TYPES = (bool, Optional[bool])


def composable(tp: Any) -> Any:
    """``tp`` as OmegaConf can type a field: a ``Literal`` as the type of its values (checked where the value is
    parsed, e.g. ``precisions.parse``), a ``Mapping`` as a ``Dict`` of the same keys and values; others as they are."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Literal:
        return type(args[0])
    if origin is collections.abc.Mapping:
        return typing.Dict[args]
    return tp


def _nested(tp: Any) -> Optional[type]:
    """The dataclass a field holds, where it holds one (plain or Optional)."""
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    candidate = args[0] if typing.get_origin(tp) is typing.Union and len(args) == 1 else tp
    return candidate if dataclasses.is_dataclass(candidate) else None


@functools.lru_cache(maxsize=None)
def loose(schema: type) -> type:
    """``schema`` (a dataclass) with every boolean field typed ``Any`` and every other as OmegaConf can type it
    (:func:`composable`), nested dataclasses likewise, defaults kept:
    ``Loose<Name>`` in the schema's module, which must build it when imported (so a process that unpickles it
    finds it there)."""
    hints = typing.get_type_hints(schema)
    specs = []
    for f in dataclasses.fields(schema):
        tp, nested = hints[f.name], _nested(hints[f.name])
        if tp in FLAG_TYPES:
            tp = Any
        tp = composable(tp)
        if nested is not None:
            tp = loose(nested) if tp is nested else Optional[loose(nested)]
        kwargs: dict = {}
        if nested is not None and f.default_factory is nested:
            kwargs["default_factory"] = loose(nested)
        elif f.default is not dataclasses.MISSING:
            kwargs["default"] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            kwargs["default_factory"] = f.default_factory
        specs.append((f.name, tp, dataclasses.field(**kwargs)))
    made = dataclasses.make_dataclass(f"Loose{schema.__name__}", specs)
    made.__module__, made.__qualname__, made.__doc__ = schema.__module__, f"Loose{schema.__qualname__}", schema.__doc__
    made.__name__ = schema.__name__  # what composition errors print ("Key 'x' not in 'ProfileConfig'")
    # Importable by name beside its schema: pickle (a fresh-process launcher sends the ConfigStore to its jobs)
    # then refers to it instead of copying it, and a copy loses dataclasses.MISSING on the fields without default.
    setattr(sys.modules[schema.__module__], made.__qualname__, made)
    return made


def problem(values: Mapping[str, Any], schema: type, where: str = "") -> Optional[str]:
    """The first boolean field of ``schema`` whose value in ``values`` (plain data) is not a boolean, in one line
    naming the key and the fix; nested dataclasses are walked. None where every flag is true, false (or null
    where the field is optional)."""
    hints = typing.get_type_hints(schema)
    for f in dataclasses.fields(schema):
        if f.name not in values:
            continue
        value, tp, key = values[f.name], hints[f.name], f"{where}{f.name}"
        if tp in FLAG_TYPES and not isinstance(value, bool) and not (value is None and tp is not bool):
            return f"{key}={value!r} is not a boolean; write true or false" + ("" if tp is bool else " (or null)")
        nested = _nested(tp)
        if nested is not None and isinstance(value, Mapping):
            found = problem(value, nested, f"{key}.")
            if found:
                return found
    return None
