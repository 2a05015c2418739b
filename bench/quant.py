"""Quantized precisions against the bf16 route on this machine's GPU (issue 32): the seed table's 25 cells and the
HF suite's BERT-QA cells, ``precision=[fp32,tf32,bf16,fp8,int8_weight_only]`` and the default accuracy budget
(cosine >= 0.999 against fp32 eager), against the same run restricted to ``precision=[fp32,tf32,bf16]``.

For each model it tunes once with the full list (``auto``), then routes that run's own measurements again over
the candidates of the restricted list alone (``bf16_route``: what the run would have served without the quantized
recipes) and saves that route's checkpoint too. Both routed models are loaded back from their checkpoints, as a
user serves them, and at each batch size auto's output is scored against fp32 eager (the budget's metric, on the
batches the profile timed) and both are timed in the same interleaved rounds. Writes ``quant-<tag>.json``
(``summary``: cells, budget_violations, matmul_bound_speedup_over_bf16_route (the geomean of bf16_route / auto
latency over vit_b_16 at 17 and 64 and BERT-QA at 32 and 128), cells_by_precision, ...) and ``.md``, which also
lists every quantized candidate's score and profile medians (where the budget rules a recipe out, they show it).

What it trades to finish inside one 10-minute call on one H200:

- the restricted run is not tuned again: its route is the same run's profile over its own candidates, which is
  what a second run would choose from the same measurements, for half the compiles;
- backends ``graph`` and ``graph_inductor`` only (eager and plain Inductor never won an H200 precision cell:
  ``precision-h200-rerun.md``), ``profile=quick``, graphs recorded at the tuned sizes only (``grid``; other
  sizes would pad to the next tuned one), the run's own reload check off (the bench loads both checkpoints
  itself), and no ``reduce-overhead`` peer;
- the matmul-bound models go first, and no model starts once ``--budget-s`` (default 540) would be passed by its
  ``bench_seconds`` in ``--expect-from`` tables, or else by the slowest model so far: the tables are rewritten after
  each model, ``summary.not_run`` names the models left, and a second call with ``--models ...`` is joined with
  ``--combine``.

    source bench/device_env.sh            # .whl/ holds torchao 0.18.0's wheel besides the usual ones
    python3 bench/quant.py --out OUT --tag h200
    python3 bench/quant.py --combine OUT/quant-h200.json OUT/quant-h200-b.json --out OUT --tag h200   # if split
    python bench/quant.py --out OUT --tag cpu --device cpu --smoke   # the CPU check: tiny models, eager, no numbers
"""

from __future__ import annotations

import argparse
import math
import platform
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Sequence

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import (budget_arguments, command_line, joined_lanes, lane_arguments, run_lane,  # noqa: E402
                          tune_and_load, unfinished, within_budget, write_table)
from bench.seed_table import MODELS as SEED_MODELS, SIZES as SEED_SIZES  # noqa: E402
from pipeline import devices  # noqa: E402
from pipeline import runner  # noqa: E402
from pipeline.context import RunContext  # noqa: E402
from pipeline.measure import accuracy  # noqa: E402
from pipeline.measure.interleaved import measure_interleaved  # noqa: E402
from pipeline.route import checkpoint  # noqa: E402
from pipeline.route.policy import backend_for  # noqa: E402

BERT = "BertForQuestionAnswering"
HF_SIZES = [1, 8, 32, 128]  # the HF suite's
PRECISIONS = ["fp32", "tf32", "bf16", "fp8", "int8_weight_only"]
RESTRICTED = ["fp32", "tf32", "bf16"]
BACKENDS = ["graph", "graph_inductor"]
# Matmul-bound models first (the summary's speed-up rests on them), mobilenet's long compiles last.
MODELS = ["vit_b_16", BERT, "resnet50", "resnet18", "mlp", "mobilenet_v3_small"]
TABLE_ORDER = [*SEED_MODELS, BERT]
MATMUL_BOUND = {"vit_b_16": (17, 64), BERT: (32, 128)}
PEER = "bf16_route"
# --smoke: tiny models on eager alone, to prove the bench runs on a CPU (tf32 and fp8 are skipped there).
SMOKE_MODELS = ["tiny_mlp", BERT]
SMOKE_SIZES = [1, 3]
SMOKE_MATMUL_BOUND = {BERT: (3,)}
SMOKE_HF = ["+model.hf.config={num_hidden_layers: 2, hidden_size: 64, num_attention_heads: 2, intermediate_size: 128}",
            "model.hf.seq_len=16"]


