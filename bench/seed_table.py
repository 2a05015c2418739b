"""The seed release table on this machine's GPU: every backend and the routed model, per model.

For each model it tunes with the pipeline itself (the ``seed_table`` backends, the chosen profile
preset), loads the routed model back from its checkpoint (``auto``, served as a user would), then
times every backend and ``auto`` interleaved round by round at each batch size, so all the ratios
in a row come from one measurement. All models are tuned one after another in this one process;
the table is rewritten after each model, so a run cut short keeps the models it finished. Writes
``seed-table-<tag>.json`` and ``.md`` under --out.

    python bench/seed_table.py --out OUT --tag h200                      # fp32
    python bench/seed_table.py --out OUT --tag h200-bf16 --autocast bfloat16

Models can be split over GPUs (``--models``, one command per GPU, each its own ``--tag``) and the
parts joined: ``python bench/seed_table.py --combine OUT/seed-table-h200-a.json
OUT/seed-table-h200-b.json --out OUT --tag h200``.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Sequence, Tuple

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import command_line, joined_lanes, lane_arguments, run_lane, tune_and_load  # noqa: E402
from pipeline import devices  # noqa: E402
from pipeline.models import make_inputs  # noqa: E402
from pipeline.measure.interleaved import measure_interleaved# noqa: E402

MODELS = ["mlp", "mobilenet_v3_small", "resnet18", "resnet50", "vit_b_16"]
BACKENDS = ["eager", "inductor", "graph", "graph_inductor", "inductor_reduce_overhead"]
SIZES = [1, 3, 8, 17, 64]
PEER = "inductor_reduce_overhead"


@dataclass(frozen=True)
class Table:
    """A table's columns: the competing backends, the batch sizes, and the peer ``auto`` is held against
    (what a user would pick instead of us)."""

    backends: Sequence[str]
    sizes: Sequence[int]
    peer: str


SEED = Table(BACKENDS, SIZES, PEER)


def overrides_for(model: str, profile: str, autocast: str, runs: Path, device: str, tag: str) -> List[str]:
    ov = [f"model={model}", f"device={device}", f"backends=[{','.join(BACKENDS)}]", f"profile={profile}",
          f"model.batch_sizes=[{','.join(map(str, SIZES))}]", "tracking=sqlite",
          f"tracking.uri=sqlite:///{runs.resolve()}/mlflow-{tag}.db", f"tracking.experiment=seed_table{'_' + autocast if autocast else ''}"]
    if autocast:
        for b in BACKENDS:
            ov += [f"backends.{b}.autocast_enabled=true", f"backends.{b}.autocast_dtype={autocast}"]
    return ov


def bench_model(model: str, overrides: List[str], run_dir: Path, sizes: Sequence[int] = SIZES) -> Dict:
    """Tune with ``overrides``, load the checkpoint as ``auto``, and time every backend and ``auto``
    interleaved at each size."""
    cfg, ctx, auto, tune_s, load_s = tune_and_load(overrides, run_dir)
    cells: Dict[str, Dict[int, Dict]] = {}
    for bs in sizes:
        inputs = make_inputs(ctx.inputs, bs, ctx.device, cfg.seed)
        fns = {name: (lambda b=b: b(**inputs)) for name, b in ctx.backends.items()}
        fns["auto"] = lambda: auto(**inputs)
        for name, b in auto.backends.items():  # the loaded backends without the router: its overhead, apart
            fns[f"auto_direct:{name}"] = lambda b=b: b(**inputs)
        for name, m in measure_interleaved(fns, ctx.device, cfg.profile).items():
            cells.setdefault(name, {})[bs] = m.summary()
    row = {
        "model": model,
        "tune_seconds": tune_s,
        "checkpoint_load_seconds": load_s,
        "route": [r.to_dict() for r in ctx.route],
        "validation_ok": ctx.validation.get("ok"),
        "outcomes": {n: o.to_dict() for n, o in ctx.outcomes.items()},
        "backend_stats": {n: b.stats() for n, b in ctx.backends.items()},
        "loaded_backend_stats": {n: b.stats() for n, b in auto.backends.items()},
        "stage_seconds": ctx.stage_seconds,
        "cells": cells,
        # the tune's own profile (what the route was decided on): where the table disagrees, this says why
        "tune_cells": {b: {k: {"median_ms": m.median, "interval_ms": list(m.interval), "noisy": m.noisy,
                               "contended": m.contended} for k, m in per.items() if isinstance(k, int) and m.count}
                       for b, per in ctx.profile.items()},
        "min_gain": float(cfg.route.min_gain),
    }
    return row


def served_at(row: Dict, bs: int) -> str:
    """The backend the row's route serves ``bs`` with."""
    return next(r["backend"] for r in row["route"] if r["lo"] <= bs and (r["hi"] is None or bs <= r["hi"]))


