"""Verified checkpoints: one file that rebuilds a routed model, and that cannot run code when loaded.

Layout of a ``.tweak`` file::

    TWEAKPIPE-CHECKPOINT 1\\n
    sha256:<64 hex digits of the body>\\n
    <body: torch.save of plain data and tensors>

The body holds the route table, each routed backend's config (rebuilt by ``kind`` through the
backend registry, never by import path), the model's state dict, the input spec (with each input's
batch dimension), each output tensor's batch dimension, the tuned batch sizes, the versions and the
device it was tuned on. It holds no example data: loading warms the backends up on random fills
of the input spec. A quantized backend holds only its recipe's name beside the model's own weights,
and is quantized again on load: no tensor subclass is ever written. Where lengths were tuned, ``seq``
holds them, each output's length dimension and the backends whose padding capture proved, and the route
is a table of (batch range x length range) tiles (``pipeline.route.table``). It is read with
``torch.load(weights_only=True)`` only after its SHA-256 matches, and every field is checked
(``pipeline.route.payload``) before anything is built; the backends are built on a copy of the
caller's model holding the file's tensors, and the caller's model gets the weights only once all of
it succeeded.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import io
import logging
import os
import pickle
import platform
import time
from importlib import metadata
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import torch
from omegaconf import OmegaConf
from torch import nn

from pipeline import backends as backend_registry
from pipeline import devices, disks
from pipeline.backends import Backend, Candidate
from pipeline.batching import BatchDims
from pipeline.compile import aot
from pipeline.compile import artifacts as compiled
from pipeline.compile import loads
from pipeline.compile.manifest import claims_problem, mismatch
from pipeline.compile import pool as compile_pool
from pipeline.compile.build import BuildSpec, build_and_warm
from pipeline.config import limits
from pipeline.copies import holding
from pipeline.route import payload as payload_check
from pipeline.models import make_inputs
from pipeline.errors import CheckpointError  # noqa: F401 (callers catch it here)
from pipeline.route.payload import StateDictMismatch, UntrustedOptions  # noqa: F401 (callers catch them here)
from pipeline.route.served import RoutedModule, TuneRecord
from pipeline.route.policy import Range, sizes_owned
from pipeline.route.table import Tile
from pipeline.seqlen import SeqDims

log = logging.getLogger(__name__)

MAGIC = b"TWEAKPIPE-CHECKPOINT"
# 2: each backend's config holds the keys of its kind's schema only; 3: and its precision; 4: and cast_weights;
# 5: a precision may name a quantization recipe (pipeline.backends.quantize: the fp32 weights are stored, and
# load quantizes them again), and versions then records torchao's; 6: compiled, the record of the compiled
# artifacts beside the file (pipeline.compile.artifacts); 7: seq (tuned lengths, pipeline.seqlen) with a route of tiles,
# inputs' seq_dim and pad, backends' per_length and graph caps; 8: compiled.aot, the manifests of the routed programs
# built ahead of time (pipeline.compile.aot)
FORMAT = 8
READS = (2, 3, 4, 5, 6, 7, 8)  # older files are format-8 files without seq or aot, their backends' newer keys at their defaults
KEYS = ("name", "route", "backends", "state_dict", "inputs", "batch_sizes", "max_batch_size", "versions", "device")
# The seed of the sample inputs used to build and warm the backends on load.
SAMPLE_SEED = 0
IGNORED = "ignored: "  # load_report.artifacts of artifacts not used, before why

PathLike = Union[str, os.PathLike]


class NotACheckpoint(CheckpointError):
    """The file was not written by tweakpipe."""


class ChecksumMismatch(CheckpointError):
    """The file changed after it was written."""


class DeviceMismatch(CheckpointError):
    """The checkpoint was tuned for another device type."""


def plain(value: Any, where: str = "value") -> Any:
    """``value`` as plain dicts, lists, strings and numbers: all that a weights-only load accepts besides tensors."""
    if OmegaConf.is_config(value):
        value = OmegaConf.to_container(value, resolve=True)
    if isinstance(value, Mapping):
        return {str(k): plain(v, f"{where}.{k}") for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v, f"{where}[{i}]") for i, v in enumerate(value)]
    for kind in (bool, int, float, str):  # bool first: it is an int; subclasses (TorchVersion) become the base type
        if isinstance(value, kind):
            return kind(value)
    if value is None:
        return None
    raise TypeError(f"{where} is a {type(value).__name__}; a checkpoint holds only plain data and tensors")


def version_of(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "unknown"


def payload_of(routed: RoutedModule) -> Dict[str, Any]:
    """Everything needed to rebuild ``routed``, as plain data and CPU tensors."""
    rec = routed.record
    state: Dict[str, torch.Tensor] = {}
    for key, value in rec.model.state_dict().items():
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"state dict entry {key!r} is a {type(value).__name__}, not a tensor; "
                            f"checkpoints hold only tensors so that loading executes nothing")
        state[key] = value.detach().cpu()
    used = list(dict.fromkeys(r.backend for r in routed.route))
    quantized = any(routed.backends[n].candidate.quantizes for n in used)  # load quantizes the stored weights again
    meta = plain({
        "format": FORMAT,
        "name": rec.name,
        "route": [r.to_dict() for r in routed.route],
        "backends": {n: routed.backends[n].describe() for n in used},
        "inputs": rec.inputs,
        "output_batch_dims": rec.output_batch_dims,
        "batch_sizes": sorted(int(b) for b in rec.batch_sizes),
        "max_batch_size": max(int(b) for b in rec.batch_sizes),
        "versions": {"torch": torch.__version__, "tweakpipe": version_of("tweakpipe"),
                     "python": platform.python_version(), **({"torchao": version_of("torchao")} if quantized else {})},
        "device": {"type": rec.device.type, "name": devices.name(rec.device)},
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        **({"seq": {"lengths": list(rec.seq.lengths), "output_dims": dict(rec.seq.outputs),
                    "padded": [n for n in rec.padded if n in used]}} if rec.seq else {}),
    }, "checkpoint")
    return {**meta, "state_dict": state}


def write(payload: Mapping[str, Any], path: PathLike) -> Path:
    """Write ``payload`` with its checksum; atomic, so a reader never sees half a file, and a failed
    write (disk full, read-only directory) leaves no partial file and names the path."""
    buf = io.BytesIO()
    torch.save(dict(payload), buf)
    body = buf.getvalue()
    head = MAGIC + f" {FORMAT}\n".encode() + f"sha256:{hashlib.sha256(body).hexdigest()}\n".encode()
    return disks.write_atomic(Path(path), head + body, "checkpoint")


def save(routed: RoutedModule, path: PathLike, aot: bool = True) -> Path:
    """Write the checkpoint of a routed model to ``path``, and beside it (``path.compiled``, signed with this user's
    key) the routed backends' compiled artifacts, whose SHA-256 and build setup the checkpoint records; with
    ``aot``, they carry each routed Inductor program built ahead of time, where it holds up (``routed.aot``)."""
    payload, path = payload_of(routed), Path(path)
    used = dict.fromkeys(r.backend for r in routed.route)
    packages = ahead_of_time(routed, used) if aot else {}
    record = compiled.write(path, {n: routed.backends[n].artifacts for n in used}, routed.record.device,
                            payload["state_dict"], packages)
    return write({**payload, **({"compiled": record} if record else {})}, path)


def ahead_of_time(routed: RoutedModule, used: Sequence[str]) -> Dict[str, Any]:
    """Each routed program that compiles, built ahead of time where it holds up against the traced one
    (``pipeline.compile.aot.package_for``); ``routed.aot`` says per backend whether, why not, and what it cost."""
    rec, packages = routed.record, {}
    tuned = sorted(int(b) for b in rec.batch_sizes)
    routed.aot = {}
    for name in used:
        backend = routed.backends[name]
        if not (backend.candidate.compiles or backend.kind in aot.RUNTIME_FORMS):
            continue  # nothing to save: eager, or device graphs of eager
        # the standalone program capture loaded and the profile timed is kept as it is where it is the device's form;
        # on a CPU the AOTInductor package is built as ever (it loads without importing Inductor: far sooner)
        form = aot.form_for(backend)
        if backend.ahead is not None and form is not None and backend.ahead.manifest.get("format") == form.name:
            packages[name] = backend.ahead
            routed.aot[name] = {"used": True, "why": "", "build_s": 0.0, "profiled": True,
                                "worker_build_s": round(backend.ahead.build_s, 3)}
            continue
        package, report = aot.package_for(backend, rec.inputs,
                                          sizes_owned(routed.route, name, tuned) if not rec.seq else [],
                                          limits.MAX_BATCH_SIZE)
        routed.aot[name] = report
        if package is not None:
            packages[name] = package
        else:
            log.info("save: %s keeps its traced program (%s)", name, report["why"])
    return packages


def read(path: PathLike) -> Dict[str, Any]:
    """The verified payload of a checkpoint, without building anything (for inspection and ``load``)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path}")
    with path.open("rb") as f:
        head = f.readline(64)
        sha_line = f.readline(80)
        body = f.read()
    if not head.startswith(MAGIC + b" "):
        raise NotACheckpoint(f"{path} is not a tweakpipe checkpoint (it does not start with {MAGIC.decode()!r}); "
                             f"write one with pipeline.save(tuned, path) or the route stage")
    fmt = head[len(MAGIC):].strip().decode(errors="replace")
    if fmt not in map(str, READS):
        raise CheckpointError(f"{path} has checkpoint format {fmt!r}; this tweakpipe reads formats {list(READS)}. "
                              f"Load it with the tweakpipe version that wrote it, or re-tune")
    recorded = sha_line.strip().decode(errors="replace").removeprefix("sha256:")
    actual = hashlib.sha256(body).hexdigest()
    if recorded != actual:
        raise ChecksumMismatch(f"{path} changed after it was written: its SHA-256 is {actual}, the recorded one is "
                               f"{recorded!r}. The file is damaged or was edited; copy it again or re-tune")
    try:
        payload = torch.load(io.BytesIO(body), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        raise CheckpointError(f"{path} holds objects a weights-only load refuses, so it was not loaded: {exc}") from None
    missing = [k for k in KEYS if not isinstance(payload, dict) or k not in payload]
    if missing:
        raise CheckpointError(f"{path} lacks {missing}; it was not written by pipeline.save or the route stage")
    if str(payload.get("format", fmt)) != fmt:
        raise CheckpointError(f"{path} says format {fmt} in its header but {payload['format']!r} in its body; "
                              f"it was edited. Re-save it with pipeline.save or re-tune")
    return payload


def sign(path: PathLike) -> Path:
    """Trust the compiled artifacts beside the checkpoint at ``path`` (``tweakpipe trust``): sign them with this
    user's key, once the checkpoint is verified and they are the ones it records. Returns the artifacts' path."""
    return compiled.sign(Path(path), read(path).get("compiled"))


def requested_device(device: Optional[Union[str, torch.device]]) -> Optional[torch.device]:
    """``load``'s ``device`` argument as a torch device (None: the type the checkpoint was tuned for)."""
    if device is None or isinstance(device, torch.device):
        return device
    try:
        return torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"device={device!r} is not a device; pass 'cpu', 'cuda', 'cuda:1', 'xpu' or None "
                         f"(the device type the checkpoint was tuned for)") from None


