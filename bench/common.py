"""What every bench shares: the command that made its figures (without machine paths), how fast the
host ran Python while they measured, the lanes of the table benches (one model after another in one
process, the tables rewritten after each, a failing model recorded as such; ``--combine`` joins lanes),
the reference peers a tune built (the user's own ``torch.compile`` in each mode: what auto is held against), and
the ``torch.compile(mode="reduce-overhead")`` peer of the benches that compile one themselves."""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import statistics
import subprocess
import tempfile
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import torch

ROOT = Path(__file__).resolve().parents[1]
PATH_OPTIONS = {"--out": "OUT", "--runs": "RUNS"}  # options naming a folder of this machine, and their stand-in


def command_line(argv: Sequence[str] = ()) -> str:
    """``python bench/<script> ...`` as run, the script repository-relative and ``--out DIR`` as ``--out OUT``
    (``--runs DIR`` as ``--runs RUNS``): no machine paths."""
    argv = list(argv or sys.argv)
    script = Path(argv[0]).resolve()
    words = ["python", str(script.relative_to(ROOT)) if script.is_relative_to(ROOT) else script.name]
    rest = argv[1:]
    for i, word in enumerate(rest):
        option = word.split("=", 1)[0]
        if i and rest[i - 1] in PATH_OPTIONS:
            word = PATH_OPTIONS[rest[i - 1]]
        elif "=" in word and option in PATH_OPTIONS:
            word = f"{option}={PATH_OPTIONS[option]}"
        words.append(word)
    return " ".join(words)


def host_probe_ms(calls: int = 50) -> float:
    """Median milliseconds of a fixed piece of pure Python (``sum(range(20_000))``).

    Launch-bound latencies (eager, Inductor without graphs) move with how fast the host runs a
    launch thread, so a bench records this beside them.
    """
    def once() -> float:
        start = time.perf_counter()
        sum(range(20_000))
        return (time.perf_counter() - start) * 1e3

    return statistics.median(once() for _ in range(calls))


def lane_arguments(parser: argparse.ArgumentParser, models: Sequence[str], profile: str) -> None:
    """The options of a table bench: its output, tag, models (one lane), profile preset, device, and --combine."""
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--tag", default="h200")
    parser.add_argument("--models", nargs="+", default=list(models))
    parser.add_argument("--profile", default=profile)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--combine", nargs="+", type=Path, help="join these lanes' JSON instead of running")
    runs_argument(parser)


def runs_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--runs", type=Path, help="run directories, checkpoints and the MLflow store; default: a new "
                                                  "temporary directory, so that OUT holds only the tables")


def runs_dir(args: argparse.Namespace) -> Path:
    """Where the bench's runs go (``--runs``, or a new temporary directory), absolute (runs in a child process
    with another working directory find it), said once on stdout."""
    args.runs = (Path(tempfile.mkdtemp(prefix="tweakpipe-bench-")) if args.runs is None else args.runs).resolve()
    print(f"run directories and MLflow store: {args.runs}", flush=True)
    return args.runs


def run_lane(args: argparse.Namespace, meta: Callable[[], Dict[str, Any]], bench_model: Callable[[str], Dict],
             write: Callable[[Path, str, Dict[str, Any], List[Dict]], str],
             combine: Callable[[List[Path], Path, str], None]) -> None:
    """Bench ``args.models`` one after another, rewriting the tables after each model so that a run cut short
    keeps what finished; or, with ``--combine``, join lanes' JSON."""
    args.out.mkdir(parents=True, exist_ok=True)
    if args.combine:
        combine(args.combine, args.out, args.tag)
        return
    runs_dir(args)
    about, rows = meta(), []
    for model in args.models:
        rows.append(bench_model(model))
        print(write(args.out, args.tag, about, rows), flush=True)
        gc.collect()  # the finished model's backends, graphs and compiled code go before the next model
        torch.cuda.empty_cache()


def reduce_overhead(model: torch.nn.Module, device: torch.device, dtype: Optional[torch.dtype]) -> Callable[..., Any]:
    """The peer: ``torch.compile(model, mode="reduce-overhead")`` as a user would write it, called under
    autocast of ``dtype`` (None: fp32, no autocast)."""
    compiled = torch.compile(model, mode="reduce-overhead")

    def call(**inputs: torch.Tensor) -> Any:
        autocast = torch.autocast(device.type, dtype=dtype) if dtype is not None else contextlib.nullcontext()
        with torch.inference_mode(), autocast:
            torch.compiler.cudagraph_mark_step_begin()
            return compiled(**inputs)

    return call


