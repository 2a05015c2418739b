"""Sequence length: a second routed dimension beside the batch, for models served at every length.

An input may name a length dimension (``model.inputs.<name>.seq_dim``, ``tune(..., seq_dims=)``) and the
run its tuned lengths (``model.seq_lens``). Every profile cell is then a (batch size, length) pair, and
the route a (batch range x length range) table. A call at an untuned length is padded up to the next
tuned one (each input with its own pad value: the pad id for token ids, 0 for masks) and its outputs are
cut back to the real length, along each output's length dimension, found by running eager at two
lengths as batch dimensions are (``pipeline.batching.output_seq_dims``). Padding is proved per backend at capture,
never assumed: a backend whose padded outputs differ from eager's at the exact length serves tuned
lengths only, or untuned ones unpadded where it runs any length (eager, Inductor with the length
dynamic, the exported runtimes).

A run without tuned lengths keys its cells by batch size alone (an ``int``), exactly as before; with
them, by ``(batch size, length)``. The helpers here turn either key into words, metric names and parts.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import torch

from pipeline.leaves import map_outputs

# A profile cell: a batch size, or (batch size, length) where the run tunes lengths.
Key = Union[int, Tuple[int, int]]
# The batch size eager runs at to find each output's length dimension (two rows: a squeezed batch of one is no help).
PROBE_BATCH = 2


def batch_of(key: Key) -> int:
    return key if isinstance(key, int) else key[0]


def length_of(key: Key) -> Optional[int]:
    """The key's length, or None for a run without a length dimension."""
    return None if isinstance(key, int) else key[1]


def label(key: Key) -> str:
    """``bs=8``, or ``bs=8 len=64``, for logs and messages."""
    return f"bs={key}" if isinstance(key, int) else f"bs={key[0]} len={key[1]}"


def words(key: Key) -> str:
    """``batch size 8``, or ``batch size 8 length 64``, in reasons."""
    return f"batch size {key}" if isinstance(key, int) else f"batch size {key[0]} length {key[1]}"


def metric_suffix(key: Key) -> str:
    """The end of a cell's MLflow metric names: ``bs8``, or ``bs8/len64``."""
    return f"bs{key}" if isinstance(key, int) else f"bs{key[0]}/len{key[1]}"


def cells(batch_sizes: Sequence[int], lengths: Sequence[int]) -> List[Key]:
    """Every tuned cell: the batch sizes, or each batch size at each length, ascending."""
    sizes = sorted({int(b) for b in batch_sizes})
    return sizes if not lengths else [(b, int(n)) for b in sizes for n in sorted({int(n) for n in lengths})]


def per_sample_index(seq_dim: int, batch_dim: int) -> int:
    """Where the length lies in an input's per-sample shape (the full tensor without its batch dimension)."""
    return seq_dim - 1 if seq_dim > batch_dim else seq_dim


def spec_at(spec: Mapping[str, Mapping[str, Any]], length: Optional[int]) -> Dict[str, Dict[str, Any]]:
    """``model.inputs`` with every length dimension at ``length`` (the spec as it is for None)."""
    out = {name: dict(s) for name, s in spec.items()}
    if length is None:
        return out
    for s in out.values():
        if s.get("seq_dim") is not None:
            shape = list(s["shape"])
            shape[per_sample_index(int(s["seq_dim"]), int(s.get("batch_dim", 0)))] = int(length)
            s["shape"] = shape
    return out


def declared(spec: Mapping[str, Mapping[str, Any]], lengths: Sequence[int]) -> Dict[str, Dict[str, Any]]:
    """``model.inputs`` with ``seq_dim`` and ``pad`` kept only where lengths are tuned, on inputs that have a length
    dimension: a run and its checkpoint hold such an input as it is, and any other as it always was."""
    return {name: {k: v for k, v in s.items()
                   if k not in ("seq_dim", "pad") or (lengths and s.get("seq_dim") is not None)}
            for name, s in spec.items()}


def resized(t: torch.Tensor, length: int, dim: int, pad: float) -> torch.Tensor:
    """``t`` at ``length`` along ``dim``: its first ``length`` entries (a contiguous copy, as a caller's tensor is),
    or all of them followed by ``pad``."""
    have = t.shape[dim]
    if have >= length:
        return t.narrow(dim, 0, length).contiguous() if have > length else t
    shape = list(t.shape)
    shape[dim] = length - have
    return torch.cat([t, torch.full(shape, pad, dtype=t.dtype, device=t.device)], dim)