def target_device(payload: Mapping[str, Any], device: Optional[torch.device], path: Path) -> torch.device:
    """The device to load on: the requested one, which must be of the type the checkpoint was tuned for."""
    kind, name = payload["device"]["type"], payload["device"]["name"]
    if device is None:
        if not devices.available(kind):
            raise DeviceMismatch(
                f"{path} was tuned on {kind} ({name}), and this machine's torch ({torch.__version__}) sees no {kind} "
                f"device. Load it where {kind} is available, or tune for this machine: "
                f"pipeline.tune(model, example_inputs, overrides=['device=cpu'])")
        return torch.device(kind)
    if device.type != kind:
        raise DeviceMismatch(
            f"{path} was tuned on {kind} ({name}), not {device.type}: its route and backends were chosen for {kind}. "
            f"Pass device='{kind}' (or device=None) on a machine with a {kind} device, or tune for {device.type}: "
            f"pipeline.tune(model, example_inputs, overrides=['device={device.type}'])")
    return devices.resolve(str(device))


def warn_on_drift(payload: Mapping[str, Any], device: torch.device) -> None:
    """A route timed on another device model or torch version still works, but may no longer be the fastest."""
    tuned_torch = payload["versions"]["torch"]
    if tuned_torch != torch.__version__:
        log.warning("checkpoint tuned with torch %s, running torch %s: re-tune if timings matter",
                    tuned_torch, torch.__version__)
    tuned_torchao = payload["versions"].get("torchao")
    if tuned_torchao is not None and tuned_torchao != version_of("torchao"):
        log.warning("checkpoint quantized with torchao %s, running torchao %s: its weights are quantized again by "
                    "this version and may differ from the tuned ones; re-tune if outputs must match",
                    tuned_torchao, version_of("torchao"))
    here = devices.name(device)
    if payload["device"]["name"] != here:
        log.warning("checkpoint tuned on %s, loading on %s: re-tune if timings matter", payload["device"]["name"], here)


