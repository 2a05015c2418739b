"""``tweakpipe report``: the seed-style latency table, built from MLflow.

Rows are model x backend plus the routed ``auto``; columns are batch sizes; cells are median latency in ms, marked
``*`` where the profile flagged the cell noisy (``noisy/<backend>/bs<N>``). ``auto`` is the latency of the backend the
route picked at that size (a run logs it too, as ``latency_ms/auto/bs<N>``: ``pipeline.route.figures``), or a logged
``latency_ms/auto/bs<N>`` where a run has no route; the row after it is auto's speed-up over the best reference peer
at each size, the user's best own ``torch.compile`` (``speedup_vs_compile/bs<N>``), where the run timed one; a note
under the table names each run whose route rests on noisy cells (tag ``route.rests_on_noisy``), each whose routed
median is above eager's (within both cells' intervals, where the router keeps the owner), and each reference the
comparison lacks (not built under ``tune.budget_s``, failed: tag ``reference.unmeasured.<name>``). A candidate the
screen dropped is a row marked ``(screened out)`` holding the screen's medians (``screen_ms/<backend>/bs<N>``), with
why under the table. A run that tuned lengths (``latency_ms/<backend>/bs<N>/len<L>``) gives a row per backend and
length, and its heatmap follows the table: the backend serving each (batch size, length) and its speed-up over eager.
The runs come from a sweep (its parent run), an experiment (the newest run of each model) or a list of run ids; under
a sweep's table come its failed jobs, each with its overrides and reason (the parent run's ``sweep.failed_job.<N>``
tags). The
table is printed and written as Markdown and CSV::

    tweakpipe report                                  # the newest sweep in outputs/mlflow.db with a finished run
    tweakpipe report --sweep <parent run id> --out outputs/reports/seed
    tweakpipe report --experiment tweakpipe --uri http://127.0.0.1:5000
    tweakpipe report --runs <run id> <run id>
    tweakpipe report --experiment tweakpipe --accuracy  # + precision, score vs fp32 eager, in budget
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence, Set, Tuple

from pipeline.config.errors import fail, one_line
from pipeline.errors import ConfigError
from pipeline.config.schema import TrackingConfig
from pipeline.route.figures import AUTO
from pipeline.route.policy import Range, backend_for
from pipeline.record.store import check_store
from pipeline.record.tracker import (CONTENDED_TAG, FAILED_JOB_TAG, JOBS_FAILED_TAG, PARENT_TAG, SWEEP_TAG,
                                    UNMEASURED_TAG)

METRIC = re.compile(r"^(?P<figure>latency_ms|noisy|contended|screen_ms)/(?P<backend>[^/]+)/bs(?P<bs>\d+)"
                    r"(?:/len(?P<len>\d+))?$")
# auto over the best reference peer (pipeline.route.figures.reference_figures), ``contended_`` where it rests on a
# contended cell
VERSUS = re.compile(r"^(?P<contended>contended_)?speedup_vs_compile/bs(?P<bs>\d+)$")
SCORE = re.compile(r"^accuracy/(?P<metric>[^/]+)/(?P<backend>[^/]+)$")  # the budget's metric (recorder.capture)
VERSUS_ROW = "auto vs best own compile (x)"  # auto's speed-up over the user's best torch.compile, not a latency
LEGEND = "`*` noisy: the profile flagged this cell (its samples or passes disagreed; profile.csv says why)"
CONTENDED_LEGEND = ("`!` contended: measured on a busy host (profile.csv: contention); its figure measures the other "
                    "jobs as much as the model, so quote none of them: profile again on a quiet machine or with "
                    "profile.on_busy=wait")
SCREENED = "screened out"  # a candidate the screen dropped: its row holds the screen's medians
SCREENED_TAG = "screened_out."  # + candidate: why the screen dropped it (the recorder's tag)
EAGER = "eager"
# The router's rule against eager (pipeline.route.policy.owners_with), said where a table seems to break it.
WITHIN_NOISE = ("the router takes a size from its owner for not beating eager only where eager is faster beyond "
                "both cells' intervals; here they overlap, so a re-run may as well put auto below eager")


@dataclass
class Row:
    model: str
    backend: str
    ms: Dict[int, float]
    noisy: Set[int] = field(default_factory=set)  # batch sizes whose cell was flagged noisy
    contended: Set[int] = field(default_factory=set)  # batch sizes whose figure rests on a cell measured on a busy host
    # --accuracy: the candidate's precision and its score against fp32 eager (accuracy/<metric>/<backend>)
    precision: str = ""
    score: Optional[float] = None
    within: Optional[bool] = None
    screened: str = ""  # why the screen dropped it, where it did: then ``ms`` are the screen's medians

    @property
    def label(self) -> str:
        """The backend as the table names it: marked where the screen dropped it."""
        return f"{self.backend} ({SCREENED})" if self.screened else self.backend


@dataclass
class Table:
    sizes: List[int] = field(default_factory=list)
    rows: List[Row] = field(default_factory=list)
    title: str = "median latency (ms) by batch size"
    notes: List[str] = field(default_factory=list)  # one per run whose route rests on noisy cells
    accuracy: bool = False  # show each candidate's precision and score beside its latencies
    heatmaps: List[str] = field(default_factory=list)  # one per run that tuned lengths (Markdown)
    failed: List[str] = field(default_factory=list)  # a sweep's "N of M jobs failed", then each failed job in one line


ACCURACY_COLUMNS = ["precision", "score", "in budget"]


def accuracy_columns(table: Table, r: Row) -> List[str]:
    """precision, score and in-budget cells of ``r`` (none without ``--accuracy``)."""
    if not table.accuracy:
        return []
    within = "" if r.within is None else "yes" if r.within else "NO"
    return [r.precision, "" if r.score is None else f"{r.score:.6g}", within]


def scores(run) -> Dict[str, float]:
    """backend -> its score against fp32 eager, from a run's ``accuracy/<metric>/<backend>`` metrics."""
    return {m["backend"]: value for key, value in run.data.metrics.items() if (m := SCORE.match(key))}


