"""Profiles that repeat, and routes that a busy CPU does not decide, on one GPU.

(a) Two back-to-back profile runs of each model (same built backends, same config) must agree
    within 5% on every cell (backend x batch size).
(b) A profile taken while one spinning process per CPU core saturates the host picks the route
    (``choose_route``, router strategy). With the load stopped every backend is re-timed; at each
    batch size the chosen backend must be within 5% of the fastest (regret <= 1.05).

Backends are built once per model by the capture stage and reused by every run; every run goes
through the real profile stage (``stages/profile.py``).
Verdict (b) uses min_gain=0 (the fastest backend per size as the profile saw it); the product route
(``route.min_gain``) is reported beside it, against the route the quiet profile would pick.

    python bench/timing.py --out OUT     # writes OUT/timing-h200.json; about 4-6 minutes on one H200
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List, Mapping, Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from hydra.utils import instantiate  # noqa: E402
from omegaconf import DictConfig, OmegaConf  # noqa: E402

from pipeline import devices  # noqa: E402
from pipeline.api import compose_config  # noqa: E402
from pipeline.context import RunContext  # noqa: E402
from pipeline.route.policy import backend_for, choose_route, eager_baseline  # noqa: E402
from pipeline.measure.host import host_probe_ms# noqa: E402
from pipeline.measure.measurement import Measurement# noqa: E402
from stages import capture as capture_stage  # noqa: E402
from stages import profile as profile_stage  # noqa: E402

AGREE = 0.05  # (a): two runs within 5% on every cell
MAX_REGRET = 1.05  # (b)
# Modest budgets so that four profiles of two models fit in minutes; still +-2% medians.
PROFILE = ["profile=default", "profile.warmup_ms=30", "profile.min_warmup_calls=3", "profile.min_samples=10",
           "profile.max_samples=200", "profile.budget_ms=250", "profile.min_window_ms=25", "profile.max_repeats=2"]

Profile = Dict[str, Dict[int, Measurement]]


def bench_config(model: str, backends: str, device: str, extra: List[str]) -> DictConfig:
    return compose_config([f"model={model}", f"backends={backends}", f"device={device}", "tracking=off",
                           *PROFILE, *extra])


def host_cores() -> int:
    """CPU cores this process may use: its affinity, capped by a cgroup v2 CPU quota if one is set."""
    n = len(os.sched_getaffinity(0))
    with contextlib.suppress(OSError, ValueError):
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()
        if quota != "max":
            n = min(n, math.ceil(int(quota) / int(period)))
    return max(1, n)


# A spinner also stops by itself once its parent is gone or after a deadline, so a killed bench
# never leaves the machine loaded.
SPIN = """import os, sys, time
parent, end = os.getppid(), time.monotonic() + float(sys.argv[1])
while os.getppid() == parent and time.monotonic() < end:
    for _ in range(10000):
        pass