def disagreements(rows: List[Dict], table: Table = SEED) -> List[str]:
    """Each cell where a backend the route did not serve there beat ``auto`` in the table by more than the route's own
    margin, with what the tune measured of both: the route was right on the tune's numbers (the cells moved between
    the tune and the table), or the tune's numbers already showed the winner (a bug of the route's)."""
    out = []
    for row in rows:
        margin, tuned = row.get("min_gain", 0.10), row.get("tune_cells", {})
        for bs in table.sizes:
            singles = {b: c[bs]["median_ms"] for b, c in row["cells"].items() if not b.startswith("auto") and bs in c}
            best = min(singles, key=singles.get)
            auto = row["cells"]["auto"][bs]["median_ms"]
            served = served_at(row, bs)
            if best == served or auto <= singles[best] * (1 + margin):
                continue
            tune = {b: tuned.get(b, {}).get(str(bs)) or tuned.get(b, {}).get(bs) for b in (best, served)}
            said = "; ".join(f"{b} {t['median_ms']:.3g} ms [{t['interval_ms'][0]:.3g}, {t['interval_ms'][1]:.3g}]"
                             f"{' noisy' if t['noisy'] else ''}{' contended' if t['contended'] else ''}"
                             if t else f"{b} not profiled" for b, t in tune.items())
            verdict = ("the tune showed it faster beyond the margin: the route's bug"
                       if all(tune.values()) and tune[best]["median_ms"] * (1 + margin) < tune[served]["median_ms"]
                       else "the tune did not show it faster beyond the margin: the cells moved between tune and table")
            out.append(f"{row['model']} bs={bs}: {best} {singles[best]:.3g} ms beats auto ({served}) {auto:.3g} ms by "
                       f"{auto / singles[best]:.2f}x; the tune measured {said}: {verdict}")
    return out


def ratios(row: Dict, table: Table = SEED) -> Dict[int, Dict[str, Any]]:
    """Per batch size: auto over the best single backend, over eager, over the peer, and whether the best single
    backend is the one the route serves there (``best_is_served``): then the ratio is one instance of a backend
    against another (the checkpoint's, loaded, against the table's own), not a choice of the route's."""
    out = {}
    cells = row["cells"]
    for bs in table.sizes:
        auto = cells["auto"][bs]["median_ms"]
        singles = {b: c[bs]["median_ms"] for b, c in cells.items() if not b.startswith("auto") and bs in c}
        best = min(singles, key=singles.get)
        out[bs] = {"auto_over_best": auto / singles[best],
                   "auto_over_eager": auto / singles["eager"] if "eager" in singles else math.nan,
                   "auto_over_peer": auto / singles[table.peer] if table.peer in singles else math.nan,
                   "best_is_served": best == served_at(row, bs)}
    return out


