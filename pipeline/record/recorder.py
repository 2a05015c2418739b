"""The one place a run's results leave the process: run-directory files, the plot and MLflow.

Stages put their results on the run context and do no I/O but their product (the route stage saves the checkpoint
and hands on the route done, ``pipeline.route.outcome.RouteReport``); the runner hands them here after each stage,
and the profile's cells as they are measured, so a crash or a kill loses nothing measured earlier. The recorder
writes what it is handed and decides nothing: it imports no compilation, backend or route building (a contract of
``pyproject.toml``). Every file is written whatever the tracking setting, for command-line and API runs alike:

- ``config.yaml``: the resolved config (at the start), the credentials of its URLs redacted as in every record
  (``pipeline.redact``: ``run.json``, the log and MLflow's params and tags too);
- ``capture.json``: each backend's status, reason, build seconds, error against eager, evidence;
- ``profile.csv``: one row per backend and batch size, appended as each cell is measured and
  rewritten whole when the profile ends; ``cells.jsonl`` keeps every cell's raw windows, so an
  interrupted profile resumes where it stopped;
- ``route.json`` (the route stage writes ``model.tweak``, the checkpoint), ``validation.json``, ``latency.png``
  (where lengths are tuned, a heatmap of the chosen backend and its speed-up over eager per (batch size, length));
- ``cost.json``: the tune's own cost, per stage and per candidate, and ``tune_s`` (once every stage ran);
- ``tweakpipe.log``: the run's log (Hydra writes it for command-line runs; the runner for API runs);
- ``run.json``: what the run measures (its fingerprint), the stages it finished and how it ended.
"""

from __future__ import annotations

import csv
import json
import logging
import os
from pathlib import Path
from typing import Any, Dict, Iterator, Mapping, Tuple

from omegaconf import DictConfig, OmegaConf

from pipeline.disks import write_atomic
from pipeline.errors import ConfigError
from pipeline.context import BackendOutcome, Earlier, RunContext
from pipeline.measure.accuracy import describe
from pipeline.measure.measurement import Measurement
from pipeline.measure.statistics import samples_per_second
from pipeline.record.tracker import CONTENDED_TAG, UNMEASURED_TAG, NullTracker
from pipeline.redact import redacted
from pipeline.route.figures import cell_fields, cell_key
from pipeline.seqlen import Key, metric_suffix

log = logging.getLogger(__name__)

COLUMNS = ["backend", "batch_size", "median_ms", "ci_lo_ms", "ci_hi_ms", "p10_ms", "p90_ms", "samples",
           "first_call_ms", "warmup_calls", "passes", "repeats", "windows_used", "device_ms", "throughput_per_s",
           "noisy", "noise", "contended", "contention"]
RUN_FILE = "mlflow_run.json"  # the MLflow run this directory logs to, so a resumed run continues it
RECORD_FILE = "run.json"  # what the run measures (pipeline.record.fingerprint), the stages it finished, its status
# What the recorder appends to; a fresh run in a reused directory starts them anew.
APPENDED = ("profile.csv", "cells.jsonl", RUN_FILE)


# Where lengths are tuned, each cell's length follows its batch size.
COLUMNS_2D = COLUMNS[:2] + ["seq_len"] + COLUMNS[2:]


def profile_row(name: str, key: Key, m: Measurement) -> Dict[str, Any]:
    """One cell as a ``profile.csv`` row; throughput is derived here, next to the measurement, once."""
    summary = m.summary()
    return {"backend": name, **cell_fields(key), **{k: summary[k] for k in COLUMNS if k in summary},
            "throughput_per_s": samples_per_second(key if isinstance(key, int) else key[0], m.median)}


def read_json(path: Path, resume_dir: Path) -> Any:
    """A JSON file an interrupted run left, or a one-line ConfigError saying it cannot be read."""
    try:
        return json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"resume={resume_dir}: {path.name} cannot be read ({exc}); restore it, or start a new run "
                          f"without resume=") from None


def earlier_record(run_dir: Path) -> Dict[str, Any]:
    """``run.json`` of an earlier run in ``run_dir``: its fingerprint, finished stages and status ({} if none)."""
    path = run_dir / RECORD_FILE
    return read_json(path, run_dir) if path.is_file() else {}