def per_cell(run, figure: str, lengths: bool = False) -> Dict[str, Dict]:
    """backend -> batch size -> value from a run's ``<figure>/<backend>/bs<N>`` metrics (``latency_ms``, ``noisy``);
    with ``lengths``, backend -> (batch size, length) -> value from its ``.../bs<N>/len<L>`` metrics."""
    out: Dict[str, Dict] = {}
    for key, value in run.data.metrics.items():
        m = METRIC.match(key)
        if m and m["figure"] == figure and not math.isnan(value) and (m["len"] is not None) == lengths:
            cell = (int(m["bs"]), int(m["len"])) if lengths else int(m["bs"])
            out.setdefault(m["backend"], {})[cell] = value
    return out


def length_rows(run, label: str, table: Table) -> Set[int]:
    """A run that tuned lengths: a row per backend and length (``auto`` from its table), and its heatmap; the batch
    sizes it profiled (none for a run without such metrics)."""
    from pipeline.record.heatmap import markdown_grid
    from pipeline.route.table import Tile, backend_at

    lat, noisy = per_cell(run, "latency_ms", True), per_cell(run, "noisy", True)
    if not lat:
        return set()
    text = run.data.tags.get("route_table_json")
    tiles = [Tile(**t) for t in json.loads(text)] if text else None
    order = [b for b in run.data.tags.get("backends", "").split(",") if b in lat]
    order += sorted(b for b in lat if b not in order and b != AUTO)
    lengths = sorted({n for per in lat.values() for _, n in per})
    for n in lengths:
        for backend in order:
            ms = {bs: v for (bs, m), v in lat[backend].items() if m == n}
            if ms:
                table.rows.append(Row(label, f"{backend} len={n}", ms,
                                      {bs for (bs, m), flag in noisy.get(backend, {}).items() if m == n and flag}))
        if tiles:
            auto = {bs: lat[b][(bs, n)] for bs in sorted({bs for per in lat.values() for bs, m in per if m == n})
                    if (b := backend_at(tiles, bs, n)) in lat and (bs, n) in lat[b]}
            table.rows.append(Row(label, f"{AUTO} len={n}", auto))
    baseline = EAGER if EAGER in lat else next((b for b in order if b.startswith(EAGER)), None)
    table.heatmaps.append(f"{label}: the backend serving each (batch size, length), and its speed-up over "
                          f"{baseline or 'eager'}\n\n{markdown_grid(lat, tiles, baseline)}")
    return {bs for per in lat.values() for bs, _ in per}


