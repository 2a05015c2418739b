"""What a checkpoint may hold, checked field by field before ``load`` builds or changes anything.

A checkpoint is data from anyone: its SHA-256 detects damage, not tampering, since whoever edits a
file can write its checksum too. :func:`check` holds the whole payload to the format (each field's
type, the bounds of ``pipeline.config.limits``, a route covering 1..inf without gaps, backend configs
through their kind's schema and rules (``pipeline.backends.rules``), input specs and batch dimensions, the state dict against
the caller's model, and nothing in it but plain data and plain tensors), so a refused file leaves the caller's
model as it was. Where lengths were tuned (``seq``), the route is a (batch range x length range) table: its bands
cover every tuned length, each band's ranges cover 1..inf, and a band's untuned lengths go only to a backend
whose padding capture proved or that runs any length. Inductor options whose
declared type admits free text can name a program Inductor runs (``cpp.cxx``) or a path it writes:
a checkpoint that sets one is refused unless the caller trusts it (``trust_options=True``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional

import torch
from torch import nn

from pipeline import backends as backends_registry
from pipeline import devices
from pipeline.backends import precision, rules
from pipeline.backends.candidate import Candidate
from pipeline.config import inductor_options, limits
from pipeline.compile import artifacts as compiled
from pipeline.errors import CheckpointError

# Every field a payload may hold, and its type (``created`` and ``format`` are informative).
FIELDS: Dict[str, type] = {"format": int, "name": str, "created": str, "route": list, "backends": dict,
                           "inputs": dict, "output_batch_dims": dict, "batch_sizes": list, "max_batch_size": int,
                           "versions": dict, "device": dict, "state_dict": dict, "compiled": dict, "seq": dict}
ROUTE_KEYS = {"lo", "hi", "backend"}
SEQ_KEYS = {"lengths", "output_dims", "padded"}  # format 7, where lengths were tuned (pipeline.seqlen)
TILE_KEYS = {"len_lo", "len_hi", *ROUTE_KEYS}
PLAIN = (str, int, float, bool, type(None))  # besides dicts, lists and plain tensors: all a payload holds


class StateDictMismatch(CheckpointError):
    """The checkpoint's weights do not fit the model it is loaded into."""


class UntrustedOptions(CheckpointError):
    """The checkpoint sets Inductor options that can name a program or a path, and the caller did not trust it."""


def listed(keys: List[str], limit: int = 8) -> str:
    more = f" and {len(keys) - limit} more" if len(keys) > limit else ""
    return ", ".join(keys[:limit]) + more


def foreign_object(payload: Mapping[str, Any]) -> Optional[str]:
    """Where the payload holds anything but plain data and plain tensors. A weights-only load also builds
    every class a library has registered as safe (torchao registers its tensor subclasses, layouts and
    enums once imported); a checkpoint never holds one, so one found here is refused rather than loaded
    into the model. Iterative, so that no nesting depth can exhaust the stack."""
    stack = [("payload", payload)]
    while stack:
        where, value = stack.pop()
        if type(value) in (dict, list, tuple):
            items = value.items() if type(value) is dict else enumerate(value)
            for key, item in items:
                if type(value) is dict and type(key) not in PLAIN:
                    return f"{where} has a key of type {type(key).__qualname__}"
                stack.append((f"{where}[{key!r}]", item))
        elif type(value) not in PLAIN and type(value) is not torch.Tensor:
            return (f"{where} is a {type(value).__module__}.{type(value).__qualname__}, which a checkpoint never "
                    f"holds (only plain data and plain tensors)")
    return None


def fields_problem(payload: Mapping[str, Any]) -> Optional[str]:
    """Unknown fields, wrong types, and the device and versions records."""
    unknown = sorted(set(payload) - set(FIELDS))
    if unknown:
        return f"unknown fields {unknown}"
    for key, kind in FIELDS.items():
        if key in payload and (not isinstance(payload[key], kind) or (kind is int and not limits.is_int(payload[key]))):
            return f"{key} is a {type(payload[key]).__name__}, not a {kind.__name__}"
    device = payload["device"]
    if device.get("type") not in devices.KNOWN or not isinstance(device.get("name"), str):
        return f"device={device!r} must be {{type: one of {list(devices.KNOWN)}, name: a string}}"
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in payload["versions"].items()):
        return "versions must map package names to version strings"
    return None


def sizes_problem(sizes: List[Any], largest: Any) -> Optional[str]:
    """Tuned sizes: ascending, distinct, in bounds; ``max_batch_size`` is the largest of them."""
    if not 1 <= len(sizes) <= limits.MAX_TUNED_SIZES:
        return f"batch_sizes holds {len(sizes)} sizes, not 1 to {limits.MAX_TUNED_SIZES}"
    for i, size in enumerate(sizes):
        problem = limits.batch_size_problem(size, f"batch_sizes[{i}]")
        if problem:
            return problem
    if sizes != sorted(set(sizes)):
        return f"batch_sizes={sizes} must be ascending without repeats"
    if largest != sizes[-1]:
        return f"max_batch_size={largest!r} must be the largest of batch_sizes, {sizes[-1]}"
    return None