def sizes_of(model: str, args: argparse.Namespace) -> List[int]:
    if args.smoke:
        return SMOKE_SIZES
    return HF_SIZES if model == BERT else SEED_SIZES


def overrides(model: str, args: argparse.Namespace) -> List[str]:
    """The full-list run of ``model``: its model config, the backends (graphs at the tuned sizes), the profile."""
    sizes = ",".join(map(str, sizes_of(model, args)))
    if model == BERT:  # the HF suite's BERT-QA, without its per-backend autocast (precision is the routed choice)
        ov = ["model=hf", f"model.hf.model_class={model}", "model.hf.seq_len=128", "model.hf.use_cache=false",
              *(SMOKE_HF if args.smoke else [])]
    else:
        ov = [f"model={model}"]
    ov += [f"model.batch_sizes=[{sizes}]", f"device={args.device}", f"backends=[{','.join(args.backends)}]",
           f"precision=[{','.join(args.precisions)}]", f"profile={args.profile}", "validate.check_reload=false",
           # no screen: a restricted candidate the screen dropped for a faster quantized one would be missing
           # from the restricted route, which would then read slower than a run of its own list
           "profile.screen=false",
           "reference=false",  # the restricted lists are this bench's peers; a reference would join every list
           "tracking=sqlite", f"tracking.uri=sqlite:///{args.runs.resolve()}/mlflow-{args.tag}.db",
           "tracking.experiment=quant"]
    if args.smoke:  # tiny Linears, far below torchao's row-wise filter: quantize them all, to exercise the bench
        ov += [f"backends.{b}.large_linears_only=false" for b in args.backends]
    return ov + [f"backends.{b}.grid=[{sizes}]" for b in args.backends if b.startswith("graph")]


def routed_over(ctx: RunContext, precision_list: Sequence[str], path: Path) -> Any:
    """The route of ``ctx``'s measurements over ``precision_list``'s candidates (the route stage run again on them
    alone: ``runner.rerun``, which saves its checkpoint), copied to ``path`` and loaded back."""
    sub = runner.rerun(ctx, "route", precision=precision_list)
    for saved in (sub.checkpoint_path, sub.route_report.artifacts):
        if saved is not None:
            shutil.copyfile(saved, path.parent / saved.name.replace(sub.checkpoint_path.name, path.name))
    return sub, checkpoint.load(path, ctx.model, device=ctx.device)


