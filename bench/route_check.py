"""ResNet-18 on one GPU: the route the pipeline chooses, and its checkpoint served from a new process.

Tunes torchvision ResNet-18 (random weights) through ``pipeline.tune`` with eager, Inductor, graph
and graph + Inductor at batch sizes 1..64, prints the route and the profile medians, then loads
``model.tweak`` in a new Python process and checks that it serves the same outputs as the tuned
module (tuned, untuned and above-maximum sizes) and as eager. Reports the load time. Writes
``route-<tag>.json`` under --out, and the run's small files under ``route-<tag>-run/``.

    python bench/route_check.py --out OUT        # about 3-4 minutes on an H200
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# Tuned, untuned (padded) and above the largest tuned size (chunked / dynamic).
CHECK = [1, 2, 3, 5, 8, 17, 33, 64, 65, 100]
INPUT_SEED = 11
RUN_FILES = ("config.yaml", "capture.json", "profile.csv", "route.json", "validation.json")


def resnet18(seed: int):
    import torch
    import torchvision

    torch.manual_seed(seed)
    return torchvision.models.resnet18(weights=None)


def outputs(module, spec, device) -> Dict[int, "torch.Tensor"]:
    """Outputs at every CHECK size, on the CPU, from the same seeded inputs in every process."""
    import torch

    from pipeline.models import make_inputs

    with torch.inference_mode():
        return {bs: module(**make_inputs(spec, bs, device, INPUT_SEED)).float().cpu() for bs in CHECK}


def rel(a, b) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-6))


def child(args: argparse.Namespace) -> None:
    """The new process: load the checkpoint into a freshly built ResNet-18 and serve the CHECK sizes."""
    start = time.perf_counter()
    import torch

    import pipeline
    from pipeline.route.policy import backend_for

    import_s = time.perf_counter() - start
    model = resnet18(seed=1)  # other weights than the tuned model: the checkpoint must replace them
    loaded = pipeline.load(args.load, model)
    first_call = time.perf_counter()
    got = outputs(loaded, loaded.record.inputs, loaded.record.device)
    serve_s = time.perf_counter() - first_call
    ref = torch.load(args.ref, weights_only=True)
    eager = outputs(model, loaded.record.inputs, loaded.record.device)
    rows = [{"batch_size": bs, "backend": backend_for(loaded.route, bs), "tuned": bs in loaded.record.batch_sizes,
             "rel_err_vs_tuned_module": rel(got[bs], ref[bs]), "rel_err_vs_eager": rel(got[bs], eager[bs])}
            for bs in CHECK]
    Path(args.result).write_text(json.dumps({
        "import_seconds": import_s, "load_seconds": loaded.load_seconds, "first_calls_seconds": serve_s,
        "route": loaded.extra_repr(),
        "recorded_sizes": {n: b.stats().get("recorded_sizes") for n, b in loaded.backends.items()},
        "rows": rows}, indent=2))


def parent(args: argparse.Namespace) -> None:
    import torch

    import pipeline
    from pipeline import devices

    if not devices.available(args.device):
        sys.exit(f"route_check needs a {args.device} device (the graph backends need CUDA or XPU)")
    sizes = [int(b) for b in args.batch_sizes.split(",")]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="route_check_"))
    model = resnet18(seed=0)
    overrides = ["model=resnet18", f"backends=[{args.backends}]", f"model.batch_sizes=[{','.join(map(str, sizes))}]",
                 f"profile={args.profile}", "tracking=off", f"device={args.device}",
                 # The new process below is the reload check; skip validate's in-process one to save time.
                 "validate.check_reload=false"]
    start = time.perf_counter()
    tuned = pipeline.tune(model, {"x": torch.randn(1, 3, 224, 224)}, overrides=overrides, run_dir=work / "run")
    tune_s = time.perf_counter() - start
    route = json.loads((work / "run" / "route.json").read_text())
    capture = json.loads((work / "run" / "capture.json").read_text())

    ref = outputs(tuned, tuned.record.inputs, tuned.record.device)
    torch.save(ref, work / "ref.pt")
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, __file__, "--load", str(work / "run" / "model.tweak"),
                           "--ref", str(work / "ref.pt"), "--result", str(work / "child.json")],
                          cwd=ROOT, capture_output=True, text=True, timeout=args.child_timeout)
    child_wall = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"loading in a new process failed:\n{proc.stderr[-4000:]}")
    loaded = json.loads((work / "child.json").read_text())

    ranges = route["ranges"]
    owner = {bs: next(r["backend"] for r in ranges if r["lo"] <= bs and (r["hi"] is None or bs <= r["hi"]))
             for bs in sizes}
    small_graph = owner[min(sizes)].startswith("graph")
    large_inductor = owner[max(sizes)] == "inductor"
    tol = 5e-3  # fp32 tolerance of pipeline/measure/compare.py (TF32 convolutions, reordered reductions)
    same_outputs = all(r["rel_err_vs_tuned_module"] <= 1e-5 for r in loaded["rows"])
    matches_eager = all(r["rel_err_vs_eager"] <= tol for r in loaded["rows"])
    result = {
        "device": devices.name(torch.device(args.device)), "torch": torch.__version__, "profile": args.profile,
        "tune_seconds": tune_s, "child_wall_seconds": child_wall,
        "route": ranges, "owner_per_tuned_size": owner,
        "profile_medians_ms": route["profile_medians_ms"], "excluded": route["excluded"],
        "capture": {n: {k: o[k] for k in ("status", "reason", "build_seconds", "max_rel_error")} for n, o in capture.items()},
        "reload": loaded,
        "checks": {"small_batches_to_a_graph_backend": small_graph, "large_batches_to_inductor": large_inductor,
                   "reloaded_outputs_equal_tuned_module": same_outputs, "reloaded_outputs_match_eager": matches_eager},
    }
    path = out / f"route-{args.tag}.json"
    path.write_text(json.dumps(result, indent=2))
    run_copy = out / f"route-{args.tag}-run"
    run_copy.mkdir(exist_ok=True)
    for name in RUN_FILES:
        if (work / "run" / name).is_file():
            shutil.copy(work / "run" / name, run_copy / name)
    shutil.rmtree(work, ignore_errors=True)

    print(f"device {result['device']}, torch {result['torch']}, tuned in {tune_s:.0f} s")
    print("median ms       " + "".join(f"{bs:>9}" for bs in sizes))
    for name, per in route["profile_medians_ms"].items():
        print(f"{name:<16}" + "".join(f"{per.get(str(bs), float('nan')):>9.3f}" for bs in sizes))
    for name, reason in route["excluded"].items():
        print(f"excluded {name}: {reason[:200]}")
    print("route: " + "; ".join(f"{r['lo']}..{r['hi'] or 'inf'} -> {r['backend']}" for r in ranges))
    print(f"new process: import {loaded['import_seconds']:.1f} s, load {loaded['load_seconds']:.1f} s "
          f"(builds + warm-up), first calls {loaded['first_calls_seconds']:.1f} s; recorded {loaded['recorded_sizes']}")
    worst_tuned = max(r["rel_err_vs_tuned_module"] for r in loaded["rows"])
    worst_eager = max(r["rel_err_vs_eager"] for r in loaded["rows"])
    print(f"reloaded vs tuned module: worst rel err {worst_tuned:.2e}; vs eager {worst_eager:.2e} (tol {tol})")
    print("checks: " + ", ".join(f"{k}={v}" for k, v in result["checks"].items()))
    print(f"wrote {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench/results", help="folder for route-<tag>.json")
    parser.add_argument("--tag", default="h200")
    parser.add_argument("--profile", default="quick", help="profile preset (conf/profile)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--backends", default="eager,inductor,graph,graph_inductor")
    parser.add_argument("--batch-sizes", default="1,2,4,8,16,32,64")
    parser.add_argument("--child-timeout", type=int, default=400)
    parser.add_argument("--load", help=argparse.SUPPRESS)
    parser.add_argument("--ref", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args()
    child(args) if args.load else parent(args)


if __name__ == "__main__":
    main()