def latencies(run) -> Dict[str, Dict[int, float]]:
    """backend -> batch size -> ms from a run's ``latency_ms/<backend>/bs<N>`` metrics."""
    return per_cell(run, "latency_ms")


def route_of(run) -> Optional[List[Range]]:
    """The route a run logged (tag ``route_json``), or None if the route stage did not run."""
    text = run.data.tags.get("route_json")
    return [Range(r["lo"], r["hi"], r["backend"]) for r in json.loads(text)] if text else None


def auto_row(lat: Dict[str, Dict[int, float]], route: Optional[List[Range]]) -> Dict[int, float]:
    """The routed backend's latency at each size, else (a run without a route) the logged auto latencies."""
    if not route:
        return dict(lat.get(AUTO, {}))
    sizes = sorted({bs for per in lat.values() for bs in per})
    return {bs: lat[backend_for(route, bs)][bs] for bs in sizes if bs in lat.get(backend_for(route, bs), {})}


def labels(runs: Sequence) -> List[str]:
    """Row labels: the model name, plus what sets its runs apart (overrides, else the run id) where models repeat."""
    models = [r.data.tags.get("model", r.info.run_name or r.info.run_id) for r in runs]
    overrides = [set(r.data.tags.get("hydra.overrides", "").split()) for r in runs]
    out = []
    for run, model, own in zip(runs, models, overrides):
        if models.count(model) == 1:
            out.append(model)
            continue
        shared = set.intersection(*(o for m, o in zip(models, overrides) if m == model))
        rest = [o for o in run.data.tags.get("hydra.overrides", "").split() if o not in shared]
        out.append(f"{model} [{' '.join(rest)}]" if rest else f"{model} [{run.info.run_id[:8]}]")
    return [lab if out.count(lab) == 1 else f"{lab} [{run.info.run_id[:8]}]" for lab, run in zip(out, runs)]


def screened_rows(run, label: str, score: Mapping[str, float]) -> List[Row]:
    """A row per candidate the screen dropped (tag ``screened_out.<candidate>``), holding its screen medians
    (``screen_ms/<candidate>/bs<N>``) and why: shown, not left out."""
    screen = per_cell(run, "screen_ms")
    tags = run.data.tags
    return [Row(label, name, screen.get(name, {}), score=score.get(name), precision=tags.get(f"precision.{name}", ""),
                screened=why.removeprefix(f"{SCREENED}: "))
            for key, why in sorted(tags.items()) if key.startswith(SCREENED_TAG)
            for name in [key[len(SCREENED_TAG):]]]


