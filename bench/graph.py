"""Graph backends against eager, Inductor and torch.compile(mode="reduce-overhead") on one GPU.

For each model (its conf/model file, random weights, fp32) it builds the five backends for
every size up to the largest, so graphs cover the grid 1, 2, 4, 8, ..., 64 only: unlike capture, it
does not record the off-grid sizes (3, 17) exactly, so those columns show what padding costs. Each
backend is checked against eager at a padded size (17), then all five are timed interleaved round
by round at each batch size, so every ratio in a row comes from one measurement. Also reports
compile and record seconds, graph count and pool memory; each size's first call is kept apart as
``first_call_ms``. Writes ``graph-<tag>.json`` under --out and prints a table.

    python bench/graph.py --out OUT                      # about 4-6 minutes on one H200
    python bench/graph.py --out OUT --models mlp mobilenet_v3_small resnet18
    python bench/graph.py --out OUT --models resnet50 vit_b_16 --append   # fills the same file
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import sys
import time
from pathlib import Path
from typing import Dict, List

import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import command_line  # noqa: E402
from pipeline import backends as backend_registry  # noqa: E402
from pipeline import devices  # noqa: E402
from pipeline.api import compose_config  # noqa: E402
from pipeline.measure.compare import judge  # noqa: E402
from pipeline.models import make_inputs  # noqa: E402
from pipeline.measure.interleaved import measure_interleaved# noqa: E402
from pipeline.backends.candidate import Candidate  # noqa: E402

MODELS = ["mlp", "mobilenet_v3_small", "resnet18", "resnet50", "vit_b_16"]
BACKENDS = ["eager", "inductor", "inductor_reduce_overhead", "graph", "graph_inductor"]
SIZES = [1, 3, 8, 17, 64]
CHECK_SIZE = 17  # padded through the 24 graph
# Modest budgets: five models x five sizes x five backends must fit in a few minutes.
TIMING = {"warmup_ms": 25, "min_warmup_calls": 3, "min_samples": 10, "max_samples": 100, "budget_ms": 150,
          "rel_precision": 0.03, "noise_threshold": 0.30, "max_repeats": 1}


def bench_model(name: str, device: torch.device) -> Dict:
    cfg = compose_config([f"model={name}", f"backends=[{','.join(BACKENDS)}]", "tracking=off"])
    torch.manual_seed(cfg.seed)
    model = instantiate(cfg.model.build).eval().to(device)
    spec = OmegaConf.to_container(cfg.model.inputs, resolve=True)
    largest = max(SIZES)
    # A one-row sample: Inductor compiles for batch 1 at build and once more, dynamic, at the next size
    # (a static compile at 64 would be shadowed by that dynamic one); graph backends tile it to 64.
    sample = make_inputs(spec, 1, device, cfg.seed)
    check = make_inputs(spec, CHECK_SIZE, device, cfg.seed + 1)
    with torch.inference_mode():
        expected = model(**check)

    built, builds = {}, {}
    for bname in BACKENDS:
        bcfg = OmegaConf.to_container(cfg.backends[bname], resolve=True)
        backend = backend_registry.create(Candidate.of(bname, bcfg))
        devices.reset_peak_memory(device)
        try:
            backend.build(model, sample, device, list(range(1, largest + 1)))
            builds[bname] = {"build_seconds": backend.build_seconds,
                             "peak_memory_bytes": devices.peak_memory_bytes(device),
                             f"max_rel_error_bs{CHECK_SIZE}": judge(backend(**check), expected).error,
                             **backend.stats()}
        except Exception as exc:  # one backend's failure is a result, not the end of an unattended run
            builds[bname] = {"error": f"{type(exc).__name__}: {exc}"[:2000]}
            print(f"   FAILED {bname}: {builds[bname]['error'][:300]}", flush=True)
            continue
        built[bname] = backend
        print(f"   built {bname:<26} {backend.build_seconds:6.1f} s", flush=True)

    cells: Dict[str, Dict[int, Dict]] = {}
    for bs in SIZES:
        inputs = make_inputs(spec, bs, device, cfg.seed)
        fns = {n: (lambda b=b: b(**inputs)) for n, b in built.items()}
        for n, m in measure_interleaved(fns, device, TIMING).items():
            cells.setdefault(n, {})[bs] = m.summary()
    del built, model
    gc.collect()
    torch._dynamo.reset()
    torch.cuda.empty_cache()
    return {"model": name, "builds": builds, "cells": cells}


def table(rows: List[Dict]) -> str:
    head = f"{'model':<20} {'backend':<26} " + " ".join(f"{'bs' + str(bs):>8}" for bs in SIZES)
    head += f" {'first s':>9} {'record s':>8} {'pool MiB':>8}"
    lines = [head, "-" * len(head)]
    for row in rows:
        for b in BACKENDS:
            per, build = row["cells"].get(b), row["builds"][b]
            if per is None:
                lines.append(f"{row['model']:<20} {b:<26} {build['error'][:80]}")
                continue
            # rows kept by --append from before the stat's rename name it compile_seconds
            compile_s = build.get("first_calls_seconds", build.get("compile_seconds", build["build_seconds"]))
            record = f"{build['record_seconds']:8.2f} {build['pool_bytes'] / 2**20:8.1f}" if "record_seconds" in build else ""
            lines.append(f"{row['model']:<20} {b:<26} " + " ".join(f"{per[bs]['median_ms']:8.3f}" for bs in SIZES)
                         + f" {compile_s:9.1f} {record}")
    return "\n".join(lines)


def verdict(rows: List[Dict]) -> Dict[str, float]:
    """graph_inductor over inductor_reduce_overhead at batch size 1, per model (below 1: faster)."""
    return {row["model"]: row["cells"]["graph_inductor"][1]["median_ms"]
            / row["cells"]["inductor_reduce_overhead"][1]["median_ms"]
            for row in rows if {"graph_inductor", "inductor_reduce_overhead"} <= row["cells"].keys()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--tag", default="h200")
    parser.add_argument("--models", nargs="+", default=MODELS)
    parser.add_argument("--device", default="cuda", help="cuda or xpu (cpu only smoke-tests this script)")
    parser.add_argument("--append", action="store_true", help="keep the other models' rows already in the file")
    args = parser.parse_args()
    device = devices.resolve(args.device)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"graph-{args.tag}.json"
    start, rows, commands = time.perf_counter(), [], []
    if args.append and path.exists():
        previous = json.loads(path.read_text())
        rows = [r for r in previous["rows"] if r["model"] not in args.models]
        for r in rows:  # JSON turned the batch-size keys into strings
            r["cells"] = {b: {int(bs): c for bs, c in per.items()} for b, per in r["cells"].items()}
        commands = previous["commands"]
    commands.append(command_line())
    for name in args.models:
        print(f"== {name} (at {time.perf_counter() - start:.0f} s)", flush=True)
        rows.append(bench_model(name, device))
        result = {"device": devices.name(device), "torch": torch.__version__, "python": platform.python_version(),
                  "dtype": "float32", "commands": commands, "timing": TIMING,
                  "batch_sizes": SIZES, "rows": rows, "graph_inductor_over_reduce_overhead_bs1": verdict(rows),
                  "seconds": time.perf_counter() - start}
        path.write_text(json.dumps(result, indent=2, default=str))
    print(f"\nLatency median ms by batch size, {result['device']}, fp32, torch {torch.__version__}\n")
    print(table(rows))
    ratios = verdict(rows)
    print("\ngraph_inductor / inductor_reduce_overhead at bs1: "
          + ", ".join(f"{m} {r:.2f}" for m, r in ratios.items())
          + f"  ->  faster on every model: {len(ratios) == len(rows) and all(r < 1 for r in ratios.values())}")
    print(f"total {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
