"""The run context: what every stage reads from and writes to, in one place."""

from __future__ import annotations

import contextlib
import copy
import time
from dataclasses import MISSING, asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Set, Tuple, TypeVar

import torch
from omegaconf import DictConfig
from torch import nn

from pipeline import progress
from pipeline.backends import Backend
from pipeline.backends.candidate import Candidate
from pipeline.batching import BatchDims
from pipeline.compile.cost import CandidateCost, Stopwatch
from pipeline.measure import accuracy
from pipeline.config.precisions import Precision, parse
from pipeline.config.schema import STAGE_NAMES
from pipeline.route.decision import Race, baseline
from pipeline.route.outcome import RouteReport
from pipeline.route.policy import Range
from pipeline.measure.contention import Watch, read_host
from pipeline.measure.measurement import Measurement
from pipeline.measure.padding import PROVED
from pipeline.measure.references import InputSource, input_sources
from pipeline.seqlen import Key, SeqDims, cells

T = TypeVar("T")

# Added wherever an unverified backend is left out, so the error names the key that lets it in.
ALLOW_HINT = " (validate.allow_unverified=true routes over unverified backends)"
# What each stage leaves on the run context: the fields a stage run again starts without (RunContext.before).
WRITES = {"capture": ("output_batch_dims", "output_seq_dims", "backends", "outcomes", "precision_screened",
                      "budget_skipped"),
          "profile": ("screen", "screened_out", "profile", "profile_reduced"),
          "route": ("route", "route_report", "routed"),
          "validate": ("validation",)}


