"""The tool's own cost (issue 27): tune time cold and warm, the cost account, and the route it buys.

For each model it tunes as a user would, ``python -m pipeline model=M device=cuda backends=gpu
'precision=[fp32,tf32,bf16]'`` with the default profile, in a fresh process: first with an empty compile cache
(``cold``), then, for the models named by ``--warm``, again on the cache the first run left (``warm``, as a
second sweep job or a re-run finds it). Each run's wall time (the process, imports included) and its own
``tune_s`` and cost account (``cost.json``) are recorded. Then the routed model is timed against the route the
previous code chose for the same model (``--before``, default: the routes of
``bench/results/precision-h200-rerun.json``, measured before screening and the compile cache existed; issue 28
names the same routes for resnet50 and vit_b_16 under ``backends=gpu``), both loaded from checkpoints and timed
in the same interleaved rounds at every tuned size: ``auto_vs_before`` is the geometric mean of before / new
medians (>= 1: the new route is as fast or faster). The before checkpoint is the new one with its route and
backends replaced, so both serve the same weights.

Writes ``tune-cost-<tag>.json`` (``summary: {model: {cold_s, warm_s, auto_vs_before}}``) and ``.md``.

    python bench/tune_cost.py --out OUT --tag h200 --models resnet50 mlp vit_b_16 --warm resnet50
    python bench/tune_cost.py --out OUT --tag cpu --device cpu --smoke     # the CPU check: a tiny model, seconds
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import sys
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import (command_line, joined_lanes, row_or_error, run_lane, runs_argument, tune_process,  # noqa: E402
                          write_table)
from pipeline import devices  # noqa: E402

BEFORE_FILE = ROOT / "bench" / "results" / "precision-h200-rerun.json"
GPU = ["backends=gpu", "precision=[fp32,tf32,bf16]"]
# --smoke: the bench's whole path on a CPU in a minute, numbers meaningless.
SMOKE = {"models": ["tiny_mlp"], "overrides": ["backends=[eager,inductor]", "profile=quick"],
         "before": {"tiny_mlp": [{"lo": 1, "hi": None, "backend": "eager"}]}}


def before_routes(path: Path) -> Dict[str, List[Dict[str, Any]]]:
    """model -> the ranges the previous code routed it by (a committed bench result)."""
    rows = json.loads(path.read_text())["rows"]
    return {row["model"]: [{k: r[k] for k in ("lo", "hi", "backend")} for r in row["route"]] for row in rows}


def tune(model: str, args: argparse.Namespace, cache: Path, run_dir: Path) -> Dict[str, Any]:
    """One tune in a fresh process, as a user runs it; its wall time and what its run directory says."""
    overrides = [f"model={model}", f"device={args.device}", *args.overrides, f"compile_cache.dir={cache}",
                 f"hydra.run.dir={run_dir}", "tracking=sqlite", f"tracking.uri=sqlite:///{args.runs}/mlflow.db",
                 "tracking.experiment=tune_cost"]
    done = tune_process([sys.executable, "-m", "pipeline", *overrides], ROOT, {**os.environ, "PYTHONUNBUFFERED": "1"},
                        args.runs / f"{run_dir.name}.log", run_dir, f"{model}: the tune")
    cost, route = done["cost"], done["route"]
    return {"wall_s": done["wall_s"], "tune_s": cost["tune_s"], "stage_s": cost["stage_s"], "candidates": cost["candidates"],
            "route": route["ranges"], "screened_out": sorted(route["screened_out"]),
            "noisy_cells": len(route["noisy_cells"]), "checkpoint": str(run_dir / "model.tweak")}


def before_checkpoint(new: Path, ranges: Sequence[Mapping[str, Any]], config: Path, out: Path) -> Path:
    """``new``'s checkpoint with the previous code's route and those backends' configs (same weights)."""
    from omegaconf import OmegaConf

    from pipeline.preflight.checks import candidates_of
    from pipeline.route import checkpoint

    payload = checkpoint.read(new)
    candidates = candidates_of(OmegaConf.load(config))
    payload["route"] = [dict(r) for r in ranges]
    payload["backends"] = {r["backend"]: {"name": r["backend"], **candidates[r["backend"]].config()} for r in ranges}
    payload.pop("compiled", None)  # the new route's artifacts are not the old route's
    checkpoint.write(payload, out)
    return out


