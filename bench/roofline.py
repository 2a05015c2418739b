"""Where each cell of a suite table (``bench/suite.py``) spends its time against the GPU's physical limit (issue 56).

For every model and batch size of a suite JSON, the model is built as the suite tunes it (its ``SUITE`` entry's
overrides, composed by the pipeline's own config and built by ``model.build``; random weights, nothing downloads)
and one forward is counted at the suite's input shapes without running it: the weights are made on the meta device
and the forward runs on fake tensors (shapes only), so a billion-parameter model costs seconds and no memory. Counted:

- FLOPs: ``torch.utils.flop_counter.FlopCounterMode`` (a multiply-add is 2). Fake tensors on the CPU send SDPA to
  ``_scaled_dot_product_flash_attention_for_cpu``, which the counter has no formula for, so it is given the one
  the counter uses for the GPU's SDPA kernels (causal attention counted in full, as there). An op that carries
  matmul work and still has no formula is named in the cell (``uncounted``): that model's count is too low.
- bytes that must move at least once: the weights at 2 bytes (bf16, the suite's precision; parameters and buffers,
  tied weights once; integer buffers at their own size), the inputs as the suite feeds them and the outputs as every
  candidate answers (the model's own dtype, fp32). Activations are left out: the bound assumes perfect fusion.
- kernels: the aten calls of one eager forward that are not views, a rough count of what eager launches (the
  batch-1 cells are bound by launches, not by FLOPs or bytes).

The lower bound on a cell's time is max(FLOPs / peak compute, bytes / peak bandwidth), from the suite JSON's
``device`` and the vendor's datasheet figures in ``PEAKS`` (dense bf16 tensor-core FLOP/s, half the "with sparsity"
figure NVIDIA lists; HBM bandwidth). Per cell: that bound and which term sets it, auto's and the best reference's
fraction of it (bound / measured ms), and the largest speed-up over the reference left if auto reached the bound
(reference ms / bound). The summary holds the measured geomean of auto over the reference beside the geomean that
every cell at its bound would give, for all cells and per kind (batch 1, the larger (harness) batch), against what
issue 56 asks (1.5x). The counts come from this machine's torch, not the suite's: FLOPs and bytes do not depend on it,
eager's op count may differ a little.

    python bench/roofline.py --suite bench/results/suite-h100.json --out OUT   # writes OUT/roofline-h100.{json,md}
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import torch
from omegaconf import OmegaConf
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode, flop_registry, sdpa_flop_count

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import suite  # noqa: E402
from bench.common import command_line, unfinished, write_table  # noqa: E402
from pipeline import inputs as model_inputs  # noqa: E402
from pipeline.api import compose_config  # noqa: E402
from pipeline.leaves import tensor_leaves  # noqa: E402
from pipeline.models import make_inputs  # noqa: E402
from pipeline.runner import built  # noqa: E402

TARGET = 1.5  # issue 56: auto over the user's best own torch.compile, geomean over the suite's cells
WEIGHT_BYTES = 2  # bf16, the suite's precision
MATMUL_LIKE = ("mm", "conv", "attention", "einsum", "linear", "matmul")  # op names that carry FLOPs worth counting


@dataclass(frozen=True)
class Peak:
    """A GPU's physical limits: dense bf16 tensor-core FLOP/s and memory bandwidth in bytes/s."""

    flops: float
    bandwidth: float


# Device names as torch.cuda.get_device_name gives them (matched as substrings, first first). NVIDIA's datasheets:
# H100 SXM5 (80 GB HBM3) 1,979 bf16 TFLOP/s with sparsity, so 989 dense, 3.35 TB/s; H200 (SXM, 141 GB HBM3e) the
# same compute, 4.8 TB/s. The suite's "NVIDIA H200" does not say SXM or NVL: the SXM figures are used.
PEAKS: Dict[str, Peak] = {"H200": Peak(989e12, 4.8e12), "H100 80GB HBM3": Peak(989e12, 3.35e12)}


