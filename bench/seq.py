"""Sequence length as a routed dimension on this machine's GPU (issue 31): BERT-QA, DistilBERT-QA, GPT-2 and the T5
encoder (full-size default configs, random weights) in bf16, at batch sizes {1, 8, 32} x lengths {32, 128, 512}.

For each model the pipeline tunes a (batch range x length range) route over ``eager``, ``inductor`` (the length
dynamic) and ``graph_inductor`` (graphs at every tuned length), every candidate on a bf16 copy of the model
(``precision: bf16, cast_weights: true``), and the routed model is loaded back from its checkpoint (``auto``) as a
user serves it. At every cell, in the same interleaved rounds (``measure_interleaved``), it is timed against what a
user would write instead: the bf16 model under ``torch.compile(mode="reduce-overhead", dynamic=True)`` called at the
exact length (``exact``), the same compiled model on the call padded to 512 and its outputs cut back (``padded``),
and the bf16 model in eager (``eager``, the floor); the compile runs on a function of its own (``peers``), so that
the four models share no Dynamo cache and none of them silently runs eagerly (``summary.peer_fallbacks``). Writes
``seq-<tag>.json`` (``summary``: models, cells, geomean_speedup_over_best_peer (the geometric mean over the cells of
the better peer's latency over auto's), worst_auto_over_eager (the largest auto / eager latency; at most 1.0 means
never slower), not_run, ...) and ``.md`` with the route's heatmap per model.

What it trades to finish inside 10-minute calls on one H200 (16 CPU cores):

- ``profile=quick`` without the screen (eager is never screened out, and the two others are not 1.5x apart
  everywhere), only the backends that matter on a GPU (no ``graph`` of eager kernels; ``inductor.per_length``,
  one program per length, only with ``--per-length``: its six more compiles per model cost a minute), graphs at the
  tuned batch sizes only (``grid``: other sizes pad to the next tuned one), and validate without its reload (this
  bench loads the checkpoint itself) or extra batch sizes;
- the accuracy budget at cosine >= 0.99 against fp32 eager (the peers compute in the same bf16; each cell's cosine is
  in the JSON);
- no model starts once ``--budget-s`` (default 540) would be passed by its ``bench_seconds`` in ``--expect-from``
  tables, or else by the slowest model so far: the tables are rewritten after each model, ``summary.not_run`` names
  the models left, and a second call with ``--models ...`` is joined with ``--combine``.

    source bench/device_env.sh
    python3 bench/seq.py --out OUT --tag h200-a --models BertForQuestionAnswering DistilBertForQuestionAnswering
    python3 bench/seq.py --out OUT --tag h200-b --models GPT2Model T5EncoderModel     # a second call
    python3 bench/seq.py --combine OUT/seq-h200-a.json OUT/seq-h200-b.json --out OUT --tag h200
    python bench/seq.py --out OUT --tag cpu --device cpu --smoke  # the CPU check: tiny models, eager, no numbers
"""

from __future__ import annotations

import argparse
import copy
import math
import platform
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Sequence, Tuple

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import (budget_arguments, command_line, joined_lanes, lane_arguments, run_lane,  # noqa: E402
                          tune_and_load, unfinished, within_budget, write_table)
from pipeline import devices  # noqa: E402
from pipeline.backends.program import Program  # noqa: E402
from pipeline.measure import accuracy  # noqa: E402
from pipeline.measure.interleaved import measure_interleaved  # noqa: E402
from pipeline.record.heatmap import markdown_grid  # noqa: E402
from pipeline.route.table import backend_at  # noqa: E402

MODELS = ["BertForQuestionAnswering", "DistilBertForQuestionAnswering", "GPT2Model", "T5EncoderModel"]
SIZES, LENGTHS = [1, 8, 32], [32, 128, 512]
BACKENDS = ["eager", "inductor", "graph_inductor"]
PEERS = ("exact", "padded")  # reduce-overhead, dynamic=True: at the call's own length, and padded to the longest
BOUND = 0.99  # the accuracy budget's cosine against fp32 eager
# Each cell's interleaved rounds (over the profile preset's rules): the bench's own figures, so more than quick's.
TIMING = {"budget_ms": 300.0, "max_samples": 200, "min_samples": 10, "warmup_ms": 50.0}
# --smoke: the four model classes made tiny, on eager alone, to prove the bench runs on a CPU.
SMOKE_SIZES, SMOKE_LENGTHS = [1, 2], [8, 16]
SMOKE_CONFIG = {"BertForQuestionAnswering": "num_hidden_layers: 1, hidden_size: 32, num_attention_heads: 2, "
                                            "intermediate_size: 64, vocab_size: 500",
                "DistilBertForQuestionAnswering": "n_layers: 1, dim: 32, n_heads: 2, hidden_dim: 64, vocab_size: 500",
                "GPT2Model": "n_layer: 1, n_embd: 32, n_head: 2, vocab_size: 500",
                "T5EncoderModel": "num_layers: 1, d_model: 32, d_kv: 16, num_heads: 2, d_ff: 64, vocab_size: 500"}


