"""Structured-config schemas behind the YAML in ``conf/``.

Every group's YAML extends one of these dataclasses (registered in Hydra's ConfigStore as
``schema_<group>``, outside the option groups), so a misspelt key or a wrong type fails when the
config is composed, before any model is built. Backends have one schema per kind
(``pipeline.config.backend_schema``).

Each default lives here and only here: a group's ``default`` option holds nothing but its schema
reference, and the other options say only what they change (``tests/test_config_defaults.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from hydra.core.config_store import ConfigStore

from pipeline.config.resolvers import register_resolvers
from omegaconf import MISSING

from pipeline.config import backend_schema, flags

STAGE_NAMES = ("capture", "profile", "route", "validate")


@dataclass
class InputSpec:
    """One model input: its per-sample shape, dtype, how to fill it, and where its batch dimension goes."""

    shape: List[int] = MISSING
    dtype: str = "float32"
    # "randn" for floats; "randint" draws integers in [0, high) (token ids); "ones"; "mask": ones then
    # zeros along the last dimension (attention masks with padding).
    fill: str = "randn"
    high: int = 2
    # The batch's place in the full tensor: 0 is batch-first; 1 for (time, batch, features).
    batch_dim: int = 0
    # The length's place in the full tensor (1 for batch-first token ids), routed at model.seq_lens: a call is
    # padded with ``pad`` (the pad id; 0 for masks) up to the next tuned length. null: no length dimension.
    seq_dim: Optional[int] = None
    pad: float = 0.0


@dataclass
class HFModel:
    """``model=hf``: a transformers model class built from its config class (random weights)."""

    model_class: str = MISSING
    config: Dict[str, Any] = field(default_factory=dict)  # config class keywords, e.g. {num_hidden_layers: 4}
    use_cache: bool = False  # past key values make outputs depend on earlier calls
    seq_len: int = 128  # tokens per sample (input_ids, attention_mask, ...)
    samples: int = 16000  # raw audio samples per sample (input_values)


@dataclass
class TimmModel:
    """``model=timm``: ``timm.create_model(name, pretrained=False, **kwargs)``."""

    name: str = MISSING
    kwargs: Dict[str, Any] = field(default_factory=dict)


@dataclass
class ModelConfig:
    """A model built through ``_target_`` with random weights, and what to tune it for."""

    name: str = MISSING
    # ``{_target_: dotted.path, **kwargs}``: instantiated by Hydra with random weights.
    build: Dict[str, Any] = MISSING
    # Left out (or an input's shape left ???), they are derived from hf, timm or examples.
    inputs: Dict[str, InputSpec] = MISSING
    batch_sizes: List[int] = MISSING
    # The tuned lengths of the inputs that name a seq_dim: the route is a (batch range x length range) table.
    # Empty: no length dimension (every input at its shape).
    seq_lens: List[int] = field(default_factory=list)
    # A torch.save'd dict of input name -> tensor: the data every tuned batch is built from.
    examples: Optional[str] = None
    hf: Optional[HFModel] = None
    timm: Optional[TimmModel] = None


@dataclass
class ProfileConfig:
    """Timing budgets and stop rules (pipeline/measure/); all durations in milliseconds."""

    # At each new batch size the first call (compile, record) is kept apart as first_call_ms, then
    # warm-up calls run for warmup_ms (at least min_warmup_calls). None of them is a sample.
    warmup_ms: float = 100.0
    min_warmup_calls: int = 3
    # One window of interleaved rounds stops a backend at max_samples, or after min_samples once it
    # has spent budget_ms or, having spent min_window_ms (calls close in time are not independent),
    # its median is known to +-rel_precision at 95% confidence.
    min_samples: int = 10
    max_samples: int = 300
    budget_ms: float = 1000.0
    min_window_ms: float = 30.0
    rel_precision: float = 0.02
    # On the CPU each visit of a round calls the callable cpu_settle_calls times untimed, then cpu_timed_calls times
    # timed (a sample each): what the callable before it left on the cores (another runtime's thread pool, its
    # caches) falls on the untimed call, and the samples are the back-to-back calls a served model makes. On 16
    # cores (4 threads each, resnet18 at 64x64, 3 repetitions), one timed call a visit read ONNX Runtime 48-70%
    # slower than alone at batch 1 (every cell 0-70%), behind OpenVINO in a repetition where alone it was 16% ahead;
    # one settling and 4 timed calls read 0.83-1.27x alone, within the repetitions' own spread
    # (bench/probes/settle_probe.py; bench/results/README.md). On an accelerator a visit is one timed call (the
    # device is synchronised around each; no host runtime between).
    cpu_settle_calls: int = 1
    cpu_timed_calls: int = 4
    # Saturation: stop growing batch size once throughput has not grown by `cutoff` (relative)
    # for `backoff` consecutive measured sizes. backoff <= 0 disables the rule.
    saturation_cutoff: float = 0.05
    saturation_backoff: int = 0
    # A cell whose samples disagree (median not within rel_precision, p10-p90 spread above
    # noise_threshold of the median, or drift above half of it) is flagged noisy; where the route rests
    # on it (the owner's cell and its challengers') it gets another window, up to max_repeats.
    noise_threshold: float = 0.20
    max_repeats: int = 2
    # On CUDA, cross-check each backend that can be captured against a graph-captured device time.
    device_check: bool = True
    # Every cell is measured in this many passes over all batch sizes, seconds apart: a cell whose
    # passes disagree is flagged noisy, and each cell's interval spans its passes.
    passes: int = 2
    # Screening (pipeline/measure/screening.py): before the full profile, one short window of every candidate
    # at the smallest, a middle and the largest tuned size; a candidate slower than the fastest one that may
    # serve by screen_margin at every screened size, beyond both cells' intervals, is screened out (recorded
    # with its numbers, never profiled further). Each screen window stops at screen_budget_ms.
    screen: bool = True
    screen_margin: float = 1.5
    screen_budget_ms: float = 200.0
    # Precision first (stages/capture.py), with screen on: before any Inductor program is compiled, the candidates
    # that compile nothing (eager and graph at each precision) get the same short windows; a precision (with its
    # weights) whose fastest such candidate is screen_margin slower than another's at every screened size, beyond
    # both intervals, gets no compiling candidate built (Inductor's gain over a precision's own kernels would have to
    # beat the other precision's by that margin). Recorded in capture.json and route.json (precision_screen).
    precision_screen: bool = True
    # A busy host (other runnable tasks on the cores, a calibration kernel slower than its quiet time:
    # pipeline/measure/contention.py) is named in one line at the top of the run and read again around every
    # measured cell. warn: cells measured on it are marked contended (profile.csv), and settle no screen and no
    # choice of the route; wait: before each cell, wait for a quiet host (at most on_busy_wait_s, a log line every
    # 10 s), then measure; fail: stop with a one-line error naming what was seen.
    on_busy: str = "warn"
    on_busy_wait_s: float = 300.0


@dataclass
class AccuracyBudget:
    """How far a candidate's output may move from fp32 eager's (``pipeline.measure.accuracy``)."""

    metric: str = "cosine"  # cosine (>= bound) | max_rel_error (<= bound) | top1_agreement (>= bound)
    bound: float = 0.999


@dataclass
class RouteConfig:
    """How the routed model is chosen from the profile."""

    strategy: str = "router"  # router | highest_throughput | first_wins | one_backend
    backend: Optional[str] = None  # for one_backend
    min_gain: float = 0.10
    # Fail the run, saving nothing, when the route rests on cells the profile flagged noisy.
    require_confident: bool = False
    checkpoint_name: str = "model.tweak"
    # Save each routed program ahead of time too (in the compiled artifacts, where it matches the backend's own
    # outputs and speed: for Inductor an AOTInductor package on the CPU, Inductor's standalone_compile form on CUDA;
    # for ONNX Runtime and OpenVINO the runtime's own model): a trusted load then traces and compiles nothing. false:
    # the checkpoint carries Inductor's cache entries only (a load traces each program and exports each runtime's
    # model again), and saving is quicker.
    aot: bool = True
    # Measured against fp32 eager at every tuned size; a candidate outside it never serves.
    accuracy_budget: AccuracyBudget = field(default_factory=AccuracyBudget)


@dataclass
class ValidateConfig:
    """End-to-end check of the routed model against eager."""

    # Untuned sizes checked beside the tuned ones: padded, and above the largest (chunked).
    extra_batch_sizes: List[int] = field(default_factory=lambda: [2, 5, 100])
    check_reload: bool = True
    # Tolerance scale applied on top of the dtype-aware defaults.
    tolerance_scale: float = 1.0
    # Route over backends that capture could not check, because eager's output cannot tell right from
    # wrong (constant, zero, NaN) on any input tried; validation then accepts such checks too.
    allow_unverified: bool = False


@dataclass
class CompileCacheConfig:
    """Inductor's on-disk caches (pipeline/compile/cache.py): one directory for every candidate, run and sweep
    job on a machine, so a program is compiled once; a Redis server shares them between machines."""

    enabled: bool = True
    dir: str = "outputs/compile_cache"  # relative to where the run starts, like outputs/; made 0700
    # A dir that another user owns or others may write is refused unless shared: true, which trusts everyone who
    # can write it to run code in your runs (Inductor imports what it finds there); artifacts are then unsigned.
    shared: bool = False
    # redis[s]://[USER:PASSWORD@]HOST:PORT: Inductor's remote caches (pip install -e ".[redis]"); every client of
    # that server can run code in your runs. The password may come from $TWEAKPIPE_REDIS_PASSWORD instead; every
    # record the run writes shows it as *** (a resumed run takes it from $TWEAKPIPE_REDIS_PASSWORD).
    remote: Optional[str] = None
    # Worker processes that compile candidates' programs ahead of capture (pipeline/compile/ahead.py);
    # null: one per 4 CPU cores the run may use (affinity, cgroup quota), none below 8; 0: the run's own process only.
    workers: Optional[int] = None
    # How long one worker's job may run from when a worker takes it (its time in the queue, and the
    # pauses while the run times the host, do not count). Past it the worker is stopped and the job's candidates
    # fail with the reason; they are not compiled again in the run's process, where the same compile would take as
    # long, or hang as it did (a user's max-autotune compile took 4-9 min on an H100: bench/results/README.md).
    job_timeout_s: float = 900.0
    # true: a worker compiles each candidate's Inductor program in the standalone form a checkpoint saves
    # (pipeline/compile/aot.py), which the run loads with no Dynamo trace, times, and saves as it is (no second
    # compile at save). null: on for CUDA runs (on the H200 it cut ResNet-50's cold tune from 159 s to 107 s and
    # GPT-2 medium's from 215 s to 135 s, same routes: bench/results/README.md), off on the CPU, whose checkpoint
    # saves another form (an AOTInductor package) and where it was not measured against the traced programs.
    standalone: Optional[bool] = None


@dataclass
class TrackingConfig:
    """Where runs are logged. ``enabled: false`` runs without MLflow."""

    enabled: bool = True
    uri: str = "sqlite:///outputs/mlflow.db"
    experiment: str = "tweakpipe"
    run_name: Optional[str] = None
    log_checkpoint: bool = True
    # How long a write waits for other processes holding a SQLite store; past it the run goes on without
    # MLflow (its files are the record) and the MLflow run is marked once the store answers again.
    max_wait_s: float = 120.0


@dataclass
class TuneConfig:
    """The tune as a whole."""

    # Seconds the tune may take, from its start (null: no limit). Capture builds the candidates that compile nothing
    # first, then the compiling ones likely winners first (stages/capture.py); once the budget is spent, those not
    # yet built are skipped with the reason (plain eager never is), and the profile measures one pass without
    # re-measuring. Validation always runs. route.json's budget says what was skipped and why.
    budget_s: Optional[float] = None


# The schema each group's YAML files extend, registered as ``schema_<group>``.
SCHEMAS = {"model": ModelConfig, "profile": ProfileConfig, "route": RouteConfig, "validate": ValidateConfig,
           "tracking": TrackingConfig}


@dataclass
class Config:
    """The whole run: which model, which backends compete, and which stages run."""

    model: ModelConfig = MISSING
    # Each backend is typed by its kind's schema where its file extends it, else checked early.
    backends: Dict[str, Any] = MISSING
    profile: ProfileConfig = field(default_factory=ProfileConfig)
    route: RouteConfig = field(default_factory=RouteConfig)
    validate: ValidateConfig = field(default_factory=ValidateConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    compile_cache: CompileCacheConfig = field(default_factory=CompileCacheConfig)
    tune: TuneConfig = field(default_factory=TuneConfig)
    device: str = "auto"
    # Each backend competes once per precision (fp32, tf32, bf16, fp16; bf16 and fp16 twice, as autocast and
    # with cast weights; int8_weight_only, int8_dynamic, fp8: torchao's recipes): pipeline.backends.precision.
    precision: List[str] = field(default_factory=lambda: ["fp32"])
    # Each PyTorch backend competes once more per attention kernel besides default (PyTorch's own choice): flash,
    # efficient, cudnn, math, every scaled_dot_product_attention call on that kernel (pipeline.config.attention).
    attention: List[str] = field(default_factory=lambda: ["default"])
    # CPU threads of the run: torch.set_num_threads for eager and Inductor, and the thread pool of
    # every backend of its own runtime (OpenVINO, ONNX Runtime) that does not set threads itself.
    # null: torch's current count (where other runnable tasks leave fewer cores free, the run's first line names
    # the count that fits: pipeline/measure/contention.py). The run records the count in force (config.yaml, MLflow).
    threads: Optional[int] = None
    # The reference peers (pipeline.backends.reference): torch.compile as the user would write it, once per mode of
    # reference_modes, at each precision, timed beside the candidates; the route is reported against the best of
    # them and never serves a tuned size slower. false: a cheaper run without them.
    reference: bool = True
    # The torch.compile modes of the user's by-hand compiles (default, reduce-overhead, max-autotune,
    # max-autotune-no-cudagraphs). null: reduce-overhead and max-autotune on CUDA, default and max-autotune elsewhere.
    reference_modes: Optional[List[str]] = None
    seed: int = 0
    stages: List[str] = field(default_factory=lambda: list(STAGE_NAMES))
    # An interrupted run's directory: its config, failed backends and measured cells are reused.
    resume: Optional[str] = None


# What Hydra composes from (booleans checked by the early checks), built here at import (flags.loose says why).
LOOSE_CONFIG = flags.loose(Config)
LOOSE_SCHEMAS = {name: flags.loose(node) for name, node in SCHEMAS.items()}


def register_configs() -> None:
    """Register the schemas, outside every option group, so the YAML files extend them
    (``- /schema_model@_here_``) while ``--help`` and ``model=...`` offer only real options."""
    register_resolvers()
    cs = ConfigStore.instance()
    cs.store(name="base_config", node=LOOSE_CONFIG)
    for name, node in LOOSE_SCHEMAS.items():
        cs.store(name=f"schema_{name}", node=node)
    backend_schema.register(cs)