def owned_by(route: Sequence[Any], name: str, servable: Sequence[int], tuned: Sequence[int], seq: SeqDims
             ) -> Tuple[List[int], List[int], List[int]]:
    """The batch sizes ``name`` serves, the tuned ones among them, and (where lengths are tuned) the tuned lengths
    its calls run at: those in its tiles, and the one each band pads to."""
    if not seq:
        return sizes_owned(route, name, servable), sizes_owned(route, name, tuned), []
    tiles = [t for t in route if t.backend == name]
    ranges = [Range(t.lo, t.hi, t.backend) for t in tiles]
    holds = lambda bs: any(r.holds(bs) for r in ranges)  # noqa: E731
    lengths = ({n for t in tiles for n in seq.lengths if t.len_lo <= n <= t.len_hi}
               | {seq.target(t.len_hi) for t in tiles})
    return [bs for bs in servable if holds(bs)], [bs for bs in tuned if holds(bs)], sorted(lengths)


def load(path: PathLike, model: nn.Module, device: Optional[Union[str, torch.device]] = None,
         trust_options: bool = False, trust_compiled: Optional[bool] = None) -> RoutedModule:
    """Rebuild only the routed backends of a checkpoint, and load its weights into ``model``.

    Everything is checked and built before ``model`` is touched: every field of the file
    (``pipeline.route.payload``), that each routed backend can run on the device (its precision, its
    packages), then the backends themselves, built on a copy of ``model`` that holds the file's own
    tensors. Only when all of that succeeded are the weights copied into ``model`` (its device and mode
    stay as they were), so a refused file, whatever refused it, leaves ``model`` exactly as it was. The
    returned module serves that copy, never ``model``: changing ``model`` later changes nothing served.
    Inductor options that can name a program or a path (``cpp.cxx``, ``*_dir``, any option whose
    declared type admits free text) are refused unless ``trust_options=True``: pass it only for a file
    whose every option you would put in your own config.

    Each backend is built for the batch sizes it owns up to the largest tuned size (a graph
    backend records only the sizes in its ranges, and its tuned sizes exactly, as capture did),
    then called once at each tuned size it owns so that compiles happen here and not in the first
    served call. ``load_seconds`` on the result says how long this took, ``load_report`` where the time went. A
    compile-worker pool the load started (Dynamo's Inductor backend starts one where it traces on a GPU machine) is
    ended as it returns (``pipeline.compile.pool``): a served process keeps nothing running for it.

    Compiled artifacts beside the file (``path.compiled``, ``pipeline.compile.artifacts``) run code when loaded, so
    they are used only when trusted: ``trust_compiled=None`` (the default) uses them where they are signed with
    this user's key, ``True`` also where they are not (and raises where they cannot be used), ``False`` never.
    Their checksum, versions, device and weights are checked first; a check that fails rebuilds the backends.
    """
    start = time.perf_counter()
    path, requested = Path(path), requested_device(device)
    payload = read(path)
    payload_check.check(payload, model, path, trust_options)
    dev = target_device(payload, requested, path)
    problem = payload_check.device_problem(payload, dev)
    if problem:
        raise CheckpointError(f"{path}: {problem}; nothing was loaded. Load it on a device that runs it, or re-tune "
                              f"here")
    too_big = limits.memory_problem(payload["inputs"], payload["max_batch_size"], dev)
    if too_big:
        raise CheckpointError(f"{path}: {too_big}; nothing was loaded. Load it where more memory is free, "
                              f"or re-tune with smaller model.batch_sizes")
    warn_on_drift(payload, dev)
    report = compiled.LoadReport(read_s=time.perf_counter() - start)
    installing = time.perf_counter()
    artifacts = usable_artifacts(payload, path, dev, trust_compiled, report)
    # what the load compiles or installs stays out of every other cache; a compile-worker pool it starts ends with it
    with contextlib.ExitStack() as stack:
        programs = installed(stack, payload, artifacts, path, dev, trust_compiled, report)
        report.artifacts_s = time.perf_counter() - installing
        stack.enter_context(compile_pool.none_left_behind())
        routed = rebuilt(payload, holding(model, payload["state_dict"]).eval().to(dev), dev, path, report, programs)
    with torch.no_grad():  # the last step, once everything else succeeded
        model.load_state_dict(payload["state_dict"])
    routed.load_seconds = report.total_s = time.perf_counter() - start
    routed.load_report = report
    log.info("%s", load_line(path, dev, routed, report))
    log.debug("load: where the time went: %s", report.summary())
    return routed


