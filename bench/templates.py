"""Every shipped Inductor mode and template on one GPU: latency, compile seconds, error vs eager.

Each backend of the ``inductor_all`` set is built as capture builds it, for the model's largest
benchmarked batch size first, then called once at each smaller size (that call's time is the
size's compile seconds). Its outputs are compared with eager at every size, and it is timed against
eager, interleaved round by round (as the profile stage times), so each speed-up comes from one
measurement. ``torch._dynamo.reset()`` runs between backends. Inductor's on-disk caches start empty
(a fresh TORCHINDUCTOR_CACHE_DIR unless one is set) but are shared within the run, so backends run
cheapest first and the autotuning ones last. Writes ``templates-<tag>.json`` under --out after
every backend (a killed run keeps what it measured) and prints a table.

    python bench/templates.py --out OUT          # all ten; the six without autotuning take about 2 minutes on one H200
    python bench/templates.py --out OUT --device cpu --model tiny_mlp --batch-sizes 1 2   # smoke test

The autotuning backends take minutes each to build. ``--inductor-config compile_threads=1`` (any
Inductor option, validated like a template's) is patched around each backend's build and first
calls through ``torch._inductor.config.patch``; on torch 2.11 it stops autotuning from compiling
every choice a second time, serially. Each backend's row records the patch. ``--resume`` keeps the
backends the JSON already holds:

    python bench/templates.py --out OUT --backends inductor_max_autotune_template inductor_tma --inductor-config compile_threads=1

Lanes on several GPUs (each its own --tag; they may split the backends, the batch sizes or both)
are joined with ``python bench/templates.py --out OUT --tag h200 --merge OUT/templates-h200-l*.json``.
A lane given one batch size compiles for that size alone (a static shape), where one run over both
sizes compiles batch size 1 as the second shape of a dynamic-shape graph, as the pipeline does.
"""

from __future__ import annotations

import os
import tempfile

os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="tweakpipe-inductor-"))

import argparse  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any, Dict, List  # noqa: E402

import torch  # noqa: E402
import torch._inductor.config  # noqa: E402
import yaml  # noqa: E402
from hydra.utils import instantiate  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import command_line  # noqa: E402
from pipeline import backends as backend_registry  # noqa: E402
from pipeline import devices  # noqa: E402
from pipeline.config import inductor_options  # noqa: E402
from pipeline.api import compose_config  # noqa: E402
from pipeline.measure.compare import judge, tolerance  # noqa: E402
from pipeline.models import make_inputs  # noqa: E402
from pipeline.measure.interleaved import measure_interleaved, time_call  # noqa: E402
from pipeline.backends.candidate import Candidate  # noqa: E402

# Cheapest first; the autotuning backends last, so they share autotuning results in that order.
ORDER = ["inductor", "inductor_triton", "inductor_cudagraphs", "inductor_reduce_overhead", "inductor_freezing",
         "inductor_cpp_wrapper", "inductor_max_autotune_no_cudagraphs", "inductor_max_autotune_template",
         "inductor_max_autotune", "inductor_tma"]
TIMING = {"warmup_ms": 25, "min_warmup_calls": 3, "min_samples": 10, "max_samples": 100, "budget_ms": 150,
          "rel_precision": 0.03, "noise_threshold": 0.30, "max_repeats": 1}


def setting(cfg: Dict[str, Any]) -> str:
    for key in ("template", "mode", "options"):
        if cfg.get(key) not in (None, "", {}):
            return f"{key}={cfg[key]}"
    return ""


