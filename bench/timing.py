"""Does a profile say honestly how far its numbers would move on a re-run, and do its routes hold?

Per model, the capture stage builds the backends once; then the real profile stage
(``stages/profile.py``) runs three times over them:

- ``quiet_1``, ``quiet_2``: two back-to-back profiles;
- ``loaded``: one profile while one spinning process per CPU core saturates the host.

Per model, and in ``summary`` over all of them:

- ``unflagged_disagreements``: cells whose medians differ between the quiet runs by more than 10%
  though neither run flagged them noisy (the flag should catch every such cell);
- ``interval_held_share``: per run, the share of cells whose stated interval holds the other run's
  median (``unflagged_interval_held_share``: of the cells that run did not flag);
- ``cross_regret``: each quiet run's route (the product route: ``route.min_gain``, the cells'
  intervals, the eager baseline), timed with the other run's medians, against the fastest backend
  there, at the worst size (``cross_regret_of_confident_routes``: of the routes that did not rest
  on noisy cells, the claim a route makes when route.json says ``rests_on_noisy: false``);
- ``busy_cpu_regret``: the route the loaded profile picks (``min_gain=0``: the fastest backend per
  size as it saw it), timed with each quiet run's medians, against the fastest there.

Budgets are modest (``PROFILE``) so that three profiles of two models fit in minutes:

    python bench/timing.py --out OUT --models resnet18 mobilenet_v3_small   # one H200: about 5 minutes
    python bench/timing.py --out OUT --device cpu --models tiny_mlp mlp     # CPU, backends=cpu
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
from omegaconf import DictConfig  # noqa: E402

from bench.common import command_line, host_probe_ms  # noqa: E402
from pipeline import devices, runner  # noqa: E402
from pipeline.api import compose_config  # noqa: E402
from pipeline.context import RunContext  # noqa: E402
from pipeline.measure.measurement import Measurement  # noqa: E402
from pipeline.route.decision import baseline as eager_candidate  # noqa: E402
from pipeline.route.policy import backend_for, choose_route, rests_on  # noqa: E402

DISAGREE = 0.10  # medians further apart than this should have been flagged
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
def cpu_load(processes: int, deadline_s: float = 1800.0) -> Iterator[Dict[str, Any]]:
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


def profile_run(base: RunContext, name: str) -> RunContext:
    """One run of the real profile stage over already-built backends (``runner.rerun``): the context it leaves."""
    start = time.perf_counter()
    ctx = runner.rerun(base, "profile")
    print(f"    {name}: profiled in {time.perf_counter() - start:.1f} s", flush=True)
    return ctx


def cells(profile: Profile) -> Dict[str, Dict[str, Any]]:
    """Every cell's summary plus its windows' sizes, passes and medians."""
    out: Dict[str, Dict[str, Any]] = {}
    for b, per in profile.items():
        for bs, m in sorted(per.items()):
            out.setdefault(b, {})[str(bs)] = {**m.summary(), "window_sizes": [len(w) for w in m.windows],
                                             "window_passes": m.passes,
                                             "window_medians_ms": [statistics.median(w) for w in m.windows]}
    return out


def pairs(a: Profile, b: Profile) -> Iterator[tuple]:
    """``(backend, batch size, cell in a, cell in b)`` for every cell both profiles measured."""
    for backend, per in a.items():
        for bs, m in sorted(per.items()):
            other = b.get(backend, {}).get(bs)
            if other is not None and m.count and other.count:
                yield backend, bs, m, other


def agreement(a: Profile, b: Profile) -> Dict[str, Any]:
    """Per cell, how far the two runs' medians are apart and whether either run flagged it."""
    rows = [{"backend": backend, "batch_size": bs, "run1_ms": m.median, "run2_ms": other.median,
             "rel_diff": abs(m.median - other.median) / min(m.median, other.median), "noisy": m.noisy or other.noisy}
            for backend, bs, m, other in pairs(a, b)]
    unflagged = [r for r in rows if not r["noisy"]]
    return {"cells": rows, "worst_rel_diff": max((r["rel_diff"] for r in rows), default=float("nan")),
            "unflagged_cells": len(unflagged),
            "unflagged_disagreements": [r for r in unflagged if r["rel_diff"] > DISAGREE]}