"""


@contextlib.contextmanager
def cpu_load(processes: int, deadline_s: float = 300.0) -> Iterator[Dict[str, Any]]:
    """One spinning Python process per core, killed (each by its own handle) on the way out."""
    procs = [subprocess.Popen([sys.executable, "-c", SPIN, str(deadline_s)]) for _ in range(processes)]
    info: Dict[str, Any] = {"processes": processes}
    try:
        time.sleep(2.0)  # let them all start spinning
        info["probe_under_load"] = host_probe_ms()
        yield info
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()
        info["loadavg_1min_at_end"] = os.getloadavg()[0]


def profile_run(base: RunContext, run_dir: Path) -> Profile:
    """One pass of the real profile stage over already-built backends."""
    run_dir.mkdir(parents=True, exist_ok=True)
    ctx = RunContext(cfg=base.cfg, run_dir=run_dir, device=base.device, model=base.model, inputs=base.inputs)
    ctx.backends = dict(base.backends)
    start = time.perf_counter()
    profile_stage.run(ctx)
    print(f"    {run_dir.name}: profiled in {time.perf_counter() - start:.1f} s", flush=True)
    return ctx.profile


def medians(profile: Profile) -> Dict[str, Dict[int, float]]:
    return {b: {bs: m.median for bs, m in per.items() if m.count} for b, per in profile.items()}


def cells(profile: Profile) -> Dict[str, Dict[str, Any]]:
    """Every cell's summary plus its windows' sizes and medians."""
    out: Dict[str, Dict[str, Any]] = {}
    for b, per in profile.items():
        for bs, m in sorted(per.items()):
            out.setdefault(b, {})[str(bs)] = {**m.summary(), "window_sizes": [len(w) for w in m.windows],
                                             "window_medians_ms": [statistics.median(w) for w in m.windows]}
    return out


def repeatability(a: Profile, b: Profile) -> Dict[str, Any]:
    rows = []
    for backend, per in a.items():
        for bs, m in sorted(per.items()):
            other = b.get(backend, {}).get(bs)
            if other is None or not m.count or not other.count:
                continue
            diff = abs(m.median - other.median) / min(m.median, other.median)
            rows.append({"backend": backend, "batch_size": bs, "run1_ms": m.median, "run2_ms": other.median,
                         "rel_diff": diff, "ok": diff <= AGREE, "noisy": m.noisy or other.noisy})
    worst = max((r["rel_diff"] for r in rows), default=float("nan"))
    # The profile's own claim: a cell it did not flag noisy in either run should repeat.
    unflagged = [r for r in rows if not r["noisy"]]
    return {"cells": rows, "worst_rel_diff": worst, "ok": bool(rows) and all(r["ok"] for r in rows),
            "unflagged_cells": len(unflagged),
            "worst_unflagged_rel_diff": max((r["rel_diff"] for r in unflagged), default=float("nan"))}


def regret(route_from: Profile, quiet: Profile, order: List[str], min_gain: float,
           baseline: Optional[str]) -> Dict[str, Any]:
    """Route on ``route_from``; judge each size's chosen backend by the quiet re-timing."""
    route = choose_route(medians(route_from), order, "router", min_gain, baseline=baseline)
    quiet_route = choose_route(medians(quiet), order, "router", min_gain, baseline=baseline)
    q = medians(quiet)
    rows = []
    for bs in sorted({bs for per in q.values() for bs in per}):
        measured = {b: per[bs] for b, per in q.items() if bs in per}
        chosen, best = backend_for(route, bs), min(measured, key=measured.get)
        quiet_choice = backend_for(quiet_route, bs)
        rows.append({"batch_size": bs, "chosen": chosen, "chosen_ms": measured.get(chosen), "best": best,
                     "best_ms": measured[best], "regret": measured[chosen] / measured[best] if chosen in measured
                     else float("inf"), "quiet_route_choice": quiet_choice,
                     "regret_vs_quiet_route": measured[chosen] / measured[quiet_choice]
                     if chosen in measured and quiet_choice in measured else float("inf")})
    return {"min_gain": min_gain, "route": [r.to_dict() for r in route],
            "quiet_route": [r.to_dict() for r in quiet_route], "per_size": rows,
            "worst_regret": max(r["regret"] for r in rows), "worst_regret_vs_quiet_route":
                max(r["regret_vs_quiet_route"] for r in rows)}


def bench_model(model_name: str, args: argparse.Namespace, out: Path, load_processes: int) -> Dict[str, Any]:
    cfg = bench_config(model_name, args.backends, args.device, args.override)
    device = devices.resolve(args.device)
    torch.manual_seed(cfg.seed)
    model = instantiate(cfg.model.build).eval().to(device)
    base = RunContext(cfg=cfg, run_dir=out / "runs" / f"{model_name}-capture", device=device, model=model,
                      inputs=OmegaConf.to_container(cfg.model.inputs, resolve=True))
    base.run_dir.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    capture_stage.run(base)  # compiles and records once; every run below reuses these backends
    print(f"  {model_name}: built {sorted(base.backends)} in {time.perf_counter() - start:.0f} s", flush=True)
    order = list(cfg.backends)
    baseline = eager_baseline(cfg.backends)
    runs: Dict[str, Profile] = {}
    runs["quiet_1"] = profile_run(base, out / "runs" / f"{model_name}-quiet_1")
    runs["quiet_2"] = profile_run(base, out / "runs" / f"{model_name}-quiet_2")
    with cpu_load(load_processes) as load:
        runs["loaded"] = profile_run(base, out / "runs" / f"{model_name}-loaded")
    load["probe_quiet"] = host_probe_ms()
    runs["retimed"] = profile_run(base, out / "runs" / f"{model_name}-retimed")
    result = {
        "batch_sizes": base.batch_sizes,
        "capture": {n: o.to_dict() for n, o in base.outcomes.items()},
        "load": load,
        "runs": {name: cells(p) for name, p in runs.items()},
        "repeatability": repeatability(runs["quiet_1"], runs["quiet_2"]),
        "regret_loaded_route": regret(runs["loaded"], runs["retimed"], order, 0.0, baseline),
        "product_route": regret(runs["loaded"], runs["retimed"], order, float(cfg.route.min_gain), baseline),
    }
    result["ok"] = {"repeatable_within_5pct": result["repeatability"]["ok"],
                    "regret_le_1.05": result["regret_loaded_route"]["worst_regret"] <= MAX_REGRET}
    del base, model, runs
    torch._dynamo.reset()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return result


