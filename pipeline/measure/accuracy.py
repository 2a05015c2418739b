"""The accuracy budget: how far a candidate's output may move from fp32 eager's and still serve.

``route.accuracy_budget`` names a metric and a bound. The metric is taken leaf by leaf over every
floating output tensor (``pipeline.leaves``), and the worst leaf counts:

- ``cosine``: cosine similarity of the flattened leaf with eager's; at least ``bound``;
- ``max_rel_error``: the largest difference over eager's largest magnitude; at most ``bound``;
- ``top1_agreement``: the share of rows whose arg-max over the last dimension matches eager's
  (classifier logits); at least ``bound``.

A leaf that is missing, of another shape, or not finite where eager is, scores the worst possible
value. Unlike :func:`pipeline.measure.compare.judge`, which holds fp32 candidates to fp32's rounding,
this is the user's trade: reduced-precision candidates are held to it alone.
"""

from __future__ import annotations

import math
from typing import Any, Dict, Iterable, Mapping

import torch

from pipeline.measure.compare import Verdict, in_chunks, reduced
from pipeline.leaves import tensor_leaves

# metric -> whether larger values are better, and the range a bound may take
METRICS: Dict[str, Dict[str, Any]] = {
    "cosine": {"higher_is_better": True, "range": (-1.0, 1.0)},
    "max_rel_error": {"higher_is_better": False, "range": (0.0, math.inf)},
    "top1_agreement": {"higher_is_better": True, "range": (0.0, 1.0)},
}


def worst_value(metric: str) -> float:
    return METRICS[metric]["range"][0] if METRICS[metric]["higher_is_better"] else math.inf


def worst(values: Iterable[float], metric: str) -> float:
    """The worst of ``values`` for ``metric`` (NaN counts as worst); the best possible value if there are none."""
    values = [worst_value(metric) if math.isnan(v) else v for v in values]
    if not values:
        return 1.0 if METRICS[metric]["higher_is_better"] else 0.0
    return min(values) if METRICS[metric]["higher_is_better"] else max(values)


def within(value: float, metric: str, bound: float) -> bool:
    if math.isnan(value):
        return False
    return value >= bound if METRICS[metric]["higher_is_better"] else value <= bound


# A score "far outside" the budget misses it by more than this many times the budget's own margin.
FAR = 10.0


def shortfall(value: float, metric: str) -> float:
    """How far ``value`` is from a perfect match (0): 1 - value for cosine and top-1 agreement, the error itself
    for max_rel_error; infinite for NaN."""
    if math.isnan(value):
        return math.inf
    return 1.0 - value if METRICS[metric]["higher_is_better"] else value


def far_outside(value: float, metric: str, bound: float) -> bool:
    """Whether ``value`` misses the budget by more than FAR times its margin (a bound of cosine 0.999 allows
    0.001; a cosine below 0.99 is far outside): no other compilation of the same numerics would bring it in."""
    return shortfall(value, metric) > FAR * shortfall(bound, metric)


def budget_problem(metric: Any, bound: Any) -> str:
    """Why ``{metric, bound}`` is not a budget ('' if it is)."""
    if metric not in METRICS:
        return f"route.accuracy_budget.metric={metric!r} is unknown; use one of {list(METRICS)}"
    low, high = METRICS[metric]["range"]
    if isinstance(bound, bool) or not isinstance(bound, (int, float)) or not low <= bound <= high:
        return (f"route.accuracy_budget.bound={bound!r} is outside {metric}'s range [{low}, {high}]; "
                f"e.g. route.accuracy_budget.bound={0.999 if METRICS[metric]['higher_is_better'] else 0.01}")
    return ""


def describe(metric: str, bound: float) -> str:
    return f"{metric} {'>=' if METRICS[metric]['higher_is_better'] else '<='} {bound:g}"


def leaf_score(c: torch.Tensor, r: torch.Tensor, metric: str) -> float:
    """``metric`` of one leaf, reduced chunk by chunk on the output's device (``compare.in_chunks``)."""
    if c.shape != r.shape:
        return worst_value(metric)
    if r.numel() == 0:
        return worst([], metric)
    c, r = c.detach(), r.detach()
    same, finite_c, finite_r, largest, difference, dot, c_squares, r_squares = reduced(
        [(((x == y) | (x.isnan() & y.isnan())).all(), torch.isfinite(x).all(), torch.isfinite(y).all(),
          y.abs().max(), (x - y).abs().max(), (x * y).sum(), x.square().sum(), y.square().sum())
         for x, y in in_chunks(c, r)],
        (torch.all, torch.all, torch.all, torch.max, torch.max, torch.sum, torch.sum, torch.sum))
    if same:
        return worst([], metric)  # the best value, without the rounding of computing it (NaN where eager has NaN too)
    if not finite_c and finite_r:
        return worst_value(metric)
    if metric == "top1_agreement":
        c, r = (c.reshape(1, 1), r.reshape(1, 1)) if r.dim() == 0 else (c.flatten(0, -2), r.flatten(0, -2))
        return float((c.argmax(-1) == r.to(c.device).argmax(-1)).double().mean()) if len(r) else 1.0
    if metric == "max_rel_error":
        return difference / largest if largest > 0 else (0.0 if difference == 0 else math.inf)
    cn, rn = math.sqrt(c_squares), math.sqrt(r_squares)
    if cn == 0 or rn == 0:
        return 1.0 if cn == rn else 0.0
    return float(dot / (cn * rn))


def score(candidate: Any, reference: Any, metric: str) -> float:
    """``metric`` of ``candidate`` (a backend's output) against ``reference`` (fp32 eager's), worst leaf."""
    outs, refs = tensor_leaves(candidate), tensor_leaves(reference)
    values = []
    for path, r in refs.items():
        if not (r.is_floating_point() or r.is_complex()):
            continue  # integer leaves are compared exactly by judge()
        c = outs.get(path)
        if c is None:
            values.append(worst_value(metric))
            continue
        if r.is_complex() or c.is_complex():
            c, r = torch.view_as_real(c.resolve_conj()), torch.view_as_real(r.resolve_conj())
        values.append(leaf_score(c, r, metric))
    return worst(values, metric)


def relaxed(verdict: Verdict, by_budget: bool) -> Verdict:
    """``verdict`` for a candidate that answers to the budget alone (``by_budget``: a reduced precision from
    the ``precision`` list): a mismatch of finite error passes, since its rounding is the user's trade; a
    broken structure (a shape, a dtype, NaN where eager is finite: error inf) still fails."""
    if by_budget and verdict.status == "mismatch" and math.isfinite(verdict.error):
        return Verdict(True, verdict.error, "", verdict.tensors)
    return verdict


def budget_of(cfg: Mapping[str, Any]) -> Dict[str, Any]:
    """``route.accuracy_budget`` as route.json writes it."""
    return {"metric": str(cfg["metric"]), "bound": float(cfg["bound"])}