def bench_backend(name: str, bcfg: Dict[str, Any], model: torch.nn.Module, spec: Dict, sizes: List[int],
                  device: torch.device, seed: int) -> Dict[str, Any]:
    """One backend at every size: compile seconds, error vs eager, latency interleaved with eager."""
    backend = backend_registry.create(Candidate.of(name, bcfg))
    row: Dict[str, Any] = {"setting": setting(bcfg), "options": backend.effective_options(), "per_batch": {}}
    reason = backend.unsupported_reason(device)
    if reason:
        return {**row, "status": "skipped", "reason": reason}
    largest = max(sizes)
    try:
        backend.build(model, make_inputs(spec, largest, device, seed), device, sizes)
        for bs in sorted(sizes, reverse=True):
            inputs = make_inputs(spec, bs, device, seed)
            compile_s = backend.build_seconds if bs == largest else time_call(lambda: backend(**inputs), device) / 1e3
            check = make_inputs(spec, bs, device, seed + 1)
            with torch.inference_mode():
                expected = model(**check)
            dtype = backend.candidate.compute_dtype
            verdict, tol = judge(backend(**check), expected, dtype), tolerance(dtype)
            fns = {"eager": lambda: model(**inputs), name: lambda: backend(**inputs)}
            with torch.inference_mode():
                timed = measure_interleaved(fns, device, TIMING)
            row["per_batch"][str(bs)] = {
                "compile_s": compile_s, "max_rel_error": verdict.error, "tolerance": tol, "ok": verdict.ok,
                "latency": timed[name].summary(), "eager": timed["eager"].summary(),
                "speedup_vs_eager": timed["eager"].median / timed[name].median,
            }
    except Exception as exc:  # one backend's failure is a result, not the end of an unattended run
        traceback.print_exc()
        return {**row, "status": "failed", "reason": f"{type(exc).__name__}: {exc}"[:2000]}
    finally:
        del backend
        gc.collect()
        torch._dynamo.reset()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    bad = [bs for bs, cell in row["per_batch"].items() if not cell["ok"]]
    return {**row, "status": "mismatch" if bad else "ok",
            "reason": f"differs from eager beyond tolerance at batch sizes {bad}" if bad else ""}


def table(result: Dict[str, Any]) -> str:
    sizes = result["batch_sizes"]
    head = f"{'backend':<38} {'setting':<34}" + "".join(f" {'bs' + str(b) + ' ms':>10} {'x eager':>7}" for b in sizes)
    head += "".join(f" {'compile' + str(b):>10}" for b in sizes) + f" {'max err':>8}"
    lines = [head, "-" * len(head)]
    for name, row in result["backends"].items():
        if row["status"] in ("skipped", "failed"):
            lines.append(f"{name:<38} {row['setting']:<34} {row['status']}: {row['reason'][:110]}")
            continue
        cells = [row["per_batch"].get(str(b)) for b in sizes]  # a lane may not have run every size
        line = f"{name:<38} {row['setting']:<34}"
        line += "".join(f" {c['latency']['median_ms']:10.3f} {c['speedup_vs_eager']:7.2f}" if c else f" {'-':>10} {'-':>7}"
                        for c in cells)
        line += "".join(f" {c['compile_s']:9.1f}s" if c else f" {'-':>10}" for c in cells)
        line += f" {max(c['max_rel_error'] for c in cells if c):8.1e}" + ("" if row["status"] == "ok" else "  MISMATCH")
        lines.append(line)
    return "\n".join(lines)


def merge(paths: List[Path], out: Path) -> Dict[str, Any]:
    """Join lanes of one model into one result: lanes may split the backends, the batch sizes, or both.

    A backend's cells are the union of its lanes' cells (a lane started with --resume from a shared
    file repeats that file's rows, identically); it is ok only if it is ok in every lane.
    """
    parts = [json.loads(p.read_text()) for p in paths]
    for path, part in zip(paths, parts):
        if part["model"] != parts[0]["model"]:
            raise SystemExit(f"--merge: {path} is for {part['model']}, not {parts[0]['model']}")
    result = {**parts[0], "batch_sizes": sorted({bs for part in parts for bs in part["batch_sizes"]}),
              "command": "python bench/templates.py --merge " + " ".join(map(str, paths)), "backends": {},
              "lanes": {str(p): {k: part.get(k) for k in ("command", "device", "batch_sizes", "seconds")}
                        for p, part in zip(paths, parts)}}
    result.pop("seconds", None)  # each lane's own is under "lanes"
    for name in ORDER:
        rows = [part["backends"][name] for part in parts if name in part["backends"]]
        if not rows:
            continue
        merged = {**rows[-1], "per_batch": {}}
        for row in rows:
            merged["per_batch"].update(row.get("per_batch", {}))
        failed = [row for row in rows if row["status"] != "ok"]
        if failed:
            merged["status"], merged["reason"] = failed[-1]["status"], failed[-1]["reason"]
        result["backends"][name] = merged
    out.write_text(json.dumps(result, indent=2, default=str))
    return result