def grid_of(args: argparse.Namespace) -> Dict[str, List[int]]:
    return {"sizes": SMOKE_SIZES if args.smoke else SIZES, "lengths": SMOKE_LENGTHS if args.smoke else LENGTHS}


def overrides(model: str, args: argparse.Namespace) -> List[str]:
    """The tune of ``model``: its config, the lengths and sizes, every backend on a bf16 copy, the profile."""
    shape = grid_of(args)
    sizes, lengths = (",".join(map(str, shape[k])) for k in ("sizes", "lengths"))
    ov = ["model=hf", f"model.hf.model_class={model}", "model.hf.use_cache=false", f"model.seq_lens=[{lengths}]",
          f"model.batch_sizes=[{sizes}]", f"device={args.device}", f"backends=[{','.join(args.backends)}]",
          f"profile={args.profile}", "profile.screen=false", "validate.check_reload=false",
          "reference=false",  # this bench times the user's own compile itself, at the exact and the padded length
          "validate.extra_batch_sizes=[]",
          f"route.accuracy_budget.bound={BOUND}", "tracking=sqlite",
          f"tracking.uri=sqlite:///{args.runs.resolve()}/mlflow-{args.tag}.db", "tracking.experiment=seq"]
    ov += [f"+model.hf.config={{{SMOKE_CONFIG[model]}}}"] if args.smoke else []
    for b in args.backends:
        ov += [f"backends.{b}.precision=bf16", f"backends.{b}.cast_weights=true"]
        if b.startswith("graph"):
            ov.append(f"backends.{b}.grid=[{sizes}]")
        if b == "inductor" and not args.per_length:
            ov.append(f"backends.{b}.per_length=false")
    return ov


def peers(model: torch.nn.Module, ctx: Any) -> Tuple[Program, Dict[str, Any]]:
    """What a user would write: the bf16 model under ``torch.compile(mode="reduce-overhead", dynamic=True)``, called at
    the exact length or padded to the longest (outputs cut back), and the same bf16 model in eager.

    The compile is a :class:`~pipeline.backends.program.Program` (the same ``torch.compile`` arguments on a function
    of its own that calls the model): transformers' models share one decorated ``forward`` code object, whose Dynamo
    recompile limit the four models' compiles in one process would otherwise exhaust, and past it the peer would run
    eagerly, silently. Its ``fallback_reason`` is recorded."""
    user = copy.deepcopy(model).to(torch.bfloat16)  # the user's own bf16 copy; ours stays fp32 for the checkpoint
    kwargs = {"backend": "inductor", "mode": "reduce-overhead", "dynamic": True}
    program = Program(user, "reduce_overhead_peer", kwargs, ctx.device, records_cuda_graphs=ctx.device.type == "cuda")
    seq, longest = ctx.dims().seq, ctx.lengths[-1]

    def exact(**inputs: torch.Tensor) -> Any:
        with torch.inference_mode():
            torch.compiler.cudagraph_mark_step_begin()  # reduce-overhead: a new step per call
            return program(**inputs)

    def padded(**inputs: torch.Tensor) -> Any:
        return seq.cut(exact(**seq.resized(inputs, longest)), seq.length(inputs))

    def eager(**inputs: torch.Tensor) -> Any:
        with torch.inference_mode():
            return user(**inputs)

    return program, {"exact": exact, "padded": padded, "eager": eager}


def bench_model(model: str, args: argparse.Namespace) -> Dict[str, Any]:
    run_dir = args.runs / f"{args.tag}-{model}"
    cfg, ctx, auto, tune_s, load_s = tune_and_load(overrides(model, args), run_dir)
    start = time.perf_counter()
    program, users = peers(ctx.model, ctx)
    _, inputs_at = ctx.input_sources()[0]  # the batches the profile timed
    metric, timing = cfg.route.accuracy_budget.metric, {**cfg.profile, **TIMING}
    cells = []
    for key in ctx.cells:
        inputs = inputs_at(key)
        calls = {"auto": lambda: auto(**inputs), **{name: (lambda f=f: f(**inputs)) for name, f in users.items()}}
        with torch.inference_mode():
            reference = ctx.model(**inputs)
            scores = {name: accuracy.score(call(), reference, metric) for name, call in calls.items()}
        timed = {name: m.summary() for name, m in measure_interleaved(calls, ctx.device, timing).items()}
        ms = {name: t["median_ms"] for name, t in timed.items()}
        best = min(PEERS, key=lambda p: ms[p])
        cells.append({"batch_size": key[0], "seq_len": key[1], "backend": backend_at(auto.route, *key),
                      "scores": scores, "timed": timed, "best_peer": best,
                      "speedup_over_best_peer": ms[best] / ms["auto"],
                      **{f"speedup_over_{p}": ms[p] / ms["auto"] for p in PEERS},
                      "auto_over_eager": ms["auto"] / ms["eager"]})
    return {"model": model, "tune_seconds": tune_s, "checkpoint_load_seconds": load_s,
            "peers_and_timing_seconds": time.perf_counter() - start, "stage_seconds": ctx.stage_seconds,
            "peer_fallback": program.fallback_reason(),  # None: every peer call ran its compiled program
            "table": ctx.route_info["table"], "validation_ok": ctx.validation.get("ok"),
            "candidates": ctx.route_info["candidates"], "heatmap": markdown_grid(ctx.medians(), auto.route, "eager"),
            "graphs": {n: {"graphs": o.graphs, "pool_mb": o.pool_mb} for n, o in ctx.outcomes.items() if o.graphs},
            "cells": cells}