def peak_of(device: str) -> Peak:
    """The limits of the GPU named ``device``; a one-line ValueError naming the known ones otherwise."""
    for name, peak in PEAKS.items():
        if name in device:
            return peak
    raise ValueError(f"no peak figures for the device {device!r}; known: {', '.join(PEAKS)} (add its dense bf16 "
                     f"FLOP/s and memory bandwidth to PEAKS in bench/roofline.py)")


class KernelCount(TorchDispatchMode):
    """Counts the aten calls of a forward that are not views (a view launches no kernel): a rough count of eager's
    kernels. Run it under ``no_grad``: composite ops (``conv2d``, ``linear``) then reach it as their parts only (under
    ``inference_mode`` they come whole and then again as their parts)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: Counter = Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Optional[Dict] = None) -> Any:
        if func.namespace == "aten" and not func.is_view:
            self.calls[func.overloadpacket] += 1
        return func(*args, **(kwargs or {}))


def cpu_sdpa_flops(query: Sequence[int], key: Sequence[int], value: Sequence[int], *args: Any,
                   out_shape: Any = None, **kwargs: Any) -> int:
    """SDPA's CPU kernel, counted as the counter counts its GPU kernels (shapes in, ``sdpa_flop_count``)."""
    return sdpa_flop_count(query, key, value)


CUSTOM_FLOPS = {torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: cpu_sdpa_flops}


@dataclass(frozen=True)
class Count:
    """What one forward needs: FLOPs, the bytes that must move at least once, and eager's kernels."""

    flops: int
    weight_bytes: int
    io_bytes: int
    kernels: int
    distinct_ops: int
    uncounted: Tuple[str, ...]  # ops that carry matmul work without a FLOP formula: the count misses them

    @property
    def bytes(self) -> int:
        return self.weight_bytes + self.io_bytes


def nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def weight_bytes(model: nn.Module) -> int:
    """Parameters and buffers (each tensor once, so tied weights once), floating ones at bf16."""
    tensors = {id(t): t for t in [*model.parameters(), *model.buffers()]}.values()
    return sum(t.numel() * WEIGHT_BYTES if t.is_floating_point() else nbytes(t) for t in tensors)


def count(build: Callable[[], nn.Module], inputs: Callable[[], Dict[str, torch.Tensor]]) -> Count:
    """Count one forward of ``build()`` on ``inputs()`` without running it: the model is built on the meta device and
    runs on fake tensors (shapes only), so its size costs nothing; ``inputs`` is called under the fake mode."""
    with torch.device("meta"):
        model = build().eval()
    weights = weight_bytes(model)
    with FakeTensorMode(allow_non_fake_inputs=True):  # the meta weights become fake CPU tensors
        model.to_empty(device="cpu")
        feed = inputs()
        flops, kernels = FlopCounterMode(display=False, custom_mapping=CUSTOM_FLOPS), KernelCount()
        with torch.no_grad(), flops, kernels:
            out = model(**feed)
        io = sum(map(nbytes, [*feed.values(), *tensor_leaves(out).values()]))
    counted = set(flop_registry) | set(CUSTOM_FLOPS)
    uncounted = sorted(str(op) for op in kernels.calls if op not in counted
                       and any(word in str(op) for word in MATMUL_LIKE))
    return Count(flops=flops.get_total_flops(), weight_bytes=weights, io_bytes=io,
                 kernels=sum(kernels.calls.values()), distinct_ops=len(kernels.calls), uncounted=tuple(uncounted))


def bound_ms(c: Count, peak: Peak) -> Tuple[float, str]:
    """The least time one forward can take, in ms, and which limit sets it (``compute`` or ``memory``)."""
    compute, memory = c.flops / peak.flops, c.bytes / peak.bandwidth
    return max(compute, memory) * 1e3, "compute" if compute >= memory else "memory"