def row_or_error(model: str, bench_model: Callable[[str], Dict[str, Any]]) -> Dict[str, Any]:
    """A model's row; a model that fails is recorded with its error and the lane goes on to the next."""
    try:
        return bench_model(model)
    except Exception as exc:  # noqa: BLE001 (reported, not hidden: the row and stderr say what failed)
        traceback.print_exc()
        return {"model": model, "error": "".join(traceback.format_exception_only(type(exc), exc)).strip()[-2000:]}


def budget_arguments(parser: argparse.ArgumentParser) -> None:
    """``--budget-s`` and ``--expect-from``: what :func:`within_budget` reads."""
    parser.add_argument("--budget-s", type=float, default=540.0, help="start no model that would end past this")
    parser.add_argument("--expect-from", nargs="+", type=earlier_table, default=[],
                        help="earlier tables (JSON) of this bench: a model with a row there is expected to take its "
                             "bench_seconds again; the others, as long as the slowest model so far")


def earlier_table(text: str) -> Path:
    """An ``--expect-from`` argument: a readable JSON table with ``rows``, checked as the command line is read, so a
    wrong path is a one-line usage error before any model runs rather than a traceback after the imports."""
    path = Path(text)
    try:
        rows = json.loads(path.read_text()).get("rows")
    except (OSError, ValueError, AttributeError) as exc:
        raise argparse.ArgumentTypeError(f"{text}: not a readable JSON table of this bench ({exc})") from exc
    if not isinstance(rows, list):
        raise argparse.ArgumentTypeError(f"{text}: a JSON table of this bench has a 'rows' list; this file has none")
    return path


def expected_seconds(tables: Sequence[Path]) -> Dict[str, float]:
    """Model -> the seconds its row took to bench (``bench_seconds``) in ``tables``, the longest where several have
    it. Rows written before the figure was recorded give none: their tune seconds leave out the eager timing,
    the references and the load that the bench spends around the tune."""
    seconds: Dict[str, float] = {}
    for table in tables:
        for row in json.loads(table.read_text())["rows"]:
            if "bench_seconds" in row:
                seconds[row["model"]] = max(seconds.get(row["model"], 0.0), float(row["bench_seconds"]))
    return seconds


def within_budget(args: argparse.Namespace, bench_model: Callable[[str], Dict[str, Any]]) -> Callable[[str], Dict]:
    """``bench_model`` (each failure a row, :func:`row_or_error`, with the seconds it took as ``bench_seconds``),
    unless it would end past ``args.budget_s``: by its ``bench_seconds`` in the tables of ``args.expect_from``, else
    by the slowest model so far. Then the row says so (``not_run``), and a second call runs the rest
    (``--combine``): a model cut off by the call's own limit leaves no row and costs the device time it ran."""
    start, slowest = time.perf_counter(), [0.0]
    expected = expected_seconds(args.expect_from)

    def one(model: str) -> Dict[str, Any]:
        began = time.perf_counter()
        guess, why = (expected[model], f"{model} took {expected[model]:.0f} s in --expect-from") \
            if model in expected else (slowest[0], f"the slowest model so far took {slowest[0]:.0f} s")
        if began - start + guess > args.budget_s:
            return {"model": model, "not_run": f"{began - start:.0f} s in, and {why}: past --budget-s "
                                               f"{args.budget_s:.0f}"}
        row = row_or_error(model, bench_model)
        took = time.perf_counter() - began
        slowest[0] = max(slowest[0], took)
        return {**row, "bench_seconds": round(took, 1)}

    return one


def unfinished(row: Dict[str, Any]) -> Optional[str]:
    """What a table says of a model that failed or was not run (:func:`row_or_error`, :func:`within_budget`)."""
    if "error" in row:
        return f"failed: {row['error'].splitlines()[-1][:120]}"
    return f"not run: {row['not_run']}" if "not_run" in row else None


def write_table(out: Path, stem: str, meta: Dict[str, Any], rows: List[Dict[str, Any]],
                summary: Callable[[List[Dict]], Dict[str, Any]],
                markdown: Callable[[List[Dict], Dict[str, Any]], str]) -> str:
    """Write ``<stem>.json`` (``meta``, ``summary(rows)``, the rows) and ``<stem>.md`` (``markdown(rows, meta)``, the
    summary and the command); returns the Markdown."""
    result = {**meta, "summary": summary(rows), "rows": rows}
    (out / f"{stem}.json").write_text(json.dumps(result, indent=2, default=str))
    md = markdown(rows, meta) + f"\nSummary: {json.dumps(result['summary'])}\n\nCommand: `{meta['command']}`\n"
    (out / f"{stem}.md").write_text(md)
    return md