def build(runs: Sequence, accuracy: bool = False, failed: Sequence[str] = ()) -> Table:
    """The table over ``runs`` in the order given (sweeps: job order); ``accuracy`` adds each candidate's
    precision and its score, the budget's metric (the budget, e.g. ``cosine >= 0.999``, goes in the title);
    ``failed``: the sweep's failed jobs (:func:`failed_jobs`), under the table."""
    table = Table(accuracy=accuracy, failed=list(failed))
    budgets = sorted({r.data.tags["accuracy_budget"] for r in runs if "accuracy_budget" in r.data.tags})
    if accuracy and budgets:
        table.title += f"; score against fp32 eager (worst tuned size), budget {' / '.join(budgets)}"
    sizes = set()
    for run, label in zip(runs, labels(runs)):
        lat = latencies(run)
        if not lat:
            sizes.update(length_rows(run, label, table))
            continue
        noisy, busy = ({b: {bs for bs, flag in per.items() if flag} for b, per in per_cell(run, figure).items()}
                       for figure in ("noisy", "contended"))
        order = [b for b in run.data.tags.get("backends", "").split(",") if b in lat]
        order += sorted(b for b in lat if b not in order and b != AUTO)
        metrics, tags, score = run.data.metrics, run.data.tags, scores(run)
        for backend in order:
            within = metrics.get(f"within_budget/{backend}")
            table.rows.append(Row(label, backend, lat[backend], noisy.get(backend, set()), busy.get(backend, set()),
                                  tags.get(f"precision.{backend}", ""), score.get(backend),
                                  None if within is None else bool(within)))
        table.rows += screened_rows(run, label, score)
        route = route_of(run)
        auto = auto_row(lat, route)
        if auto:
            served = {bs: backend_for(route, bs) for bs in auto} if route else {}
            table.rows.append(Row(label, AUTO, auto, {bs for bs, b in served.items() if bs in noisy.get(b, ())},
                                  {bs for bs, b in served.items() if bs in busy.get(b, ())}))
        versus = {int(m["bs"]): (v, bool(m["contended"])) for key, v in run.data.metrics.items()
                  if (m := VERSUS.match(key))}
        if versus:
            table.rows.append(Row(label, VERSUS_ROW, {bs: v for bs, (v, _) in versus.items()},
                                  contended={bs for bs, (_, flag) in versus.items() if flag}))
        if tags.get(CONTENDED_TAG) == "true":
            table.notes.append(f"{label}: {tags.get(f'{CONTENDED_TAG}_cells', 'some')} cell(s) measured on a busy "
                               f"host (marked `!`): no figure of this run is the model's alone")
        table.notes += [f"{label}: {VERSUS_ROW} leaves out {key[len(UNMEASURED_TAG):]}, not measured: {why}"
                        for key, why in sorted(tags.items()) if key.startswith(UNMEASURED_TAG)]
        above = [bs for bs in sorted(auto) if auto[bs] > lat.get(EAGER, {}).get(bs, math.inf)]
        if above and route and run.data.params.get("route.strategy") == "router":
            table.notes.append(f"{label}: auto is above {EAGER} at bs {', '.join(map(str, above))}: {WITHIN_NOISE}")
        if run.data.tags.get("route.rests_on_noisy") == "true":
            table.notes.append(f"{label}: the route rests on noisy cells ({run.data.tags.get('route.noisy_cells', '')})")
        sizes.update(bs for per in lat.values() for bs in per)
    table.sizes = sorted(sizes)
    return table


def cell(row: Row, bs: int) -> str:
    """A row's median at ``bs`` as printed, ``*`` after it where the cell was noisy, ``!`` where it was measured on a
    busy host."""
    ms = row.ms.get(bs)
    text = "" if ms is None else f"{ms:.2f}" if ms >= 0.1 else f"{ms:.4f}"
    if not text:
        return text
    return text + "*" * (bs in row.noisy) + "!" * (bs in row.contended)


def footer(table: Table) -> List[str]:
    """The legends of ``*`` and ``!`` (where a cell has one), why each screened-out candidate was, the notes on
    routes that rest on noisy cells and runs measured on a busy host, and a sweep's failed jobs."""
    screened = [f"{r.model}: {r.backend} {SCREENED} (its row: the screen's medians): {r.screened}"
                for r in table.rows if r.screened]
    legends = [legend for legend, on in ((LEGEND, any(r.noisy for r in table.rows)),
                                         (CONTENDED_LEGEND, any(r.contended for r in table.rows))) if on]
    return legends + screened + table.notes + table.failed


def markdown(table: Table) -> str:
    extra = ACCURACY_COLUMNS if table.accuracy else []
    head = ["model", "backend", *extra, *map(str, table.sizes)]
    lines = [f"{table.title}\n", "| " + " | ".join(head) + " |",
             "|" + "---|" * (2 + len(extra)) + "---:|" * len(table.sizes)]
    for r in table.rows:
        lines.append("| " + " | ".join([r.model, r.label, *accuracy_columns(table, r),
                                         *(cell(r, bs) for bs in table.sizes)]) + " |")
    notes = footer(table)
    heatmaps = [f"\n{h}" for h in table.heatmaps]
    return "\n".join(lines + ([""] + [f"{n}  " for n in notes] if notes else []) + heatmaps) + "\n"


