"""A third-party suite (issue 40): models from lists someone else wrote, each tuned as a user would, scored against
eager and against the user's own ``torch.compile``.

The models and their batch sizes come from the TorchDynamo benchmark harness (pytorch/benchmarks/dynamo):
``huggingface_models_list.txt`` (encoders: BertForMaskedLM 32, DistilBertForMaskedLM 256, AlbertForMaskedLM 8,
ElectraForQuestionAnswering 128; an encoder-decoder, T5ForConditionalGeneration 8; decoder-only, GPTNeoForCausalLM
32 and PegasusForCausalLM 128, each at its class's default config as the harness builds it),
``timm_models_list.txt`` (mobilenetv3_large_100 512, deit_tiny_patch16_224 128) and TorchBench's small models,
re-declared here because they are a few lines each (``lennard_jones``: a 5-layer tanh MLP of width 16 on 1-d
points, batch 1000; ``phlippe_resnet``: a CIFAR ResNet of 3x3 residual blocks at
16/32/64 channels, batch 128). Random weights, inputs derived as ``model=hf`` / ``model=timm`` derive them (Hugging
Face at sequence length 128).

Each model is tuned through the pipeline at batch sizes [1, its harness size] (``tune_and_load``: the run the CLI
makes, default backends of the device and the reference peers: the user's own ``torch.compile`` in each of the
device's ``reference_modes``, reduce-overhead and max-autotune on a GPU), its checkpoint is loaded back as a user
serves it, and at each cell the loaded routed model (``auto``), eager and every reference candidate the run built are
timed in the same interleaved rounds; the run's validate stage checks the routed model against eager end to end. Per
cell: auto over eager, and the best reference over auto (the speed-up over the user's best own compile), with that
reference's mode; a reference the run did not build (``tune.budget_s``, a failure) is named with the reason in the row
and the summary (``references_not_measured``), never silently left out. Scored as GraphNet scores compilers (Li et
al., "GraphNet: A Large-Scale Computational Graph Dataset for Tensor Compiler Research", arXiv 2510.24035, Appendix
B): each cell's speed-up over eager is rectified, a failure (the tune failed, or its validate stage found the routed
outputs off eager's) counting ``b`` = 0.1 and a slowdown ``s < 1`` counting ``s ** (p + 1)`` with the penalty power
``p`` (0 by default, as GraphNet's); S(t) is the geometric mean of the rectified speed-ups at tolerance level t, and
ES(t) the same with failures of a kind the level tolerates counted 1 (an accuracy failure from t >= 1, a crash from t
>= 3). At t = 0 nothing is tolerated, so S(0) = ES(0) here; both are reported. Writes ``suite-<tag>.json``
(``summary``: models, cells, worst_auto_over_reference, geomean_speedup_over_reference, best_reference_modes,
references_not_measured, S0, ES0, failed, not_run) and
``.md``.

    source bench/device_env.sh
    python3 bench/suite.py --out OUT --tag h200-a --models BertForMaskedLM lennard_jones ...   # one call
    python3 bench/suite.py --combine OUT/suite-h200-a.json OUT/suite-h200-b.json --out OUT --tag h200
    python bench/suite.py --out OUT --tag cpu --device cpu --smoke   # the CPU check: tiny shapes, no numbers
    python3 bench/suite.py --out OUT --tag h100-sdpa --overrides 'attention=[default,cudnn,efficient]' --models ...
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import platform
from collections import Counter
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import (budget_arguments, command_line, joined_lanes, lane_arguments, references_of,  # noqa: E402
                          run_lane, tune_and_load, unfinished, within_budget, write_table)
from pipeline import devices  # noqa: E402
from pipeline.config.schema import AccuracyBudget  # noqa: E402
from pipeline.measure.interleaved import measure_interleaved  # noqa: E402
from pipeline.route.decision import baseline  # noqa: E402

FAILURE_SCORE = 0.1  # GraphNet's b: what a failed cell counts in S(t)
TOLERATED_FROM = {"accuracy": 1, "crash": 3}  # the tolerance level from which ES(t) forgives a failure of the kind


class LennardJones(nn.Module):
    """TorchBench's ``lennard_jones``: energy of 1-d pair distances through a 5-layer tanh MLP of width 16."""

    def __init__(self, width: int = 16) -> None:
        super().__init__()
        layers: List[nn.Module] = [nn.Linear(1, width), nn.Tanh()]
        for _ in range(3):
            layers += [nn.Linear(width, width), nn.Tanh()]
        self.net = nn.Sequential(*layers, nn.Linear(width, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class ResidualBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: int) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU(),
                                  nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False), nn.BatchNorm2d(c_out))
        self.skip = (nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm2d(c_out))
                     if stride != 1 or c_in != c_out else nn.Identity())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.body(x) + self.skip(x))


