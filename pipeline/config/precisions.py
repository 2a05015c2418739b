"""The precisions a candidate runs at, as one type: :data:`Precision`, a ``Literal`` of plain strings.

A precision arrives untyped: a backend's ``precision`` key (a run's config, or a checkpoint's stored backend), the
top-level ``precision`` list (config, command line, a bench's re-run), a resumed run's ``capture.json``. :func:`parse`
is the one door from there to the typed value, a one-line ConfigError naming the valid ones otherwise; past it
every signature says :data:`Precision`. Plain strings and not an Enum: a checkpoint stores a backend's settings as
plain data and loads them ``weights_only``, which unpickles no class of ours, so checkpoints written before load
as they did. What each precision means: ``pipeline.backends.precision``.
"""

from __future__ import annotations

import reprlib
import typing
from typing import Any, List, Literal, Sequence, Tuple

from pipeline.config import limits
from pipeline.errors import ConfigError

Reduced = Literal["bf16", "fp16"]  # autocast to that dtype, or (cast_weights) a copy of the model cast to it
Quantized = Literal["int8_weight_only", "int8_dynamic", "fp8"]  # torchao's recipes (pipeline.backends.quantize)
Precision = Literal["fp32", "tf32", Reduced, Quantized]
PRECISIONS: Tuple[Precision, ...] = typing.get_args(Precision)
EXAMPLE = "'precision=[fp32,bf16]'"


def parse(value: Any, where: str) -> Precision:
    """``value`` as a :data:`Precision` (the plain string itself), or a ConfigError ``<where>=<value> is unknown``
    naming the valid ones; a long value is shown cut short (a checkpoint's may be any string)."""
    if isinstance(value, str) and value in PRECISIONS:
        return PRECISIONS[PRECISIONS.index(value)]
    raise ConfigError(f"{where}={reprlib.repr(value)} is unknown; use one of {list(PRECISIONS)}")


def parse_list(values: Sequence[Any]) -> List[Precision]:
    """The top-level ``precision`` list as precisions: each known (:func:`parse`), none twice, at least one."""
    typed = [parse(value, "precision") for value in values]
    problem = limits.choices_problem("precision", typed, PRECISIONS, "precision", EXAMPLE)
    if problem:
        raise ConfigError(problem)
    return typed