def load_line(path: Path, dev: torch.device, routed: RoutedModule, report: compiled.LoadReport) -> str:
    """The one line a load says: the route, the seconds, and whether the compiled artifacts were used or why not
    (with the way to trust them, where that is why)."""
    if report.artifacts == "used":
        artifacts = "used"
    elif report.artifacts.startswith(IGNORED):
        artifacts = f"not used, the backends were rebuilt: {report.artifacts[len(IGNORED):]}"
    else:
        artifacts = "none saved with it, the backends were rebuilt"
    programs = "".join(f"; {name}'s program built ahead of time {why.replace('not used', 'is not used', 1)}, it "
                       f"was traced" for name, why in report.aot.items())
    return (f"loaded {path} in {routed.load_seconds:.2f} s on {dev}, route {routed.extra_repr()}; compiled "
            f"artifacts {artifacts}{programs}")


def usable_artifacts(payload: Mapping[str, Any], path: Path, dev: torch.device, trust_compiled: Optional[bool],
                     report: compiled.LoadReport) -> Optional[compiled.Usable]:
    """The checkpoint's compiled artifacts where they may be used; else None, having said why in one line (or raise
    :class:`~pipeline.compile.artifacts.ArtifactsRefused` where the caller demanded them)."""
    record = payload.get("compiled")
    if record is None:
        if trust_compiled:
            raise compiled.ArtifactsRefused(f"{path} records no compiled artifacts (its route compiles nothing, or it "
                                            f"was saved without them); nothing was loaded. Load it with "
                                            f"trust_compiled=None to rebuild its backends")
        return None
    artifacts, why = compiled.usable(record, path, dev, payload["state_dict"], trust_compiled)
    if artifacts is None:
        unused(path, why, trust_compiled, report)
    return artifacts


