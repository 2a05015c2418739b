"""The one judge of whether a backend computes what eager computes: capture, validate, reload checks and
the graph backend's self-check all ask :func:`judge`.

Every tensor leaf of the output (``pipeline.leaves``) is judged on its own, so a small output beside a
large one is held to its own scale. A floating leaf passes two tests, both within the compute dtype's
tolerance:

- **magnitude**: the largest difference over eager's largest magnitude in that leaf. Relative to the
  leaf itself, with no absolute floor, so an output of 5e-14 is judged as strictly as one of 5;
  floating point keeps its relative precision at any magnitude above the type's smallest normal.
- **direction**: the distance between the two leaves scaled to unit length (``sqrt(2 - 2 cos)``), which
  no scale can hide: negation scores 2, unrelated noise about 1.4. It catches a leaf whose largest
  element is right while the bulk is wrong.

Integer and bool leaves must be equal, and empty leaves equal in shape and dtype. Eager's output can
also be unable to tell right from wrong: no tensors, NaN, below the float type's smallest normal
number, or constant within the tolerance (then a backend returning that constant would pass). The
verdict then says so (``uninformative``) instead of passing, unless some other leaf can tell.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Iterator, List, Mapping, Optional, Sequence, Tuple

import torch

from pipeline.leaves import tensor_leaves

# Allowed error relative to the leaf's scale. fp32 leaves room for TF32 convolutions (~1e-3) and
# Inductor's reordered reductions (~1e-6); reduced precision leaves room for its rounding (bf16 ~1e-2).
TOLERANCES = {torch.float32: 5e-3, torch.bfloat16: 6e-2, torch.float16: 2e-2, torch.float64: 1e-6}
# Elements judged at once (float64): 128 MiB per temporary, whatever the output's size.
CHUNK = 1 << 24
SHOWN_PROBLEMS = 3  # a reason names this many failing leaves, then counts the rest
UNCHECKABLE = "holds NaN or inf, so it cannot be checked (check the model and its inputs)"


def tolerance(compute_dtype: Optional[torch.dtype], scale: float = 1.0) -> float:
    """The allowed relative error for a backend computing in ``compute_dtype`` (None = fp32)."""
    return TOLERANCES.get(compute_dtype or torch.float32, TOLERANCES[torch.float32]) * scale


@dataclass(frozen=True)
class Verdict:
    """Whether an output matches eager's. ``error`` is the worst leaf's, in the tolerance's units (0 when
    equal, inf for a structural mismatch). ``uninformative``: not ok only because eager's output cannot
    tell a wrong backend from a right one, so nothing was proved either way."""

    ok: bool
    error: float
    reason: str = ""
    tensors: int = 0
    uninformative: bool = False

    @property
    def status(self) -> str:
        """``ok``, ``mismatch`` or ``uninformative``."""
        return "ok" if self.ok else "uninformative" if self.uninformative else "mismatch"


def zero_floor(dtype: torch.dtype, compute_dtype: Optional[torch.dtype]) -> float:
    """The smallest normal number of the coarser of the leaf's and the compute dtype: below it a float
    has lost its relative precision (float16 loses it below 6e-5, float32 and bfloat16 below 1e-38)."""
    return max(torch.finfo(d).tiny for d in (dtype, compute_dtype) if d is not None)


def summary(problems: List[str]) -> str:
    """The first few problems, and how many more there are."""
    more = len(problems) - SHOWN_PROBLEMS
    return "; ".join(problems[:SHOWN_PROBLEMS]) + (f"; and {more} more" if more > 0 else "")


def as_real(t: torch.Tensor) -> torch.Tensor:
    """Complex tensors as their real and imaginary parts, so they are judged as floats."""
    return torch.view_as_real(t.resolve_conj()) if t.is_complex() else t


def in_chunks(*leaves: torch.Tensor) -> Iterator[Tuple[torch.Tensor, ...]]:
    """The leaves' elements in step, CHUNK at a time, in float64 on the first leaf's device: a judgement's memory
    stays bounded and its arithmetic stays where the output is (DistilBERT's masked-LM logits at batch 256 are
    1e9 elements: as one float64 copy on the host each, every check of each recorded graph took tens of seconds)."""
    device, flat = leaves[0].device, [leaf.reshape(-1) for leaf in leaves]
    for start in range(0, flat[0].numel(), CHUNK):
        yield tuple(f[start:start + CHUNK].to(device, torch.float64) for f in flat)


def reduced(per_chunk: List[Tuple[torch.Tensor, ...]], how: Sequence[Callable[[torch.Tensor], torch.Tensor]]
            ) -> List[Any]:
    """Each statistic over all chunks (``how``: its reduction, e.g. ``torch.max``), as Python numbers: one
    synchronisation per judgement, not one per chunk."""
    return [reduce(torch.stack(column)).item() for reduce, column in zip(how, zip(*per_chunk))]


def leaf_uninformative(r: torch.Tensor, compute_dtype: Optional[torch.dtype], tol: float) -> str:
    """Why eager's leaf ``r`` cannot tell a wrong output from a right one, or '' if it can. An empty leaf
    can: its shape is compared exactly, and a detector's number of boxes depends on its input."""
    if r.numel() == 0:
        return ""
    r = as_real(r.detach())
    if not r.is_floating_point():
        constant = r.numel() > 1 and bool((r == r.flatten()[0]).all())
        return f"is the constant {r.flatten()[0].item()!r}" if constant else ""
    floor = zero_floor(r.dtype, compute_dtype)
    finite, low, high = reduced([(torch.isfinite(x).all(), x.min(), x.max()) for (x,) in in_chunks(r)],
                                (torch.all, torch.min, torch.max))
    if not finite:
        return UNCHECKABLE
    largest = max(abs(low), abs(high))
    if largest < floor:
        return f"is zero to the float type's precision (largest magnitude {largest:.3g} < {floor:.3g})"
    if r.numel() > 1 and high - low <= 2 * tol * largest:  # a backend returning the midpoint would pass
        return f"is constant within the tolerance ({low:.6g} to {high:.6g})"
    return ""