def write(table: Table, stem: Path) -> List[Path]:
    """``<stem>.md`` and ``<stem>.csv`` (full precision); returns both paths."""
    stem.parent.mkdir(parents=True, exist_ok=True)
    md, csv_path = stem.with_suffix(".md"), stem.with_suffix(".csv")
    md.write_text(markdown(table))
    with csv_path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["model", "backend", *(["precision", "score", "within_budget"] if table.accuracy else []),
                         *table.sizes, "noisy", "contended"])
        for r in table.rows:
            extra = [r.precision, "" if r.score is None else r.score, "" if r.within is None else r.within]
            writer.writerow([r.model, r.label, *(extra if table.accuracy else []),
                             *(r.ms.get(bs, "") for bs in table.sizes), " ".join(map(str, sorted(r.noisy))),
                             " ".join(map(str, sorted(r.contended)))])
    return [md, csv_path]


def show(table: Table) -> None:
    """Print the table to the terminal."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table as RichTable

    out = RichTable(title=table.title)
    out.add_column("model")
    out.add_column("backend")
    for name in (ACCURACY_COLUMNS if table.accuracy else []):
        out.add_column(name)
    for bs in table.sizes:
        out.add_column(str(bs), justify="right")
    for r in table.rows:
        out.add_row(escape(r.model), f"[bold]{r.backend}[/bold]" if r.backend == AUTO else escape(r.label),
                    *accuracy_columns(table, r), *(cell(r, bs) for bs in table.sizes))
    console = Console(width=max(100, 24 + 10 * len(table.sizes) + 36 * table.accuracy))
    console.print(out)
    for note in footer(table):
        console.print(escape(note))
    for heatmap in table.heatmaps:
        console.print(escape(heatmap))


def runs_of_sweep(client, parent_id: str) -> list:
    """The child runs of a sweep's parent run, in job order."""
    parent = client.get_run(parent_id)
    runs = client.search_runs([parent.info.experiment_id], f"tags.`{PARENT_TAG}` = '{parent_id}'", max_results=10000)
    return sorted(runs, key=lambda r: (int(r.data.tags.get("hydra.job.num", 0)), r.info.start_time))


def failed_jobs(client, parent_id: str) -> List[str]:
    """A sweep's failed jobs, from its parent run's tags: ``N of M jobs failed:``, then ``job N (overrides): reason``
    for each, in job order (none where every job ran, or the sweep's sweeper did not say)."""
    tags = client.get_run(parent_id).data.tags
    jobs = sorted((int(key[len(FAILED_JOB_TAG):]), line) for key, line in tags.items()
                  if key.startswith(FAILED_JOB_TAG) and key[len(FAILED_JOB_TAG):].isdigit())
    return [f"{tags[JOBS_FAILED_TAG]}:", *(line for _, line in jobs)] if jobs else []


def finished_children(client, parent) -> int:
    """How many of a sweep's jobs finished their run."""
    return len(client.search_runs([parent.info.experiment_id], f"tags.`{PARENT_TAG}` = '{parent.info.run_id}' and "
                                  f"attributes.status = 'FINISHED'", max_results=10000))


def latest_sweep(client, experiment: str) -> Tuple[str, str]:
    """The newest sweep parent run in ``experiment`` that did not fail and has a finished job, and one line naming
    it and the newer sweeps passed over (a sweep whose every job failed, or that stopped before its first, has
    nothing to report)."""
    exp = experiment_or_fail(client, experiment)
    skipped: List[str] = []
    token = None
    while True:
        found = client.search_runs([exp.experiment_id], f"tags.`{SWEEP_TAG}` = '1'", max_results=100,
                                   order_by=["attributes.start_time DESC"], page_token=token)
        for parent in found:
            finished = 0 if parent.info.status == "FAILED" else finished_children(client, parent)
            name = parent.info.run_name or parent.info.run_id
            if finished:
                passed = f"; passed over {len(skipped)} newer one(s), failed or with no finished run: " \
                         f"{', '.join(skipped)}" if skipped else ""
                return parent.info.run_id, (f"sweep {parent.info.run_id} ({name}, {finished} finished run(s)) "
                                            f"in experiment {experiment!r}{passed}")
            skipped.append(f"{name} ({parent.info.status.lower()}, {finished} finished)")
        token = found.token
        if not token:
            break
    what = f"; {len(skipped)} failed or have no finished run" if skipped else ""
    raise ConfigError(f"no sweep with a finished run in experiment {experiment!r}{what}; run one with "
                      f"python -m pipeline -m ..., or pass --experiment/--runs")