@dataclass
class BackendOutcome:
    """What capture found for one backend: ok, failed (with the error), skipped (unsupported) or
    unverified (eager's output could not tell it right from wrong)."""

    name: str
    kind: str
    status: str = "pending"  # ok | failed | skipped | unverified
    reason: str = ""
    build_seconds: float = 0.0
    max_rel_error: float = float("nan")
    tolerance: float = float("nan")
    tensors: int = 0  # output tensors compared with eager's, over every check
    peak_memory_bytes: int = 0  # the process's peak during its build, what the candidates before it held included
    # Device memory it keeps once built and checked (its weights copy, graph pools, CUDA-graph trees and the outputs
    # they hold), kept while the run holds the candidate (through the profile). 0 on the CPU: torch counts none.
    held_bytes: int = 0
    # Evidence that a compiling backend served its compiled program: Dynamo graphs, graph breaks,
    # frames and eager calls of its own program ({} for a backend that does not compile).
    compile: Dict[str, int] = field(default_factory=dict)
    precision: Precision = "fp32"  # fp32 | tf32 | bf16 | fp16 | int8_weight_only | int8_dynamic | fp8
    weights: str = "fp32"  # the precision its weights run in: fp32, bf16/fp16 (a -weights candidate), int8/fp8
    # The accuracy budget (route.accuracy_budget): the worst value of its metric against fp32 eager over
    # the tuned sizes, and whether that is within its bound. A candidate outside it is timed, never routed.
    accuracy: float = float("nan")
    within_budget: bool = True
    cost: CandidateCost = field(default_factory=CandidateCost)  # what it cost the tune (pipeline.compile.cost)
    # Where lengths are tuned (pipeline.seqlen): "ok" once capture proved that padded calls answer as eager does at
    # the exact length (pipeline.measure.padding), else why not ("" without tuned lengths); and whether it runs
    # untuned lengths unpadded. A candidate that does neither serves its tuned lengths alone.
    padding: str = ""
    any_length: bool = True
    # A graph backend's recorded graphs and the memory pool they take (0 for other backends).
    graphs: int = 0
    pool_mb: float = 0.0

    def to_dict(self) -> Dict[str, Any]:
        return {**asdict(self), "cost": self.cost.to_dict()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "BackendOutcome":
        values = {f.name: data[f.name] for f in fields(cls) if f.name in data}
        typed = parse(values.get("precision", "fp32"), f"backend {values.get('name')!r}: precision")
        return cls(**{**values, "cost": CandidateCost.from_dict(values.get("cost") or {}), "precision": typed})


@dataclass
class Earlier:
    """What an interrupted run in the same directory already found: capture's outcomes and the
    profile's measured cells. Capture rebuilds only the backends that were ok; profile measures
    only the cells that are missing."""

    outcomes: Dict[str, BackendOutcome] = field(default_factory=dict)
    cells: Dict[str, Dict[Key, Measurement]] = field(default_factory=dict)
    screen: Dict[str, Dict[Key, Measurement]] = field(default_factory=dict)


@dataclass
class RunContext:
    """Data flows one way: config -> context -> capture -> profile -> route -> validate.

    Each stage reads what the earlier ones left here and adds its own results as data; none does
    I/O. The runner hands the results to the recorder after each stage, and the profile's cells as
    they are measured (``on_cell``).
    """

    cfg: DictConfig
    run_dir: Path
    device: torch.device
    model: nn.Module
    inputs: Dict[str, Dict[str, Any]]
    # Every competing candidate, in order: each backend once per precision (cfg.precision), as the checks
    # made them (pipeline.preflight), held once for the run.
    candidates: Dict[str, Candidate]
    api: bool = False  # the caller's model, tuned through pipeline.tune (not built from model.build)
    # The user's example inputs (input name -> rows on the device): every tuned batch is made of them.
    examples: Dict[str, torch.Tensor] = field(default_factory=dict)
    earlier: Earlier = field(default_factory=Earlier)
    # Hears of every cell as it is measured: (backend, batch size, cell, "screen" or "profile").
    on_cell: Callable[[str, int, Measurement, str], None] = lambda name, bs, m, phase: None
    # How long work shows itself (steps and track: pipeline.progress, a live bar or log lines), handed to the
    # stages so that none of them picks its own UI; a caller may hand another with the same two functions.
    progress: Any = progress
    # capture
    output_batch_dims: Dict[str, Optional[int]] = field(default_factory=dict)  # pipeline.batching
    output_seq_dims: Dict[str, Optional[int]] = field(default_factory=dict)  # pipeline.seqlen, with tuned lengths
    backends: Dict[str, Backend] = field(default_factory=dict)
    outcomes: Dict[str, BackendOutcome] = field(default_factory=dict)
    # The precision-first screen (stages/capture.py): numerics whose compiling candidates were not built, and why.
    precision_screened: Dict[str, str] = field(default_factory=dict)
    # tune.budget_s: the candidates capture did not build once it was spent, and why; why the profile took one pass.
    budget_skipped: Dict[str, str] = field(default_factory=dict)
    profile_reduced: str = ""
    started: float = field(default_factory=time.perf_counter)  # the tune's clock, for tune.budget_s
    # profile: the screen's cells, the candidates it screened out (and why), then the profile's cells
    screen: Dict[str, Dict[Key, Measurement]] = field(default_factory=dict)
    screened_out: Dict[str, str] = field(default_factory=dict)
    profile: Dict[str, Dict[Key, Measurement]] = field(default_factory=dict)  # cells: pipeline.seqlen.Key
    # route
    route: List[Range] = field(default_factory=list)
    route_report: Optional[RouteReport] = None  # the route done: route.json, the figures, the checkpoint written
    routed: Optional[nn.Module] = None
    # validate
    validation: Dict[str, Any] = field(default_factory=dict)
    stage_seconds: Dict[str, float] = field(default_factory=dict)
    # A stage's own steps that belong to no candidate ("capture.eager_outputs"): where its seconds went beside theirs
    step_seconds: Dict[str, float] = field(default_factory=dict)
    # The model's weights and buffers as handed in (on the CPU): every stage's calls may advance a
    # buffer (a call counter, running statistics), so the runner puts them back after each stage
    # and the checkpoint stores the state the user tuned, not a mid-tune one.
    initial_state: Dict[str, torch.Tensor] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.initial_state:
            self.initial_state = {k: v.detach().to("cpu", copy=True) for k, v in self.model.state_dict().items()
                                  if isinstance(v, torch.Tensor)}

    def restore_model_state(self) -> None:
        """Put the model's weights and buffers back as handed in, in place (graphs keep their addresses)."""
        with torch.inference_mode():  # a buffer a call rebound is an inference tensor; copy_ works on both
            for key, value in self.model.state_dict().items():
                if key in self.initial_state:
                    value.copy_(self.initial_state[key])

    def input_sources(self, seed_offset: int = 0, start: int = 0) -> List[InputSource]:
        """Where batches come from: the user's example rows from row ``start``, where there are any, then
        random fills at the run's seed plus ``seed_offset``. The first is what the model is tuned on."""
        return input_sources(self.inputs, self.examples, self.device, self.cfg.seed + seed_offset, start)

    def budget_left(self) -> Optional[float]:
        """The seconds ``tune.budget_s`` leaves (0 once spent), or None without a budget."""
        budget = self.cfg.tune.budget_s
        return None if budget is None else max(0.0, budget - (time.perf_counter() - self.started))

    def budget_spent(self) -> Optional[str]:
        """Why no more optional work may start (``tune.budget_s`` spent, and the seconds so far), or None."""
        budget, elapsed = self.cfg.tune.budget_s, time.perf_counter() - self.started
        return None if budget is None or elapsed < budget else f"tune.budget_s={budget:g} spent ({elapsed:.0f} s elapsed)"

    def watch(self) -> Watch:
        """The host's watch for what this run times (``profile.on_busy``), judging readings for the threads in force."""
        pcfg, on_cpu = self.cfg.profile, self.device.type == "cpu"
        return Watch(pcfg.on_busy, torch.get_num_threads(), pcfg.on_busy_wait_s, lambda: read_host(parallel=on_cpu))

    def calls(self, key: Key, names: Sequence[str]) -> Dict[str, Callable[[], Any]]:
        """Each named backend's call on the batch of the cell ``key`` (its rows, at its length) that capture
        checked: what the screens and the profile time."""
        inputs = self.input_sources()[0][1](key)
        return {name: (lambda b=self.backends[name]: b(**inputs)) for name in names}

    @property
    def batch_sizes(self) -> List[int]:
        return sorted(set(int(b) for b in self.cfg.model.batch_sizes))

    @property
    def lengths(self) -> List[int]:
        """The tuned sequence lengths (``model.seq_lens``), ascending; empty without a length dimension."""
        return sorted(set(int(n) for n in self.cfg.model.seq_lens))

    @property
    def cells(self) -> List[Key]:
        """Every tuned cell: the batch sizes, or (batch size, length) pairs where lengths are tuned."""
        return cells(self.batch_sizes, self.lengths)

    def dims(self) -> BatchDims:
        """Where the batch, and the length where lengths are tuned, lie in every input and output."""
        return BatchDims.of(self.inputs, self.output_batch_dims,
                            SeqDims.of(self.inputs, self.lengths, self.output_seq_dims))

    def exclude(self, name: str, reason: str) -> None:
        """Fail a captured backend after the fact (it fell back to eager): it neither serves nor keeps timings."""
        self.outcomes[name].status, self.outcomes[name].reason = "failed", reason
        self.backends.pop(name, None)
        self.profile.pop(name, None)

    def failures(self) -> Dict[str, str]:
        """Backends the route excludes, and why: every one not ok, except unverified ones where
        ``validate.allow_unverified`` is set."""
        allow = self.cfg.validate.allow_unverified
        failed = {n: f"{o.status}: {o.reason}" + (ALLOW_HINT if o.status == "unverified" else "")
                  for n, o in self.outcomes.items() if o.status != "ok" and not (allow and o.status == "unverified")}
        budget = self.cfg.route.accuracy_budget
        outside = {n: f"outside the accuracy budget: {budget.metric} {o.accuracy:.6g} against fp32 eager, the budget "
                      f"is {accuracy.describe(budget.metric, budget.bound)}"
                   for n, o in self.outcomes.items() if n not in failed and not o.within_budget}
        return {**failed, **outside}

    def references(self) -> List[str]:
        """The candidates that play the user's own torch.compile (``pipeline.backends.reference``), in order."""
        return list(self.reference_modes())

    def reference_modes(self) -> Dict[str, str]:
        """Each candidate that plays the user's own torch.compile -> its mode as the user writes it, in order."""
        return {n: c.reference for n, c in self.candidates.items() if c.reference}

    @property
    def route_info(self) -> Dict[str, Any]:
        """route.json as the route stage wrote it ({} before it ran): the rule, ranges, medians, exclusions."""
        return dict(self.route_report.info) if self.route_report is not None else {}

    @property
    def checkpoint_path(self) -> Optional[Path]:
        """The checkpoint the route stage saved (None before, or where nothing shipped)."""
        return self.route_report.checkpoint if self.route_report is not None else None

    def baseline(self) -> Optional[str]:
        """Plain eager at fp32 where it competes: what the route never loses to, and speed-ups are over."""
        return baseline(self.candidates)

    def race(self) -> Race:
        """What the route is decided on, as plain data (``pipeline.route.decision``)."""
        return Race(self.medians(), self.intervals(), list(self.candidates), self.failures(),
                    baseline(self.candidates), self.lengths,
                    {n for n, o in self.outcomes.items() if o.padding == PROVED or o.any_length}, self.references(),
                    self.contended())

    def contended(self) -> Set[Tuple[str, Key]]:
        """The profile's cells measured on a busy host (``pipeline.measure.contention``), as (backend, cell)."""
        return {(n, key) for n, per in self.profile.items() for key, m in per.items() if m.contended}

    def before(self, stage: str, candidates: Optional[Mapping[str, Candidate]] = None) -> "RunContext":
        """A copy as the stages before ``stage`` left it (what ``stage`` and the later ones found is left out),
        over ``candidates`` where given (some of this run's): the same built backends and measurements, and
        outcomes of its own, so that running ``stage`` on the copy changes nothing here."""
        keep = dict(candidates if candidates is not None else self.candidates)
        ours = lambda per: {n: v for n, v in per.items() if n in keep}  # noqa: E731
        later = {name for s in STAGE_NAMES[STAGE_NAMES.index(stage):] for name in WRITES[s]}
        fresh = {f.name: f.default_factory() if f.default_factory is not MISSING else f.default
                 for f in fields(self) if f.name in later}
        kept = {"candidates": keep, "backends": ours(self.backends), "outcomes": copy.deepcopy(ours(self.outcomes)),
                "screen": ours(self.screen), "screened_out": ours(self.screened_out), "profile": ours(self.profile),
                "stage_seconds": {}, "step_seconds": {}}
        return replace(self, **{**kept, **fresh})

    @contextlib.contextmanager
    def step(self, name: str) -> Iterator[None]:
        """Add the block's wall seconds to ``step_seconds[name]``."""
        watch = Stopwatch()
        try:
            yield
        finally:
            self.step_seconds[name] = self.step_seconds.get(name, 0.0) + watch.seconds

    def unverified(self) -> List[str]:
        """Backends capture could neither prove right nor wrong."""
        return [n for n, o in self.outcomes.items() if o.status == "unverified"]

    def cell_figures(self, figure: Callable[[Measurement], T]) -> Dict[str, Dict[Key, T]]:
        """The profile as backend -> cell -> ``figure(cell)``, over the cells with samples."""
        return {b: {bs: figure(m) for bs, m in per.items() if m.count} for b, per in self.profile.items()}

    def screened_medians(self) -> Dict[str, Dict[Key, float]]:
        """The screened-out candidates as candidate -> cell -> the screen's median ms: all that was timed of them,
        shown beside the profile (greyed in the plot, marked in the log) rather than dropped."""
        return {n: {key: m.median for key, m in sorted(self.screen.get(n, {}).items()) if m.count}
                for n in self.screened_out}

    def medians(self) -> Dict[str, Dict[Key, float]]:
        """The profile as backend -> cell -> median ms (the router's input)."""
        return self.cell_figures(lambda m: m.median)

    def intervals(self) -> Dict[str, Dict[Key, Tuple[float, float]]]:
        """The profile as backend -> cell -> the median's interval in ms (the router's other input)."""
        return self.cell_figures(lambda m: m.interval)