def unused(path: Path, why: str, trust_compiled: Optional[bool], report: compiled.LoadReport) -> None:
    """The checkpoint's compiled artifacts are not used, for ``why``: said in the load's line, or raised as
    :class:`~pipeline.compile.artifacts.ArtifactsRefused` where the caller demanded them."""
    if trust_compiled:
        raise compiled.ArtifactsRefused(f"{path}: its compiled artifacts cannot be used: {why}; nothing was "
                                        f"loaded. Load it with trust_compiled=None to rebuild its backends")
    report.artifacts = f"{IGNORED}{why}"


def installed(stack: contextlib.ExitStack, payload: Mapping[str, Any], artifacts: Optional[compiled.Usable],
              path: Path, dev: torch.device, trust_compiled: Optional[bool], report: compiled.LoadReport
              ) -> Dict[str, Callable[[nn.Module], Any]]:
    """The load's own Inductor cache entered on ``stack`` (``pipeline.compile.artifacts.load_cache``), the trusted
    artifacts installed in it, and the programs built ahead of time the load uses (``ahead_programs``). Where the
    load's folder cannot take them (not private, full, not writable: ``pipeline.compile.loads``), nothing of them is
    used and the backends are rebuilt, as with any other reason the artifacts are unusable."""
    if artifacts is not None:
        attempt = contextlib.ExitStack()
        try:
            where = attempt.enter_context(compiled.load_cache(artifacts))
            programs = ahead_programs(payload, artifacts, where, dev, path, report)
            compiled.install(artifacts.contents, where, skip=programs)
        except OSError as exc:
            attempt.close()
            report.aot.clear()
            unused(path, loads.failure(exc, loads.root()), trust_compiled, report)
        else:
            stack.enter_context(attempt)
            report.artifacts = "used"
            return programs
    stack.enter_context(compiled.load_cache(None))
    return {}


def ahead_programs(payload: Mapping[str, Any], artifacts: compiled.Usable, where: Path, dev: torch.device,
                   path: Path, report: compiled.LoadReport) -> Dict[str, Callable[[nn.Module], Any]]:
    """Backend -> what builds its program ahead of time (``pipeline.compile.aot.loader_for``), for the trusted
    artifacts' packages that fit this machine, each as its signed manifest describes it; one made elsewhere, one
    whose manifest is not signed (written before manifests were) or differs from the checkpoint's claims, or one
    refused, leaves its backend traced."""
    claimed, programs = payload["compiled"].get("aot", {}), {}
    for name, data in artifacts.contents.aot.items():
        signed = artifacts.contents.manifests.get(name)
        why = ("its manifest is not under the signature (saved by an older tweakpipe; save it again to load it ahead "
               "of time)" if signed is None else
               claims_problem(signed, claimed[name], payload["inputs"], int(payload["max_batch_size"]))
               or mismatch(signed, dev))
        if not why:
            graph = payload["backends"][name].get("kind") == "graph"
            try:
                programs[name] = aot.loader_for(data, signed, where, dev, single_threaded=graph)
            except ValueError as exc:
                why = str(exc)
        if why:
            report.aot[name] = f"not used: {why}"
            log.debug("%s: %s's program built ahead of time is not used (%s); it is traced", path, name, why)
    return programs


