"""Precision as a routed choice on this machine's device: the seed table's cells with
``precision=[fp32,tf32,bf16]`` and the default accuracy budget (cosine >= 0.999 against fp32 eager).

For each model it tunes with the pipeline (the seed table's backends, each once per precision), loads
the routed model back from its checkpoint (``auto``, served as a user would), then at each batch size
measures auto's error against fp32 eager (the budget's metric, on the batches the profile timed) and
times auto against ``torch.compile(model, mode="reduce-overhead")`` in fp32, interleaved round by round.
Writes ``precision-<tag>.json`` (``summary``: cells, budget_violations,
geomean_speedup_over_fp32_reduce_overhead, ...) and ``.md`` (the chosen precision and error per cell).

    python bench/precision.py --out OUT --tag h200
    python bench/precision.py --out OUT --tag cpu --device cpu --models mlp --quick   # a minute on a CPU

Lanes as in ``bench/seed_table.py``: ``--models`` per GPU with its own ``--tag``, then
``python bench/precision.py --combine OUT/precision-h200-a.json OUT/precision-h200-b.json --out OUT --tag h200``.
"""

from __future__ import annotations

import argparse
import math
import platform
import sys
from pathlib import Path
from typing import Any, Dict, List

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import command_line, joined_lanes, lane_arguments, reduce_overhead, row_or_error, run_lane, tune_and_load, write_table  # noqa: E402
from bench.seed_table import BACKENDS, MODELS, SIZES  # noqa: E402
from pipeline import devices  # noqa: E402
from pipeline.measure import accuracy  # noqa: E402
from pipeline.measure.interleaved import measure_interleaved  # noqa: E402
from pipeline.route.policy import backend_for  # noqa: E402

PRECISIONS = ["fp32", "tf32", "bf16"]
PEER = "fp32_reduce_overhead"  # torch.compile(model, mode="reduce-overhead"), fp32, as a user would write it
# --quick: two sizes, the quick profile, eager and Inductor only: to try the bench on a CPU.
QUICK = {"sizes": [1, 8], "backends": ["eager", "inductor"], "profile": "quick"}


def overrides(model: str, args: argparse.Namespace) -> List[str]:
    return [f"model={model}", f"device={args.device}", f"backends=[{','.join(args.backends)}]",
            f"precision=[{','.join(args.precisions)}]", f"profile={args.profile}",
            f"model.batch_sizes=[{','.join(map(str, args.sizes))}]", "tracking=sqlite",
            f"tracking.uri=sqlite:///{args.runs.resolve()}/mlflow-{args.tag}.db", "tracking.experiment=precision"]


def bench_model(model: str, args: argparse.Namespace) -> Dict[str, Any]:
    cfg, ctx, auto, tune_s, load_s = tune_and_load(overrides(model, args), args.runs / f"{args.tag}-{model}")
    peer = reduce_overhead(ctx.model, ctx.device, None)
    budget = cfg.route.accuracy_budget
    _, inputs_at = ctx.input_sources()[0]  # the batches the profile timed
    served = {r["backend"]: r for r in ctx.route_info["ranges"]}
    cells = []
    for bs in ctx.batch_sizes:
        inputs = inputs_at(bs)
        with torch.inference_mode():
            error = accuracy.score(auto(**inputs), ctx.model(**inputs), budget.metric)
        timed = measure_interleaved({"auto": lambda: auto(**inputs), PEER: lambda: peer(**inputs)}, ctx.device,
                                    cfg.profile)
        chosen = backend_for(auto.route, bs)
        cells.append({"batch_size": bs, "backend": chosen, "precision": served[chosen]["precision"],
                      "weights": served[chosen]["weights"], "error": error,
                      "within_budget": accuracy.within(error, budget.metric, budget.bound),
                      "auto": timed["auto"].summary(), PEER: timed[PEER].summary(),
                      "speedup_over_fp32_reduce_overhead": timed[PEER].median / timed["auto"].median})
    return {"model": model, "tune_seconds": tune_s, "checkpoint_load_seconds": load_s,
            "accuracy_budget": ctx.route_info["accuracy_budget"], "route": ctx.route_info["ranges"],
            "candidates": ctx.route_info["candidates"], "validation_ok": ctx.validation.get("ok"),
            "profile_medians_ms": ctx.route_info["profile_medians_ms"], "stage_seconds": ctx.stage_seconds,
            "cells": cells}