def earlier_results(run_dir: Path) -> Earlier:
    """What an interrupted run left in ``run_dir``: capture's outcomes and every measured cell. The last line
    of ``cells.jsonl`` may be cut short (a run killed mid-write) and is skipped; any other bad row is a
    ConfigError naming it."""
    earlier = Earlier()
    capture = run_dir / "capture.json"
    if capture.is_file():
        try:
            earlier.outcomes = {n: BackendOutcome.from_dict(o) for n, o in read_json(capture, run_dir).items()}
        except (AttributeError, TypeError, ConfigError) as exc:
            raise ConfigError(f"resume={run_dir}: capture.json is not what a run writes ({exc}); restore it, or start "
                              f"a new run without resume=") from None
    cells = run_dir / "cells.jsonl"
    lines = cells.read_text(errors="replace").splitlines() if cells.is_file() else []
    for number, line in enumerate(lines, 1):
        try:
            row = json.loads(line)
            found = earlier.screen if row.get("phase") == "screen" else earlier.cells
            found.setdefault(str(row["backend"]), {})[cell_key(row)] = Measurement.from_dict(row["cell"])
        except json.JSONDecodeError:
            if number == len(lines):
                continue  # the last line of a run killed mid-write
            raise ConfigError(f"resume={run_dir}: cells.jsonl line {number} is not JSON ({line[:60]!r}); delete that "
                              f"line to measure the cell again, or start a new run without resume=") from None
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ConfigError(f"resume={run_dir}: cells.jsonl line {number} is not a measured cell ({type(exc).__name__}:"
                              f" {exc}); delete that line to measure the cell again, or start a new run without "
                              f"resume=") from None
    return earlier