class PhlippeResNet(nn.Module):
    """TorchBench's ``phlippe_resnet`` (the UvA deep-learning tutorial's CIFAR ResNet): 3 stages of 3 residual blocks
    at 16, 32 and 64 channels on 3x32x32 images, 10 classes."""

    def __init__(self, channels: Sequence[int] = (16, 32, 64), blocks: int = 3, classes: int = 10) -> None:
        super().__init__()
        layers: List[nn.Module] = [nn.Conv2d(3, channels[0], 3, 1, 1, bias=False), nn.BatchNorm2d(channels[0]),
                                   nn.ReLU()]
        c_in = channels[0]
        for i, c in enumerate(channels):
            for j in range(blocks):
                layers.append(ResidualBlock(c_in, c, 2 if j == 0 and i > 0 else 1))
                c_in = c
        self.net = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c_in, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


@dataclass(frozen=True)
class Entry:
    """A model of the suite: the list it comes from, its harness batch size, and the overrides that build it."""

    name: str
    source: str  # huggingface, timm, torchbench
    batch_size: int
    overrides: Tuple[str, ...]
    smoke: Tuple[str, ...] = ()  # --smoke: what shrinks it for a CPU check


def hf(name: str, batch_size: int, smoke_config: str = "", *extra: str) -> Entry:
    """A Hugging Face model at its class's default config, sequence 128, and ``extra`` overrides; ``smoke_config``:
    what else its two-layer smoke config needs (GPT-Neo lists an attention type per layer)."""
    return Entry(name, "huggingface", batch_size,
                 ("model=hf", f"model.hf.model_class={name}", "model.hf.seq_len=128", *extra),
                 (f"+model.hf.config={{num_hidden_layers: 2, hidden_size: 64, num_attention_heads: 2{smoke_config}}}",
                  "model.hf.seq_len=16"))


def timm(name: str, batch_size: int, smoke: str) -> Entry:
    return Entry(name, "timm", batch_size, ("model=timm", f"model.timm.name={name}"), (smoke,))


def torchbench(name: str, batch_size: int, target: str, shape: str) -> Entry:
    return Entry(name, "torchbench", batch_size, ("model=mlp", f"model.name={name}", f"model.build._target_={target}",
                                                  "~model.build.width", "~model.build.depth",
                                                  f"model.inputs.x.shape={shape}"))


SUITE = {e.name: e for e in (
    hf("BertForMaskedLM", 32), hf("DistilBertForMaskedLM", 256), hf("AlbertForMaskedLM", 8),
    hf("ElectraForQuestionAnswering", 128), hf("T5ForConditionalGeneration", 8),
    # GPT-Neo's default config (24 layers of 2048, random weights) drifts in bf16 itself: its logits under bf16
    # autocast read cosine 0.9729 against fp32 eager on an H100 (2026-12-06), 0.9707 on a CPU, and 0.9707 with bf16
    # weights (bench/probes/gptneo_bf16_drift_probe.py), under the default bound of 0.999, so no bf16 candidate could
    # serve. The user's own bf16 compiles are held to no bound; ours to 0.96, what bf16 eager meets with room for a
    # compile's own rounding.
    hf("GPTNeoForCausalLM", 32, ", attention_types: [[[global, local], 1]]", "route.accuracy_budget.bound=0.96"),
    hf("PegasusForCausalLM", 128),
    timm("mobilenetv3_large_100", 512, "model.inputs.x.shape=[3,64,64]"),
    timm("deit_tiny_patch16_224", 128, "+model.timm.kwargs={img_size: 32}"),
    torchbench("lennard_jones", 1000, "bench.suite.LennardJones", "[1]"),
    torchbench("phlippe_resnet", 128, "bench.suite.PhlippeResNet", "[3,32,32]"),
)}