def uninformative(reference: Any, compute_dtype: Optional[torch.dtype] = None, tolerance_scale: float = 1.0) -> str:
    """Why eager's output cannot tell a wrong backend from a right one, or '' if it can: one leaf that can
    is enough, but a leaf holding NaN or inf leaves part of the output unchecked."""
    tol = tolerance(compute_dtype, tolerance_scale)
    leaves = tensor_leaves(reference)
    if not leaves:
        return "eager's output holds no tensors, so there is nothing to compare"
    reasons = {path: leaf_uninformative(r, compute_dtype, tol) for path, r in leaves.items()}
    unchecked = [f"{path} {why}" for path, why in reasons.items() if why == UNCHECKABLE]
    if unchecked:
        return "eager's " + summary(unchecked)
    if all(reasons.values()):
        return "eager's " + summary([f"{path} {why}" for path, why in reasons.items()])
    return ""


def compare_leaf(c: torch.Tensor, r: torch.Tensor, compute_dtype: Optional[torch.dtype],
                 tol: float) -> Tuple[float, str]:
    """One leaf's error (tolerance units) and what is wrong with it ('' if nothing); NaN where eager's
    leaf is not finite, which :func:`uninformative` reports."""
    if c.shape != r.shape:
        return math.inf, f"shape {tuple(c.shape)} differs from eager's {tuple(r.shape)}"
    allowed = {r.dtype, compute_dtype} if r.is_floating_point() else {r.dtype}  # autocast may return compute_dtype
    if c.dtype not in allowed:
        return math.inf, f"dtype {c.dtype} differs from eager's {r.dtype}"
    if r.numel() == 0:
        return 0.0, ""
    c, r = as_real(c.detach()), as_real(r.detach())
    if not r.is_floating_point():
        wrong = int((c != r.to(c.device)).sum())
        return (math.inf, f"{wrong} of {r.numel()} elements differ (compared exactly)") if wrong else (0.0, "")
    floor = zero_floor(r.dtype, compute_dtype)
    finite_r, finite_c, largest, c_largest, difference, c_squares, r_squares = reduced(
        [(torch.isfinite(y).all(), torch.isfinite(x).all(), y.abs().max(), x.abs().max(), (x - y).abs().max(),
          x.square().sum(), y.square().sum()) for x, y in in_chunks(c, r)],
        (torch.all, torch.all, torch.max, torch.max, torch.max, torch.sum, torch.sum))
    if not finite_r:
        return math.nan, ""
    if not finite_c:
        return math.inf, "holds NaN or inf where eager is finite"
    if largest < floor:  # eager is zero: so must the output be
        return (0.0, "") if c_largest < floor else (math.inf, f"reaches {c_largest:.3g} where eager is zero")
    magnitude = difference / largest
    direction = 0.0  # zeros fail on magnitude
    if c_largest > 0:
        c_norm, r_norm = math.sqrt(c_squares), math.sqrt(r_squares)
        direction = math.sqrt(reduced([((x / c_norm - y / r_norm).square().sum(),) for x, y in in_chunks(c, r)],
                                      (torch.sum,))[0])
    error = max(magnitude, direction)
    if error <= tol:
        return error, ""
    if magnitude >= direction:
        return error, (f"largest difference {magnitude:.3g} of eager's largest magnitude {largest:.3g} "
                       f"> tolerance {tol:.3g}")
    cosine = 1 - direction ** 2 / 2
    return error, (f"direction differs from eager's (cosine {cosine:.6f}, distance {direction:.3g} "
                   f"> tolerance {tol:.3g})")