def experiment_or_fail(client, name: str):
    exp = client.get_experiment_by_name(name)
    if exp is None:
        names = [e.name for e in client.search_experiments()]
        raise ConfigError(f"no experiment {name!r} in this store; it has {names}")
    return exp


def runs_of_experiment(client, name: str) -> list:
    """The newest finished run of each model in the experiment (sweep parents excluded)."""
    exp = experiment_or_fail(client, name)
    newest: Dict[str, object] = {}
    for run in client.search_runs([exp.experiment_id], "attributes.status = 'FINISHED'", max_results=10000,
                                  order_by=["attributes.start_time DESC"]):
        if run.data.tags.get(SWEEP_TAG) != "1":
            newest.setdefault(run.data.tags.get("model", run.info.run_id), run)
    return sorted(newest.values(), key=lambda r: r.data.tags.get("model", ""))


def table_of(args: argparse.Namespace) -> Tuple[Table, str, str]:
    """The table the arguments ask for, its label, and the line naming the sweep ``--sweep latest`` picked (else
    empty). The store is checked first as strictly as a run checks it, and more: the report never creates or
    migrates one (``check_store(reading=True)``)."""
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    check_store(args.uri, reading=True)
    client = MlflowClient(tracking_uri=args.uri)
    picked, failed = "", []
    try:
        if args.runs:
            runs, label = [client.get_run(r) for r in args.runs], f"runs-{args.runs[0][:8]}"
        elif args.experiment and not args.sweep:
            runs, label = runs_of_experiment(client, args.experiment), args.experiment
        else:
            sweep = args.sweep
            if sweep in (None, "latest"):
                sweep, picked = latest_sweep(client, args.experiment or "tweakpipe")
            runs, label, failed = runs_of_sweep(client, sweep), f"sweep-{sweep[:8]}", failed_jobs(client, sweep)
    except MlflowException as exc:  # an unknown run id, most often
        raise ConfigError(f"{args.uri}: {one_line(exc)}; list the runs with mlflow ui, or pass --experiment") from None
    table = build(runs, accuracy=args.accuracy, failed=failed)
    if not table.rows:
        raise ConfigError(f"none of the {len(runs)} run(s) has latency_ms/<backend>/bs<N>[/len<L>] metrics; "
                          f"did their profile stage run?")
    return table, label, picked


def main(argv: Optional[Sequence[str]] = None, prog: str = "tweakpipe report") -> None:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0].replace("``", ""))
    parser.add_argument("--uri", default=os.environ.get("MLFLOW_TRACKING_URI", TrackingConfig.uri),
                        help=f"tracking store (default: $MLFLOW_TRACKING_URI or {TrackingConfig.uri})")
    parser.add_argument("--experiment", default=None, help="all models of this experiment (newest run each)")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--sweep", metavar="PARENT_RUN_ID", help="a sweep's parent run id, or 'latest' (default)")
    group.add_argument("--runs", nargs="+", metavar="RUN_ID", help="these runs, in this order")
    parser.add_argument("--out", type=Path, default=None, help="folder for report.md and report.csv "
                        "(default: outputs/reports/<sweep id, experiment or first run id>)")
    parser.add_argument("--accuracy", action="store_true", help="add each candidate's precision, its score "
                        "against fp32 eager (the accuracy budget's metric) and whether it is within the budget")
    args = parser.parse_args(argv)

    try:
        table, label, picked = table_of(args)
    except ConfigError as exc:
        fail(str(exc))
    if picked:
        print(f"report of the newest sweep with a finished run: {picked}")
    show(table)
    for path in write(table, (args.out or Path("outputs/reports") / label) / "report"):
        print(f"wrote {path}")