def overrides(entry: Entry, args: argparse.Namespace) -> List[str]:
    sizes = [1, 3] if args.smoke else [1, entry.batch_size]
    ov = [*entry.overrides, f"device={args.device}", f"profile={args.profile}", f"precision={args.precision}",
          f"model.batch_sizes=[{','.join(map(str, sizes))}]", "validate.check_reload=false",
          "validate.extra_batch_sizes=[]", f"tracking.uri=sqlite:///{args.runs}/mlflow-{args.tag}.db"]
    if args.smoke:  # route.aot=false: on a CPU the routed program's AOTInductor package took half the smoke's tune
        ov += [*entry.smoke, "backends=[eager,inductor]", "compile_cache.workers=0", "route.aot=false"]
    else:
        ov.append("backends=cpu" if args.device == "cpu" else "backends=gpu")
    return ov + list(args.overrides)


def bench_model(name: str, args: argparse.Namespace) -> Dict[str, Any]:
    """Tune one model, load its checkpoint, and time auto, eager and the references at each tuned size."""
    entry = SUITE[name]
    cfg, ctx, auto, tune_s, load_s = tune_and_load(overrides(entry, args), args.runs / f"{args.tag}-{name}")
    references, not_measured = references_of(ctx)
    eager = baseline(ctx.candidates)  # the model as written: eager at fp32 where the run has it
    _, inputs_at = ctx.input_sources()[0]
    cells = {}
    for bs in ctx.batch_sizes:
        inputs = inputs_at(bs)
        fns = {"auto": lambda: auto(**inputs), **{n: (lambda b=ctx.backends[n]: b(**inputs))
                                                  for n in dict.fromkeys([eager, *references])}}
        cells[bs] = {n: m.summary() for n, m in measure_interleaved(fns, ctx.device, cfg.profile).items()}
    return {"model": name, "source": entry.source, "harness_batch_size": entry.batch_size,
            "tune_seconds": tune_s, "load_seconds": load_s, "eager": eager, "references": list(references),
            "programs_compiled": sum(o.cost.cache_misses + o.cost.ahead_compiled for o in ctx.outcomes.values()),
            "reference_compile_seconds": {n: round(ctx.outcomes[n].cost.ahead_s + ctx.outcomes[n].cost.build_s, 1)
                                          for n in references if n in ctx.outcomes},
            "reference_modes": references, "references_not_measured": not_measured,
            "route": [r.to_dict() for r in ctx.route], "validation_ok": bool(ctx.validation.get("ok")),
            "route_reference": ctx.route_info.get("reference"),
            "screened_out": sorted(ctx.screened_out), "stage_seconds": ctx.stage_seconds,
            "step_seconds": ctx.step_seconds,
            "accuracy_budget": {"metric": cfg.route.accuracy_budget.metric, "bound": cfg.route.accuracy_budget.bound},
            "outcomes": {n: {"status": o.status, "reason": o.reason[:300], "accuracy": o.accuracy,
                             "held_mb": round(o.held_bytes / 2**20, 1)}  # device memory it kept once built
                         for n, o in ctx.outcomes.items()},
            "batch_sizes": ctx.batch_sizes, "cells": cells}


def ratios(row: Dict[str, Any]) -> List[Dict[str, Any]]:
    """Per tuned size: auto over eager, auto over the best reference (and its mode), and the speed-up over it."""
    out = []
    for bs in row["batch_sizes"]:
        cell = row["cells"][bs]
        auto = cell["auto"]["median_ms"]
        best = min(row["references"], key=lambda n: cell[n]["median_ms"]) if row["references"] else None
        out.append({"batch_size": bs, "auto_over_eager": auto / cell[row["eager"]]["median_ms"],
                    "reference": best, "reference_mode": row.get("reference_modes", {}).get(best),
                    "auto_over_reference": auto / cell[best]["median_ms"] if best else math.nan})
    return out