def timed_against_before(model: str, cold: Mapping[str, Any], ranges: Sequence[Mapping[str, Any]],
                         args: argparse.Namespace) -> Dict[str, Any]:
    """The new route and the previous one, loaded from checkpoints, timed in the same rounds at every tuned size."""
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    from pipeline.measure.interleaved import measure_interleaved
    from pipeline.models import make_inputs
    from pipeline.route import checkpoint

    run_dir = Path(cold["checkpoint"]).parent
    cfg = OmegaConf.load(run_dir / "config.yaml")
    before = before_checkpoint(Path(cold["checkpoint"]), ranges, run_dir / "config.yaml",
                               args.runs / f"{model}-before.tweak")
    device = torch.device(args.device)
    torch.manual_seed(int(cfg.seed))
    auto = checkpoint.load(cold["checkpoint"], instantiate(cfg.model.build).eval(), device=device)
    previous = checkpoint.load(before, instantiate(cfg.model.build).eval(), device=device)
    cells = []
    for bs in sorted(int(b) for b in cfg.model.batch_sizes):
        inputs = make_inputs(OmegaConf.to_container(cfg.model.inputs, resolve=True), bs, device, seed=1)
        timed = measure_interleaved({"auto": lambda: auto(**inputs), "before": lambda: previous(**inputs)}, device,
                                    cfg.profile)
        cells.append({"batch_size": bs, "auto": timed["auto"].summary(), "before": timed["before"].summary(),
                      "before_over_auto": timed["before"].median / timed["auto"].median})
    ratios = [c["before_over_auto"] for c in cells]
    return {"before_route": list(ranges), "cells": cells,
            "auto_vs_before": math.exp(sum(map(math.log, ratios)) / len(ratios)),
            "auto_load_s": auto.load_seconds, "before_load_s": previous.load_seconds}


def bench_model(model: str, args: argparse.Namespace) -> Dict[str, Any]:
    cache = args.runs / f"cache-{model}"
    shutil.rmtree(cache, ignore_errors=True)  # cold: an empty compile cache
    row: Dict[str, Any] = {"model": model, "cold": tune(model, args, cache, args.runs / f"{model}-cold")}
    if model in args.warm:
        row["warm"] = tune(model, args, cache, args.runs / f"{model}-warm")
    if model in args.before:
        row.update(timed_against_before(model, row["cold"], args.before[model], args))
    else:
        row["before_missing"] = f"no earlier route of {model} in {BEFORE_FILE.name}"
    return row


def summary(rows: List[Dict[str, Any]]) -> Dict[str, Any]:
    return {r["model"]: {"cold_s": r["cold"]["wall_s"], "warm_s": r.get("warm", {}).get("wall_s"),
                         "cold_tune_s": r["cold"]["tune_s"], "warm_tune_s": r.get("warm", {}).get("tune_s"),
                         "auto_vs_before": r.get("auto_vs_before")} for r in rows if "cold" in r}


def markdown(rows: List[Dict[str, Any]], meta: Dict[str, Any]) -> str:
    lines = [f"# Tune cost on {meta['device']} (torch {meta['torch']})", "",
             "Wall seconds of `python -m pipeline` (imports included), its own `tune_s`, and the new route against "
             "the previous code's, timed in the same rounds (before / new median, geomean).", "",
             "| model | cold s | cold tune_s | warm s | warm tune_s | screened out | route | auto vs before |",
             "|---|---:|---:|---:|---:|---:|---|---:|"]
    for r in rows:
        if "cold" not in r:
            lines.append(f"| {r['model']} | failed: {r.get('error', '')[:200]} |||||||")
            continue
        warm = r.get("warm", {})
        route = "; ".join(f"{x['lo']}-{x['hi'] or 'inf'} {x['backend']}" for x in r["cold"]["route"])
        lines.append(f"| {r['model']} | {r['cold']['wall_s']:.1f} | {r['cold']['tune_s']:.1f} | "
                     f"{warm.get('wall_s', float('nan')):.1f} | {warm.get('tune_s', float('nan')):.1f} | "
                     f"{len(r['cold']['screened_out'])} | {route} | {r.get('auto_vs_before') or float('nan'):.3f} |")
    return "\n".join(lines) + "\n"


def write(out: Path, tag: str, meta: Dict[str, Any], rows: List[Dict[str, Any]]) -> str:
    return write_table(out, f"tune-cost-{tag}", meta, rows, summary, markdown)


def combine(parts: List[Path], out: Path, tag: str) -> None:
    print(write(out, tag, *joined_lanes(parts, ["resnet50", "mlp", "vit_b_16"], ["device", "torch", "python", "cpus"])))


def machine(args: argparse.Namespace, argv: Optional[Sequence[str]]) -> Dict[str, Any]:
    """The table's header: the device, torch, Python, the cores, and the command."""
    return {"device": devices.name(torch.device(args.device)), "torch": torch.__version__,
            "python": platform.python_version(), "cpus": os.cpu_count(),
            "command": command_line(argv and [sys.argv[0], *argv])}


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--tag", default="h200")
    parser.add_argument("--models", nargs="+", default=["resnet50", "mlp", "vit_b_16"])
    parser.add_argument("--warm", nargs="*", default=["resnet50"], help="models tuned a second time, warm")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--smoke", action="store_true", help="a tiny model on this machine: the path, not numbers")
    parser.add_argument("--combine", nargs="+", type=Path, help="join these calls' JSON instead of running")
    runs_argument(parser)
    args = parser.parse_args(argv)
    args.overrides = SMOKE["overrides"] if args.smoke else GPU
    args.before = SMOKE["before"] if args.smoke else before_routes(BEFORE_FILE)
    if args.smoke:
        args.models, args.warm = SMOKE["models"], SMOKE["models"]
    run_lane(args, lambda: machine(args, argv), lambda model: row_or_error(model, lambda m: bench_model(m, args)),
             write, combine)


if __name__ == "__main__":
    main()