def interval_held(stated: Profile, rerun: Profile) -> Dict[str, Any]:
    """The share of ``stated``'s cells whose interval holds ``rerun``'s median, of all and of the unflagged."""
    held = [(m.interval[0] <= other.median <= m.interval[1], m.noisy) for _, _, m, other in pairs(stated, rerun)]
    calm = [ok for ok, noisy in held if not noisy]
    return {"cells": len(held), "share": sum(ok for ok, _ in held) / len(held) if held else float("nan"),
            "unflagged_cells": len(calm), "unflagged_share": sum(calm) / len(calm) if calm else float("nan")}


def regret(route_from: RunContext, judge: RunContext, order: List[str], min_gain: float, baseline: Optional[str],
           use_intervals: bool) -> Dict[str, Any]:
    """Route on ``route_from``; time each size's chosen backend with ``judge``'s medians, against the fastest there.

    Says too whether the route rested on cells ``route_from`` flagged noisy, as route.json would.
    """
    route = choose_route(route_from.medians(), order, "router", min_gain, baseline=baseline,
                         intervals=route_from.intervals() if use_intervals else None)
    noisy = [(b, bs) for b, bs in rests_on(route, route_from.medians(), route_from.intervals())
             if route_from.profile[b][bs].noisy]
    timed = judge.medians()
    rows = []
    for bs in sorted({bs for per in timed.values() for bs in per}):
        measured = {b: per[bs] for b, per in timed.items() if bs in per}
        chosen, best = backend_for(route, bs), min(measured, key=measured.get)
        rows.append({"batch_size": bs, "chosen": chosen, "best": best,
                     "regret": measured[chosen] / measured[best] if chosen in measured else float("inf")})
    return {"min_gain": min_gain, "intervals": use_intervals, "route": [r.to_dict() for r in route],
            "rests_on_noisy": bool(noisy), "noisy_cells": noisy, "per_size": rows,
            "worst_regret": max(r["regret"] for r in rows)}


def bench_model(model_name: str, args: argparse.Namespace, out: Path, load_processes: int) -> Dict[str, Any]:
    cfg = bench_config(model_name, args.backends, args.device, [*args.override, "stages=[capture]"])
    device = devices.resolve(args.device)
    start = time.perf_counter()
    # The capture stage of a run, which compiles and records once; every profile below reuses these backends.
    base = runner.run(cfg, out / f"{model_name}-capture")
    print(f"  {model_name}: built {sorted(base.backends)} in {time.perf_counter() - start:.0f} s", flush=True)
    order, baseline, min_gain = list(base.candidates), eager_candidate(base.candidates), float(cfg.route.min_gain)
    runs = {name: profile_run(base, f"{model_name}-{name}") for name in ("quiet_1", "quiet_2")}
    with cpu_load(load_processes) as load:
        runs["loaded"] = profile_run(base, f"{model_name}-loaded")
    load["probe_quiet"] = host_probe_ms()
    quiet = [("quiet_1", "quiet_2"), ("quiet_2", "quiet_1")]
    result = {
        "batch_sizes": base.batch_sizes,
        "capture": {n: o.to_dict() for n, o in base.outcomes.items()},
        "load": load,
        "runs": {name: cells(ctx.profile) for name, ctx in runs.items()},
        "agreement": agreement(runs["quiet_1"].profile, runs["quiet_2"].profile),
        "interval_held": {a: interval_held(runs[a].profile, runs[b].profile) for a, b in quiet},
        "cross_regret": {a: regret(runs[a], runs[b], order, min_gain, baseline, True) for a, b in quiet},
        "busy_cpu_regret": {q: regret(runs["loaded"], runs[q], order, 0.0, baseline, False) for q, _ in quiet},
        "busy_cpu_regret_product_route": {q: regret(runs["loaded"], runs[q], order, min_gain, baseline, True)
                                          for q, _ in quiet},
    }
    del base, runs
    torch._dynamo.reset()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return result