def suite_model(name: str, overrides: Sequence[str] = (), smoke: bool = False
                ) -> Tuple[Callable[[], nn.Module], Dict[str, Any]]:
    """The suite model ``name`` as ``bench/suite.py`` tunes it: its builder and its input spec (``model.inputs``),
    from the suite entry's overrides (with its smoke shrinking where the table was a smoke run) and the table's own."""
    entry = suite.SUITE[name]
    cfg = compose_config([*entry.overrides, *(entry.smoke if smoke else ()), *overrides])
    model_inputs.complete(cfg)
    return (lambda: built(cfg.model.build)), OmegaConf.to_container(cfg.model.inputs, resolve=True)


def model_cells(row: Dict[str, Any], table: Mapping[str, Any], peak: Peak) -> List[Dict[str, Any]]:
    """A suite row's cells against their bounds: counts, bound, the measured auto and best reference."""
    row = {**row, "cells": {int(bs): per for bs, per in row["cells"].items()}}  # JSON made the sizes strings
    build, spec = suite_model(row["model"], table.get("overrides") or (), bool(table.get("smoke")))
    out = []
    for r in suite.ratios(row):
        bs, measured = r["batch_size"], row["cells"][r["batch_size"]]
        c = count(build, lambda: make_inputs(spec, bs, torch.device("cpu")))
        bound, by = bound_ms(c, peak)
        auto, ref = measured["auto"]["median_ms"], measured[r["reference"]]["median_ms"]
        out.append({"model": row["model"], "batch_size": bs, "gflop": c.flops / 1e9, "mb": c.bytes / 1e6,
                    "weight_mb": c.weight_bytes / 1e6, "io_mb": c.io_bytes / 1e6, "kernels": c.kernels,
                    "distinct_ops": c.distinct_ops, "uncounted": list(c.uncounted), "bound_ms": bound, "bound_by": by,
                    "auto_ms": auto,
                    "reference": r["reference"], "reference_mode": r["reference_mode"], "reference_ms": ref,
                    "auto_of_bound": bound / auto, "reference_of_bound": bound / ref,
                    "auto_of_bound_for_target": TARGET * bound / ref,
                    "auto_over_reference": auto / ref, "speedup_at_bound": ref / bound})
    return out


def geomean(values: Sequence[float]) -> float:
    return math.exp(sum(map(math.log, values)) / len(values)) if values else math.nan


def kind_summary(cells: List[Dict[str, Any]]) -> Dict[str, Any]:
    """Measured and at-bound speed-ups over the reference (geomeans), and the fraction of its bound auto reaches
    against the fraction the target needs."""
    at_bound = geomean([c["speedup_at_bound"] for c in cells])
    return {"cells": len(cells), "speedup_over_reference": geomean([1 / c["auto_over_reference"] for c in cells]),
            "speedup_at_bound": at_bound, "auto_of_bound": geomean([c["auto_of_bound"] for c in cells]),
            "auto_of_bound_for_target": TARGET / at_bound}


def summary(cells: List[Dict[str, Any]]) -> Dict[str, Any]:
    """The geomeans for every cell, the batch-1 cells (launch bound) and the larger batch, and the models whose FLOP
    count misses an op."""
    return {"target": TARGET, "auto_over_reference": geomean([c["auto_over_reference"] for c in cells]),
            "all": kind_summary(cells),
            "batch_1": kind_summary([c for c in cells if c["batch_size"] == 1]),
            "larger": kind_summary([c for c in cells if c["batch_size"] > 1]),
            "uncounted": {c["model"]: c["uncounted"] for c in cells if c["uncounted"]}}


