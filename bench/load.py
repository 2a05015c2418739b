"""Checkpoint load time with compiled artifacts (issue 28): each checkpoint loaded in fresh processes, as a service
restarts, in three ways:

- ``trusted``: its compiled artifacts signed by this user (as the tune wrote them), the Inductor cache the tune left
  (a restart on the machine that tuned);
- ``clean_cache``: the same artifacts into an empty Inductor cache directory (a copy to a clean machine);
- ``untrusted``: artifacts refused (``trust_compiled=False``) and an empty cache: every backend compiled again.

Before them, one trusted load whose seconds are reported apart (``first_s``): the first process after the tune to
import what only a load imports writes Python's bytecode cache of it (as installing a package does) and reads the
program's files from disk. ``left_running`` (``_untrusted``): the child processes a trusted (untrusted) load left
running ten seconds after it returned (a compile-worker pool).

Each process reports ``load_seconds`` (``pipeline.load`` alone: importing torch is outside it), its load report
(per backend: build, Dynamo trace, Inductor compile, graph recording, warm-up, cache hits and misses, whether
artifacts were used) and whether the served outputs match eager within the accuracy budget at every tuned size and
one untuned size. Writes ``load-<tag>.json`` (``summary: {model: {trusted_s, clean_cache_s, untrusted_s,
outputs_ok}}``) and ``.md``.

    python bench/load.py --out OUT --tag h200 --checkpoints RUNS/resnet50-cold/model.tweak RUNS/mlp-cold/model.tweak
    python bench/load.py --out OUT --tag cpu --smoke        # tunes a tiny Inductor route first, on this machine
    python bench/load.py --out OUT --tag h200 --checkpoints ... --profile  # and where a trusted load's seconds go
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import command_line, joined_lanes, runs_argument, runs_dir, write_table  # noqa: E402

PROFILE_TOP = 40
SETTLE_S = 10.0  # how long a load's child processes get to end before they count as left running
WAYS = {"trusted": {"trust": None, "clean": False}, "clean_cache": {"trust": None, "clean": True},
        "untrusted": {"trust": False, "clean": True}}
SMOKE = ["model=tiny_mlp", "backends=[eager,inductor]", "route=one_backend", "route.backend=inductor",
         "profile=quick", "device=cpu", "tracking=off"]


def children() -> List[str]:
    """The command lines of this process's live child processes (Linux): what a load left running, such as a pool
    of compile workers."""
    found = []
    for task in Path(f"/proc/{os.getpid()}/task").glob("*/children"):
        for pid in task.read_text().split():
            try:
                found.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:200].strip())
            except OSError:
                continue  # it ended meanwhile
    return found


def left_behind(seconds: float = SETTLE_S) -> List[str]:
    """:func:`children` once they ended, or ``seconds`` later: what a served process keeps running after its load (a
    compile-worker pool the load started is ended in the background as it returns: ``pipeline.compile.pool``)."""
    deadline = time.monotonic() + seconds
    while (found := children()) and time.monotonic() < deadline:
        time.sleep(0.1)
    return found


def heaviest(profiler: Any, top: int = PROFILE_TOP) -> List[Dict[str, Any]]:
    """The ``top`` functions of a cProfile run by cumulative seconds (file paths cut to the package's own)."""
    import pstats

    stats = pstats.Stats(profiler).stats  # {(file, line, name): (calls, primitive calls, tottime, cumtime, callers)}
    rows = sorted(stats.items(), key=lambda kv: kv[1][3], reverse=True)[:top]
    short = lambda f: f.split("site-packages/")[-1].split(str(ROOT) + "/")[-1]  # noqa: E731
    return [{"function": f"{short(f)}:{line}({name})", "cum_s": round(v[3], 3), "own_s": round(v[2], 3),
             "calls": v[0]} for (f, line, name), v in rows]


def load_once(checkpoint: Path, trust: Optional[bool], profile: bool = False) -> Dict[str, Any]:
    """In this (fresh) process: load ``checkpoint`` and check its outputs against eager; the figures as a dict.
    ``profile``: the load runs under cProfile and its heaviest functions are returned too (where its seconds go;
    the load's own seconds then include the profiler's overhead)."""
    import cProfile

    start = time.perf_counter()
    import torch

    torch_s, start = time.perf_counter() - start, time.perf_counter()
    import pipeline
    import pipeline.route.checkpoint  # noqa: F401 -- what pipeline.load imports

    import_s = time.perf_counter() - start  # beyond torch's own import
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    from pipeline.measure import accuracy
    from pipeline.models import make_inputs

    cfg = OmegaConf.load(checkpoint.parent / "config.yaml")
    torch.manual_seed(int(cfg.seed))
    model = instantiate(cfg.model.build).eval()
    profiler = cProfile.Profile() if profile else None
    if profiler:
        profiler.enable()
    served = pipeline.load(checkpoint, model, trust_compiled=trust)
    if profiler:
        profiler.disable()
    left_running = left_behind()
    budget, spec = cfg.route.accuracy_budget, OmegaConf.to_container(cfg.model.inputs, resolve=True)
    sizes = sorted({int(b) for b in cfg.model.batch_sizes} | {int(max(cfg.model.batch_sizes)) - 1 or 1})
    scores = {}
    model = model.to(served.record.device)
    for bs in sizes:
        inputs = make_inputs(spec, bs, served.record.device, seed=1)
        with torch.inference_mode():
            scores[bs] = accuracy.score(served(**inputs), model(**inputs), budget.metric)
    return {"torch_import_s": torch_s, "import_s": import_s, "load_s": served.load_seconds,
            "report": served.load_report.to_dict(), "children": left_running,
            **({"profile": heaviest(profiler)} if profiler else {}),
            "scores": scores, "outputs_ok": all(accuracy.within(v, budget.metric, budget.bound) for v in scores.values())}


def in_fresh_process(checkpoint: Path, way: str, runs: Path, profile: bool = False) -> Dict[str, Any]:
    """One way of loading, in a new Python process (a cleaned Inductor cache where the way says so), under cProfile
    where ``profile`` says so."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    cfg = json.loads(json.dumps(WAYS[way]))
    if cfg["clean"]:
        env["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix=f"clean-{way}-", dir=runs)
    else:
        from omegaconf import OmegaConf

        cache = OmegaConf.load(checkpoint.parent / "config.yaml").compile_cache
        env["TORCHINDUCTOR_CACHE_DIR"] = str((ROOT / cache.dir) if not Path(cache.dir).is_absolute() else cache.dir)
    proc = subprocess.run([sys.executable, __file__, "--one", str(checkpoint), "--trust", json.dumps(cfg["trust"]),
                           *(["--cprofile"] if profile else [])], cwd=ROOT, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        return {"error": proc.stderr[-3000:]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def bench_checkpoint(checkpoint: Path, runs: Path, profile: bool = False) -> Dict[str, Any]:
    """Each way's load of ``checkpoint``, after a first trusted load (``first``: the first process to import what a
    load imports beyond the tune writes Python's bytecode cache of it, as installing a package does on a user's
    machine, and reads the program's files from disk; its seconds are reported apart, not as the restart's); with
    ``profile``, one more trusted load under cProfile (``profiled``: its heaviest functions; its seconds are no
    figure)."""
    from omegaconf import OmegaConf

    model = OmegaConf.load(checkpoint.parent / "config.yaml").model.name
    row = {"model": model, "run": checkpoint.parent.name, "checkpoint": checkpoint.name,
           "first": in_fresh_process(checkpoint, "trusted", runs),
           **{way: in_fresh_process(checkpoint, way, runs) for way in WAYS}}
    if profile:
        row["profiled"] = in_fresh_process(checkpoint, "trusted", runs, profile=True)
    return row


def traced(load: Dict[str, Any]) -> Optional[bool]:
    """Whether any backend of a load traced or compiled (None where the load failed)."""
    backends = load.get("report", {}).get("backends")
    return None if backends is None else any(b.get("traced") for b in backends.values())


def label(row: Dict[str, Any], rows: List[Dict[str, Any]]) -> str:
    """A row's name: its model, and its run's folder where two checkpoints of one model are loaded."""
    twins = sum(r["model"] == row["model"] for r in rows) > 1
    return f"{row['model']} ({row.get('run', row['checkpoint'])})" if twins else row["model"]


def summary(rows: List[Dict[str, Any]]) -> Dict[str, Any]:
    """Per model (:func:`label`): ``import pipeline``'s seconds beyond torch's, each way's load seconds, whether the
    trusted load traced anything, and whether every way's outputs matched eager."""
    return {label(r, rows): {"import_s": r["trusted"].get("import_s")} | {f"{way}_s": r[way].get("load_s") for way in WAYS}
            | {"first_s": r.get("first", {}).get("load_s"), "left_running": len(r["trusted"].get("children", [])),
               "left_running_untrusted": len(r["untrusted"].get("children", [])),
               "traced": traced(r["trusted"]), "outputs_ok": all(r[way].get("outputs_ok") for way in WAYS)}
            for r in rows}