def joined_lanes(parts: List[Path], models: Sequence[str], keys: Sequence[str],
                 before: Optional[Mapping[str, Any]] = None) -> Tuple[Dict[str, Any], List[Dict]]:
    """Lanes' JSON (``--combine``) as one table: the meta ``keys`` the lanes share with every lane's command,
    and all rows, ``models``' order first. Lanes that differ in one of ``keys`` (another GPU, another torch) are
    refused, naming it: their ratios were measured on different things and one table would say one. A lane written
    before a key existed has the value in ``before`` (what its runs did). A model measured in several lanes keeps
    the row of the lane given last (after a fix, or on a quieter machine) unless that lane left it for later
    (``not_run``), and the meta keeps each finished row it replaced whole (``measured_again``: the lane's file name,
    its place among ``parts``, its command and its row), so a table measured again still shows what it read the
    first time."""
    loaded = [{**(before or {}), **json.loads(p.read_text())} for p in parts]
    for key in keys:
        seen = {json.dumps(part.get(key), sort_keys=True): path for part, path in zip(loaded, parts)}
        if len(seen) > 1:
            raise SystemExit(f"--combine: the lanes differ in {key}: " + "; ".join(
                f"{path.name}: {value}" for value, path in seen.items()) + "; join only lanes measured alike")
    order = {m: i for i, m in enumerate(models)}
    latest: Dict[str, Dict] = {}
    replaced: List[Dict[str, Any]] = []
    for index, (part, path) in enumerate(zip(loaded, parts)):
        for row in part["rows"]:
            earlier = latest.get(row["model"])
            if earlier is not None and "not_run" in row:
                continue  # a lane that left the model for later replaces nothing
            if earlier is not None and "not_run" not in earlier["row"]:
                replaced.append({"model": row["model"], **earlier})
            latest[row["model"]] = {"lane": path.name, "part": index, "command": part["command"], "row": row}
    rows = sorted((kept["row"] for kept in latest.values()), key=lambda r: order.get(r["model"], len(models)))
    meta = {k: loaded[0][k] for k in keys}
    meta["command"] = " ; ".join(part["command"] for part in loaded)
    if replaced:
        meta["measured_again"] = replaced
    return meta, rows


def tune_and_load(overrides: List[str], run_dir: Path) -> Tuple[Any, Any, Any, float, float]:
    """Tune with the pipeline itself, then load the routed model back from its checkpoint, as a user serves it:
    the composed config, the run's context, the loaded model, and the seconds tuning and loading took."""
    from pipeline.api import compose_config
    from pipeline.route import checkpoint
    from pipeline.runner import run

    cfg = compose_config(overrides)
    start = time.perf_counter()
    ctx = run(cfg, run_dir)
    tune_s, start = time.perf_counter() - start, time.perf_counter()
    auto = checkpoint.load(ctx.checkpoint_path, ctx.model, device=ctx.device)
    return cfg, ctx, auto, tune_s, time.perf_counter() - start


def references_of(ctx: Any) -> Tuple[Dict[str, str], Dict[str, str]]:
    """A tuned run's reference peers (``pipeline.backends.reference``): those it built (candidate -> torch.compile mode
    as the user writes it), which a bench times auto against, taking the best per cell; and those the route stage
    found unmeasured (route.json's ``reference.unmeasured``: candidate -> why, ``tune.budget_s``, the precision
    screen, a failure), which its table must name."""
    built = {n: m for n, m in ctx.reference_modes().items() if n in ctx.backends}
    return built, dict((ctx.route_info.get("reference") or {}).get("unmeasured", {}))


def tune_process(command: Sequence[str], cwd: Path, env: Dict[str, str], log: Path, run_dir: Path,
                 what: str) -> Dict[str, Any]:
    """One tune run as its own process, as a user runs it (the command line, or a script): its wall seconds, its
    output (standard output and error, as they came), and its run directory's ``cost.json`` and ``route.json``. The
    output goes to ``log`` while the tune runs, so a call cut short by its host's time limit keeps the tune's progress
    lines (a ResNet-50 tune killed at 575 s left one line of the bench, 2026-12-06). A failed tune raises
    RuntimeError naming ``what``, with the end of its output."""
    start = time.perf_counter()
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as out:
        proc = subprocess.run(list(command), cwd=cwd, stdout=out, stderr=subprocess.STDOUT, text=True, env=env)
    wall = time.perf_counter() - start
    output = log.read_text(errors="replace")
    if proc.returncode != 0:
        raise RuntimeError(f"{what} failed ({proc.returncode}): {output[-3000:]}")
    return {"wall_s": wall, "output": output, "cost": json.loads((run_dir / "cost.json").read_text()),
            "route": json.loads((run_dir / "route.json").read_text())}