class Recorder:
    """Writes one run's results to its directory and its tracker, as they appear."""

    def __init__(self, cfg: DictConfig, run_dir: Path, tracker: NullTracker) -> None:
        self.cfg, self.run_dir, self.tracker = cfg, run_dir, tracker
        self.record: Dict[str, Any] = {}  # run.json, once started
        self.columns = COLUMNS_2D if cfg.model.get("seq_lens") else COLUMNS

    def start(self, fingerprint: Mapping[str, Any], resume: bool = False, host: str = "") -> None:
        """The resolved config, ``run.json`` (what the run measures, and ``host``: what the run's first look at the
        host saw where it was busy or took fewer threads), and the MLflow run (the earlier one again, when
        resuming; tag ``host``)."""
        done: list = earlier_record(self.run_dir).get("stages_done", []) if resume else []
        if not resume:
            for name in APPENDED:
                (self.run_dir / name).unlink(missing_ok=True)
        self.record = {"fingerprint": dict(fingerprint), "stages_done": done, "status": "RUNNING", "host": host}
        self.write_record()
        cfg, shown = self.cfg, redacted(OmegaConf.to_container(self.cfg, resolve=True))
        write_atomic(self.run_dir / "config.yaml", OmegaConf.to_yaml(shown))
        tags = {"model": cfg.model.name, "stages": ",".join(cfg.stages), "backends": ",".join(cfg.backends),
                "run_dir": str(self.run_dir), **({"host": host} if host else {})}
        earlier = self.run_dir / RUN_FILE
        resume_id = json.loads(earlier.read_text())["run_id"] if earlier.is_file() else None
        self.tracker.start(cfg.tracking.get("run_name") or cfg.model.name, shown, tags, resume_id=resume_id)
        if self.tracker.run_id is not None:
            write_atomic(earlier, json.dumps({"run_id": self.tracker.run_id,
                                              "tracking_uri": redacted(cfg.tracking.uri)}))
        self.tracker.log_artifact(self.run_dir / "config.yaml")

    def write_record(self) -> None:
        """``run.json`` as the run stands now (:func:`pipeline.redact.redacted`, as every record a run keeps)."""
        write_atomic(self.run_dir / RECORD_FILE, json.dumps(redacted(self.record), indent=1))

    def cell(self, name: str, key: Key, m: Measurement, phase: str = "profile") -> None:
        """A cell as soon as it is measured: appended to ``cells.jsonl``, and a profile cell to ``profile.csv``;
        a screen cell goes to MLflow as ``screen_ms/<candidate>/bs<N>`` (``.../bs<N>/len<L>`` with lengths)."""
        with (self.run_dir / "cells.jsonl").open("a") as f:
            f.write(json.dumps({"backend": name, **cell_fields(key), "phase": phase, "cell": m.to_dict()}) + "\n")
        if phase == "screen":
            self.tracker.log_metrics({f"screen_ms/{name}/{metric_suffix(key)}": m.median})
            return
        csv_path = self.run_dir / "profile.csv"
        fresh = not csv_path.exists()
        with csv_path.open("a", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=self.columns)
            if fresh:
                writer.writeheader()
            writer.writerow(profile_row(name, key, m))
        self.tracker.log_metrics(self.cell_metrics(name, key, m))

    @staticmethod
    def cell_metrics(name: str, key: Key, m: Measurement) -> Dict[str, float]:
        """The median, its interval, throughput, the noisy flag (1.0 or 0.0), which the report marks, and the
        contended flag (measured on a busy host); named
        ``<figure>/<backend>/bs<N>``, and ``.../bs<N>/len<L>`` where lengths are tuned."""
        lo, hi, cell = *m.interval, metric_suffix(key)
        bs = key if isinstance(key, int) else key[0]
        return {f"latency_ms/{name}/{cell}": m.median, f"latency_lo_ms/{name}/{cell}": lo,
                f"latency_hi_ms/{name}/{cell}": hi, f"throughput/{name}/{cell}": samples_per_second(bs, m.median),
                f"noisy/{name}/{cell}": float(m.noisy), f"contended/{name}/{cell}": float(m.contended)}

    def stage_ended(self, stage: str, ctx: RunContext) -> None:
        """Whatever ``stage`` put on the context, finished or not (a failing stage's partial results too)."""
        {"capture": self.capture, "profile": self.profile, "route": self.route, "validate": self.validate}[stage](ctx)
        if stage in ctx.stage_seconds:
            self.tracker.log_metrics({f"stage_s/{stage}": ctx.stage_seconds[stage]})
            self.tracker.set_tags({f"stage.{stage}": "done"})
            self.record["stages_done"] = list(dict.fromkeys([*self.record["stages_done"], stage]))
            self.write_record()

    def capture(self, ctx: RunContext) -> None:
        path = write_atomic(self.run_dir / "capture.json",
                            json.dumps({n: o.to_dict() for n, o in ctx.outcomes.items()}, indent=2))
        metrics: Dict[str, float] = {}
        budget = self.cfg.route.accuracy_budget
        for name, o in ctx.outcomes.items():
            if o.status in ("ok", "unverified"):
                metrics.update(self.cost_metrics(name, o))
                # accuracy/<metric>/<candidate>: the budget's metric against fp32 eager (worst tuned size)
                metrics.update({f"max_rel_error/{name}": o.max_rel_error,
                                f"peak_memory_mb/{name}": o.peak_memory_bytes / 2**20,
                                f"held_memory_mb/{name}": o.held_bytes / 2**20,
                                f"accuracy/{budget.metric}/{name}": o.accuracy,
                                f"within_budget/{name}": float(o.within_budget)})
                metrics.update({f"dynamo_{k}/{name}": v for k, v in o.compile.items()})
        self.tracker.log_metrics(metrics)
        self.tracker.set_tags({**{f"backend_status.{n}": f"{o.status}: {o.reason}" for n, o in ctx.outcomes.items()},
                               **{f"precision.{n}": o.precision for n, o in ctx.outcomes.items()},
                               "accuracy_budget": describe(budget.metric, budget.bound)})
        self.tracker.log_artifact(path)

    @staticmethod
    def cost_metrics(name: str, o: BackendOutcome) -> Dict[str, float]:
        """A candidate's cost account: ``build_s``, ``compile_s`` (Dynamo and Inductor), cache hits and misses,
        ``ahead_compiled`` (the programs its compile worker compiled), ``check_s``, ``wait_s`` (capture blocked on its
        compile worker), ``screen_s``, ``profile_s`` and its total."""
        cost = o.cost.to_dict()
        return {"build_s/" + name: cost["build_s"], "compile_s/" + name: cost["trace_s"] + cost["compile_s"],
                **{f"{key}/{name}": cost[key] for key in ("cache_hits", "cache_misses", "ahead_compiled", "check_s",
                                                          "wait_s", "screen_s", "profile_s", "total_s")}}

    def profile(self, ctx: RunContext) -> None:
        """The profile as it ended: every cell's final figures (a re-measured size pooled its windows)."""
        rows = [profile_row(name, bs, m) for name, bs, m in cells_of(ctx.profile)]
        path = self.run_dir / "profile.csv"
        with path.with_name("profile.csv.tmp").open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=self.columns)
            writer.writeheader()
            writer.writerows(rows)
        os.replace(path.with_name("profile.csv.tmp"), path)
        metrics: Dict[str, float] = {}
        for name, bs, m in cells_of(ctx.profile):
            metrics.update(self.cell_metrics(name, bs, m))
        self.tracker.log_metrics(metrics)
        self.capture(ctx)  # each candidate's screen and profile seconds; a backend caught serving eager is failed now
        busy = ctx.contended()
        self.tracker.set_tags({**{f"screened_out.{n}": why for n, why in ctx.screened_out.items()},
                               CONTENDED_TAG: str(bool(busy)).lower(), f"{CONTENDED_TAG}_cells": str(len(busy))})
        self.tracker.log_artifact(path)
        self.plot(ctx)

    def route(self, ctx: RunContext) -> None:
        """What the route stage handed on (``pipeline.route.outcome.RouteReport``): ``route.json``, the figures
        against the user's own compile, the route's tags and, where a route shipped, the checkpoint and its compiled
        artifacts (validate then reloads it)."""
        report = ctx.route_report
        if report is None:
            return
        self.tracker.log_metrics(dict(report.reference_figures))
        self.tracker.set_tags({**{f"{UNMEASURED_TAG}{n}": why for n, why in report.unmeasured.items()},
                               **report.tags()})
        self.tracker.log_artifact(write_atomic(self.run_dir / "route.json", report.to_json()))
        if report.checkpoint is None:  # refused (route.require_confident) or not saved: route.json says why
            return
        if self.cfg.tracking.log_checkpoint:  # and its compiled artifacts, so a copy taken from the run compiles nothing
            for path in (report.checkpoint, report.artifacts):
                if path is not None:
                    self.tracker.log_artifact(path)
        self.plot(ctx)

    def validate(self, ctx: RunContext) -> None:
        if not ctx.validation:
            return
        path = write_atomic(self.run_dir / "validation.json", json.dumps(ctx.validation, indent=2))
        self.tracker.log_metrics({"validation_ok": float(ctx.validation["ok"])})
        self.tracker.log_artifact(path)

    def plot(self, ctx: RunContext) -> None:
        """``latency.png``: medians with p10-p90 whiskers and noisy cells marked, the screened-out candidates greyed
        at their screen medians, speed-up over eager, and
        the routed ranges named once there is a route; where lengths are tuned, the heatmap of the backend
        serving each (batch size, length) and its speed-up over eager (``record.heatmap``)."""
        medians = ctx.medians()
        if not any(medians.values()):
            return
        from pipeline.record.plots import contended_title

        contended = {b: {bs for bs, flag in per.items() if flag}
                     for b, per in ctx.cell_figures(lambda m: m.contended).items()}
        title = contended_title(f"{self.cfg.model.name} ({ctx.device})", contended)
        if ctx.lengths:
            from pipeline.record.heatmap import heatmap_plot

            self.tracker.log_artifact(heatmap_plot(medians, ctx.route or None, ctx.baseline(),
                                                   self.run_dir / "latency.png", title))
            return
        from pipeline.record.plots import latency_plot

        bands = ctx.cell_figures(lambda m: (m.quantile(0.10), m.quantile(0.90)))
        noisy = {b: {bs for bs, flag in per.items() if flag} for b, per in ctx.cell_figures(lambda m: m.noisy).items()}
        self.tracker.log_artifact(latency_plot(medians, ctx.route or None, self.run_dir / "latency.png", title,
                                               bands, noisy, ctx.screened_medians(), ctx.references(), contended))

    def tuned(self, ctx: RunContext, tune_s: float) -> None:
        """The run's own cost: ``tune_s`` (from the first build to the end of its last stage), each stage's and
        each candidate's account and the stages' steps of no candidate (``step_s``), in ``cost.json`` and MLflow;
        and the routed model's figures (the route stage's, ``pipeline.route.figures``, and validate's ``load_s``: how
        long its reload of the checkpoint took) on the run and, with ``tracking.log_checkpoint``, on the routed model
        logged as an MLflow model (``pipeline.record.logged_model``)."""
        from pipeline.record.logged_model import routed_files

        path = write_atomic(self.run_dir / "cost.json", json.dumps(
            {"tune_s": tune_s, "stage_s": ctx.stage_seconds, "step_s": ctx.step_seconds,
             "candidates": {n: o.cost.to_dict() for n, o in ctx.outcomes.items()}}, indent=2))
        report = ctx.route_report
        shipped = report is not None and report.checkpoint is not None
        metrics = {"tune_s": tune_s, **{f"step_s/{step}": seconds for step, seconds in ctx.step_seconds.items()},
                   **(report.figures if shipped else {}),
                   **({"load_s": float(ctx.validation["reload"]["total_s"])} if "reload" in ctx.validation else {})}
        if shipped and self.cfg.tracking.log_checkpoint:
            params = {"model": self.cfg.model.name, "device": str(ctx.device), "route.strategy": self.cfg.route.strategy,
                      "route": report.text}
            self.tracker.log_model(routed_files(self.cfg.model.name, report.checkpoint, report.artifacts,
                                                report.checkpoint_format, metrics, params))
        else:
            self.tracker.log_metrics(metrics)
        self.tracker.log_artifact(path)

    def finish(self, status: str) -> None:
        """The run's final status in ``run.json``, the log as an artifact, then the status in MLflow."""
        if self.record:
            self.record["status"] = status
            self.write_record()
        for path in [*sorted(self.run_dir.glob("*.log")), self.run_dir / "cells.jsonl", self.run_dir / RECORD_FILE]:
            self.tracker.log_artifact(path)  # cells.jsonl: every raw window, which a resumed run starts from
        self.tracker.finish(status)


def cells_of(profile: Mapping[str, Mapping[Key, Measurement]]) -> Iterator[Tuple[str, Key, Measurement]]:
    """Every cell of a profile, backend by backend, in ascending batch size (then length)."""
    for name, per in profile.items():
        for bs, m in sorted(per.items()):
            yield name, bs, m