def markdown(rows: List[Dict[str, Any]], meta: Dict[str, Any]) -> str:
    lines = [f"# Checkpoint load on {meta['device']} (torch {meta['torch']})", "",
             "`pipeline.load` seconds in a fresh process (imports outside), and what the load report says.", "",
             "| model | import s | first s | trusted s | clean cache s | untrusted s | programs (trusted) | traced | left "
             "running (trusted/untrusted) | outputs ok |",
             "|---|---:|---:|---:|---:|---:|---|---|---:|---|"]
    nan = float("nan")
    for r in rows:
        s, name = summary([r])[r["model"]], label(r, rows)
        programs = ", ".join(f"{n}: {b.get('program')}" for n, b in r["trusted"].get("report", {}).get("backends",
                                                                                                         {}).items())
        lines.append(f"| {name} | {s['import_s'] or nan:.2f} | {s['first_s'] or nan:.2f} | "
                     f"{s['trusted_s'] or nan:.2f} | {s['clean_cache_s'] or nan:.2f} | {s['untrusted_s'] or nan:.2f} | "
                     f"{programs} | {s['traced']} | {s['left_running']}/{s['left_running_untrusted']} | {s['outputs_ok']} |")
    return "\n".join(lines) + "\n"


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--tag", default="h200")
    parser.add_argument("--checkpoints", nargs="*", type=Path, default=[])
    parser.add_argument("--smoke", action="store_true", help="tune a tiny Inductor route here first, then load it")
    parser.add_argument("--one", type=Path, help=argparse.SUPPRESS)  # the child process: load this checkpoint
    parser.add_argument("--trust", default="null", help=argparse.SUPPRESS)
    parser.add_argument("--cprofile", action="store_true", help=argparse.SUPPRESS)  # the child: under cProfile
    parser.add_argument("--profile", action="store_true",
                        help="also load each checkpoint once more under cProfile: where a trusted load's seconds go")
    runs_argument(parser)
    parser.add_argument("--combine", nargs="+", type=Path, help="join these calls' JSON instead of running")
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(load_once(args.one, json.loads(args.trust), args.cprofile), default=str))
        return
    args.out.mkdir(parents=True, exist_ok=True)
    if args.combine:
        meta, rows = joined_lanes(args.combine, ["resnet50", "mlp", "vit_b_16"], ["device", "torch", "python"])
        print(write_table(args.out, f"load-{args.tag}", meta, rows, summary, markdown))
        return
    runs = runs_dir(args)
    checkpoints = [c.resolve() for c in args.checkpoints]
    if args.smoke:
        subprocess.run([sys.executable, "-m", "pipeline", *SMOKE, f"hydra.run.dir={runs / 'smoke'}",
                        f"compile_cache.dir={runs / 'smoke-cache'}"], cwd=ROOT, check=True, capture_output=True)
        checkpoints.append(runs / "smoke" / "model.tweak")
    import torch

    from pipeline import devices

    meta = {"device": devices.name(torch.device("cuda" if torch.cuda.is_available() else "cpu")),
            "torch": torch.__version__, "python": platform.python_version(),
            "bytecode_cache": not sys.dont_write_bytecode,  # off: every fresh process compiles torch from source
            "command": command_line(argv and [sys.argv[0], *argv])}
    rows = []
    for checkpoint in checkpoints:
        rows.append(bench_checkpoint(checkpoint, runs, args.profile))
        print(write_table(args.out, f"load-{args.tag}", meta, rows, summary, markdown), flush=True)


if __name__ == "__main__":
    main()
