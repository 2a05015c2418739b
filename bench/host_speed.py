"""Does the host's own speed change while nothing else runs, and does a busy neighbour core change it?

Launch-bound cells (eager, Inductor without graphs) cost host time per call, so two profiles agree
only if the host runs Python at one speed. Every ``--every`` seconds this samples a fixed piece of
Python, the host probe (``bench.common.host_probe_ms``) and the wall time of a launch-bound GPU loop
(``--launches`` tiny kernels, then a sync), in three phases of ``--phase-s`` seconds: ``idle``,
``neighbour`` (one spinning process pinned to another core) and ``idle_again``. For each phase it
prints the median, p10 and p90, the share of samples more than 1.5x slower than the fastest seen,
and the longest stretch of such samples in seconds.

    python bench/host_speed.py --out OUT          # about 3 x --phase-s seconds; writes OUT/host-speed.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from bench.common import command_line, host_probe_ms  # noqa: E402

SLOW = 1.5  # a sample this many times the fastest counts as the slow state
SPIN = "while True:\n    pass\n"


def launch_loop_ms(launches: int, x: Optional[torch.Tensor]) -> Optional[float]:
    """Wall time of ``launches`` tiny kernels and a sync: a launch-bound call, as eager is at batch size 1."""
    if x is None:
        return None
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(launches):
        x.add_(1.0)
    torch.cuda.synchronize()
    return (time.perf_counter() - start) * 1e3


def sample_phase(seconds: float, every: float, launches: int, x: Optional[torch.Tensor]) -> List[Dict[str, Any]]:
    samples, start = [], time.monotonic()
    while time.monotonic() - start < seconds:
        samples.append({"t": time.monotonic() - start,
                        "probe_ms": host_probe_ms(calls=10),
                        "launch_ms": launch_loop_ms(launches, x)})
        time.sleep(every)
    return samples


def summarise(samples: List[Dict[str, Any]], key: str, fastest: float, every: float) -> Dict[str, Any]:
    values = [s[key] for s in samples]
    q = statistics.quantiles(values, n=10)
    slow = [v > SLOW * fastest for v in values]
    longest = run = 0
    for s in slow:
        run = run + 1 if s else 0
        longest = max(longest, run)
    return {"median_ms": statistics.median(values), "p10_ms": q[0], "p90_ms": q[-1],
            "slow_share": sum(slow) / len(slow), "longest_slow_s": longest * every, "samples": len(values)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--phase-s", type=float, default=60.0)
    parser.add_argument("--every", type=float, default=0.25, help="seconds between samples")
    parser.add_argument("--launches", type=int, default=200)
    args = parser.parse_args()
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        sys.exit("bench/host_speed.py needs two cores: one to sample on, one for the busy neighbour")
    os.sched_setaffinity(0, {cores[0]})
    x = torch.zeros(16, device="cuda") if torch.cuda.is_available() else None
    phases: Dict[str, List[Dict[str, Any]]] = {}
    phases["idle"] = sample_phase(args.phase_s, args.every, args.launches, x)
    spinner = subprocess.Popen([sys.executable, "-c", SPIN])
    try:
        os.sched_setaffinity(spinner.pid, {cores[1]})
        phases["neighbour"] = sample_phase(args.phase_s, args.every, args.launches, x)
    finally:
        spinner.kill()
        spinner.wait()
    phases["idle_again"] = sample_phase(args.phase_s, args.every, args.launches, x)
    keys = ["probe_ms"] + (["launch_ms"] if x is not None else [])
    fastest = {k: min(s[k] for p in phases.values() for s in p) for k in keys}
    summary = {p: {k: summarise(s, k, fastest[k], args.every) for k in keys} for p, s in phases.items()}
    report = {"command": command_line(), "torch": torch.__version__,
              "python": platform.python_version(), "cores": cores, "sample_core": cores[0],
              "neighbour_core": cores[1], "launches": args.launches,
              "device": torch.cuda.get_device_name() if x is not None else "cpu",
              "fastest_ms": fastest, "summary": summary, "samples": phases}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "host-speed.json").write_text(json.dumps(report, indent=1))
    for p, per in summary.items():
        print(p, "  ".join(f"{k}: median {v['median_ms']:.3f} p10 {v['p10_ms']:.3f} p90 {v['p90_ms']:.3f} "
                             f"slow {v['slow_share']:.0%} longest slow {v['longest_slow_s']:.1f} s" for k, v in per.items()))


if __name__ == "__main__":
    main()
