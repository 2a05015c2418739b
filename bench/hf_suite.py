"""The seed's Hugging Face suite on this machine's GPU: each model tuned, served from its checkpoint, and timed
against every backend and a plain ``torch.compile(model, mode="reduce-overhead")``.

For each model of ``experiment=hf_suite`` (six transformers models at their full-size default configs, random
weights, bf16 autocast on every backend, sequence length 128, batch sizes 1 8 32 128, ``backends=gpu_all``) it tunes
with the pipeline itself, loads the routed model back from its checkpoint (``auto``, served as a user would serve
it, and checked against eager at every size), then times auto, every backend and the ``reduce-overhead`` peer under
the same autocast, interleaved round by round at each batch size (``measure_interleaved``), so every ratio in a row
comes from one measurement. All models are tuned one after another in this one process; ``hf-suite-<tag>.json``
and ``.md`` are rewritten after each model, so a run cut short keeps the models it finished, and a model that
fails is recorded with its error while the lane goes on.

Two lanes on a 2-GPU host, about 7-8 minutes each (all six in one process take about 15 minutes):

    CUDA_VISIBLE_DEVICES=0 taskset -c 0-15 python3 bench/hf_suite.py --out OUT --tag h200-a \
        --models BertForQuestionAnswering ElectraForQuestionAnswering DistilBertForQuestionAnswering &
    CUDA_VISIBLE_DEVICES=1 taskset -c 16-31 python3 bench/hf_suite.py --out OUT --tag h200-b \
        --models GPT2Model T5EncoderModel ViTForImageClassification &
    wait
    python3 bench/hf_suite.py --combine OUT/hf-suite-h200-a.json OUT/hf-suite-h200-b.json --out OUT --tag h200
    python bench/hf_suite.py --out OUT --tag cpu-tiny --device cpu --tiny   # proves the bench runs; no numbers

The profile preset is ``quick`` by default: a BERT-base tune with ``gpu_all`` spends most of its two minutes
compiling, and ``default`` would add about a minute of timing per model, past a lane's 8 minutes. The run's own
reload check is off (``validate.check_reload=false``): this bench loads every checkpoint itself and checks it
against eager. Run directories, checkpoints (about 1.5 GB for the suite) and the MLflow store go to ``--runs`` (a
temporary directory unless given), so OUT holds only the tables.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
from pathlib import Path
from typing import Any, Dict, List

import torch
from omegaconf import OmegaConf

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import command_line, joined_lanes, lane_arguments, reduce_overhead, row_or_error, run_lane, tune_and_load  # noqa: E402
from bench.seed_table import cost_table  # noqa: E402
from pipeline import devices  # noqa: E402
from pipeline.config import SHIPPED_CONF  # noqa: E402
from pipeline.measure.compare import judge  # noqa: E402
from pipeline.measure.interleaved import measure_interleaved  # noqa: E402

EXPERIMENT = OmegaConf.load(SHIPPED_CONF / "experiment" / "hf_suite.yaml")
MODELS = EXPERIMENT.hydra.sweeper.params["model.hf.model_class"].split(",")
PEER = "reduce_overhead"  # torch.compile(model, mode="reduce-overhead"), as a user would write it
# --tiny: a few narrow layers (keys every config class maps), small images, short sequences: for a CPU.
TINY = ["+model.hf.config={num_hidden_layers: 2, hidden_size: 64, num_attention_heads: 2}", "model.hf.seq_len=16",
        "model.batch_sizes=[1,3]", "validate.extra_batch_sizes=[2]"]
TINY_EXTRA = {"ViTForImageClassification": ["+model.hf.config.image_size=32"]}


def overrides(model: str, args: argparse.Namespace) -> List[str]:
    ov = ["experiment=hf_suite", f"model.hf.model_class={model}", f"device={args.device}", f"profile={args.profile}",
          "validate.check_reload=false", f"tracking.uri=sqlite:///{args.runs.resolve()}/mlflow-{args.tag}.db"]
    return ov + (TINY + TINY_EXTRA.get(model, []) if args.tiny else [])


def bench_model(model: str, args: argparse.Namespace) -> Dict[str, Any]:
    run_dir = args.runs / f"{args.tag}-{model.rsplit('.', 1)[-1]}"
    cfg, ctx, auto, tune_s, load_s = tune_and_load(overrides(model, args), run_dir)
    dtype = ctx.backends["eager"].candidate.compute_dtype
    peer = reduce_overhead(ctx.model, ctx.device, dtype)
    _, inputs_at = ctx.input_sources()[0]  # the batches the profile timed
    cells: Dict[str, Dict[int, Dict]] = {}
    checks = []
    for bs in ctx.batch_sizes:
        inputs = inputs_at(bs)
        with torch.inference_mode():
            verdict = judge(auto(**inputs), ctx.model(**inputs), dtype)
        checks.append({"batch_size": bs, "ok": verdict.ok, "max_rel_error": verdict.error, "reason": verdict.reason})
        fns = {name: (lambda b=b: b(**inputs)) for name, b in ctx.backends.items()}
        fns.update(auto=lambda: auto(**inputs), **{PEER: lambda: peer(**inputs)})
        for name, m in measure_interleaved(fns, ctx.device, cfg.profile).items():
            cells.setdefault(name, {})[bs] = m.summary()
    return {"model": model, "tune_seconds": tune_s, "checkpoint_load_seconds": load_s,
            "route": [r.to_dict() for r in ctx.route], "validation_ok": ctx.validation.get("ok"),
            "auto_checks": checks, "auto_ok": all(c["ok"] for c in checks),
            "outcomes": {n: o.to_dict() for n, o in ctx.outcomes.items()},
            "backend_stats": {n: b.stats() for n, b in ctx.backends.items()},
            "stage_seconds": ctx.stage_seconds, "batch_sizes": ctx.batch_sizes, "cells": cells}


def ratios(row: Dict[str, Any]) -> List[Dict[str, float]]:
    """Per batch size: auto over the best single backend and over eager, and the peer's latency over auto's."""
    cells = row["cells"]
    out = []
    for bs in row["batch_sizes"]:
        auto = cells["auto"][bs]["median_ms"]
        best = min(per[bs]["median_ms"] for name, per in cells.items() if name not in ("auto", PEER))
        out.append({"batch_size": bs, "auto_over_best": auto / best,
                    "auto_over_eager": auto / cells["eager"][bs]["median_ms"],
                    "speedup_over_reduce_overhead": cells[PEER][bs]["median_ms"] / auto})
    return out


def summary(rows: List[Dict[str, Any]]) -> Dict[str, Any]:
    done = [row for row in rows if "error" not in row]
    cells = [r for row in done for r in ratios(row)]
    speedups = [c["speedup_over_reduce_overhead"] for c in cells]
    return {"models": len(done), "worst_auto_over_eager": max((c["auto_over_eager"] for c in cells), default=math.nan),
            "geomean_speedup_over_reduce_overhead":
                math.exp(sum(map(math.log, speedups)) / len(speedups)) if speedups else math.nan,
            "cells": len(cells), "all_auto_ok": all(row["auto_ok"] for row in done),
            "failed": [row["model"] for row in rows if "error" in row]}


def markdown(result: Dict[str, Any]) -> str:
    done = [row for row in result["rows"] if "error" not in row]
    names = list(dict.fromkeys(name for row in done for name in row["cells"] if name not in ("auto", PEER)))
    names += [PEER, "auto"]
    lines = [f"## {result['device']}, bf16 autocast, torch {result['torch']}, transformers {result['transformers']}",
             "", f"Latency ms at each model's batch sizes ({PEER}: torch.compile(model, mode=\"reduce-overhead\"))", "",
             "| model | batch sizes | " + " | ".join(names) + " |", "|---" * (len(names) + 2) + "|"]
    for row in done:
        per = [" ".join(f"{row['cells'][n][bs]['median_ms']:.2f}" for bs in row["batch_sizes"])
               if n in row["cells"] else "excluded" for n in names]
        lines.append(f"| {row['model']} | {' '.join(map(str, row['batch_sizes']))} | " + " | ".join(per) + " |")
    lines += ["", "| model | auto / best single | auto / eager | speedup over reduce-overhead | tune s | route |",
              "|---|---|---|---|---|---|"]
    for row in done:
        r = ratios(row)
        figures = [" ".join(f"{c[key]:.2f}" for c in r)
                   for key in ("auto_over_best", "auto_over_eager", "speedup_over_reduce_overhead")]
        route = ", ".join(f"{x['lo']}-{x['hi'] or 'inf'}:{x['backend']}" for x in row["route"])
        lines.append(f"| {row['model']} | " + " | ".join(figures) + f" | {row['tune_seconds']:.0f} | {route} |")
    lines += [f"\nFailed: {row['model']}: {row['error']}" for row in result["rows"] if "error" in row]
    return ("\n".join(lines) + "\n" + cost_table(done) + f"\nSummary: {json.dumps(result['summary'])}\n\n"
            f"Command: `{result['command']}`\n")


def write(out: Path, tag: str, meta: Dict[str, Any], rows: List[Dict[str, Any]]) -> str:
    """Write ``hf-suite-<tag>.json`` and ``.md`` for ``rows``; returns the Markdown."""
    result = {**meta, "summary": summary(rows), "rows": rows}
    (out / f"hf-suite-{tag}.json").write_text(json.dumps(result, indent=2, default=str))
    md = markdown(result)
    (out / f"hf-suite-{tag}.md").write_text(md)
    return md


def combine(parts: List[Path], out: Path, tag: str) -> None:
    """Join lanes (same device and versions) into one table, in the experiment's model order."""
    meta, rows = joined_lanes(parts, MODELS, ("device", "torch", "transformers", "python", "tiny"))
    for row in rows:  # JSON turned the batch-size keys into strings
        row["cells"] = {b: {int(bs): c for bs, c in per.items()} for b, per in row.get("cells", {}).items()}
    print(write(out, tag, meta, rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    lane_arguments(parser, MODELS, profile="quick")
    parser.add_argument("--tiny", action="store_true", help="two narrow layers, sequence 16, batch sizes 1 3: a CPU check")
    args = parser.parse_args()

    def meta() -> Dict[str, Any]:
        import transformers

        return {"device": devices.name(torch.device(args.device)), "torch": torch.__version__,
                "transformers": transformers.__version__, "python": platform.python_version(), "tiny": args.tiny,
                "command": command_line()}

    run_lane(args, meta, lambda model: row_or_error(model, lambda m: bench_model(m, args)), write, combine)


if __name__ == "__main__":
    main()