def geomean(values: Sequence[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else math.nan


def summary(rows: List[Dict[str, Any]]) -> Dict[str, Any]:
    done = [r for r in rows if "cells" in r]
    cells = [c for r in done for c in r["cells"]]
    return {"models": len(done), "cells": len(cells),
            "geomean_speedup_over_best_peer": geomean([c["speedup_over_best_peer"] for c in cells]),
            "worst_auto_over_eager": max((c["auto_over_eager"] for c in cells), default=math.nan),
            **{f"geomean_speedup_over_{p}": geomean([c[f"speedup_over_{p}"] for c in cells]) for p in PEERS},
            "cells_slower_than_eager": sum(c["auto_over_eager"] > 1.0 for c in cells),
            "worst_auto_score": min((c["scores"]["auto"] for c in cells), default=math.nan),
            "failed_models": [r["model"] for r in rows if "error" in r],
            "peer_fallbacks": {r["model"]: r["peer_fallback"] for r in done if r.get("peer_fallback")},
            "not_run": [r["model"] for r in rows if "not_run" in r],
            "validation_ok": all(r.get("validation_ok") for r in done)}


def markdown(rows: List[Dict[str, Any]], meta: Dict[str, Any]) -> str:
    lines = [f"## {meta['device']}, torch {meta['torch']}, transformers {meta['transformers']}, bf16, batch "
             f"{meta['sizes']} x length {meta['lengths']}", "",
             "Per cell: the backend `auto` (loaded from its checkpoint) serves, and median ms of auto, the bf16 model "
             "under `torch.compile(mode=\"reduce-overhead\", dynamic=True)` at the exact length (`exact`) and padded "
             "to the longest (`padded`), and the bf16 model in eager, all timed in the same interleaved rounds.", "",
             "| model | batch | length | backend | auto ms | exact ms | padded ms | eager ms | over best peer "
             "| auto / eager |",
             "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|"]
    for row in rows:
        why = unfinished(row)
        if why:
            lines.append(f"| {row['model']} | | | {why} | | | | | | |")
        for c in row.get("cells", []):
            ms = {name: t["median_ms"] for name, t in c["timed"].items()}
            lines.append(f"| {row['model']} | {c['batch_size']} | {c['seq_len']} | {c['backend']} | {ms['auto']:.3f} | "
                         f"{ms['exact']:.3f} | {ms['padded']:.3f} | {ms['eager']:.3f} | "
                         f"{c['speedup_over_best_peer']:.2f}x | {c['auto_over_eager']:.2f} |")
    for row in rows:
        if "heatmap" in row:
            lines += ["", f"{row['model']}: the routed backend and its speed-up over eager per tuned cell (the "
                          f"profile's medians), tune {row['tune_seconds']:.0f} s, load "
                          f"{row['checkpoint_load_seconds']:.0f} s", "", row["heatmap"].rstrip()]
    return "\n".join(lines) + "\n"


def write(out: Path, tag: str, meta: Dict[str, Any], rows: List[Dict[str, Any]]) -> str:
    """Write ``seq-<tag>.json`` and ``.md`` for ``rows``; returns the Markdown."""
    return write_table(out, f"seq-{tag}", meta, rows, summary, markdown)


def combine(parts: List[Path], out: Path, tag: str) -> None:
    """Join calls (same device and versions) into one table in the issue's model order, a model one call left unrun
    taken from the call that ran it."""
    meta, rows = joined_lanes(parts, MODELS, ("device", "torch", "transformers", "python", "sizes", "lengths", "smoke"))
    ran = {r["model"] for r in rows if "not_run" not in r}
    print(write(out, tag, meta, [r for r in rows if "not_run" not in r or r["model"] not in ran]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    lane_arguments(parser, MODELS, profile="quick")
    parser.add_argument("--backends", nargs="+", default=None, help=f"default: {' '.join(BACKENDS)} (--smoke: eager)")
    parser.add_argument("--per-length", action="store_true", help="inductor also competes compiled per length")
    budget_arguments(parser)
    parser.add_argument("--smoke", action="store_true", help=f"a CPU check: the models made tiny, batch sizes "
                                                            f"{SMOKE_SIZES} x lengths {SMOKE_LENGTHS}, eager")
    args = parser.parse_args()
    args.backends = args.backends or (["eager"] if args.smoke else BACKENDS)

    def meta() -> Dict[str, Any]:
        import transformers

        return {"device": devices.name(torch.device(args.device)), "torch": torch.__version__,
                "transformers": transformers.__version__, "python": platform.python_version(),
                **grid_of(args), "backends": args.backends, "smoke": args.smoke, "command": command_line()}

    run_lane(args, meta, within_budget(args, lambda m: bench_model(m, args)), write, combine)


if __name__ == "__main__":
    main()