def route_problem(route: List[Any], backends: Mapping[str, Any], tuned: int) -> Optional[str]:
    """Ranges from 1 up without gaps or overlaps, the last open-ended, each naming a stored backend;
    no more of them than ``tuned`` sizes (a range is won at a profiled size)."""
    if len(route) > tuned:
        return f"route has {len(route)} ranges, more than its {tuned} tuned batch sizes can give"
    start = 1
    for i, r in enumerate(route):
        where = f"route[{i}]"
        if not isinstance(r, dict) or set(r) != ROUTE_KEYS:
            return f"{where}={r!r} must hold exactly lo, hi and backend"
        if r["lo"] != start or not limits.is_int(r["lo"]):
            return f"{where} starts at {r['lo']!r}, not {start}: the ranges must cover 1..inf without gaps or overlaps"
        if r["backend"] not in backends:
            return f"{where} routes to backend {r['backend']!r}, which the checkpoint does not hold ({sorted(backends)})"
        if r["hi"] is None:
            if i != len(route) - 1:
                return f"{where} is open-ended (hi: null) but not the last range"
            return None
        problem = limits.batch_size_problem(r["hi"], f"{where}.hi")
        if problem or r["hi"] < r["lo"]:
            return problem or f"{where} ends at {r['hi']}, before it starts at {r['lo']}"
        start = r["hi"] + 1
    return "the last range of route must be open-ended (hi: null), so that every batch size has a backend"


def seq_problem(seq: Mapping[str, Any], inputs: Mapping[str, Any], backends: Mapping[str, Any]) -> Optional[str]:
    """The tuned lengths, the outputs' length dimensions and the padded backends; an input that carries them."""
    if set(seq) != SEQ_KEYS:
        return f"seq holds {sorted(seq)}, not exactly {sorted(SEQ_KEYS)}"
    problem = (limits.lengths_problem(seq["lengths"], "seq.lengths", ascending=True)
               or limits.output_dims_problem(seq["output_dims"], "seq.output_dims"))
    if problem:
        return problem
    padded = seq["padded"]
    if not isinstance(padded, list) or not all(isinstance(n, str) and n in backends for n in padded):
        return f"seq.padded must list backends the checkpoint holds ({sorted(backends)})"
    if not any(isinstance(s, dict) and s.get("seq_dim") is not None for s in inputs.values()):
        return "seq is set, but no input has a length dimension (seq_dim)"
    return None


def table_problem(route: List[Any], backends: Mapping[str, Any], seq: Mapping[str, Any], tuned: int) -> Optional[str]:
    """Tiles ``{len_lo, len_hi, lo, hi, backend}``: bands of lengths from 1 to the largest tuned one, disjoint and
    covering every tuned length, each band's ranges as :func:`route_problem` wants them; a band's untuned lengths
    routed only to a backend that pads (``seq.padded``) or runs any length."""
    lengths = seq["lengths"]
    if len(route) > 2 * len(lengths) * tuned:
        return f"route has {len(route)} tiles, more than {len(lengths)} tuned lengths x {tuned} batch sizes can give"
    bands: Dict[tuple, List[Any]] = {}
    for i, t in enumerate(route):
        if not isinstance(t, dict) or set(t) != TILE_KEYS:
            return f"route[{i}]={t!r} must hold exactly len_lo, len_hi, lo, hi and backend"
        lo, hi = t["len_lo"], t["len_hi"]
        if not (limits.is_int(lo) and limits.is_int(hi) and 1 <= lo <= hi <= lengths[-1]):
            return f"route[{i}] spans lengths {lo!r}..{hi!r}, not within 1..{lengths[-1]} (the largest tuned length)"
        bands.setdefault((lo, hi), []).append({k: t[k] for k in ROUTE_KEYS})
    spans = sorted(bands)
    for (_, hi), (lo, _) in zip(spans, spans[1:]):
        if lo <= hi:
            return f"route's length bands overlap at length {lo}"
    for n in lengths:
        if not any(lo <= n <= hi for lo, hi in spans):
            return f"route serves no band holding the tuned length {n}"
    for (lo, hi), ranges in bands.items():
        problem = route_problem(ranges, backends, tuned)
        if problem:
            return f"lengths {lo}..{hi}: {problem}"
        if any(n not in lengths for n in range(lo, hi + 1)):
            unable = [r["backend"] for r in ranges if r["backend"] not in seq["padded"] and not
                      backends_registry.create(Candidate.stored(r["backend"], backends[r["backend"]])).any_length]
            if unable:
                return (f"lengths {lo}..{hi} hold untuned lengths, and backend {unable[0]!r} neither pads (seq.padded) "
                        f"nor runs any length")
    return None


def backend_problem(name: str, cfg: Any) -> Optional[str]:
    """One stored backend config, held to its kind's schema and rules (``rules.check``, as a run's are)."""
    if not isinstance(cfg, dict):
        return f"backend {name!r} is a {type(cfg).__name__}, not a config"
    if cfg.get("template"):
        return f"backend {name!r} names template {cfg['template']!r}; a checkpoint holds a template's resolved options"
    try:
        candidate = Candidate.stored(name, cfg)
        rules.check(candidate)
    except ValueError as exc:
        return str(exc)
    return precision.name_problem(candidate)


