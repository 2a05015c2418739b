"""Eager's outputs that backends are checked against, from inputs whose output can tell right from wrong.

A model with random weights can answer some inputs with an output that proves nothing (constant,
zero to the float type's precision, NaN), so each batch size tries input sources in order until
eager's output can judge a backend. The sources are the user's own example rows where there are
any (``pipeline.tune``'s ``example_inputs``, ``model.examples``), then the random fills of
``model.inputs`` at the run's seed and the next seeds, for config-named models without data.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import torch
from torch import nn

from pipeline.batching import tile
from pipeline.measure.compare import uninformative
from pipeline.models import make_inputs
from pipeline.seqlen import Key, batch_of, label, length_of, resized, spec_at

log = logging.getLogger(__name__)

RANDOM_SEEDS = 3  # seeds of the random fills tried: the run's seed and the two after it

# A label for logs and reasons, and cell (a batch size, or (batch size, length)) -> inputs.
InputSource = Tuple[str, Callable[[Key], Dict[str, torch.Tensor]]]


@dataclass(frozen=True)
class Reference:
    """Eager's output for one batch of inputs, and why it cannot judge a backend ('' when it can)."""

    inputs: Dict[str, torch.Tensor]
    output: Any
    source: str
    uninformative: str


def random_fill(spec: Mapping[str, Any], device: torch.device, seed: int) -> Callable[[Key], Dict[str, torch.Tensor]]:
    """Cell -> the random fill of ``spec`` (``model.inputs``) at ``seed``, at the cell's length where it has one."""
    def fill(key: Key) -> Dict[str, torch.Tensor]:
        return make_inputs(spec_at(spec, length_of(key)), batch_of(key), device, seed)

    return fill


def random_fills(spec: Mapping[str, Any], device: torch.device, seed: int,
                 count: int = RANDOM_SEEDS) -> List[InputSource]:
    """The random fills of ``spec`` (``model.inputs``) at ``seed`` and the ``count - 1`` seeds after it."""
    return [(f"random inputs of seed {s}", random_fill(spec, device, s)) for s in range(seed, seed + count)]


def example_rows(examples: Mapping[str, torch.Tensor], spec: Mapping[str, Any], start: int = 0) -> InputSource:
    """Batches of the user's example rows, from row ``start`` on and cycled, along each input's batch dimension;
    at a cell's length, each input with a length dimension cut to it or padded with its pad value."""
    def rows(key: Key) -> Dict[str, torch.Tensor]:
        out = {name: tile(t, batch_of(key), int(spec[name].get("batch_dim", 0)), start) for name, t in examples.items()}
        length = length_of(key)
        if length is None:
            return out
        return {name: t if spec[name].get("seq_dim") is None
                else resized(t, length, int(spec[name]["seq_dim"]), spec[name].get("pad", 0))
                for name, t in out.items()}

    return (f"your example inputs (from row {start})", rows)


def input_sources(spec: Mapping[str, Any], examples: Mapping[str, torch.Tensor], device: torch.device, seed: int,
                  start: int = 0) -> List[InputSource]:
    """The user's example rows from row ``start`` where there are any, then the random fills at ``seed`` on.
    The first source is what the model is tuned and timed on."""
    own = [example_rows(examples, spec, start)] if examples else []
    return own + random_fills(spec, device, seed)


def reference_at(model: nn.Module, key: Key, sources: Sequence[InputSource],
                 compute_dtype: Optional[torch.dtype] = None, tolerance_scale: float = 1.0) -> Reference:
    """Eager's output at the cell ``key`` (a batch size, or (batch size, length)) from the first source whose
    output can judge a backend computing in ``compute_dtype``; when none can, the last one tried (``sources``
    holds at least one), with the reason."""
    first = None
    for source, make in sources:
        inputs = make(key)
        with torch.inference_mode():
            output = model(**inputs)
        reference = Reference(inputs, output, source, uninformative(output, compute_dtype, tolerance_scale))
        first = first or reference
        if not reference.uninformative:
            if reference is not first:
                log.info("eager's output at %s proves nothing on %s (%s); checking on %s instead",
                         label(key), first.source, first.uninformative, source)
            break
    return reference
