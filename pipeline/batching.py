"""Where the batch lies in each input and output tensor, and the row operations that follow it.

Most models take and return batch-first tensors, but not all: ``nn.GRU`` without ``batch_first``
takes (time, batch, features) and returns its last hidden state as (layers, batch, hidden). Each
input declares its batch dimension (``model.inputs.<name>.batch_dim``, ``tune(..., batch_dims=)``);
each output tensor's is found by running eager at two batch sizes and seeing which dimension
follows the batch (and, where lengths are tuned, its length dimension at two lengths: :mod:`pipeline.seqlen`). The router reads batch sizes there, graph backends pad, chunk and slice there,
and input sources build batches there.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import torch
from torch import nn

from pipeline.leaves import tensor_leaves
from pipeline.seqlen import SeqDims, probe_lengths

log = logging.getLogger(__name__)

# The batch sizes eager runs at to find each output's batch dimension: two, so the dimension that
# follows the batch is the one that changes; neither 1, which some models squeeze away.
PROBE_SIZES = (2, 3)


def tile(t: torch.Tensor, rows: int, dim: int = 0, start: int = 0) -> torch.Tensor:
    """A fresh contiguous tensor of ``rows`` rows along ``dim``: ``t``'s rows from ``start`` on, cycled."""
    index = (torch.arange(rows, device=t.device) + start) % t.shape[dim]
    return t.index_select(dim, index)


def per_sample(shape: Sequence[int], dim: int) -> torch.Size:
    """``shape`` without its batch dimension ``dim``."""
    return torch.Size(shape[:dim]) + torch.Size(shape[dim + 1:])


def layout(sample_shape: Sequence[int], dim: int) -> str:
    """A full shape with the batch in place, for messages: ``(batch, 3, 224)`` or ``(12, batch, 8)``."""
    parts = [str(int(s)) for s in sample_shape]
    parts.insert(dim, "batch")
    return f"({', '.join(parts)})"


@dataclass(frozen=True)
class BatchDims:
    """The batch dimension of each input (by name, 0 unless declared) and of each output tensor
    (by its path in the output, as :func:`pipeline.leaves.tensor_leaves` names it; None for
    one that does not follow the batch, such as a scalar or a tensor the same at every size). ``seq`` holds
    the length dimensions where the run tunes lengths (:mod:`pipeline.seqlen`), empty otherwise."""

    inputs: Mapping[str, int] = field(default_factory=dict)
    outputs: Mapping[str, Optional[int]] = field(default_factory=dict)
    seq: SeqDims = field(default_factory=SeqDims)

    @classmethod
    def of(cls, spec: Mapping[str, Mapping[str, Any]], outputs: Optional[Mapping[str, Optional[int]]] = None,
           seq: Optional[SeqDims] = None) -> "BatchDims":
        """From a ``model.inputs`` spec and the outputs' dimensions found by :func:`output_batch_dims`."""
        return cls({name: int(s.get("batch_dim", 0)) for name, s in spec.items()}, dict(outputs or {}),
                   seq or SeqDims())

    def input(self, name: str) -> int:
        return self.inputs.get(name, 0)

    def output(self, path: str, t: torch.Tensor, size: int) -> Optional[int]:
        """The batch dimension of the output tensor ``t`` at ``path`` of a ``size``-row call. Where the
        outputs were never probed (a backend built directly), one whose first dimension is ``size``."""
        if path in self.outputs:
            return self.outputs[path]
        return 0 if t.dim() and t.shape[0] == size else None


def following_dim(small: torch.Tensor, large: torch.Tensor, sizes: Sequence[int] = PROBE_SIZES) -> Optional[int]:
    """The one dimension that holds as many entries as the call at both probes (batch sizes, or lengths), or None."""
    if small.dim() != large.dim():
        return None
    dims = [d for d in range(small.dim()) if (small.shape[d], large.shape[d]) == tuple(sizes)]
    return dims[0] if len(dims) == 1 else None


def probed_dims(model: nn.Module, inputs_at: Callable[[int], Dict[str, torch.Tensor]], probes: Sequence[int]
                ) -> Tuple[Dict[str, Optional[int]], List[str]]:
    """Each output tensor's dimension that follows what ``inputs_at`` varies (the batch, or the length), from
    eager's outputs at the two ``probes``; and the tensors that change along no single dimension."""
    with torch.inference_mode():
        small, large = (tensor_leaves(model(**inputs_at(p))) for p in probes)
    dims = {path: following_dim(t, large[path], probes) if path in large else None for path, t in small.items()}
    odd = [f"{path} {tuple(t.shape)} -> {tuple(large[path].shape)}" for path, t in small.items()
           if dims[path] is None and path in large and t.shape != large[path].shape]
    return dims, odd


def output_batch_dims(model: nn.Module, inputs_at: Callable[[int], Dict[str, torch.Tensor]]) -> Dict[str, Optional[int]]:
    """Each output tensor's batch dimension, from eager's outputs at the two probe sizes. A tensor that
    changes with the batch along no single dimension (flattened rows, a batch x batch matrix) gets None
    and a warning: graph backends cannot pad or chunk it, and their self-check will say where."""
    dims, odd = probed_dims(model, inputs_at, PROBE_SIZES)
    if odd:
        log.warning("output tensors change with the batch size (%d -> %d rows) along no single dimension, so graph "
                    "backends cannot pad or chunk them: %s", *PROBE_SIZES, "; ".join(odd))
    return dims


def output_seq_dims(model: nn.Module, inputs_at: Callable[[int], Dict[str, torch.Tensor]],
                    lengths: Sequence[int]) -> Dict[str, Optional[int]]:
    """Each output tensor's length dimension (``inputs_at`` takes a length), from eager's outputs at two lengths
    (:func:`pipeline.seqlen.probe_lengths`). A tensor that changes with the length along no single dimension (an
    attention map, L x L) gets None and a warning: a padded call cannot be cut back there, so padding fails its check."""
    probes = probe_lengths(lengths)
    if not probes:
        return {}
    dims, odd = probed_dims(model, inputs_at, probes)
    if odd:
        log.warning("output tensors change with the length (%d -> %d) along no single dimension, so a padded call "
                    "cannot be cut back to its length there: %s", *probes, "; ".join(odd))
    return dims