def rectified(speedup: float, failure: Optional[str], t: int, p: float, forgiving: bool) -> float:
    """One cell's contribution to S(t) (``forgiving`` False) or ES(t) (True), GraphNet's rule (module docstring)."""
    if failure is not None:
        return 1.0 if forgiving and t >= TOLERATED_FROM[failure] else FAILURE_SCORE
    return speedup ** (p + 1) if speedup < 1 else speedup


def score(cells: Sequence[Tuple[float, Optional[str]]], t: int = 0, p: float = 0.0, forgiving: bool = False) -> float:
    """S(t) (or ES(t)): the geometric mean of the rectified speed-ups over eager of ``cells`` (speed-up, failure)."""
    values = [rectified(s, f, t, p, forgiving) for s, f in cells]
    return math.exp(sum(map(math.log, values)) / len(values)) if values else math.nan


def scored_cells(rows: List[Dict[str, Any]]) -> List[Tuple[float, Optional[str]]]:
    """(speed-up over eager, failure kind or None) per cell; a model that failed counts both its cells a crash."""
    out: List[Tuple[float, Optional[str]]] = []
    for row in rows:
        if "not_run" in row:
            continue
        if "error" in row:
            out += [(math.nan, "crash")] * 2
            continue
        out += [(1 / c["auto_over_eager"], None if row["validation_ok"] else "accuracy") for c in ratios(row)]
    return out


def summary(rows: List[Dict[str, Any]]) -> Dict[str, Any]:
    done = [row for row in rows if unfinished(row) is None]
    cells = [c for row in done for c in ratios(row) if c["reference"]]
    over = [1 / c["auto_over_reference"] for c in cells]
    scored = scored_cells(rows)
    return {"models": len(done), "cells": len(cells),
            "worst_auto_over_reference": max((c["auto_over_reference"] for c in cells), default=math.nan),
            "geomean_speedup_over_reference": math.exp(sum(map(math.log, over)) / len(over)) if over else math.nan,
            "best_reference_modes": dict(Counter(str(c["reference_mode"]) for c in cells)),
            "references_not_measured": {r["model"]: r["references_not_measured"] for r in done
                                        if r.get("references_not_measured")},
            "S0": score(scored), "ES0": score(scored, forgiving=True), "ES1": score(scored, 1, forgiving=True),
            "tune_seconds": {r["model"]: round(r["tune_seconds"], 1) for r in done},
            "load_seconds": {r["model"]: round(r["load_seconds"], 2) for r in done},
            "failed": [r["model"] for r in rows if "error" in r], "not_run": [r["model"] for r in rows if "not_run" in r]}


def tune_cell(row: Dict[str, Any]) -> str:
    """The tune's seconds, with the programs it compiled (none: Inductor's cache was warm; rows of earlier lanes lack
    the count): a warm tune's seconds are not a cold one's."""
    compiled = f" ({row['programs_compiled']} compiled)" if "programs_compiled" in row else ""
    return f"{row['tune_seconds']:.0f}{compiled}"


def own_compile(row: Dict[str, Any]) -> str:
    """The seconds of the slowest reference's compile (its worker's and capture's), with its mode: what the user's own
    best compile costs them, and the part of the tune that waits on it (rows of earlier lanes lack it)."""
    seconds = row.get("reference_compile_seconds") or {}
    if not seconds:
        return ""
    name = max(seconds, key=seconds.get)
    return f"{seconds[name]:.0f} ({row['reference_modes'].get(name, name)})"


DEFAULT_BUDGET = dataclasses.asdict(AccuracyBudget())


def held_to(row: Dict[str, Any]) -> str:
    """A model the suite holds to another accuracy budget than the default, with what its references and the
    candidates it serves read against fp32 eager: the reader sees that the comparison stayed fair."""
    budget, outcomes = row["accuracy_budget"], row["outcomes"]
    served = sorted({r["backend"] for r in row.get("route", [])})
    read = ", ".join(f"{n} {outcomes[n]['accuracy']:.4f}" for n in dict.fromkeys([*served, *row["references"]])
                     if math.isfinite(outcomes.get(n, {}).get("accuracy", math.nan)))
    return (f"{row['model']}: held to {budget['metric']} {budget['bound']} against fp32 eager (the default: "
            f"{DEFAULT_BUDGET['bound']}); read: {read}")