def summary(rows: List[Dict[str, Any]]) -> Dict[str, Any]:
    cells = [c for row in rows for c in row.get("cells", [])]
    speedups = [c["speedup_over_fp32_reduce_overhead"] for c in cells]
    chosen: Dict[str, int] = {}
    for c in cells:
        chosen[c["precision"]] = chosen.get(c["precision"], 0) + 1
    return {"cells": len(cells), "budget_violations": sum(not c["within_budget"] for c in cells),
            "geomean_speedup_over_fp32_reduce_overhead":
                math.exp(sum(math.log(x) for x in speedups) / len(speedups)) if speedups else math.nan,
            "worst_speedup_over_fp32_reduce_overhead": min(speedups, default=math.nan),
            "cells_by_precision": chosen, "failed_models": [r["model"] for r in rows if "error" in r],
            "validation_ok": all(r.get("validation_ok") for r in rows)}


def markdown(rows: List[Dict[str, Any]], meta: Dict[str, Any]) -> str:
    budget = next((r["accuracy_budget"] for r in rows if "accuracy_budget" in r), None)
    shown = accuracy.describe(budget["metric"], budget["bound"]) if budget else "?"
    lines = [f"## {meta['device']}, torch {meta['torch']}, precision={meta['precisions']}, budget {shown}", "",
             "Per cell: the routed candidate (loaded from its checkpoint), its precision and the precision of its "
             "weights (`-weights` candidates run a cast copy), its error against fp32 eager (the budget's metric), "
             "its median ms, and fp32 `torch.compile(mode=\"reduce-overhead\")`'s.", "",
             "| model | batch | backend | precision | weights | error | auto ms | fp32 reduce-overhead ms | speed-up |",
             "|---|---:|---|---|---|---:|---:|---:|---:|"]
    for row in rows:
        if "error" in row:
            lines.append(f"| {row['model']} | | failed: {row['error'].splitlines()[-1][:120]} | | | | | | |")
        for c in row.get("cells", []):
            lines.append(f"| {row['model']} | {c['batch_size']} | {c['backend']} | {c['precision']} | {c['weights']} | "
                         f"{c['error']:.6f}{'' if c['within_budget'] else ' (OUTSIDE)'} | "
                         f"{c['auto']['median_ms']:.3f} | {c[PEER]['median_ms']:.3f} | "
                         f"{c['speedup_over_fp32_reduce_overhead']:.2f}x |")
    return "\n".join(lines) + "\n"


def write(out: Path, tag: str, meta: Dict[str, Any], rows: List[Dict[str, Any]]) -> str:
    """Write ``precision-<tag>.json`` and ``.md`` for ``rows``; returns the Markdown."""
    return write_table(out, f"precision-{tag}", meta, rows, summary, markdown)


def combine(parts: List[Path], out: Path, tag: str) -> None:
    """Join lanes (same device, torch and precisions) into one table, the seed's models first in their order."""
    print(write(out, tag, *joined_lanes(parts, MODELS, ("device", "torch", "python", "precisions"))))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    lane_arguments(parser, MODELS, profile="default")
    parser.add_argument("--precisions", nargs="+", default=PRECISIONS)
    parser.add_argument("--backends", nargs="+", default=None, help=f"default: {' '.join(BACKENDS)}")
    parser.add_argument("--sizes", nargs="+", type=int, default=None, help=f"default: {' '.join(map(str, SIZES))}")
    parser.add_argument("--quick", action="store_true", help=f"a CPU try-out: {QUICK} unless given")
    args = parser.parse_args()
    preset = QUICK if args.quick else {"sizes": SIZES, "backends": BACKENDS}
    args.sizes, args.backends = args.sizes or preset["sizes"], args.backends or preset["backends"]
    if args.quick and "--profile" not in sys.argv:
        args.profile = QUICK["profile"]
    run_lane(args, lambda: {"device": devices.name(torch.device(args.device)), "torch": torch.__version__,
                            "python": platform.python_version(), "precisions": args.precisions,
                            "command": command_line()},
             lambda model: row_or_error(model, lambda m: bench_model(m, args)), write, combine)


if __name__ == "__main__":
    main()