def summary(models: Mapping[str, Mapping[str, Any]]) -> Dict[str, Any]:
    """The headline figures over every model and run: counts summed, shares at their lowest, regrets at their worst."""
    def worst(key: str) -> float:
        return max(r["worst_regret"] for m in models.values() for r in m[key].values())

    held = [h for m in models.values() for h in m["interval_held"].values()]
    return {
        "worst_rel_diff": max(m["agreement"]["worst_rel_diff"] for m in models.values()),
        "unflagged_disagreements": sum(len(m["agreement"]["unflagged_disagreements"]) for m in models.values()),
        "interval_held_share": min(h["share"] for h in held),
        "unflagged_interval_held_share": min((h["unflagged_share"] for h in held if h["unflagged_cells"]),
                                             default=float("nan")),
        "cross_regret": worst("cross_regret"),
        "cross_regret_of_confident_routes": max((r["worst_regret"] for m in models.values()
                                                 for r in m["cross_regret"].values() if not r["rests_on_noisy"]),
                                                default=float("nan")),
        "busy_cpu_regret": worst("busy_cpu_regret"),
        "busy_cpu_regret_product_route": worst("busy_cpu_regret_product_route"),
    }


def print_model(name: str, r: Mapping[str, Any]) -> None:
    a = r["agreement"]
    print(f"\n== {name}: quiet runs differ by up to {a['worst_rel_diff']:.1%}; "
          f"{len(a['unflagged_disagreements'])} of {a['unflagged_cells']} unflagged cells differ by more than "
          f"{DISAGREE:.0%}")
    for run, h in r["interval_held"].items():
        print(f"  {run}: interval held the other run's median in {h['share']:.0%} of {h['cells']} cells "
              f"({h['unflagged_share']:.0%} of the {h['unflagged_cells']} it did not flag)")
    for key in ("cross_regret", "busy_cpu_regret", "busy_cpu_regret_product_route"):
        print(f"  {key}: " + ", ".join(f"{run} {x['worst_regret']:.3f}" + (" (rests on noise)" * x["rests_on_noisy"])
                                       for run, x in r[key].items()))
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
    parser.add_argument("--out", type=Path, required=True, help="folder for timing-<tag>.json")
    parser.add_argument("--models", nargs="+", default=["resnet18", "mobilenet_v3_small"])
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    parser.add_argument("--backends", default=None, help="a backends set or list (default: gpu on cuda, cpu on cpu)")
    parser.add_argument("--override", nargs="*", default=[], help="extra Hydra overrides, e.g. profile.budget_ms=500")
    parser.add_argument("--tag", default=None, help="names the result file (default: h200 on cuda, cpu on cpu)")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("bench/timing.py: no CUDA device; pass --device cpu to run it on the CPU")
    args.backends = args.backends or ("gpu" if args.device == "cuda" else "cpu")
    args.out.mkdir(parents=True, exist_ok=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the finally blocks: stop the load
    start = time.perf_counter()
    load_processes = host_cores()
    print(f"timing bench on {devices.name(torch.device(args.device))} (torch {torch.__version__}); "
          f"load = {load_processes} spinning processes", flush=True)
    report: Dict[str, Any] = {
        "command": command_line(), "device": devices.name(torch.device(args.device)), "torch": torch.__version__,
        "python": platform.python_version(), "host_cores": load_processes, "backends": args.backends,
        "profile_overrides": PROFILE + args.override, "models": {},
    }
    path = args.out / f"timing-{args.tag or ('h200' if args.device == 'cuda' else 'cpu')}.json"
    for name in args.models:  # written after every model, so a run cut short keeps what it measured
        report["models"][name] = bench_model(name, args, args.out, load_processes)
        print_model(name, report["models"][name])
        report["summary"] = summary(report["models"])
        report["elapsed_s"] = time.perf_counter() - start
        path.write_text(json.dumps(finite(report), indent=1))
    print(f"\nsummary: {json.dumps(finite(report['summary']))}  ({report['elapsed_s']:.0f} s) -> {path}")


if __name__ == "__main__":
    main()