def bench_model(model: str, args: argparse.Namespace) -> Dict[str, Any]:
    run_dir = args.runs / f"{args.tag}-{model}"
    cfg, ctx, auto, tune_s, load_s = tune_and_load(overrides(model, args), run_dir)
    start = time.perf_counter()
    sub, peer = routed_over(ctx, args.restricted, run_dir / "bf16-route.tweak")
    peer_s = time.perf_counter() - start
    budget = cfg.route.accuracy_budget
    _, inputs_at = ctx.input_sources()[0]  # the batches the profile timed
    outcomes = ctx.outcomes
    matmul_bound = args.matmul_bound.get(model, ())
    cells = []
    for bs in ctx.batch_sizes:
        inputs = inputs_at(bs)
        with torch.inference_mode():
            reference = ctx.model(**inputs)
            error = accuracy.score(auto(**inputs), reference, budget.metric)
            peer_error = accuracy.score(peer(**inputs), reference, budget.metric)
        timed = measure_interleaved({"auto": lambda: auto(**inputs), PEER: lambda: peer(**inputs)}, ctx.device,
                                    cfg.profile)
        chosen, peer_chosen = backend_for(auto.route, bs), backend_for(peer.route, bs)
        cells.append({"batch_size": bs, "backend": chosen, "precision": outcomes[chosen].precision,
                      "weights": outcomes[chosen].weights, "error": error,
                      "within_budget": accuracy.within(error, budget.metric, budget.bound),
                      f"{PEER}_backend": peer_chosen, f"{PEER}_precision": outcomes[peer_chosen].precision,
                      f"{PEER}_error": peer_error, "matmul_bound": bs in matmul_bound,
                      "auto": timed["auto"].summary(), PEER: timed[PEER].summary(),
                      f"speedup_over_{PEER}": timed[PEER].median / timed["auto"].median})
    quantized = [c for c in ctx.route_info["candidates"] if c["precision"] not in args.restricted]
    medians = ctx.route_info["profile_medians_ms"]
    return {"model": model, "tune_seconds": tune_s, "checkpoint_load_seconds": load_s,
            f"{PEER}_seconds": peer_s, "accuracy_budget": ctx.route_info["accuracy_budget"],
            "route": ctx.route_info["ranges"], f"{PEER}_route": sub.route_info["ranges"],
            "candidates": ctx.route_info["candidates"], "validation_ok": ctx.validation.get("ok"),
            "quantized_candidates": [{**c, "profile_medians_ms": medians.get(c["backend"], {}),
                                      "reason": outcomes[c["backend"]].reason} for c in quantized],
            "stage_seconds": ctx.stage_seconds, "cells": cells}


