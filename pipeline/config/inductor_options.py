"""Inductor option sets checked against the installed torch before any compile.

``torch.compile(options=...)`` only rejects a bad key once it compiles, deep inside a run. Here
every key is checked at composition time against ``torch._inductor.list_options()`` (with the
closest valid names on a typo) and against the type torch declares for it (unions, Literal
choices and containers included). Options that are
valid but do nothing on the chosen device are reported, and options whose whole purpose needs a
device the run does not have make the backend unsupported (recorded as skipped). Options whose
declared type admits free text (a compiler, a path, a directory) are named by :func:`untrusted`:
a checkpoint that sets one is loaded only when its reader trusts the file.
"""

from __future__ import annotations

import collections.abc
import difflib
import functools
import types
import typing
from typing import Any, Dict, List, Mapping, Optional

import torch

# Option families that only steer GPU code generation (Triton kernels, CUDA/ROCm templates).
GPU_ONLY_PREFIXES = ("triton.", "cuda.", "cutlass.", "rocm.")
GPU_ONLY_KEYS = {"coordinate_descent_tuning": "it tunes Triton kernel launch configs"}
# C++ kernel code generation: Inductor's CPU backend.
CPU_ONLY_PREFIXES = ("cpp.",)
# Options that are read only when one of these other options is on.
NEEDS_ANY = {"triton.enable_persistent_tma_matmul": ("max_autotune", "max_autotune_gemm")}
# Options whose purpose needs a device type; a backend setting them elsewhere is skipped.
NEEDS_DEVICE = {
    "triton.cudagraphs": (("cuda",), "records CUDA graphs"),
    "triton.enable_persistent_tma_matmul": (("cuda", "xpu"), "generates Triton TMA matmul kernels for a GPU"),
}


@functools.lru_cache(maxsize=1)
def known_options() -> List[str]:
    """Every option name the installed torch accepts in ``torch.compile(options=...)``."""
    import torch._inductor

    return sorted(torch._inductor.list_options())


def closest(key: str, n: int = 4) -> List[str]:
    """Valid option names nearest to ``key`` by spelling, whole name or last segment (``cudagraphs``)."""
    names = known_options()
    by_tail: Dict[str, List[str]] = {}
    for name in names:
        by_tail.setdefault(name.rsplit(".", 1)[-1], []).append(name)
    tails = difflib.get_close_matches(key.rsplit(".", 1)[-1], list(by_tail), n=n, cutoff=0.8)
    ranked = difflib.get_close_matches(key, names, n=n, cutoff=0.6) + [o for t in tails for o in by_tail[t]]
    return [o for o in dict.fromkeys(ranked) if o != key][:n]


def flatten(options: Mapping[str, Any], prefix: str = "") -> Dict[str, Any]:
    """``{triton: {cudagraphs: true}}`` and ``{triton.cudagraphs: true}`` alike become dotted keys.

    A key is normalised like torch does (``-`` -> ``_``). A nested mapping is only descended into
    where its own key is not itself an option (a few options hold dicts).
    """
    names = set(known_options())
    flat: Dict[str, Any] = {}
    for key, value in options.items():
        full = f"{prefix}{str(key).replace('-', '_')}"
        if isinstance(value, Mapping) and full not in names:
            flat.update(flatten(value, prefix=f"{full}."))
        else:
            flat[full] = value
    return flat


def declared_type(key: str) -> Any:
    """The type torch declares for an option (``typing.Any`` where this torch does not say)."""
    from torch._inductor import config

    get_type = getattr(config, "get_type", None)
    return get_type(key) if get_type is not None else Any


def fits(value: Any, declared: Any) -> bool:
    """Whether ``value`` fits a declared type: a class (as torch checks it), a Literal, a union, or a
    list, tuple, dict or set of those. A YAML or checkpoint list stands for a tuple. Forward
    references and Any are not checked."""
    origin, args = typing.get_origin(declared), typing.get_args(declared)
    if origin is None:
        return declared is Any or not isinstance(declared, type) or isinstance(value, declared)
    if origin is typing.Literal:
        return value in args
    if origin in (typing.Union, types.UnionType):
        return any(fits(value, a) for a in args)
    if origin in (list, set, frozenset, collections.abc.Sequence):
        return isinstance(value, (list, tuple, set, frozenset)) and all(fits(v, args[0]) for v in value if args)
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            return False
        if len(args) == 2 and args[1] is Ellipsis:
            return all(fits(v, args[0]) for v in value)
        return len(value) == len(args) and all(fits(v, a) for v, a in zip(value, args))
    if origin in (dict, collections.abc.Mapping):
        return isinstance(value, Mapping) and all(fits(k, args[0]) and fits(v, args[1]) for k, v in value.items())
    if origin is collections.abc.Callable:
        return callable(value)
    return True


