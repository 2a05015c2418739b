"""Comparing a backend's outputs with eager's, with tolerances that follow the compute dtype."""

from __future__ import annotations

from typing import Any, List, Optional

import torch

# Max error relative to the reference's largest magnitude. fp32 leaves room for TF32 convolutions
# and Inductor's reordered reductions; reduced precision leaves room for its rounding.
TOLERANCES = {torch.float32: 5e-3, torch.bfloat16: 6e-2, torch.float16: 2e-2, torch.float64: 1e-6}


def flatten(out: Any) -> List[torch.Tensor]:
    """The tensors of an output: a tensor, a tuple/list, a dict, or a transformers ModelOutput."""
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, dict) or hasattr(out, "to_tuple"):
        out = list(out.values()) if isinstance(out, dict) else list(out.to_tuple())
    if isinstance(out, (list, tuple)):
        return [t for item in out for t in flatten(item)]
    return []


def tolerance(compute_dtype: Optional[torch.dtype], scale: float = 1.0) -> float:
    """The allowed relative error for a backend computing in ``compute_dtype`` (None = fp32)."""
    return TOLERANCES.get(compute_dtype or torch.float32, TOLERANCES[torch.float32]) * scale


def check_informative(ref: Any, where: str) -> None:
    """Refuse a reference that cannot tell a wrong backend from a right one: no tensors, or every
    output tensor constant (torchvision's ViT, built with random weights, has a zero-initialised
    head and answers 0 for every input)."""
    tensors = [t.detach() for t in flatten(ref)]
    if not tensors:
        raise ValueError(f"eager's output {where} holds no tensors, so no backend can be checked against it")
    if all(t.numel() > 1 and bool((t == t.flatten()[0]).all()) for t in tensors):
        value = tensors[0].flatten()[0].item()
        raise ValueError(f"eager's output {where} is the constant {value!r} for every element, so a wrong backend "
                         "would pass every check; give the model non-degenerate weights (a zero-initialised "
                         "last layer is the usual cause)")


def rel_error(out: Any, ref: Any) -> float:
    """Largest absolute difference over the reference's largest magnitude, over all output tensors."""
    outs, refs = flatten(out), flatten(ref)
    if len(outs) != len(refs):
        raise ValueError(f"output has {len(outs)} tensors, eager has {len(refs)}")
    worst = 0.0
    for o, r in zip(outs, refs):
        if o.shape != r.shape:
            raise ValueError(f"output shape {tuple(o.shape)} differs from eager's {tuple(r.shape)}")
        o, r = o.detach().float().cpu(), r.detach().float().cpu()
        if not torch.isfinite(r).all():
            raise ValueError("eager's own output is not finite (NaN or inf), so nothing can be checked against it; "
                             "check the model and its sample inputs (model.inputs)")
        if not torch.isfinite(o).all():
            return float("inf")
        scale = max(r.abs().max().item(), 1e-6)
        worst = max(worst, (o - r).abs().max().item() / scale)
    return worst
