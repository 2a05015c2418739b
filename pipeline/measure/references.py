"""Eager's outputs that backends are checked against, from inputs whose output can tell right from wrong.

A model with random weights can answer some inputs with an output that proves nothing (constant,
zero to the float type's precision, NaN), so each batch size tries input sources in order until
eager's output can judge a backend. The sources are the user's own example rows where there are
any (``pipeline.tune``'s ``example_inputs``, ``model.examples``), then the random fills of
``model.inputs`` at the run's seed and the next seeds, for config-named models without data. Where
eager's output on the user's rows holds NaN or inf, that is the reference: the model answers so on
the data it is tuned for, and random fills that happen to give finite outputs would hide it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import torch
from torch import nn

from pipeline.batching import PROBE_SIZES, tile
from pipeline.batching import layout as layout_of
from pipeline.measure.compare import UNCHECKABLE, judge, uninformative
from pipeline.models import make_inputs
from pipeline.seqlen import Key, batch_of, length_of, resized, spec_at
from pipeline.seqlen import label as cell_label

log = logging.getLogger(__name__)

RANDOM_SEEDS = 3  # seeds of the random fills tried: the run's seed and the two after it
OWN_ROWS = "your example inputs"  # the label of the user's rows

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

    return (f"{OWN_ROWS} (from row {start})", rows)


def input_sources(spec: Mapping[str, Any], examples: Mapping[str, torch.Tensor], device: torch.device, seed: int,
                  start: int = 0) -> List[InputSource]:
    """The user's example rows from row ``start`` where there are any, then the random fills at ``seed`` on.
    The first source is what the model is tuned and timed on."""
    own = [example_rows(examples, spec, start)] if examples else []
    return own + random_fills(spec, device, seed)


def same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two tensors hold the same bytes (NaN equal to itself, unlike ``torch.equal``)."""
    flat = [t.detach().reshape(-1).contiguous() for t in (a, b)]
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(*(t.view(torch.uint8) for t in flat))


def length_problem(model: nn.Module, spec: Mapping[str, Any], source: InputSource, lengths: Sequence[int]) -> str:
    """Why eager cannot run the shortest or the longest tuned length ('' if it can): positions that end below it,
    or a length dimension that names an axis the model needs at one size (a feature axis)."""
    seq_inputs = sorted(n for n, s in spec.items() if s.get("seq_dim") is not None)
    for length in sorted({min(lengths), max(lengths)}):
        try:
            with torch.inference_mode():
                model(**source[1]((PROBE_SIZES[0], length)))
        except Exception as exc:  # noqa: BLE001 -- whatever the model raises, the length is what it was given
            message = (str(exc).strip().splitlines() or [""])[0][:300]
            positions = getattr(getattr(model, "config", None), "max_position_embeddings", None)
            limit = (f"its config's max_position_embeddings={positions}: tune lengths up to {positions}, "
                     if isinstance(positions, int) else "")
            return (f"eager fails at length {length} ({type(exc).__name__}: {message}), cutting or padding "
                    f"{', '.join(seq_inputs)} along its length dimension: the model does not take that length. "
                    f"Either its positions end below it ({limit}model.seq_lens / seq_lens= in pipeline.tune), or the "
                    f"length dimension names an axis the model needs at one size, such as features "
                    f"(model.inputs.<name>.seq_dim / seq_dims= in pipeline.tune)")
    return ""


def eager_problem(model: nn.Module, spec: Mapping[str, Any], source: InputSource, lengths: Sequence[int] = ()) -> str:
    """Why eager itself cannot be the reference on the batches of ``source`` ('' if it can): it fails on them
    (at the tuned ``lengths`` too), writes into them, or answers the same inputs differently from one call to the
    next (a call counter, randomness). Every backend is held to eager on the same batch many times over, so each
    would make every backend fail for a reason that is the model's; asked before anything is built."""
    if lengths:
        problem = length_problem(model, spec, source, lengths)
        if problem:
            return problem
    size = PROBE_SIZES[0]
    label, inputs = f"{source[0]} at batch size {size}", source[1](size)
    layout = ", ".join(f"{n}: {layout_of(s['shape'], int(s.get('batch_dim', 0)))} {s['dtype']}" for n, s in spec.items())
    kept = {name: t.clone() for name, t in inputs.items()}
    try:
        with torch.inference_mode():
            first = model(**inputs)
    except Exception as exc:  # noqa: BLE001 -- whatever the model raises, the inputs are what it was given
        message = (str(exc).strip().splitlines() or [""])[0][:300]
        return (f"eager fails on {label} ({type(exc).__name__}: {message}); the inputs are {layout}: check each "
                f"input's per-sample shape, dtype and batch dimension (model.inputs.<name>.batch_dim, "
                f"batch_dims= in pipeline.tune)")
    changed = [name for name, t in inputs.items() if not same_bytes(t, kept[name])]
    if changed:
        return (f"the model writes into its input {changed[0]!r} (an in-place op on it in forward), so a batch is "
                f"not the same batch when it is called again and every backend would disagree with eager; copy "
                f"it first in forward ({changed[0]} = {changed[0]}.clone())")
    with torch.inference_mode():
        second = model(**{name: t.clone() for name, t in kept.items()})
    verdict = judge(second, first)
    if not verdict.ok and not verdict.uninformative:
        return (f"the model answers the same inputs differently from one call to the next ({verdict.reason}): its "
                f"output depends on state its calls change (a counter, a cache), on randomness, or on dropout in "
                f"training mode; tweakpipe compares every backend with eager on the same inputs, so make forward "
                f"depend on its inputs alone")
    return ""


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
        if UNCHECKABLE in reference.uninformative and source.startswith(OWN_ROWS):
            break  # NaN or inf on the user's own data is the model's answer there: not replaced by random fills
        if not reference.uninformative:
            if reference is not first:
                log.info("eager's output at %s proves nothing on %s (%s); checking on %s instead",
                         cell_label(key), first.source, first.uninformative, source)
            break
    return reference
