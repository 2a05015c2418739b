"""The attention kernels a candidate may force on ``torch.nn.functional.scaled_dot_product_attention`` (SDPA).

PyTorch picks one of its SDPA kernels per call (FlashAttention, memory-efficient, cuDNN, or the math composition)
by a fixed priority and the call's shapes, dtype and mask; the fastest one for a model on a device is often another
(a masked BERT gets the memory-efficient kernel where cuDNN's takes the mask too). No user writes
``sdpa_kernel(...)`` around their model by hand, so the top-level ``attention`` list makes it a routed choice, as
``precision`` makes numerics one: each entry besides ``default`` (PyTorch's own choice) gives every PyTorch backend
one more candidate that runs with that kernel alone (``<candidate>.sdpa-<kernel>``; a backend's ``attention`` key).
:func:`parse` is the one door from config and checkpoint to the typed value. What the kernel does to a call:
``pipeline.backends.attention``.
"""

from __future__ import annotations

import reprlib
import typing
from typing import Any, List, Literal, Optional, Sequence, Tuple

from pipeline.config import limits
from pipeline.errors import ConfigError

Kernel = Literal["flash", "efficient", "cudnn", "math"]  # torch.nn.attention.SDPBackend, by its short name
KERNELS: Tuple[Kernel, ...] = typing.get_args(Kernel)
CUDA_ONLY = frozenset({"efficient", "cudnn"})  # PyTorch has FlashAttention and the math kernel on the CPU too
DEFAULT = "default"  # the attention list's entry for PyTorch's own choice
EXAMPLE = "'attention=[default,cudnn]'"


def parse(value: Any, where: str) -> Kernel:
    """``value`` as a :data:`Kernel`, or a ConfigError ``<where>=<value> is unknown`` naming the valid ones."""
    if isinstance(value, str) and value in KERNELS:
        return KERNELS[KERNELS.index(value)]
    raise ConfigError(f"{where}={reprlib.repr(value)} is unknown; use one of {list(KERNELS)} (or leave it null: "
                      f"PyTorch's own choice)")


def parse_list(values: Sequence[Any]) -> List[Optional[Kernel]]:
    """The top-level ``attention`` list: ``default`` as None (PyTorch's choice), each other entry a kernel; each
    known, none twice, at least one."""
    problem = limits.choices_problem("attention", list(values), (DEFAULT, *KERNELS), "attention kernel", EXAMPLE)
    if problem:
        raise ConfigError(problem)
    return [None if value == DEFAULT else parse(value, "attention") for value in values]


def device_problem(kernel: Optional[Kernel], device_type: str) -> Optional[str]:
    """Why ``kernel`` cannot run on a ``device_type`` device at all (asked before any work), or None."""
    if kernel in CUDA_ONLY and device_type != "cuda":
        return (f"attention kernel {kernel} runs on CUDA alone; on {device_type} PyTorch has "
                f"{[k for k in KERNELS if k not in CUDA_ONLY]}")
    return None