def markdown(cells: List[Dict[str, Any]], meta: Dict[str, Any]) -> str:
    lines = [f"## Against the limit: {meta['suite']} ({meta['device']}: {meta['peak_tflops']:.0f} TFLOP/s bf16, "
             f"{meta['peak_tbps']} TB/s; measured with torch {meta['torch']}, counted with torch "
             f"{meta['counted_with']})",
             "", "| model | batch | GFLOP | MB moved | bound ms | bound by | eager ops | auto ms | best reference | "
             f"ref ms | auto of bound | ref of bound | {TARGET}x needs | ref / bound |", "|---" * 14 + "|"]
    for c in cells:
        mode = f" ({c['reference_mode']})" if c["reference_mode"] else ""
        lines.append(f"| {c['model']} | {c['batch_size']} | {c['gflop']:.4g} | {c['mb']:.4g} | {c['bound_ms']:.3g} | "
                     f"{c['bound_by']} | {c['kernels']} | {c['auto_ms']:.4g} | {c['reference']}{mode} | "
                     f"{c['reference_ms']:.4g} | {c['auto_of_bound']:.3g} | {c['reference_of_bound']:.3g} | "
                     f"{c['auto_of_bound_for_target']:.3g} | {c['speedup_at_bound']:.4g} |")
    lines += [f"{name}: not in the suite's table ({why})" for name, why in meta["not_measured"].items()]
    lines += ["", "Batch 1 (bound by launches, not by FLOPs or bytes): " + "; ".join(
        f"{c['model']} {c['kernels']} ops ({c['distinct_ops']} distinct), bound {c['bound_ms'] * 1e3:.3g} us, "
        f"auto {c['auto_ms'] * 1e3:.0f} us"
        for c in cells if c["batch_size"] == 1) + "."]
    s = summary(cells)
    for kind, label in (("all", "every cell"), ("batch_1", "batch 1"), ("larger", "the larger batch")):
        k = s[kind]
        if k["cells"]:
            lines.append(f"- {label} ({k['cells']} cells): auto {k['speedup_over_reference']:.3f}x over the reference "
                         f"as measured; {k['speedup_at_bound']:.4g}x with every cell at its bound; {TARGET}x needs "
                         f"auto at {k['auto_of_bound_for_target']:.3g} of its bound (geomean), auto is at "
                         f"{k['auto_of_bound']:.3g}")
    lines += [f"- {model}: FLOPs of {', '.join(ops)} not counted, so its count is low"
              for model, ops in s["uncounted"].items()]
    return "\n".join(lines) + "\n"


def roofline(table: Mapping[str, Any]) -> Tuple[List[Dict[str, Any]], Dict[str, str]]:
    """Every measured cell of a suite table against its bound, and the models the table did not measure (why)."""
    peak = peak_of(str(table["device"]))
    if table.get("precision", "[bf16]") != "[bf16]":
        raise ValueError(f"the suite table ran precision={table['precision']}; this bound counts weights in bf16, "
                         f"so it reads only tables of bench/suite.py's default --precision '[bf16]'")
    cells: List[Dict[str, Any]] = []
    for row in table["rows"]:
        if unfinished(row) is None:
            cells += model_cells(row, table, peak)
    return cells, {row["model"]: unfinished(row) for row in table["rows"] if unfinished(row)}


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", type=Path, required=True, help="a suite table, e.g. bench/results/suite-h100.json")
    parser.add_argument("--out", type=Path, help="write roofline-<tag>.{json,md} here (default: print only)")
    parser.add_argument("--tag", help="default: the suite table's (suite-h100.json: h100)")
    args = parser.parse_args(argv)
    if not args.suite.is_file():
        parser.error(f"--suite {args.suite}: no such file; give a table bench/suite.py wrote, e.g. "
                     f"bench/results/suite-h100.json")
    table = json.loads(args.suite.read_text())
    try:
        peak, (cells, not_measured) = peak_of(str(table["device"])), roofline(table)
    except ValueError as exc:
        parser.error(str(exc))
    suite_path = args.suite.resolve()
    meta = {"suite": str(suite_path.relative_to(ROOT)) if suite_path.is_relative_to(ROOT) else suite_path.name,
            "device": table["device"], "torch": table.get("torch"), "counted_with": torch.__version__,
            "peak_tflops": peak.flops / 1e12, "peak_tbps": peak.bandwidth / 1e12, "not_measured": not_measured,
            "command": command_line([__file__, *argv] if argv else ())}
    if args.out is None:
        print(markdown(cells, meta) + f"\nSummary: {json.dumps(summary(cells))}")
        return
    args.out.mkdir(parents=True, exist_ok=True)
    tag = args.tag or args.suite.stem.removeprefix("suite-")
    print(write_table(args.out, f"roofline-{tag}", meta, cells, summary, markdown))


if __name__ == "__main__":
    main()
