"""What a run may tune and a checkpoint may hold, written down once: batch sizes, input specs, memory.

The config checks (``pipeline.preflight.checks``) and the checkpoint payload check (``pipeline.route.payload``) share
these bounds, so a checkpoint can never ask ``load`` for more than a config could ask a run for.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Optional, Sequence

import torch

from pipeline import devices
from pipeline.models import DTYPES, FILLS

# The largest batch size tweakpipe tunes, routes or rebuilds: the router keeps a table entry per
# size up to its last range's start, and loading builds each backend for every size it owns.
MAX_BATCH_SIZE = 1 << 16
MAX_TUNED_SIZES = 256  # batch sizes one run profiles; a route has at most one range per tuned size
MAX_BACKENDS = 64  # competing backends of a run, and backends of a checkpoint (each is built on load)
MAX_INPUTS = 64  # named inputs of one model
MAX_INPUT_DIMS = 8  # dimensions of one input's per-sample shape
MAX_RANDINT_HIGH = 1 << 62  # randint draws in [0, high)
MAX_THREADS = 1024  # CPU threads of a run (top-level threads) or of one backend's runtime
MAX_OUTPUT_TENSORS = 4096  # tensors in one output whose batch dimension a checkpoint records
MAX_TENSOR_DIMS = 64  # a batch dimension is below this
MAX_PATH_CHARS = 1000  # an output tensor's path (output.hidden_states[3])
# The longest sequence length tweakpipe tunes or serves (the router keeps a table entry per length up to the
# largest tuned one), and how many lengths one run tunes.
MAX_SEQ_LEN = 1 << 16
MAX_TUNED_LENGTHS = 64
MAX_GRAPHS = 1 << 16  # device graphs one graph backend records (max_graphs)
# A run holds two batches of inputs at the largest size at once (capture's sample and the batch it checks).
INPUT_COPIES = 2


def is_int(value: Any) -> bool:
    """An integer and not a bool (``True`` is an int to Python, never a size to us)."""
    return isinstance(value, int) and not isinstance(value, bool)


def choices_problem(key: str, values: Sequence[Any], valid: Sequence[str], what: str, example: str) -> Optional[str]:
    """Why ``values``, the list under ``key``, is not some of the ``valid`` names (each a ``what``), each once: one
    line naming them and an ``example``; None where it is."""
    if not values:
        return f"{key}=[] names no {what}; e.g. {example}"
    unknown = [v for v in values if v not in valid]
    if unknown:
        return f"{key} {unknown[0]!r} is unknown; use some of {list(valid)}, e.g. {example}"
    repeated = sorted({str(v) for v in values if list(values).count(v) > 1})
    if repeated:
        return f"{key} lists {repeated[0]} more than once; name each once, e.g. {example}"
    return None


def batch_size_problem(value: Any, where: str) -> Optional[str]:
    """Why ``value`` is not a batch size tweakpipe handles (an integer in 1..MAX_BATCH_SIZE), or None."""
    if not is_int(value) or not 1 <= value <= MAX_BATCH_SIZE:
        return f"{where}={value!r} is not a batch size (an integer from 1 to {MAX_BATCH_SIZE})"
    return None


def lengths_problem(lengths: Any, where: str, ascending: bool = False) -> Optional[str]:
    """Why ``lengths`` are not tuned sequence lengths (1 to MAX_TUNED_LENGTHS integers from 1 to MAX_SEQ_LEN,
    distinct; ``ascending`` where a checkpoint holds them), or None."""
    if not isinstance(lengths, (list, tuple)) or not 1 <= len(lengths) <= MAX_TUNED_LENGTHS:
        return f"{where} must list 1 to {MAX_TUNED_LENGTHS} sequence lengths, e.g. {where}=[32,128,512]"
    for i, n in enumerate(lengths):
        if not is_int(n) or not 1 <= n <= MAX_SEQ_LEN:
            return f"{where}[{i}]={n!r} is not a sequence length (an integer from 1 to {MAX_SEQ_LEN})"
    if len(set(lengths)) != len(lengths) or (ascending and list(lengths) != sorted(lengths)):
        return f"{where}={list(lengths)} must be {'ascending and ' if ascending else ''}without repeats"
    return None


def threads_problem(value: Any, where: str) -> Optional[str]:
    """Why ``value`` is not a thread count (null, or an integer in 1..MAX_THREADS), or None."""
    if value is not None and (not is_int(value) or not 1 <= value <= MAX_THREADS):
        return f"{where}={value!r} is not a thread count (an integer from 1 to {MAX_THREADS}, or null for the default)"
    return None


def input_problem(name: str, spec: Mapping[str, Any]) -> Optional[str]:
    """Why one input spec (``{shape, dtype, fill, high, batch_dim}``) cannot make sample inputs, or None."""
    extra = sorted(set(spec) - {"shape", "dtype", "fill", "high", "batch_dim", "seq_dim", "pad"})
    shape = spec.get("shape")
    if extra:
        return (f"input {name!r} has unknown keys {extra}; an input spec holds shape, dtype, fill, high, batch_dim, "
                f"seq_dim and pad")
    if not isinstance(shape, (list, tuple)) or len(shape) > MAX_INPUT_DIMS \
            or not all(is_int(d) and d >= 0 for d in shape):
        return (f"input {name!r}: shape={shape!r} must be a list of at most {MAX_INPUT_DIMS} non-negative integers "
                f"(the per-sample shape, without the batch dimension), e.g. shape: [3, 224, 224]")
    if spec.get("dtype") not in DTYPES:
        return f"input {name!r}: unknown dtype {spec.get('dtype')!r}; use one of {sorted(DTYPES)}"
    if spec.get("fill", "randn") not in FILLS:
        return f"input {name!r}: unknown fill {spec.get('fill')!r}; use one of {list(FILLS)}"
    if spec.get("fill") == "mask" and not shape:
        return f"input {name!r}: fill mask pads along the last per-sample dimension, and shape={shape!r} has none"
    high = spec.get("high", 2)
    if not is_int(high) or not 1 <= high <= MAX_RANDINT_HIGH:
        return f"input {name!r}: high={high!r} must be an integer from 1 to {MAX_RANDINT_HIGH} (randint draws in [0, high))"
    dim = spec.get("batch_dim", 0)
    if not is_int(dim) or not 0 <= dim <= len(shape):
        return (f"input {name!r}: batch_dim={dim!r} must be an integer from 0 to {len(shape)} (where the batch goes "
                f"among the {len(shape)} per-sample dimensions of shape={list(shape)}; 0 is batch-first)")
    return seq_problem(name, spec, len(shape), dim)


def seq_problem(name: str, spec: Mapping[str, Any], dims: int, batch_dim: int) -> Optional[str]:
    """Why an input's length dimension (``seq_dim``, in the full tensor of ``dims + 1`` dimensions) or its
    ``pad`` value is not one, or None."""
    seq, pad = spec.get("seq_dim"), spec.get("pad", 0)
    if seq is not None and (not is_int(seq) or not 0 <= seq <= dims or seq == batch_dim):
        return (f"input {name!r}: seq_dim={seq!r} must be a dimension of the full tensor (0 to {dims}) other than "
                f"its batch_dim {batch_dim}, e.g. seq_dim=1 for batch-first token ids")
    if (isinstance(pad, bool) or not isinstance(pad, (int, float)) or not math.isfinite(pad)
            or abs(pad) > MAX_RANDINT_HIGH):
        return f"input {name!r}: pad={pad!r} must be a finite number (the value a padded call fills in: the pad id, 0)"
    return None


def output_dims_problem(dims: Any, where: str = "output_batch_dims") -> Optional[str]:
    """Why ``dims`` (output tensor path -> batch, or length, dimension or None) is not what a tuned model found,
    or None."""
    if not isinstance(dims, Mapping) or len(dims) > MAX_OUTPUT_TENSORS:
        return f"{where} must map at most {MAX_OUTPUT_TENSORS} output tensor paths to dimensions"
    for path, dim in dims.items():
        if not isinstance(path, str) or not path.startswith("output") or len(path) > MAX_PATH_CHARS:
            return f"{where} key {str(path)[:80]!r} is not an output tensor's path (output.logits, output[0])"
        if dim is not None and (not is_int(dim) or not 0 <= dim < MAX_TENSOR_DIMS):
            return f"{where}[{path!r}]={dim!r} must be a dimension from 0 to {MAX_TENSOR_DIMS - 1}, or null"
    return None


def inputs_problem(inputs: Any) -> Optional[str]:
    """Why a model's inputs (name -> spec) cannot make sample inputs, or None."""
    if not isinstance(inputs, Mapping) or not 1 <= len(inputs) <= MAX_INPUTS:
        return f"inputs must map 1 to {MAX_INPUTS} input names to their specs"
    for name, spec in inputs.items():
        problem = input_problem(str(name), spec) if isinstance(spec, Mapping) else f"input {name!r} is not a spec"
        if problem:
            return problem
    return None


def sample_bytes(inputs: Mapping[str, Mapping[str, Any]]) -> int:
    """Bytes of one sample of every input."""
    return sum(math.prod(spec["shape"]) * DTYPES[spec["dtype"]].itemsize for spec in inputs.values())


def _gib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB"


def memory_problem(inputs: Mapping[str, Mapping[str, Any]], batch_size: int, device: torch.device) -> Optional[str]:
    """Why the inputs at ``batch_size`` do not fit ``device``'s available memory (no model counted yet), or None."""
    batch = sample_bytes(inputs) * batch_size
    have = devices.available_memory_bytes(device)
    if have is None or INPUT_COPIES * batch <= have:
        return None
    per_sample = ", ".join(f"{name}: {list(spec['shape'])} {spec['dtype']}" for name, spec in inputs.items())
    return (f"at batch size {batch_size} the inputs alone take {_gib(batch)} ({per_sample} per sample) and a run holds "
            f"{INPUT_COPIES} such batches at once, more than the {_gib(have)} {device.type} has available")
