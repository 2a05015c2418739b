"""Probe (issue 56, 2026-12-07): does the user's max-autotune compile pick slower kernels when it autotunes in a compile
worker while capture uses the same GPU, as the tune's ``reference_max_autotune`` does, than alone on a quiet GPU, as
the user's own compile would? Its picks are what every suite row compares with: a reference slowed by our own
capture would inflate the lead.

Phase 1, for each of ROUNDS x (quiet, beside), alternating: a fresh process compiles the model (a torchvision name, or
a ``module.Class`` built with no arguments such as the suite's ``bench.suite.PhlippeResNet``; random weights, bf16
weights as ``reference_max_autotune.bf16-weights``) with ``torch.compile(mode="max-autotune")`` at one
batch size into its own empty Inductor cache, with every core as its compile threads (as the tune's autotuning
worker has); for ``beside`` this process meanwhile runs what capture runs on the device: the eager model at batch
sizes cycling 1..batch, a device graph recorded and replayed every tenth step. Phase 2: a fresh process loads
every program from its own cache (an FX graph cache hit each, checked: a miss would compile again, quietly, and is
an error) and times them in the profile's interleaved rounds (``pipeline.measure.interleaved``).

    python bench/probes/autotune_beside_probe.py --model bench.suite.PhlippeResNet --batch 128 --size 32 OUT_DIR
    python bench/probes/autotune_beside_probe.py --model regnet_y_400mf --batch 32 --rounds 2 OUT_DIR
    python bench/probes/autotune_beside_probe.py --device cpu --model resnet18 --batch 2 --size 32 --rounds 1 OUT_DIR

Prints each compile's seconds and each program's median ms; the quiet programs' spread is the noise autotuning
has anyway, so beside is slower only where it falls outside it. Writes ``OUT_DIR/autotune-beside.json``.

Size it to the device call: RegNetY-400MF at 32 takes 255-295 s a compile on an H200 (2026-12-07, calls BT and BU:
one round's beside compile did not end within a 10-minute call); PhlippeResNet, the suite's CIFAR ResNet whose cells
max-autotune leads (90 s for its two batch sizes on an H100), fits two rounds.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List

ROOT = Path(__file__).resolve().parents[2]


def build(model: str, device: str) -> Any:
    """The model as the bf16-weights reference compiles it: eval mode, weights cast, on the device. ``model``: a
    torchvision name, or ``module.Class`` (imported from the repository root, built with no arguments)."""
    import importlib

    import torch
    import torchvision

    torch.manual_seed(0)
    if "." in model:
        module, _, name = model.rpartition(".")
        built = getattr(importlib.import_module(module), name)()
    else:
        built = torchvision.models.get_model(model)
    return built.eval().to(device=device, dtype=torch.bfloat16)


def sample(batch: int, size: int, device: str) -> Any:
    import torch

    return torch.randn(batch, 3, size, size, device=device, dtype=torch.bfloat16)


def compile_one(args: argparse.Namespace) -> None:
    """Phase 1's child: compile and run once (max-autotune benchmarks its templates here), print its seconds."""
    import torch

    model = build(args.model, args.device)
    start = time.perf_counter()
    with torch.inference_mode():
        torch.compile(model, mode="max-autotune", dynamic=False)(sample(args.batch, args.size, args.device))
    if args.device == "cuda":
        torch.cuda.synchronize()
    print(json.dumps({"compile_s": time.perf_counter() - start}), flush=True)


def capture_load(model: Any, args: argparse.Namespace, child: "subprocess.Popen[str]") -> int:
    """What capture runs on the device while a worker autotunes: eager calls at many batch sizes, and now and then a
    device graph recorded and replayed; until the child exits. Returns the steps run."""
    import torch

    steps, recording = 0, args.device == "cuda"
    with torch.inference_mode():
        while child.poll() is None:
            x = sample(1 + steps % args.batch, args.size, args.device)
            if recording and steps % 10 == 9:
                try:
                    graph, side = torch.cuda.CUDAGraph(), torch.cuda.Stream()
                    side.wait_stream(torch.cuda.current_stream())
                    with torch.cuda.stream(side):  # warmed up off the default stream, as recording requires
                        model(x)
                    torch.cuda.current_stream().wait_stream(side)
                    with torch.cuda.graph(graph):
                        model(x)
                    graph.replay()
                except RuntimeError as exc:  # the load goes on with eager calls alone; the log says so
                    print(f"capture load: no more device graphs ({str(exc)[:200]})", flush=True)
                    recording = False
            else:
                model(x)
            if args.device == "cuda":
                torch.cuda.synchronize()
            steps += 1
    return steps