def judge(candidate: Any, reference: Any, compute_dtype: Optional[torch.dtype] = None,
          tolerance_scale: float = 1.0) -> Verdict:
    """``candidate`` (a backend's output) against ``reference`` (eager's), leaf by leaf, within the
    tolerance of ``compute_dtype`` (None = fp32) times ``tolerance_scale``."""
    tol = tolerance(compute_dtype, tolerance_scale)
    outs, refs = tensor_leaves(candidate), tensor_leaves(reference)
    problems = [f"{path} is missing" for path in refs if path not in outs]
    problems += [f"{path} is not in eager's output" for path in outs if path not in refs]
    errors = [math.inf] if problems else []
    for path, r in refs.items():
        if path in outs:
            error, problem = compare_leaf(outs[path], r, compute_dtype, tol)
            errors.append(error)
            problems += [f"{path}: {problem}"] if problem else []
    error = max((e for e in errors if not math.isnan(e)), default=0.0)
    if problems:
        return Verdict(False, error, summary(problems), len(refs))
    why = uninformative(reference, compute_dtype, tolerance_scale)
    return Verdict(not why, error, why, len(refs), uninformative=bool(why))


def combine(verdicts: Mapping[str, Verdict]) -> Verdict:
    """One verdict over several labelled checks (batch sizes, recorded graphs): a mismatch anywhere is a
    mismatch, else any uninformative check leaves the whole unproved. Reasons are prefixed by label."""
    errors = [v.error for v in verdicts.values() if not math.isnan(v.error)]
    tensors = sum(v.tensors for v in verdicts.values())
    failed = {label: v for label, v in verdicts.items() if not v.ok}
    mismatched = {label: v for label, v in failed.items() if not v.uninformative}
    worst = mismatched or failed
    reason = summary([f"{label}: {v.reason}" for label, v in worst.items()])
    return Verdict(not failed, max(errors, default=0.0), reason, tensors,
                   uninformative=bool(failed) and not mismatched)
