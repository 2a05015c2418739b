"""Padding proved, not assumed: does a backend, called at a tuned length on a shorter input padded up to it,
answer what eager answers at the exact length once its outputs are cut back?

A model may not: without an attention mask, padding tokens take part in every position's result; absolute
positions or a pooled output can leak them; a causal model padded on the wrong side sees them first. So
capture pads the shortest untuned length of each band (``pipeline.seqlen.padding_probes``) at every tuned
batch size, and holds the cut-back outputs to eager's at the exact length with the judge and the accuracy
budget that hold the backend itself (``pipeline.measure.compare``, ``pipeline.measure.accuracy``). A backend
that fails keeps its tuned cells and is never handed a padded call: untuned lengths then go to a backend
that runs them unpadded, or are refused.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Optional

import torch

from pipeline.measure import accuracy
from pipeline.measure.compare import Verdict, combine, judge
from pipeline.measure.references import Reference
from pipeline.seqlen import SeqDims

PROVED = "ok"  # a candidate's ``padding`` once proved; otherwise the reason it is not


def padded_call(call: Callable[..., Any], inputs: Mapping[str, torch.Tensor], seq: SeqDims) -> Any:
    """``call`` on ``inputs`` padded to the tuned length above theirs, its outputs cut back to their length."""
    length = seq.length(inputs)
    with torch.inference_mode():
        return seq.cut(call(**seq.resized(inputs, seq.target(length))), length)


def check(call: Callable[..., Any], references: Mapping[Any, Reference], seq: SeqDims, budget: Mapping[str, Any],
          compute_dtype: Optional[torch.dtype], by_budget: bool, tolerance_scale: float = 1.0) -> str:
    """:data:`PROVED`, or why padding is not: ``references`` are eager's outputs at untuned cells
    ``(batch size, length)``, each of which ``call`` (a backend computing in ``compute_dtype``, judged by the
    budget alone where ``by_budget``: ``accuracy.relaxed``) is called at padded."""
    verdicts = {}
    for (bs, length), ref in references.items():
        where = f"length {length} padded to {seq.target(length)}, batch size {bs}"
        try:
            out = padded_call(call, ref.inputs, seq)
        except Exception as exc:  # a padded call that fails proves nothing: it is the backend's outcome, not a crash
            first = str(exc).splitlines()[0][:300] if str(exc) else ""
            return f"a call at {where} fails: {type(exc).__name__}: {first}"
        verdict = accuracy.relaxed(judge(out, ref.output, compute_dtype, tolerance_scale), by_budget)
        value = accuracy.score(out, ref.output, budget["metric"])
        if verdict.ok and not accuracy.within(value, budget["metric"], budget["bound"]):
            verdict = Verdict(False, verdict.error, f"{budget['metric']} {value:.6g} outside the accuracy budget",
                              verdict.tensors)
        verdicts[where] = verdict
    verdict = combine(verdicts)
    if verdict.ok:
        return PROVED
    return f"outputs of padded calls, cut back, differ from eager's at the exact length: {verdict.reason}"