def admits_free_text(declared: Any) -> bool:
    """Whether an option of this type can hold a string that is not one of fixed choices (a program,
    a path, a directory, a pattern, a name to look up), or a value of a type not known here."""
    if declared in (bool, int, float, type(None)):
        return False
    origin, args = typing.get_origin(declared), typing.get_args(declared)
    if origin is typing.Literal:
        return False
    if origin in (typing.Union, types.UnionType, list, tuple, dict, set, frozenset) and args:
        return any(admits_free_text(a) for a in args if a is not Ellipsis)
    return True


def untrusted(options: Mapping[str, Any]) -> List[str]:
    """The options (dotted) that could name something Inductor runs, reads or writes: those whose
    declared type admits free text. A checkpoint's options are refused unless its reader trusts it. No options:
    nothing to ask Inductor (importing it takes seconds, which a load of programs built ahead of time skips)."""
    return [key for key in flatten(options) if admits_free_text(declared_type(key))] if options else []


def type_problem(key: str, value: Any) -> Optional[str]:
    """Why ``value`` does not fit the type torch declares for ``key``, or None."""
    declared = declared_type(key)
    if fits(value, declared):
        return None
    if isinstance(declared, type):
        return f"{key}={value!r} is {type(value).__name__}, torch expects {declared.__name__}"
    if typing.get_origin(declared) is typing.Literal:
        return f"{key}={value!r} is not one of {list(typing.get_args(declared))}"
    return f"{key}={value!r} does not fit {declared}, the type torch declares"


def validate(options: Mapping[str, Any], where: str) -> Dict[str, Any]:
    """The options as flat dotted keys, or a ValueError naming each bad key and its fix.

    ``where`` says whose options these are (``backend 'x'`` / ``template 'y' (path)``).
    """
    flat = flatten(options)
    names = set(known_options())
    problems = []
    for key, value in flat.items():
        if key not in names:
            near = closest(key)
            hint = f"closest valid names: {', '.join(near)}" if near else "no close match"
            problems.append(f"unknown Inductor option {key!r} ({hint})")
            continue
        bad_type = type_problem(key, value)
        if bad_type:
            problems.append(bad_type)
    if problems:
        raise ValueError(
            f"{where}: " + "; ".join(problems) +
            f". Valid names are those of torch._inductor.list_options() in torch {torch.__version__} "
            f"(documented in torch/_inductor/config.py)"
        )
    return flat


def unsupported_reason(options: Mapping[str, Any], device: torch.device) -> Optional[str]:
    """Why these options cannot do their job on ``device`` (e.g. CUDA graphs on a CPU), or None."""
    for key, (device_types, purpose) in NEEDS_DEVICE.items():
        if options.get(key) and device.type not in device_types:
            return f"{key}=True, which {purpose} and needs a {' or '.join(device_types)} device, not {device.type}"
    return None


def pinned(options: Mapping[str, Any]) -> List[str]:
    """Options already at the value torch._inductor.config holds: no effect today, kept as pins."""
    from torch._inductor import config

    current = config.get_config_copy()
    return [key for key, value in options.items() if key in current and current[key] == value]


def ineffective(options: Mapping[str, Any], device: torch.device) -> Dict[str, str]:
    """Options that are valid but change nothing on ``device``, each with the reason."""
    from torch._inductor import config

    cpu_backend = options.get("cpu_backend", config.get_config_copy().get("cpu_backend"))
    gpu_codegen = device.type in ("cuda", "xpu") or cpu_backend == "triton"
    out: Dict[str, str] = {}
    for key, value in options.items():
        if not gpu_codegen and (key.startswith(GPU_ONLY_PREFIXES) or key in GPU_ONLY_KEYS):
            out[key] = GPU_ONLY_KEYS.get(key, "it steers GPU code generation") + f"; {device.type} gets C++ kernels"
        elif device.type != "cpu" and key.startswith(CPU_ONLY_PREFIXES):
            out[key] = "cpp.* options steer Inductor's C++ CPU kernels"
        elif key in NEEDS_ANY and value and not any(options.get(k) for k in NEEDS_ANY[key]):
            out[key] = f"only read by max-autotune GEMM templates; also set one of {list(NEEDS_ANY[key])}"
    if options.get("triton.enable_persistent_tma_matmul") and device.type == "cuda":
        major, _ = torch.cuda.get_device_capability(device)
        if major < 9:
            out["triton.enable_persistent_tma_matmul"] = (
                f"this GPU (sm_{major}x) has no TMA: Inductor falls back to non-TMA persistent kernels")
    return out