def padding_probes(lengths: Sequence[int]) -> Dict[int, int]:
    """Tuned length -> the untuned length capture pads up to it to prove padding: the shortest of its band
    (one above the tuned length below), which pads the most; the middle of the first band, a plausible short
    request. A tuned length of 1 (or one right above another) has no untuned length below it."""
    probes, below = {}, 0
    for n in sorted(lengths):
        probe = below + 1 if below else (n + 1) // 2
        if probe < n:
            probes[n] = probe
        below = n
    return probes


def between(lengths: Sequence[int]) -> List[int]:
    """An untuned length in every band (the middle between a tuned length and the one below): what
    validate checks besides the tuned lengths, padded where its owner pads."""
    out, below = [], 0
    for n in sorted(lengths):
        middle = (below + n + 1) // 2
        if below < middle < n:
            out.append(middle)
        below = n
    return out


def probe_lengths(lengths: Sequence[int]) -> Tuple[int, ...]:
    """Two lengths eager runs at to find each output's length dimension: the two shortest tuned ones, or one
    below a single tuned length; none for a single length of 1."""
    ordered = sorted(set(int(n) for n in lengths))
    if len(ordered) >= 2:
        return tuple(ordered[:2])
    return (ordered[0] - 1, ordered[0]) if ordered and ordered[0] > 1 else ()


@dataclass(frozen=True)
class SeqDims:
    """The length dimension of each input that has one (by name, in the full tensor) and its pad value; each
    output tensor's (by path; None for one that does not follow the length); and the tuned lengths,
    ascending. Empty (false) for a model without a length dimension."""

    inputs: Mapping[str, int] = field(default_factory=dict)
    pads: Mapping[str, float] = field(default_factory=dict)
    outputs: Mapping[str, Optional[int]] = field(default_factory=dict)
    lengths: Tuple[int, ...] = ()

    @classmethod
    def of(cls, spec: Mapping[str, Mapping[str, Any]], lengths: Sequence[int],
           outputs: Optional[Mapping[str, Optional[int]]] = None) -> "SeqDims":
        """From a ``model.inputs`` spec (``seq_dim``, ``pad``), the tuned lengths and the outputs' length dimensions."""
        if not lengths:
            return cls()
        inputs = {name: int(s["seq_dim"]) for name, s in spec.items() if s.get("seq_dim") is not None}
        return cls(inputs, {name: spec[name].get("pad", 0) for name in inputs}, dict(outputs or {}),
                   tuple(sorted({int(n) for n in lengths})))

    def __bool__(self) -> bool:
        return bool(self.lengths)

    def with_lengths(self, lengths: Sequence[int]) -> "SeqDims":
        """The same dimensions, serving only ``lengths`` (a backend built for part of the table)."""
        return SeqDims(self.inputs, self.pads, self.outputs, tuple(sorted({int(n) for n in lengths})))

    def length(self, inputs: Mapping[str, torch.Tensor]) -> int:
        """The length of a call: that of its first input with a length dimension."""
        name = next(n for n in inputs if n in self.inputs)
        return int(inputs[name].shape[self.inputs[name]])

    def target(self, length: int) -> Optional[int]:
        """The tuned length a call of ``length`` pads to (itself where tuned), or None above the largest."""
        i = bisect_left(self.lengths, length)
        return self.lengths[i] if i < len(self.lengths) else None

    def resized(self, inputs: Mapping[str, torch.Tensor], length: int) -> Dict[str, torch.Tensor]:
        """Every input with a length dimension cut or padded to ``length`` (its pad value); others as they are."""
        return {name: resized(t, length, self.inputs[name], self.pads[name]) if name in self.inputs else t
                for name, t in inputs.items()}

    def cut(self, out: Any, length: int) -> Any:
        """A padded call's output cut back to ``length`` along each output tensor's length dimension (views)."""

        def one(path: str, t: torch.Tensor) -> torch.Tensor:
            dim = self.outputs.get(path)
            return t if dim is None or t.dim() <= dim or t.shape[dim] <= length else t.narrow(dim, 0, length)

        return map_outputs(one, out)