def markdown(rows: List[Dict], title: str, table: Table = SEED) -> str:
    names = [*table.backends, "auto"]
    lines = [f"## {title}", "", "Latency ms by batch size " + " / ".join(map(str, table.sizes)), "",
             "| model | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for row in rows:
        cells = []
        for b in names:
            per = row["cells"].get(b)
            cells.append(" ".join(f"{per[bs]['median_ms']:.2f}" for bs in table.sizes) if per else "excluded")
        lines.append(f"| {row['model']} | " + " | ".join(cells) + " |")
    lines += ["", f"| model | auto / best single | auto / eager | auto / {table.peer} | tune s | route |",
              "|---|---|---|---|---|---|"]
    for row in rows:
        r = ratios(row, table)
        fmt = lambda key: " ".join(f"{r[bs][key]:.2f}" for bs in table.sizes)  # noqa: E731
        route = ", ".join(f"{x['lo']}-{x['hi'] or 'inf'}:{x['backend']}" for x in row["route"])
        lines.append(f"| {row['model']} | {fmt('auto_over_best')} | {fmt('auto_over_eager')} | "
                     f"{fmt('auto_over_peer')} | {row['tune_seconds']:.0f} | {route} |")
    return "\n".join(lines) + "\n" + cost_table(rows)


def cost_table(rows: List[Dict]) -> str:
    """Tuning cost per model: stage seconds, each backend's build (compile, graph record) and peak memory."""
    lines = ["", "Tuning cost: seconds per stage; per backend, build seconds (of which graph recording) and peak MB", "",
             "| model | tune s | capture s | profile s | validate s | build s (record s) | peak MB |",
             "|---|---|---|---|---|---|---|"]
    for row in rows:
        stage = row["stage_seconds"]
        builds = []
        for name, outcome in row["outcomes"].items():
            recorded = row["backend_stats"].get(name, {}).get("record_seconds")
            builds.append(f"{name} {outcome['build_seconds']:.1f}" + (f" ({recorded:.2f})" if recorded is not None else ""))
        peak = max((o.get("peak_memory_bytes") or 0) for o in row["outcomes"].values()) / 2**20
        lines.append(f"| {row['model']} | {row['tune_seconds']:.0f} | {stage.get('capture', 0):.0f} | "
                     f"{stage.get('profile', 0):.0f} | {stage.get('validate', 0):.0f} | {', '.join(builds)} | {peak:.0f} |")
    return "\n".join(lines) + "\n"


def summary(rows: List[Dict], table: Table = SEED) -> Dict[str, float]:
    by_cell = {f"{row['model']} bs={bs}": r for row in rows for bs, r in ratios(row, table).items()}
    all_r = list(by_cell.values())
    peer = [r["auto_over_peer"] for r in all_r if not math.isnan(r["auto_over_peer"])]
    chosen = [r["auto_over_best"] for r in all_r if not r["best_is_served"]]
    instances = [r["auto_over_best"] for r in all_r if r["best_is_served"]]
    return {
        "worst_auto_over_best": max(r["auto_over_best"] for r in all_r),
        "worst_cell": max(by_cell, key=lambda cell: by_cell[cell]["auto_over_best"]),
        # the route's choices: cells where another backend than the served one was the table's fastest
        "worst_auto_over_another_backend": max(chosen, default=math.nan),
        # the rest: the served backend's loaded instance against the table's own instance of it
        "worst_auto_over_its_own_backend": max(instances, default=math.nan),
        "cells_auto_over_best_within_1.05": sum(r["auto_over_best"] <= 1.05 for r in all_r),
        "worst_auto_over_eager": max(r["auto_over_eager"] for r in all_r),
        "geomean_speedup_over_peer": math.exp(-sum(math.log(x) for x in peer) / len(peer)) if peer else math.nan,
        "cells": len(all_r),
    }


def write(out: Path, stem: str, meta: Dict, rows: List[Dict], table: Table = SEED, notes: str = "") -> str:
    """Write ``stem``.json and ``stem``.md for ``rows`` (``notes`` under the title); returns the Markdown."""
    result = {**meta, "rows": rows, "summary": summary(rows, table)}
    (out / f"{stem}.json").write_text(json.dumps(result, indent=2, default=str))
    md = markdown(rows, f"{result['device']}, {result['dtype']}, torch {result['torch']}", table)
    md = md.replace("\n", f"\n\n{notes}\n", 1) if notes else md
    found = disagreements(rows, table)
    md += ("\nWhere a backend the route did not serve beat auto by more than the route's margin, and what the tune "
           "measured:\n\n" + "\n".join(f"- {line}" for line in found) + "\n") if found else ""
    md += f"\nSummary: {json.dumps(result['summary'])}\n\nCommand: `{result['command']}`\n"
    (out / f"{stem}.md").write_text(md)
    return md


def joined_rows(parts: List[Path], models: Sequence[str], keys: Sequence[str]) -> Tuple[Dict, List[Dict]]:
    """Lanes' JSON of this table's rows (``bench_model``'s) as one table (``common.joined_lanes``), each row's cells
    keyed by batch size again."""
    meta, rows = joined_lanes(parts, models, keys)
    for row in [*rows, *(again["row"] for again in meta.get("measured_again", []))]:
        row["cells"] = {b: {int(bs): c for bs, c in per.items()} for b, per in row["cells"].items()}  # JSON: strings
    return meta, rows


def combine(parts: List[Path], out: Path, tag: str) -> None:
    """Join parts (same device, dtype and torch) into one table, the seed's models first in their order."""
    meta, rows = joined_rows(parts, MODELS, ("device", "torch", "python", "dtype"))
    print(write(out, f"seed-table-{tag}", meta, rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    lane_arguments(parser, MODELS, profile="default")
    parser.add_argument("--autocast", default="", choices=["", "bfloat16", "float16"])
    args = parser.parse_args()
    run_lane(args, lambda: {"device": devices.name(torch.device(args.device)), "torch": torch.__version__,
                            "python": platform.python_version(), "dtype": args.autocast or "float32",
                            "command": command_line()},
             lambda model: bench_model(model, overrides_for(model, args.profile, args.autocast, args.runs, args.device,
                                                            args.tag),
                                       args.runs / f"{model}{'_' + args.autocast if args.autocast else ''}"),
             lambda out, tag, meta, rows: write(out, f"seed-table-{tag}", meta, rows), combine)


if __name__ == "__main__":
    main()
