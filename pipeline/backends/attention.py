"""A forced attention kernel (``attention`` key, ``pipeline.config.attention``): the model run inside
``torch.nn.attention.sdpa_kernel`` of one kernel.

The context sits inside the module's forward (:class:`AttentionKernel`), so it holds wherever the model runs: an
eager call, a device graph's recording, and Dynamo, which traces it, so Inductor's program (and the standalone or
AOTInductor one a worker builds from the same module) calls that kernel's op. Before a candidate is built,
:func:`problem` runs the model once: a model that calls no SDPA would repeat the default candidate under another
name, and a kernel that cannot take the model's calls (memory-efficient and cuDNN run on CUDA alone, CUDA's
FlashAttention takes no arbitrary mask) fails there with PyTorch's reason; either way the candidate is excluded with
it, as any backend that cannot run.
"""

from __future__ import annotations

import contextlib
import warnings
from typing import Any, ContextManager, Dict, Optional

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.overrides import TorchFunctionMode

from pipeline.config.attention import Kernel

BACKENDS: Dict[Kernel, SDPBackend] = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
                                      "cudnn": SDPBackend.CUDNN_ATTENTION, "math": SDPBackend.MATH}


class AttentionKernel(nn.Module):
    """``inner`` with every scaled_dot_product_attention call on ``kernel`` alone."""

    def __init__(self, inner: nn.Module, kernel: Kernel) -> None:
        super().__init__()
        self.inner, self.kernel = inner, kernel

    def forced(self) -> ContextManager:
        """The context that holds every call of the attention op to this kernel."""
        return sdpa_kernel([BACKENDS[self.kernel]])

    def forward(self, **inputs: torch.Tensor) -> Any:
        with self.forced():
            return self.inner(**inputs)


def unwrapped(module: nn.Module) -> nn.Module:
    """The module under a forced kernel's wrapper (itself where there is none): what a graph capture that saves its
    program traces, inside :func:`held_around`."""
    return module.inner if isinstance(module, AttentionKernel) else module


def held_around(module: nn.Module) -> ContextManager:
    """The forced kernel's context (none without one) to hold around a saved program's trace and compile. Traced inside
    the forward, ``sdpa_kernel`` stays in Dynamo's graph as calls that set the kernel flags and set them back, and
    Inductor's standalone form cannot save a graph that holds them (``TypeError: 'NoneType' object is not callable``
    on torch 2.11 and 2.14); and an exported graph may keep the attention op whole, to be decomposed when compiled,
    after the forward's context has ended. Held around both, the op decomposes to the forced kernel's own op while
    the program is compiled, so the program calls that kernel with no context at all."""
    return module.forced() if isinstance(module, AttentionKernel) else contextlib.nullcontext()


class _Calls(TorchFunctionMode):
    """Counts calls of ``F.scaled_dot_product_attention`` (from Python: what transformers and timm call)."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.count += func is F.scaled_dot_product_attention
        return func(*args, **(kwargs or {}))


def calls(model: nn.Module, inputs: Dict[str, torch.Tensor]) -> int:
    """How many times one call of ``model`` on ``inputs`` calls ``F.scaled_dot_product_attention``: none, and no
    kernel choice changes it (capture asks once, before any compile job starts)."""
    counted = _Calls()
    with torch.inference_mode(), counted:
        model(**inputs)
    return counted.count


def no_calls(kernel: Kernel) -> str:
    return (f"attention={kernel}: the model calls no torch.nn.functional.scaled_dot_product_attention, so a kernel "
            f"choice changes nothing; leave attention at [default] for it")


def problem(model: nn.Module, sample: Dict[str, torch.Tensor], kernel: Kernel) -> Optional[str]:
    """Why ``kernel`` cannot serve ``model`` on ``sample``'s device (one call of the model under it), or None. A
    kernel of another device is the candidate's own ``unsupported_reason``, answered before this."""
    counted = _Calls()
    try:
        with torch.inference_mode(), counted, warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            AttentionKernel(model, kernel)(**sample)
    except RuntimeError as exc:
        if not counted.count or isinstance(exc, torch.OutOfMemoryError):
            raise  # out of memory says nothing of the kernel: the candidate fails with it (capture may build it again)
        why = [str(w.message) for w in said if "kernel" in str(w.message).lower()][:2] + [str(exc)]
        reason = " ".join("; ".join(why).split())[:400]
        where = next(iter(sample.values())).device.type
        return f"attention kernel {kernel} cannot run this model's attention on {where}: {reason}"
    return None if counted.count else no_calls(kernel)
