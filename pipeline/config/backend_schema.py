"""One schema per backend kind: the keys a backend of that kind may set, their types and defaults.

Each kind's dataclass is registered in Hydra's ConfigStore as ``schema_backend_<kind>``; a backend
file that extends it (``- /schema_backend_inductor@_here_`` in its defaults list) is typed when the
config is composed, so a misspelt key, a wrong type or another kind's key fails there. A file that
only says ``kind: ...`` (a user's own, written before the schemas existed) composes untyped and is
held to the same schema by :func:`settings` in the early checks, as is every checkpoint's backend.

A new kind is a dataclass here, in :data:`KINDS`, beside its class in ``pipeline.backends``. Each is frozen: a
candidate's settings are values, and a variant is a new one (``dataclasses.replace``), never an edit. Their
containers are frozen too (``options`` a read-only mapping, ``grid`` a tuple), made so at construction;
:meth:`BackendSettings.plain` gives them back as plain dicts and lists, what checkpoints and workers are sent.
Hydra and OmegaConf type a :data:`~pipeline.config.precisions.Precision` as a string and a mapping as a dict
(``flags.loose``); :func:`settings` turns the precision into one (``precisions.parse``).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Any, Dict, List, Mapping, Optional, Tuple, Type

from omegaconf import MISSING, DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from pipeline.config import attention, flags, precisions
from pipeline.config.precisions import Precision
from pipeline.errors import ConfigError


@dataclass(frozen=True)
class BackendSettings:
    """What every kind has."""

    kind: str = MISSING
    description: str = ""
    # fp32 | tf32 | bf16 | fp16 | int8_weight_only | int8_dynamic | fp8: set for each candidate by the top-level
    # precision list (pipeline.backends.precision); a kind that cannot run one is skipped at it, with the reason.
    precision: Precision = "fp32"

    def plain(self) -> Dict[str, Any]:
        """The settings as plain data (dicts and lists, copies): what the checkpoint, the run's fingerprint and a
        compile worker get."""
        out: Dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, Mapping):
                value = dict(value)
            elif isinstance(value, tuple):
                value = list(value)
            out[f.name] = copy.deepcopy(value)
        return out


@dataclass(frozen=True)
class TorchSettings(BackendSettings):
    """What every kind that runs PyTorch code has. Autocast applies to any of them; tolerances then
    follow its dtype."""

    autocast_enabled: bool = False
    autocast_dtype: str = "bfloat16"  # or float16
    # At precision bf16/fp16: run a copy of the model with its weights cast to that dtype instead of autocast
    # (the precision list's <backend>.<precision>-weights candidates: pipeline.backends.precision.ReducedPrecision).
    cast_weights: bool = False
    # At a quantized precision (int8_weight_only, int8_dynamic, fp8): quantize only the Linear layers torchao's
    # row-wise filter admits, more than 1024 input and 2048 output features, where int8 and fp8 matmuls can beat
    # bf16 (pipeline.backends.quantize). null: set true by the precision list; false (and checkpoints written
    # before it): every Linear torchao can take.
    large_linears_only: Optional[bool] = None
    # flash | efficient | cudnn | math: every scaled_dot_product_attention call on that kernel alone (set for each
    # candidate by the top-level attention list: pipeline.backends.attention). null: PyTorch's own choice per call.
    attention: Optional[str] = None


@dataclass(frozen=True)
class EagerSettings(TorchSettings):
    """Plain PyTorch: the reference every other backend is checked against."""

    kind: str = "eager"


@dataclass(frozen=True)
class InductorSettings(TorchSettings):
    """torch.compile with Inductor, set up by at most one of mode / options / template."""

    kind: str = "inductor"
    fullgraph: bool = False
    # null: the batch dimension is dynamic from the first compile (one program serves every size but 1, and
    # inductor and graph_inductor compile the same one), other dimensions as torch decides; true: every
    # dimension; false: a static program per batch size.
    dynamic: Optional[bool] = None
    # Where lengths are tuned (model.seq_lens), with dynamic null: false compiles one program with the length
    # dynamic too (it also runs untuned lengths unpadded), true one program per tuned length (the batch dynamic);
    # null competes both (inductor: <name> and <name>.per_length; a graph backend takes false).
    per_length: Optional[bool] = None
    mode: Optional[str] = None
    options: Mapping[str, Any] = field(default_factory=dict)  # empty = not set; read-only, a copy of what was given
    template: Optional[str] = None
    # false hands out CUDA graphs' static outputs without a copy: the next call overwrites them.
    clone_outputs: bool = True
    # true: a regional program (pipeline/backends/regions.py): the model's repeated blocks (transformer layers,
    # encoder blocks, bottlenecks) are traced and compiled once and reused, for far less compile time and maybe a
    # slower program; skipped, with the reason, for a model that repeats no block.
    regional: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "options", MappingProxyType(copy.deepcopy(dict(self.options))))


@dataclass(frozen=True)
class GraphSettings(InductorSettings):
    """Device graphs over a batch-size grid, of eager's kernels or (compile_with_inductor) Inductor's.

    Inductor's settings apply only with ``compile_with_inductor: true``.
    """

    kind: str = "graph"
    compile_with_inductor: bool = False
    # No grid graph above this size (256: 35 graphs); tuned sizes above it are still recorded exactly, and
    # batches past the largest recorded graph replay in chunks of it.
    max_recorded_batch_size: int = 256
    # The recorded sizes besides the tuned ones; null = 1, 2, 4 and every multiple of 8 up to the cap.
    grid: Optional[Tuple[int, ...]] = None
    # Caps over the (batch grid x tuned lengths) graphs of one backend: how many it records, and the MB its pool
    # may take (null: no cap); past either the backend fails with the figures.
    max_graphs: int = 512
    max_pool_mb: Optional[float] = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.grid is not None:
            object.__setattr__(self, "grid", tuple(self.grid))


@dataclass(frozen=True)
class ExportedSettings(BackendSettings):
    """A runtime outside PyTorch, serving the model's ``torch.export`` graph on the CPU. Its own thread
    pool is sized here; null takes the run's count (top-level ``threads``), as eager and Inductor do."""

    threads: Optional[int] = None


