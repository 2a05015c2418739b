"""The tool's cost on models users bring (issue 38): each tuned from a plain script, cold, warm, and against the
route of a tune with screening and regional programs off.

Each model is tuned as a user tunes their own: a script with no ``if __name__ == "__main__":`` guard builds the
model (random weights, seeded) and calls ``pipeline.tune`` at top level; it runs as ``python script.py`` in a
fresh process, with compile workers as the host starts them (one per four cores from eight cores up), and
prints one line from its top level, so the bench counts how often that ran (``top_level_runs``: 1 when no
worker imported the script). Per model:

- ``cold``: an empty compile cache; ``warm`` (``--warm``): again, on the cache the cold run left;
- ``full`` (``--full``): the same tune with the profile's screen, the precision-first screen and regional programs
  off (``FULL``), on the cache the cold run left (its seconds are no figure): the route the default one must match. Both checkpoints are loaded in this process and timed in
  the same interleaved rounds at every tuned size; ``auto_vs_full`` is the geometric mean of full / auto medians
  (>= 1: the default route is as fast);
- ``worker_misses``: FX-graph cache misses in the run's own process of candidates a worker compiled ahead (0: every
  worker-compiled program was a hit there).

``cold_s`` and ``warm_s`` are the seconds of the ``pipeline.tune`` call (the process's imports apart, in
``import_s``). Writes ``tune-scale-<tag>.json`` (``summary: {model: {cold_s, warm_s, auto_vs_full,
worker_misses}}``) and ``.md``, rewritten after every step, so a call cut short keeps what it measured.

    python bench/tune_scale.py --out OUT --tag h200 --models gpt2_medium vit_l_16 resnet50 --warm resnet50 --full
    python bench/tune_scale.py --out OUT --tag cpu --device cpu --smoke     # the CPU check: a tiny model, seconds
    python bench/tune_scale.py --out OUT --tag h200-traced --models resnet50 --warm resnet50 --full \
        --overrides compile_cache.standalone=false   # the default tunes with an option set, against the full route
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import command_line, runs_argument, runs_dir, tune_process  # noqa: E402

# What each model's script builds (``model`` and ``example``), the precisions it tunes, and its tuned sizes.
MODELS: Dict[str, Dict[str, Any]] = {
    "gpt2_medium": {
        "build": "import transformers\n"
                 "model = transformers.GPT2Model(transformers.GPT2Config(n_layer=24, n_embd=1024, n_head=16, "
                 "use_cache=False)).eval()\n"
                 "example = {'input_ids': torch.randint(0, 50257, (32, 128))}",
        "precision": "[fp32,bf16]", "batch_sizes": "[1,8,32]"},
    "vit_l_16": {  # torchvision zero-initialises the head (every output 0, nothing to check against): drawn at random
        "build": "import torchvision\nmodel = torchvision.models.vit_l_16().eval()\n"
                 "torch.nn.init.normal_(model.heads.head.weight, std=0.02)\n"
                 "example = torch.randn(32, 3, 224, 224)",
        "precision": "[fp32,bf16]", "batch_sizes": "[1,8,32]"},
    "resnet50": {
        "build": "import torchvision\nmodel = torchvision.models.resnet50().eval()\n"
                 "example = torch.randn(32, 3, 224, 224)",
        "precision": "[fp32,tf32,bf16]", "batch_sizes": "[1,8,32]"},
    "tiny_mlp": {  # --smoke
        "build": "model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8)).eval()\n"
                 "example = torch.randn(8, 32)",
        "precision": "[fp32]", "batch_sizes": "[1,8]"},
}
# The tune the default must match: no screen of either kind, no regional programs.
FULL = ["profile.screen=false", "profile.precision_screen=false", "backends=[eager,inductor,graph,graph_inductor]"]
SMOKE = ["backends=[eager,inductor]", "profile=quick", "compile_cache.workers=1"]
# --smoke's full tune: no compile worker. Its programs are hits on the cache the cold tune left, so a worker only
# added a process start for capture to wait on; the cold tune keeps its worker (the path the smoke checks).
SMOKE_FULL = ["compile_cache.workers=0"]
SCRIPT = """\
import json, os, time
started = time.perf_counter()
import torch, pipeline
print("TOP-LEVEL ran in pid", os.getpid(), flush=True)
torch.manual_seed(0)
{build}
imported = time.perf_counter() - started
start = time.perf_counter()
tuned = pipeline.tune(model, example, overrides={overrides!r}, run_dir={run_dir!r})
json.dump({{"import_s": imported, "tune_call_s": time.perf_counter() - start}}, open({result!r}, "w"))
"""


def overrides_for(model: str, args: argparse.Namespace, cache: Path, extra: Sequence[str] = ()) -> List[str]:
    spec = MODELS[model]
    return [f"device={args.device}", "backends=gpu" if args.device == "cuda" else "backends=cpu",
            f"precision={spec['precision']}", f"model.batch_sizes={spec['batch_sizes']}",
            f"compile_cache.dir={cache}", f"tracking.uri=sqlite:///{args.runs}/mlflow.db",
            "tracking.experiment=tune_scale", *(SMOKE if args.smoke else []), *extra]


def tune(model: str, label: str, args: argparse.Namespace, cache: Path, extra: Sequence[str] = ()) -> Dict[str, Any]:
    """One tune from a script without a main guard, in a fresh process; its seconds and its run directory's account."""
    run_dir, result = args.runs / f"{model}-{label}", args.runs / f"{model}-{label}.json"
    script = args.runs / f"tune_{model}_{label}.py"
    script.write_text(SCRIPT.format(build=MODELS[model]["build"], overrides=overrides_for(model, args, cache, extra),
                                    run_dir=str(run_dir), result=str(result)))
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]), "TWEAKPIPE_HOME": str(args.runs / "home")}
    done = tune_process([sys.executable, str(script)], args.runs, env, args.runs / f"{model}-{label}.log", run_dir,
                        f"{model} {label}: the script")
    cost, route = done["cost"], done["route"]
    return {"wall_s": done["wall_s"], **json.loads(result.read_text()), "tune_s": cost["tune_s"],
            "stage_s": cost["stage_s"], "step_s": cost["step_s"],
            "top_level_runs": done["output"].count("TOP-LEVEL ran in pid"),
            "worker_misses": worker_misses(cost["candidates"]), "candidates": cost["candidates"],
            "route": route["ranges"], "screened_out": sorted(route.get("screened_out", {})),
            "checkpoint": f"{run_dir.name}/model.tweak"}  # under --runs: no machine path in the results