def device_problem(payload: Mapping[str, Any], device: torch.device) -> Optional[str]:
    """Why a routed backend cannot run on ``device`` (a precision it lacks, a missing package), or None:
    asked of each backend before anything is built."""
    for name in dict.fromkeys(r["backend"] for r in payload["route"]):
        backend = backends_registry.create(Candidate.stored(name, payload["backends"][name]))
        reason = backend.unsupported_reason(device) or precision.device_problem(backend.candidate.precision, device)
        if reason:
            return f"backend {name!r} cannot run on {device.type}: {reason}"
    return None


def check_state_dict(saved: Mapping[str, Any], model: nn.Module, name: str, path: Path) -> None:
    """Fail before loading when the weights do not fit, naming the keys that differ."""
    odd = [k for k, v in saved.items() if not isinstance(k, str) or not isinstance(v, torch.Tensor)
           or v.layout != torch.strided or v.device.type != "cpu"]
    if odd:
        raise CheckpointError(f"{path}: state_dict entries {listed([str(k) for k in odd])} are not dense CPU tensors; "
                              f"nothing was loaded. Re-save the checkpoint with pipeline.save")
    expected = model.state_dict()
    fits = [k for k in expected if k in saved and isinstance(expected[k], torch.Tensor)]
    missing = [k for k in expected if k not in saved]
    unexpected = [k for k in saved if k not in expected]
    shapes = [f"{k} {tuple(saved[k].shape)} vs {tuple(expected[k].shape)}" for k in fits
              if saved[k].shape != expected[k].shape]
    dtypes = [f"{k} {saved[k].dtype} vs {expected[k].dtype}" for k in fits if saved[k].dtype != expected[k].dtype]
    if missing or unexpected or shapes or dtypes:
        parts = [f"missing keys: {listed(missing)}" if missing else "",
                 f"unexpected keys: {listed(unexpected)}" if unexpected else "",
                 f"shape mismatches (checkpoint vs model): {listed(shapes)}" if shapes else "",
                 f"dtype mismatches (checkpoint vs model): {listed(dtypes)}" if dtypes else ""]
        raise StateDictMismatch(
            f"{path} holds weights of {name!r} that do not fit {type(model).__name__}: "
            + "; ".join(p for p in parts if p) + ". Pass a model built like the one that was tuned")


def compiled_problem(payload: Mapping[str, Any]) -> Optional[str]:
    """The record of compiled artifacts beside the file (``pipeline.compile.artifacts``): its form, and backends the
    route serves."""
    if "compiled" not in payload:
        return None
    problem = compiled.record_problem(payload["compiled"])
    if problem:
        return problem
    routed = {r["backend"] for r in payload["route"]}
    strays = sorted(set(payload["compiled"]["backends"]) - routed)
    return f"compiled names backends the route does not serve: {strays}" if strays else None


def check(payload: Mapping[str, Any], model: nn.Module, path: Path, trust_options: bool = False) -> None:
    """Raise unless every field of ``payload`` is within the format and its weights fit ``model``."""
    problem = (foreign_object(payload)
               or fields_problem(payload)
               or sizes_problem(payload["batch_sizes"], payload["max_batch_size"])
               or limits.inputs_problem(payload["inputs"])
               or limits.output_dims_problem(payload.get("output_batch_dims", {}))
               or next(filter(None, (backend_problem(n, c) for n, c in payload["backends"].items())), None)
               or (f"{len(payload['backends'])} backends, more than {limits.MAX_BACKENDS}"
                   if len(payload["backends"]) > limits.MAX_BACKENDS else None)
               or (seq_problem(payload["seq"], payload["inputs"], payload["backends"])
                   or table_problem(payload["route"], payload["backends"], payload["seq"], len(payload["batch_sizes"]))
                   if "seq" in payload else
                   route_problem(payload["route"], payload["backends"], len(payload["batch_sizes"])))
               or compiled_problem(payload))
    if problem:
        raise CheckpointError(f"{path} is not a checkpoint this tweakpipe can load: {problem}. Nothing was loaded; "
                              f"re-save it with pipeline.save or re-tune")
    routed = dict.fromkeys(r["backend"] for r in payload["route"])
    risky = {n: inductor_options.untrusted(payload["backends"][n].get("options") or {}) for n in routed}
    risky = {n: keys for n, keys in risky.items() if keys}
    if risky and not trust_options:
        named = "; ".join(f"backend {n!r} sets {', '.join(keys)}" for n, keys in risky.items())
        raise UntrustedOptions(
            f"{path}: {named}: Inductor options that can name a program it runs or a path it writes, and anyone "
            f"can rewrite a checkpoint with its checksum, so nothing was loaded. If you trust whoever wrote this "
            f"file, load it with pipeline.load(path, model, trust_options=True)")
    check_state_dict(payload["state_dict"], model, payload["name"], path)