def inductor_patch(pairs: List[str]) -> Dict[str, Any]:
    """``KEY=VALUE`` pairs (VALUE read as YAML) as validated Inductor options for config.patch."""
    bad = [p for p in pairs if "=" not in p]
    if bad:
        raise SystemExit(f"--inductor-config takes KEY=VALUE pairs, got {bad}")
    return inductor_options.validate({k: yaml.safe_load(v) for k, v in (p.split("=", 1) for p in pairs)},
                                     "--inductor-config")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--tag", default="h200")
    parser.add_argument("--model", default="resnet18", help="a model name (conf/model)")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 64])
    parser.add_argument("--backends", nargs="+", default=ORDER, help="a subset of the inductor_all set")
    parser.add_argument("--device", default="cuda", help="cuda (cpu only smoke-tests this script)")
    parser.add_argument("--resume", action="store_true",
                        help="keep the backends templates-<tag>.json already holds and run only the others")
    parser.add_argument("--inductor-config", nargs="+", default=[], metavar="KEY=VALUE",
                        help="Inductor options patched around each backend's build (e.g. compile_threads=1)")
    parser.add_argument("--merge", type=Path, nargs="+", help="join these lanes' JSON files into templates-<tag>.json")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.merge:
        path = args.out / f"templates-{args.tag}.json"
        print(table(merge(args.merge, path)) + f"\n\nwrote {path}")
        return
    device = devices.resolve(args.device)
    patch = inductor_patch(args.inductor_config)
    cfg = compose_config([f"model={args.model}", "backends=inductor_all", "tracking=off"])
    unknown = sorted(set(args.backends) - set(cfg.backends))
    if unknown:
        raise SystemExit(f"--backends {unknown} are not in the inductor_all set: {sorted(cfg.backends)}")
    torch.manual_seed(cfg.seed)
    model = instantiate(cfg.model.build).eval().to(device)
    spec = OmegaConf.to_container(cfg.model.inputs, resolve=True)
    start = time.perf_counter()
    result: Dict[str, Any] = {
        "command": command_line(), "device": devices.name(device), "torch": torch.__version__,
        "python": platform.python_version(), "model": args.model, "dtype": "float32",
        "batch_sizes": sorted(args.batch_sizes), "timing": TIMING,
        "note": "compile_s of the largest size is the build (first compile); of the others, the first call "
                "there. Inductor caches are shared within the run, in backend order.",
        "backends": {},
    }
    path = args.out / f"templates-{args.tag}.json"
    if args.resume and path.exists():
        earlier = json.loads(path.read_text())
        if (earlier["model"], earlier["batch_sizes"]) != (args.model, result["batch_sizes"]):
            raise SystemExit(f"--resume: {path} is for {earlier['model']} at {earlier['batch_sizes']}, not "
                             f"{args.model} at {result['batch_sizes']}; use another --tag")
        result["backends"] = earlier["backends"]
        result["command"] = earlier["command"] + " ; " + result["command"]
        start -= earlier.get("seconds", 0.0)
    for name in (b for b in args.backends if b not in result["backends"]):
        print(f"== {name} (at {time.perf_counter() - start:.0f} s)", flush=True)
        bcfg = OmegaConf.to_container(cfg.backends[name], resolve=True)
        with torch._inductor.config.patch(patch):
            result["backends"][name] = bench_backend(name, bcfg, model, spec, result["batch_sizes"], device,
                                                     cfg.seed)
        result["backends"][name]["inductor_config"] = patch
        result["seconds"] = time.perf_counter() - start
        path.write_text(json.dumps(result, indent=2, default=str))
    print(f"\n{args.model}, {result['device']}, fp32, torch {torch.__version__}: median latency, speed-up over eager "
          f"(same window), compile seconds, max relative error vs eager\n")
    print(table(result))
    print(f"\nwrote {path}; total {result['seconds']:.0f} s")


if __name__ == "__main__":
    main()