def phase_one(args: argparse.Namespace, out: Path) -> List[Dict[str, Any]]:
    """ROUNDS x (quiet, beside) compiles, each into its own cache."""
    model = build(args.model, args.device)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    programs = []
    for r in range(args.rounds):
        for kind in ("quiet", "beside"):
            cache = out / f"cache-{kind}-{r}"
            env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache), "TORCHINDUCTOR_COMPILE_THREADS": str(cores)}
            command = [sys.executable, __file__, "compile", str(out), *child_arguments(args)]
            child = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True)
            steps = capture_load(model, args, child) if kind == "beside" else 0
            output, _ = child.communicate()
            if child.returncode:
                raise SystemExit(f"{kind} compile {r} failed (rc {child.returncode})")
            entry = {"name": f"{kind}-{r}", "cache": str(cache), "capture_steps": steps,
                     **json.loads(output.strip().splitlines()[-1])}
            print(json.dumps(entry), flush=True)
            programs.append(entry)
    return programs


def time_all(args: argparse.Namespace, out: Path) -> None:
    """Phase 2's child: every program loaded from its cache (each a hit), timed in interleaved rounds."""
    import torch
    from torch._dynamo.utils import counters

    from pipeline.measure import interleaved

    programs = json.loads((out / "programs.json").read_text())
    x = sample(args.batch, args.size, args.device)
    calls = {}
    for entry in programs:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = entry["cache"]
        torch._dynamo.reset()
        hits = counters["inductor"]["fxgraph_cache_hit"]
        compiled = torch.compile(build(args.model, args.device), mode="max-autotune", dynamic=False)
        with torch.inference_mode():
            compiled(x)
        if counters["inductor"]["fxgraph_cache_hit"] <= hits:
            raise SystemExit(f"{entry['name']}: no FX graph cache hit in {entry['cache']}: it compiled again here")

        def call(fn: Any = compiled) -> Any:
            """As the profile calls a reference (``InductorBackend.__call__``): a new CUDA-graph step, the output
            cloned (the next replay overwrites it)."""
            if args.device == "cuda":
                torch.compiler.cudagraph_mark_step_begin()
            with torch.inference_mode():
                return fn(x).clone()

        calls[entry["name"]] = call
    medians: Dict[str, List[float]] = {name: [] for name in calls}
    for _ in range(args.repeats):
        timed = interleaved.measure_interleaved(calls, torch.device(args.device), {})
        for name, stats in timed.items():
            medians[name].append(stats.summary()["median_ms"])
    print(json.dumps({"median_ms": medians}), flush=True)


def child_arguments(args: argparse.Namespace) -> List[str]:
    """The program's shape, which both child phases need (the timing child is given ``--repeats`` beside it)."""
    return ["--model", args.model, "--batch", str(args.batch), "--size", str(args.size), "--device", args.device]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("phase", nargs="?", default="all", choices=["all", "compile", "time"])
    parser.add_argument("out")
    parser.add_argument("--model", default="regnet_y_400mf")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3, help="interleaved measurements of all programs")
    args = parser.parse_args()
    out = Path(args.out).resolve()
    sys.path.insert(0, str(ROOT))
    if args.phase == "compile":
        return compile_one(args)
    if args.phase == "time":
        return time_all(args, out)
    out.mkdir(parents=True, exist_ok=True)
    programs = phase_one(args, out)
    (out / "programs.json").write_text(json.dumps(programs))
    timing = subprocess.run([sys.executable, __file__, "time", str(out), *child_arguments(args),
                             "--repeats", str(args.repeats)],
                            capture_output=True, text=True)
    if timing.returncode:
        raise SystemExit(f"timing failed: {timing.stderr[-2000:]}")
    medians = json.loads(timing.stdout.strip().splitlines()[-1])["median_ms"]
    result = {"model": args.model, "batch": args.batch, "size": args.size, "device": args.device,
              "programs": [{**p, "median_ms": medians[p["name"]]} for p in programs]}
    (out / "autotune-beside.json").write_text(json.dumps(result, indent=1))
    for p in result["programs"]:
        print(f"{p['name']:10s} compile {p['compile_s']:7.1f} s  capture steps {p['capture_steps']:6d}  median ms "
              + " ".join(f"{m:.4f}" for m in p["median_ms"]), flush=True)


if __name__ == "__main__":
    main()
