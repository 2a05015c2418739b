"""Every rule between a backend's settings, in one place, checked before any model is built.

:func:`check` holds a candidate, whose settings its kind's schema typed (``pipeline.backends.candidate``),
to the rules a schema cannot say: at most one of mode / options / template, the Inductor
settings of a graph backend only with ``compile_with_inductor``, no CUDA graphs of Inductor's
own inside a graph backend's, and the values OpenVINO's and ONNX Runtime's settings take.
``backends.create`` calls it, so every run's early checks and every checkpoint load do, and so does
the checkpoint payload check. A new kind adds its rule to
:data:`RULES` (or none).
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Mapping, Optional

from pipeline.backends import graph_plan, onnxruntime, openvino
from pipeline.backends.candidate import AUTOCAST, Candidate
from pipeline.config import inductor_options, limits, templates
from pipeline.config.backend_schema import BackendSettings, TorchSettings
from pipeline.errors import ConfigError

AUTOCAST_DTYPES = ("bfloat16", "float16")
MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
INDUCTOR_SETTINGS = ("mode", "options", "template")


def inductor_settings_given(settings: BackendSettings) -> List[str]:
    """Which of mode / options / template a backend config sets (empty values count as unset)."""
    return [key for key in INDUCTOR_SETTINGS if getattr(settings, key) not in (None, {}, "")]


def resolved_options(name: str, settings: BackendSettings) -> Optional[Dict[str, Any]]:
    """The validated, flat options a backend passes to torch.compile: its options, or its template's
    (None for a mode)."""
    given = inductor_settings_given(settings)
    if "options" in given:
        return inductor_options.validate(settings.options, f"backend {name!r} options")
    if "template" in given:
        template = templates.load(str(settings.template))
        return inductor_options.validate(
            template.options, f"backend {name!r}: Inductor template {template.name!r} ({template.source})")
    return None


def effective_options(settings: BackendSettings, options: Optional[Mapping[str, Any]]) -> Dict[str, Any]:
    """The options torch applies: the resolved options, or those the mode implies."""
    if options is not None:
        return dict(options)
    if settings.mode in (None, "default"):  # Inductor's defaults: nothing to ask it (importing it takes seconds)
        return {}
    from torch._inductor import list_mode_options

    return dict(list_mode_options(settings.mode))


def check_inductor(name: str, settings: BackendSettings) -> Optional[Dict[str, Any]]:
    """At most one of mode / options / template, a known mode; returns the resolved options."""
    given = inductor_settings_given(settings)
    if len(given) > 1:
        raise ConfigError(
            f"backend {name!r} sets {' and '.join(given)}; they are mutually exclusive. Keep one: mode for a "
            f"preset, options for a dict of Inductor options, template for a named option set")
    if settings.mode is not None and settings.mode not in MODES:
        raise ConfigError(f"backend {name!r}: unknown Inductor mode {settings.mode!r}; use one of {list(MODES)}")
    return resolved_options(name, settings)


def check_graph(name: str, settings: BackendSettings) -> None:
    if settings.compile_with_inductor:
        if effective_options(settings, check_inductor(name, settings)).get("triton.cudagraphs"):
            raise ConfigError(f"backend {name!r}: its Inductor setting records CUDA graphs of its own inside ours "
                              f"(mode reduce-overhead or max-autotune, or triton.cudagraphs); use mode=default, "
                              f"max-autotune-no-cudagraphs, or options without triton.cudagraphs")
    elif inductor_settings_given(settings) or settings.regional:
        given = inductor_settings_given(settings) + (["regional"] if settings.regional else [])
        raise ConfigError(f"backend {name!r} sets {' and '.join(given)}, which only apply "
                          f"with compile_with_inductor=true; set it or drop them")
    problem = graph_sizes_problem(name, settings)
    if problem:
        raise ConfigError(problem)
    if not limits.is_int(settings.max_graphs) or not 1 <= settings.max_graphs <= limits.MAX_GRAPHS:
        raise ConfigError(f"backend {name!r}: max_graphs={settings.max_graphs!r} must be an integer from 1 to "
                          f"{limits.MAX_GRAPHS}")
    cap = settings.max_pool_mb
    if cap is not None and (isinstance(cap, bool) or not isinstance(cap, (int, float)) or not cap > 0):
        raise ConfigError(f"backend {name!r}: max_pool_mb={cap!r} must be a positive number of MB, or null for no cap")


def graph_sizes_problem(name: str, settings: BackendSettings) -> Optional[str]:
    """The cap and the grid within the batch-size bounds; the cap first, since it bounds the default grid's length."""
    problem = limits.batch_size_problem(settings.max_recorded_batch_size, f"backend {name!r} max_recorded_batch_size")
    if problem:
        return problem
    try:
        graph_plan.grid(1, settings.max_recorded_batch_size, settings.grid)
    except ValueError as exc:
        return f"backend {name!r}: {exc}"
    return next(filter(None, (limits.batch_size_problem(size, f"backend {name!r} grid[{i}]")
                              for i, size in enumerate(settings.grid or []))), None)


def one_of(name: str, settings: BackendSettings, key: str, allowed: Any) -> None:
    if getattr(settings, key) not in allowed:
        raise ConfigError(f"backend {name!r}: {key}={getattr(settings, key)!r} is not one of {list(allowed)}")


def check_threads(name: str, settings: BackendSettings) -> None:
    problem = limits.threads_problem(settings.threads, f"backend {name!r} threads")
    if problem:
        raise ConfigError(problem)


def check_openvino(name: str, settings: BackendSettings) -> None:
    check_threads(name, settings)
    one_of(name, settings, "performance_hint", openvino.PERFORMANCE_HINTS)


def check_onnxruntime(name: str, settings: BackendSettings) -> None:
    check_threads(name, settings)
    one_of(name, settings, "graph_optimization_level", onnxruntime.LEVELS)


RULES: Dict[str, Callable[[str, BackendSettings], Any]] = {
    "inductor": check_inductor, "graph": check_graph, "openvino": check_openvino, "onnxruntime": check_onnxruntime}


def check(candidate: Candidate) -> None:
    """A ConfigError for the first rule ``candidate``'s settings break; nothing where they keep every one."""
    name, settings = candidate.name, candidate.settings
    autocast = isinstance(settings, TorchSettings) and settings.autocast_enabled
    if autocast and settings.autocast_dtype not in AUTOCAST_DTYPES:
        raise ConfigError(f"backend {name!r}: autocast_dtype={settings.autocast_dtype!r} is not supported; "
                          f"use one of {list(AUTOCAST_DTYPES)}")
    if settings.precision != "fp32" and autocast:
        raise ConfigError(f"backend {name!r} sets both precision={settings.precision} and autocast_enabled=true; "
                          f"keep one")
    if isinstance(settings, TorchSettings) and settings.cast_weights and settings.precision not in AUTOCAST:
        raise ConfigError(f"backend {name!r} sets cast_weights=true at precision={settings.precision}; weights "
                          f"are cast only to a reduced precision: set precision to one of {list(AUTOCAST)}, "
                          f"or list it in precision (e.g. 'precision=[fp32,bf16]') for a -weights candidate")
    RULES.get(settings.kind, lambda *_: None)(name, settings)