def worker_misses(candidates: Mapping[str, Mapping[str, Any]]) -> int:
    """Cache misses in the run's own process of the candidates a compile worker compiled ahead."""
    return int(sum(c.get("cache_misses", 0) for c in candidates.values() if c.get("ahead_s", 0) > 0))


def timed_against_full(model: str, cold: Mapping[str, Any], full: Mapping[str, Any],
                       args: argparse.Namespace) -> Dict[str, Any]:
    """The default route and the full one, loaded from their checkpoints, timed in the same rounds at each tuned
    size; ``auto_vs_full``: the geometric mean of full / auto medians."""
    import torch
    from omegaconf import OmegaConf

    import pipeline
    from pipeline.measure.interleaved import measure_interleaved

    namespace: Dict[str, Any] = {"torch": torch}
    exec(MODELS[model]["build"], namespace)  # the scripts' own model (its weights come from each checkpoint)
    example = namespace["example"]
    device = torch.device(args.device)
    os.environ["TWEAKPIPE_HOME"] = str(args.runs / "home")  # the scripts' key signed their compiled artifacts
    auto = pipeline.load(args.runs / cold["checkpoint"], namespace["model"], device=device)
    other = pipeline.load(args.runs / full["checkpoint"], namespace["model"], device=device)
    profile = OmegaConf.load((args.runs / cold["checkpoint"]).parent / "config.yaml").profile
    cells = []
    for bs in json.loads(MODELS[model]["batch_sizes"]):
        if isinstance(example, dict):
            rows = {k: v[:bs].to(device) for k, v in example.items()}
            fns = {"auto": lambda: auto(**rows), "full": lambda: other(**rows)}
        else:
            row = example[:bs].to(device)
            fns = {"auto": lambda: auto(row), "full": lambda: other(row)}
        timed = measure_interleaved(fns, device, profile)
        cells.append({"batch_size": bs, "auto": timed["auto"].summary(), "full": timed["full"].summary(),
                      "full_over_auto": timed["full"].median / timed["auto"].median})
    ratios = [c["full_over_auto"] for c in cells]
    return {"cells": cells, "auto_vs_full": math.exp(sum(map(math.log, ratios)) / len(ratios)),
            "auto_route": cold["route"], "full_route": full["route"]}


def summary(rows: Mapping[str, Mapping[str, Any]]) -> Dict[str, Dict[str, Any]]:
    out = {}
    for model, row in rows.items():
        cold, warm, versus = row.get("cold") or {}, row.get("warm") or {}, row.get("versus") or {}
        out[model] = {"cold_s": cold.get("tune_call_s"), "warm_s": warm.get("tune_call_s"),
                      "auto_vs_full": versus.get("auto_vs_full"),
                      "worker_misses": cold.get("worker_misses"), "top_level_runs": cold.get("top_level_runs")}
    return out


def markdown(result: Mapping[str, Any]) -> str:
    lines = [f"# Tune cost on the models users bring ({result['tag']})", "", f"`{result['command']}`", "",
             "| model | cold s (tune_s) | warm s | full s | auto vs full | worker misses | top level ran | route |",
             "|---|---:|---:|---:|---:|---:|---:|---|"]
    for model, row in result["rows"].items():
        cold, warm, full = row.get("cold") or {}, row.get("warm") or {}, row.get("full") or {}
        versus = row.get("versus") or {}
        fmt = lambda v, spec=".1f": "" if v is None else format(v, spec)  # noqa: E731
        route = ", ".join(f"{r['lo']}..{r['hi'] or 'inf'}: {r['backend']}" for r in cold.get("route", []))
        lines.append(f"| {model} | {fmt(cold.get('tune_call_s'))} ({fmt(cold.get('tune_s'))}) | "
                     f"{fmt(warm.get('tune_call_s'))} | {fmt(full.get('tune_call_s'))} | "
                     f"{fmt(versus.get('auto_vs_full'), '.3f')} | {cold.get('worker_misses', '')} | "
                     f"{cold.get('top_level_runs', '')} | {route or row.get('error', '')} |")
    return "\n".join(lines) + "\n"