def geomean(values: Sequence[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else math.nan


def summary(rows: List[Dict[str, Any]]) -> Dict[str, Any]:
    cells = [c for row in rows for c in row.get("cells", [])]
    chosen: Dict[str, int] = {}
    for c in cells:
        chosen[c["precision"]] = chosen.get(c["precision"], 0) + 1
    speedup = f"speedup_over_{PEER}"
    bound = [{"model": row["model"], "batch_size": c["batch_size"], speedup: c[speedup], "precision": c["precision"]}
             for row in rows for c in row.get("cells", []) if c["matmul_bound"]]
    return {"cells": len(cells), "budget_violations": sum(not c["within_budget"] for c in cells),
            f"matmul_bound_{speedup}": geomean([c[speedup] for c in bound]), "matmul_bound_cells": bound,
            "cells_by_precision": chosen, f"geomean_{speedup}": geomean([c[speedup] for c in cells]),
            f"worst_{speedup}": min((c[speedup] for c in cells), default=math.nan),
            "failed_models": [r["model"] for r in rows if "error" in r],
            "not_run": [r["model"] for r in rows if "not_run" in r],
            "validation_ok": all(r.get("validation_ok") for r in rows if "cells" in r)}


def markdown(rows: List[Dict[str, Any]], meta: Dict[str, Any]) -> str:
    budget = next((r["accuracy_budget"] for r in rows if "accuracy_budget" in r), None)
    shown = accuracy.describe(budget["metric"], budget["bound"]) if budget else "?"
    lines = [f"## {meta['device']}, torch {meta['torch']}, torchao {meta['torchao']}, precision={meta['precisions']} "
             f"against {meta['restricted']}, budget {shown}", "",
             f"Per cell: the routed candidate (`auto`, loaded from its checkpoint), its precision and weights, its "
             f"error against fp32 eager (the budget's metric), and the same run's route over {meta['restricted']} "
             f"(`{PEER}`), both timed in the same interleaved rounds; `*` marks the matmul-bound cells.", "",
             f"| model | batch | backend | precision | weights | error | {PEER} backend | auto ms | {PEER} ms | speed-up |",
             "|---|---:|---|---|---|---:|---|---:|---:|---:|"]
    for row in rows:
        why = unfinished(row)
        if why:
            lines.append(f"| {row['model']} | | {why} | | | | | | | |")
        for c in row.get("cells", []):
            lines.append(f"| {row['model']} | {c['batch_size']}{'*' if c['matmul_bound'] else ''} | {c['backend']} | "
                         f"{c['precision']} | {c['weights']} | "
                         f"{c['error']:.6f}{'' if c['within_budget'] else ' (OUTSIDE)'}"
                         f" | {c[f'{PEER}_backend']} | {c['auto']['median_ms']:.3f} | {c[PEER]['median_ms']:.3f} | "
                         f"{c[f'speedup_over_{PEER}']:.2f}x |")
    lines += ["", "Quantized candidates: status, score against fp32 eager (the budget's metric, worst tuned size), "
              "within the budget, profile median ms at each tuned size.", "",
              "| model | candidate | status | score | in budget | profile ms |", "|---|---|---|---:|---|---|"]
    for row in rows:
        for c in row.get("quantized_candidates", []):
            ms = " ".join(f"{bs}:{v:.3f}" for bs, v in c["profile_medians_ms"].items())
            ok = c["status"] == "ok"
            status = c["status"] if ok else f"{c['status']}: {c['reason'][:100]}"
            within = ("yes" if c["within_budget"] else "NO") if ok else ""
            lines.append(f"| {row['model']} | {c['backend']} | {status} | {c['score']:.6f} | {within} | {ms} |")
    return "\n".join(lines) + "\n"


def write(out: Path, tag: str, meta: Dict[str, Any], rows: List[Dict[str, Any]]) -> str:
    """Write ``quant-<tag>.json`` and ``.md`` for ``rows``; returns the Markdown."""
    return write_table(out, f"quant-{tag}", meta, rows, summary, markdown)


def combine(parts: List[Path], out: Path, tag: str) -> None:
    """Join calls (same device, versions and precision lists) into one table in the seed's order, a model that one
    call left unrun taken from the call that ran it."""
    meta, rows = joined_lanes(parts, TABLE_ORDER, ("device", "torch", "torchao", "python", "precisions", "restricted"))
    ran = {r["model"] for r in rows if "not_run" not in r}
    print(write(out, tag, meta, [r for r in rows if "not_run" not in r or r["model"] not in ran]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    lane_arguments(parser, MODELS, profile="quick")
    parser.add_argument("--precisions", nargs="+", default=PRECISIONS)
    parser.add_argument("--restricted", nargs="+", default=RESTRICTED, help="the precision list auto is held against")
    parser.add_argument("--backends", nargs="+", default=None, help=f"default: {' '.join(BACKENDS)} (--smoke: eager)")
    budget_arguments(parser)
    parser.add_argument("--smoke", action="store_true", help=f"a CPU check: {SMOKE_MODELS} made tiny, batch sizes "
                                                            f"{SMOKE_SIZES}, eager")
    args = parser.parse_args()
    if args.smoke and "--models" not in sys.argv:
        args.models = SMOKE_MODELS
    args.backends = args.backends or (["eager"] if args.smoke else BACKENDS)
    args.matmul_bound = SMOKE_MATMUL_BOUND if args.smoke else MATMUL_BOUND
    missing = [p for p in args.restricted if p not in args.precisions]
    if missing:
        parser.error(f"--restricted {missing} must be among --precisions {args.precisions}")

    def meta() -> Dict[str, Any]:
        return {"device": devices.name(torch.device(args.device)), "torch": torch.__version__,
                "torchao": checkpoint.version_of("torchao"), "python": platform.python_version(),
                "precisions": args.precisions, "restricted": args.restricted, "smoke": args.smoke,
                "command": command_line()}

    run_lane(args, meta, within_budget(args, lambda m: bench_model(m, args)), write, combine)


if __name__ == "__main__":
    main()