def markdown(rows: List[Dict[str, Any]], meta: Dict[str, Any]) -> str:
    extra = f", with {' '.join(meta['overrides'])}" if meta.get("overrides") else ""
    lines = [f"## {meta['device']}, precision {meta['precision']}{extra}, torch {meta['torch']}", "",
             "| model | list | batch | auto ms | eager ms | best reference | ref ms | auto / reference | auto / eager "
             "| tune s | own compile s | load s | route |", "|---" * 13 + "|"]
    for row in rows:
        if unfinished(row):
            lines.append(f"| {row['model']} | | | {unfinished(row)} |" + " |" * 9)
            continue
        route = ", ".join(f"{x['lo']}-{x['hi'] or 'inf'}:{x['backend']}" for x in row["route"])
        for c in ratios(row):
            cell = row["cells"][c["batch_size"]]
            ref = cell[c["reference"]]["median_ms"] if c["reference"] else math.nan
            lines.append(f"| {row['model']} | {row['source']} | {c['batch_size']} | {cell['auto']['median_ms']:.4g} | "
                         f"{cell[row['eager']]['median_ms']:.4g} | {c['reference']} ({c['reference_mode']}) | "
                         f"{ref:.4g} | "
                         f"{c['auto_over_reference']:.3f} | {c['auto_over_eager']:.3f} | {tune_cell(row)} | "
                         f"{own_compile(row)} | {row['load_seconds']:.1f} | {route} |")
    lines += [f"{row['model']}: not measured, so not among its references: {name} ({why[:200]})"
              for row in rows for name, why in row.get("references_not_measured", {}).items()]
    lines += [held_to(row) for row in rows if row.get("accuracy_budget", DEFAULT_BUDGET) != DEFAULT_BUDGET]
    if any("programs_compiled" in row for row in rows):
        lines.append("tune s (N compiled): the programs the tune compiled, in its process and its compile workers "
                     "(Inductor's cache misses); 0 is a warm cache's tune")
    if meta.get("run_again"):
        lines += ["", f"Run again in a later lane, whose row is kept: {', '.join(meta['run_again'])}."]
    return "\n".join(lines) + "\n"


def write(out: Path, tag: str, meta: Dict[str, Any], rows: List[Dict[str, Any]]) -> str:
    return write_table(out, f"suite-{tag}", meta, rows, summary, markdown)


def combine(parts: List[Path], out: Path, tag: str) -> None:
    meta, rows = joined_lanes(parts, list(SUITE), ("device", "torch", "precision", "overrides", "python", "smoke"),
                              before={"overrides": []})
    meta["run_again"] = sorted({again["model"] for again in meta.get("measured_again", [])})
    for row in rows:  # JSON turned the batch-size keys into strings
        if "cells" in row:
            row["cells"] = {int(bs): per for bs, per in row["cells"].items()}
    print(write(out, tag, meta, rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    lane_arguments(parser, list(SUITE), profile="quick")
    parser.add_argument("--precision", default="[bf16]", help="the run's precision list, e.g. '[fp32,bf16]'")
    parser.add_argument("--overrides", nargs="*", default=[],
                        help="more overrides for every model's run (after the suite's own), e.g. "
                             "'attention=[default,cudnn]' or backends.graph_inductor.template=max_autotune")
    budget_arguments(parser)
    parser.add_argument("--smoke", action="store_true", help="tiny shapes, eager and inductor only: a CPU check")
    args = parser.parse_args()
    unknown = [m for m in args.models if m not in SUITE]
    if unknown:
        parser.error(f"unknown model {unknown[0]!r}; the suite's models: {', '.join(SUITE)}")

    def meta() -> Dict[str, Any]:
        return {"device": devices.name(torch.device(args.device)), "torch": torch.__version__,
                "precision": args.precision, "overrides": args.overrides, "python": platform.python_version(),
                "smoke": args.smoke,
                "command": command_line()}

    run_lane(args, meta, within_budget(args, lambda model: bench_model(model, args)), write, combine)


if __name__ == "__main__":
    main()