def rebuilt(payload: Mapping[str, Any], own: nn.Module, dev: torch.device, path: Path,
            report: compiled.LoadReport, programs: Optional[Mapping[str, Callable[[nn.Module], Any]]] = None
            ) -> RoutedModule:
    """The routed module of a checked payload, its backends built and warmed on ``own`` (the model's copy); what
    each cost goes into ``report``."""
    inputs, tuned = payload["inputs"], [int(b) for b in payload["batch_sizes"]]
    output_dims = payload.get("output_batch_dims", {})  # absent from checkpoints written before batch dims
    seq_record = payload.get("seq")  # format 7, where lengths were tuned
    seq = SeqDims.of(inputs, seq_record["lengths"], seq_record["output_dims"]) if seq_record else SeqDims()
    route = ([Tile(int(t["len_lo"]), int(t["len_hi"]), int(t["lo"]), None if t["hi"] is None else int(t["hi"]),
                   t["backend"]) for t in payload["route"]] if seq else
             [Range(int(r["lo"]), None if r["hi"] is None else int(r["hi"]), r["backend"]) for r in payload["route"]])
    servable = range(1, int(payload["max_batch_size"]) + 1)
    built = {}
    for name in dict.fromkeys(r.backend for r in route):
        candidate = Candidate.stored(name, payload["backends"][name])
        owned, owned_tuned, lengths = owned_by(route, name, servable, tuned, seq)
        dims = BatchDims.of(inputs, output_dims, seq.with_lengths(lengths) if seq else None)
        record = payload.get("compiled") or {}
        stored = name in record.get("backends", []) or name in record.get("aot", {})
        entry = report.backends[name] = compiled.BackendLoad(artifacts=report.artifacts if stored else "none")
        spec = BuildSpec(own, make_inputs(inputs, max(owned), dev, SAMPLE_SEED), dev, owned, owned_tuned, dims)

        def warm(built: Backend, dims: BatchDims = dims, sizes: List[int] = owned_tuned, lengths: List[int] = lengths
                 ) -> None:
            """A call at each tuned size it owns (at each length), so that compiles happen here, not in the first
            served call."""
            for bs in sizes:
                one = make_inputs(inputs, bs, dev, SAMPLE_SEED)
                for call in [dims.seq.resized(one, n) for n in lengths] if lengths else [one]:
                    built(**call)

        before = aot.activity()
        for prebuilt in dict.fromkeys([(programs or {}).get(name), None]):  # ahead of time where it can, else traced
            backend = backend_registry.create(candidate)
            backend.prebuilt = prebuilt
            try:
                entry.warmup_s = build_and_warm(backend, spec, entry, warm)
                break
            except Exception as exc:  # noqa: BLE001 -- whatever failed, the caller's model was not touched
                first = (str(exc).strip().splitlines() or [""])[0][:500]
                if prebuilt is not None:
                    report.aot[name] = f"not used: its build failed ({type(exc).__name__}: {first})"
                    log.debug("%s: %s's program built ahead of time failed to build (%s: %s); it is traced", path, name,
                             type(exc).__name__, first)
                    continue
                raise CheckpointError(f"{path}: backend {name!r} could not be rebuilt on {dev} ({type(exc).__name__}: "
                                      f"{first}); nothing was loaded, your model is as it was. Re-tune on this "
                                      f"machine") from exc
        entry.program = ("ahead of time" if backend.prebuilt is not None else
                         "traced" if backend.candidate.compiles else
                         "exported" if backend.kind in aot.RUNTIME_FORMS else "none")
        entry.traced = aot.activity() != before
        built[name] = backend  # its artifacts on it (build_and_warm): a loaded module saves them again
    devices.synchronize(dev)
    return RoutedModule(built, route, TuneRecord(payload["name"], own, inputs, tuned, dev, api=True,
                                                 output_batch_dims=output_dims, seq=seq,
                                                 padded=list(seq_record["padded"]) if seq else []))