def write(result: Dict[str, Any], out: Path, tag: str, runs: Optional[Path] = None) -> None:
    """The JSON and its table into ``out``, and the JSON beside the ``runs`` too, where ``--continue`` finds it."""
    result["summary"] = summary(result["rows"])
    stem = out / f"tune-scale-{tag}"
    for folder in filter(None, (out, runs)):
        (folder / stem.with_suffix(".json").name).write_text(json.dumps(result, indent=1, default=str))
    stem.with_suffix(".md").write_text(markdown(result))


def combine(parts: Sequence[Path], out: Path, tag: str) -> Dict[str, Any]:
    """Calls' results as one (``--combine``): per model, the row of the last call that tuned it cold (calls are
    short: a model measured in one call keeps that call's row), and every call's command."""
    loaded = [json.loads(part.read_text()) for part in parts]
    rows: Dict[str, Any] = {}
    for part in loaded:
        for model, row in part["rows"].items():
            if row.get("cold") or model not in rows:
                rows[model] = row
    commands = [c for part in loaded for c in [*part.get("commands", []), part["command"]]]
    result = {"tag": tag, "command": " ; ".join(commands), "rows": rows}
    write(result, out, tag)
    return result


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--tag", default="h200")
    parser.add_argument("--models", nargs="+", default=["gpt2_medium", "vit_l_16", "resnet50"], choices=sorted(MODELS))
    parser.add_argument("--warm", nargs="*", default=[], help="models tuned again on the cache their cold run left")
    parser.add_argument("--full", action="store_true", help="also tune with screens and regional programs off, and "
                                                            "time both routes against each other")
    parser.add_argument("--overrides", nargs="*", default=[],
                        help="more overrides for the cold and warm tunes (not the full one, the route they must "
                             "match), e.g. compile_cache.standalone=false")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--budget-s", type=float, default=None, help="start no model's next step past this")
    parser.add_argument("--smoke", action="store_true", help="tiny_mlp on the quick profile: the bench's path only")
    parser.add_argument("--continue", dest="resume", action="store_true",
                        help="keep the steps an earlier call over the same --runs finished, run the rest")
    parser.add_argument("--combine", nargs="+", type=Path, help="join these calls' JSON instead of running")
    runs_argument(parser)
    args = parser.parse_args(argv)
    if args.combine:
        args.out.mkdir(parents=True, exist_ok=True)
        print(json.dumps(combine(args.combine, args.out, args.tag)["summary"], indent=1))
        return 0
    if args.smoke:
        args.models = ["tiny_mlp"]
    args.out.mkdir(parents=True, exist_ok=True)
    runs_dir(args).mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    result: Dict[str, Any] = {"tag": args.tag, "command": command_line(argv and ["bench/tune_scale.py", *argv]),
                              "rows": {}}
    earlier = args.runs / f"tune-scale-{args.tag}.json"
    if args.resume and earlier.is_file():
        result["rows"] = {m: {k: v for k, v in row.items() if k not in ("error", "not_run")}
                          for m, row in json.loads(earlier.read_text())["rows"].items()}
        result["commands"] = [*json.loads(earlier.read_text()).get("commands", []), json.loads(earlier.read_text())["command"]]
    for model in args.models:
        row = result["rows"].setdefault(model, {})
        cache = args.runs / f"cache-{model}"
        steps = [("cold", lambda: tune(model, "cold", args, cache, args.overrides))]
        if model in args.warm:
            steps.append(("warm", lambda: tune(model, "warm", args, cache, args.overrides)))
        if args.full:
            full = [*FULL, *(SMOKE_FULL if args.smoke else [])]
            steps.append(("full", lambda: tune(model, "full", args, cache, full)))  # its seconds are not a figure
            steps.append(("versus", lambda: timed_against_full(model, row["cold"], row["full"], args)))
        for label, step in steps:
            if label in row:
                continue  # an earlier call's (--continue)
            if args.budget_s is not None and time.perf_counter() - started > args.budget_s:
                row.setdefault("not_run", []).append(label)
                continue
            try:
                row[label] = step()
            except Exception as exc:  # noqa: BLE001 -- the row says why; the next model still runs
                row["error"] = f"{label}: {type(exc).__name__}: {str(exc)[-1500:]}"
                print(f"{model} {label} FAILED: {row['error']}", flush=True)
                break
            print(f"{model} {label} done after {time.perf_counter() - started:.0f} s", flush=True)
            write(result, args.out, args.tag, args.runs)
    write(result, args.out, args.tag, args.runs)
    print(json.dumps(result["summary"], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