@dataclass(frozen=True)
class OpenVinoSettings(ExportedSettings):
    """OpenVINO's CPU plugin. ``precision`` sets its INFERENCE_PRECISION_HINT (fp32 -> f32, bf16, fp16 ->
    f16): OpenVINO picks bf16 by itself on CPUs that have it, so f32 is set explicitly at fp32."""

    kind: str = "openvino"
    performance_hint: str = "LATENCY"  # or THROUGHPUT (several streams; a single call uses one)


@dataclass(frozen=True)
class OnnxRuntimeSettings(ExportedSettings):
    """ONNX Runtime's CPU execution provider. ``graph_optimization_level``: disable | basic | extended | all.
    ``allow_spinning``: whether the session's threads spin after a call, waiting for the next (ONNX Runtime's own
    default); null: only where the process has twice the session's threads in cores (``backends.onnxruntime.spins``):
    on 2 cores spinning made the backend timed next, and the user's code after a call, 2.5x slower; on 16 cores with
    4 threads it slowed nothing, and sleeping threads cost the session 10-25% at batch 1."""

    kind: str = "onnxruntime"
    graph_optimization_level: str = "all"
    allow_spinning: Optional[bool] = None


KINDS: Dict[str, Type[BackendSettings]] = {
    s.kind: s for s in (EagerSettings, InductorSettings, GraphSettings, OpenVinoSettings, OnnxRuntimeSettings)}
# What Hydra composes from (booleans checked afterwards: config.flags), built here at import (flags.loose says why).
LOOSE_KINDS: Dict[str, type] = {kind: flags.loose(schema) for kind, schema in KINDS.items()}


def keys(kind: str) -> List[str]:
    """The keys a backend of ``kind`` may set."""
    return [f.name for f in fields(KINDS[kind])]


def kind_of(name: str, cfg: Mapping[str, Any]) -> str:
    """A backend's kind, or a ConfigError listing the kinds that exist."""
    kind = cfg.get("kind")
    if kind not in KINDS:
        raise ConfigError(f"backend {name!r}: unknown kind {kind!r}; use one of {sorted(KINDS)}")
    return kind


def foreign_key_problem(name: str, kind: str, key: str) -> str:
    """The message for a key ``kind`` does not have: which kinds do, and what ``kind`` takes."""
    owners = [k for k in KINDS if key in keys(k)]
    whose = f"a setting of {' and '.join(owners)} backends" if owners else "no backend kind has it"
    return (f"backend {name!r} (kind {kind}) sets {key!r}, which {kind} backends do not take ({whose}); "
            f"{kind} keys: {', '.join(keys(kind))}")


def settings(name: str, cfg: Mapping[str, Any]) -> BackendSettings:
    """``cfg`` held to its kind's schema: that kind's dataclass, every key present (defaults filled); a one-line
    ConfigError naming the key, the backend and the kind otherwise."""
    body = OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else dict(cfg)
    kind = kind_of(name, body)
    for key in body:
        if key not in keys(kind):
            raise ConfigError(foreign_key_problem(name, kind, str(key)))
    problem = flags.problem(body, KINDS[kind])
    if problem:
        raise ConfigError(f"backend {name!r} (kind {kind}) {problem}")
    try:
        typed = OmegaConf.to_container(OmegaConf.merge(OmegaConf.structured(LOOSE_KINDS[kind]), body))
    except OmegaConfBaseException as exc:
        raise ConfigError(f"backend {name!r} (kind {kind}) {exc.full_key}: {str(exc).splitlines()[0]}") from None
    typed["precision"] = precisions.parse(typed["precision"], f"backend {name!r}: precision")
    if typed.get("attention") is not None:
        typed["attention"] = attention.parse(typed["attention"], f"backend {name!r}: attention")
    return KINDS[kind](**typed)


def register(store: Any) -> None:
    """Register every kind's schema in Hydra's ConfigStore as ``schema_backend_<kind>``."""
    for kind, schema in LOOSE_KINDS.items():
        store.store(name=f"schema_backend_{kind}", node=schema)