def print_summary(name: str, r: Mapping[str, Any]) -> None:
    print(f"\n== {name}: repeatable within 5%: {r['ok']['repeatable_within_5pct']} "
          f"(worst {r['repeatability']['worst_rel_diff']:.1%}; {r['repeatability']['unflagged_cells']} cells not "
          f"flagged noisy in either run: worst {r['repeatability']['worst_unflagged_rel_diff']:.1%}); "
          f"regret <= 1.05: {r['ok']['regret_le_1.05']} "
          f"(worst {r['regret_loaded_route']['worst_regret']:.3f})")
    for backend, outcome in r["capture"].items():
        if outcome["status"] != "ok":
            print(f"  {backend}: {outcome['status']}: {outcome['reason'][:200]}")
    sizes = r["batch_sizes"]
    print(f"{'backend':<16}{'run':<9}" + "".join(f"{'bs' + str(bs):>10}" for bs in sizes))
    for backend in r["runs"]["quiet_1"]:
        for run, per_backend in r["runs"].items():
            per = per_backend.get(backend, {})
            row = "".join(f"{per[str(bs)]['median_ms']:>9.3f}{'*' if per[str(bs)]['noisy'] else ' '}"
                          if str(bs) in per else f"{'-':>10}" for bs in sizes)
            print(f"{backend:<16}{run:<9}{row}")
    for row in r["regret_loaded_route"]["per_size"]:
        print(f"  bs={row['batch_size']:<4} loaded profile chose {row['chosen']:<16} quiet best {row['best']:<16} "
              f"regret {row['regret']:.3f}")
    print("  (* = flagged noisy)")


def finite(x: Any) -> Any:
    """JSON without NaN/inf: they become null."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, Mapping):
        return {str(k): finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [finite(v) for v in x]
    return x


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="folder for timing-h200.json and the runs")
    parser.add_argument("--models", nargs="+", default=["resnet18", "mobilenet_v3_small"])
    parser.add_argument("--backends", default="gpu", help="a backends set or list, as on the command line")
    parser.add_argument("--override", nargs="*", default=[], help="extra Hydra overrides, e.g. profile.budget_ms=500")
    parser.add_argument("--device", default="cuda", help="cpu only for a smoke run of the script itself")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("bench/timing.py needs a CUDA device (or --device cpu for a smoke run)")
    args.out.mkdir(parents=True, exist_ok=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the finally blocks: stop the load
    start = time.perf_counter()
    load_processes = host_cores()
    print(f"timing bench on {devices.name(torch.device(args.device))} (torch {torch.__version__}); "
          f"load = {load_processes} spinning processes", flush=True)
    report: Dict[str, Any] = {
        "command": " ".join(["python", "bench/timing.py", *sys.argv[1:]]),
        "device": devices.name(torch.device(args.device)), "torch": torch.__version__, "python": platform.python_version(),
        "host_cores": load_processes, "profile_overrides": PROFILE + args.override, "models": {},
    }
    path = args.out / "timing-h200.json"
    for name in args.models:  # written after every model, so a run cut short keeps what it measured
        report["models"][name] = bench_model(name, args, args.out, load_processes)
        print_summary(name, report["models"][name])
        report["verdicts"] = {
            "repeatable_within_5pct": all(m["ok"]["repeatable_within_5pct"] for m in report["models"].values()),
            "regret_le_1.05": all(m["ok"]["regret_le_1.05"] for m in report["models"].values()),
        }
        report["elapsed_s"] = time.perf_counter() - start
        path.write_text(json.dumps(finite(report), indent=1))
    print(f"\nverdicts: {report['verdicts']}  ({report['elapsed_s']:.0f} s) -> {path}")


if __name__ == "__main__":
    main()
