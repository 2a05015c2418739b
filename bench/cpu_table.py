"""The CPU table: eager, Inductor, OpenVINO, ONNX Runtime and the routed model on this machine's CPU.

For each model it tunes with the pipeline on the CPU (those four backends, the run's ``threads``),
loads the routed model back from its checkpoint (``auto``, served as a user would), then times
every backend and ``auto`` interleaved round by round at each batch size, as ``seed_table.py`` does,
so all the ratios in a row come from one measurement; every model runs in this one process, with
the same CPU thread count for every backend. Inputs are reduced for CPU time: vision models take
3x64x64 images (the issue's resnet18 check), and the transformers model (``model=hf``) is a small
DistilBERT classifier (4 layers of 256, random weights) on 64 tokens with a padded attention mask,
returning its ModelOutput. ``auto`` is held against the best single backend, eager, and Inductor
(what a CPU user would compile with instead). Writes ``cpu-table.json`` and ``.md``
under --out, rewritten after each model; the runs and their MLflow store go to --runs (a temporary
directory unless given).

    python bench/cpu_table.py --out OUT                # 1 thread: the table in bench/results
    python bench/cpu_table.py --out OUT --threads 4 --models resnet18 bert_tiny
    python bench/cpu_table.py --out OUT --threads 4 --models bert_tiny --overrides 'attention=[default,math]'
    bash bench/device_wheels.sh openvino   # then on the GPU host's 16 cores (carry .whl):
    source bench/device_env.sh && python3 bench/cpu_table.py --out OUT --threads 4 --tracking off
    # lanes side by side on disjoint cores (each lane's meta records its CPUs), then one table:
    taskset -c 0-3 python3 bench/cpu_table.py --out A --threads 4 --models mlp resnet18 &
    taskset -c 4-7 python3 bench/cpu_table.py --out B --threads 4 --models bert_tiny; wait
    python3 bench/cpu_table.py --out OUT --threads 4 --combine A/cpu-table.json B/cpu-table.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from importlib import metadata
from pathlib import Path
from typing import Dict, List, Sequence

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import command_line, runs_argument, runs_dir  # noqa: E402
from bench.seed_table import SIZES, Table, bench_model, joined_rows, ratios, write  # noqa: E402
from pipeline import devices  # noqa: E402

CPU = Table(backends=["eager", "inductor", "openvino", "onnxruntime"], sizes=SIZES, peer="inductor")
VISION = "model.inputs.x.shape=[3,64,64]"
# Each model: the overrides that make it (the config's model, reduced for CPU time where said).
MODELS: Dict[str, List[str]] = {
    "mlp": ["model=mlp"],
    "mobilenet_v3_small": ["model=mobilenet_v3_small", VISION],
    "resnet18": ["model=resnet18", VISION],
    "bert_tiny": ["model=bert_tiny"],
    "distilbert_small": ["model=hf", "model.name=distilbert_small",
                         "model.hf.model_class=DistilBertForSequenceClassification", "model.hf.seq_len=64",
                         "+model.hf.config={dim: 256, n_layers: 4, n_heads: 4, hidden_dim: 1024}"],
}


def overrides_for(model: str, args: argparse.Namespace) -> List[str]:
    return [*MODELS[model], "device=cpu", f"backends=[{','.join(CPU.backends)}]", f"profile={args.profile}",
            f"model.batch_sizes=[{','.join(map(str, CPU.sizes))}]", f"threads={args.threads}",
            *(["tracking=off"] if args.tracking == "off" else
              ["tracking=sqlite", f"tracking.uri=sqlite:///{args.runs.resolve()}/mlflow-cpu.db",
               "tracking.experiment=cpu_table"]), *args.overrides]


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else what the platform says."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return devices.name(torch.device("cpu"))


def notes(args: argparse.Namespace, lanes: List[List[int]], cores: int, again: Sequence[Dict] = ()) -> str:
    """What the table's numbers are; ``lanes``: the CPUs each lane's process could run on (one list a lane), of the
    machine's ``cores``; ``again``: the rows a later lane measured again (``joined_lanes``' ``measured_again``),
    each named with what it read, so a row measured twice shows both readings."""
    pinned = "" if all(len(cpus) == cores for cpus in lanes) else (
        f" Each lane (one process) pinned to CPUs {'; '.join(cpu_ranges(c) for c in lanes)}: a row's cells share "
        f"its lane's cores, and, where lanes ran side by side, their neighbours' memory traffic and caches.")
    for earlier in again:
        worst = " ".join(f"{r['auto_over_best']:.2f}" for r in ratios(earlier["row"], CPU).values())
        pinned += (f" {earlier['model']} was measured again; the row replaced ({earlier['lane']}, CPUs "
                   f"{cpu_ranges(earlier['cpus'])}) read auto / best single {worst} and is kept in the JSON's "
                   f"`measured_again`.")
    return (f"{args.threads} CPU thread(s) for every backend (top-level threads), {cores} cores on the "
            f"machine; every cell timed interleaved in one process (profile={args.profile}).{pinned} Inputs reduced "
            f"for CPU time: `{VISION}` for mobilenet_v3_small and resnet18; distilbert_small is model=hf's "
            f"DistilBertForSequenceClassification with 4 layers of 256 (FFN 1024) on 64 tokens. auto: the routed "
            f"model loaded from its checkpoint; the JSON also "
            f"times its backends called without the router (`auto_direct:<backend>`) and holds the machine's load "
            f"average before and after each model (`load_average`).")


def cpu_ranges(cpus: List[int]) -> str:
    """``[0, 1, 2, 5]`` as ``0-2,5``: the form taskset takes."""
    spans: List[List[int]] = []
    for cpu in sorted(cpus):
        if spans and cpu == spans[-1][1] + 1:
            spans[-1][1] = cpu
        else:
            spans.append([cpu, cpu])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


def combine(parts: List[Path], args: argparse.Namespace) -> None:
    """Join lanes measured alike (same CPU, torch, runtimes, threads, profile inputs) into one table, MODELS' order."""
    meta, rows = joined_rows(parts, list(MODELS), ("device", "cores", "torch", "python", "dtype", "threads",
                                                   "overrides", "runtimes"))
    lanes = [json.loads(p.read_text())["cpus"] for p in parts]
    again = [{**earlier, "cpus": lanes[earlier["part"]]} for earlier in meta.get("measured_again", [])]
    print(write(args.out, "cpu-table", {**meta, "cpus": lanes}, rows, CPU, notes(args, lanes, meta["cores"], again)),
          flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--profile", default="default")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--tracking", choices=["sqlite", "off"], default="sqlite",
                        help="off on the GPU host, whose trimmed wheel set (OpenVINO's is 57 MB) carries no MLflow")
    parser.add_argument("--overrides", nargs="*", default=[],
                        help="more overrides for every model's run, e.g. 'attention=[default,math]': auto may then "
                             "route to candidates beyond the table's four backends, timed directly too")
    parser.add_argument("--combine", nargs="+", type=Path, help="join these lanes' cpu-table.json instead of running")
    runs_argument(parser)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.combine:
        combine(args.combine, args)
        return
    runs_dir(args)
    cpus = sorted(os.sched_getaffinity(0))
    meta = {"device": cpu_model(), "cores": os.cpu_count(), "torch": torch.__version__,
            "python": platform.python_version(), "dtype": "float32", "threads": args.threads,
            "overrides": args.overrides, "runtimes": {p: metadata.version(p) for p in ("openvino", "onnxruntime")},
            "command": command_line(), "cpus": cpus}
    rows = []
    with devices.cpu_threads(args.threads):  # the timing after each run, as the run itself
        for model in args.models:
            before = os.getloadavg()
            row = bench_model(model, overrides_for(model, args), args.runs / model, CPU.sizes)
            rows.append({**row, "load_average": {"before": before, "after": os.getloadavg()}})
            print(write(args.out, "cpu-table", meta, rows, CPU, notes(args, [cpus], meta["cores"])), flush=True)


if __name__ == "__main__":
    main()
