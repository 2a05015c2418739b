"""Compiled artifacts beside a checkpoint (``FILE.tweak.compiled``): a fast load, under a trust the user controls.

Loading a checkpoint rebuilds its routed backends, and an Inductor backend compiles again. The artifacts
file holds, per routed backend, Inductor's cache entries for its programs (``torch.compiler``'s
"mega-cache": FX-graph and AOTAutograd entries with their Triton kernels, and autotuning results), as
building it produced or loaded them. ``load`` puts them into the local Inductor cache and builds the
backends as always: Dynamo traces, and every compile is a cache hit, so the program served is the one
that was timed, and nothing but the compile is skipped. CUDA graphs cannot be stored; they are
recorded again (the load report says how long that took).

Those entries are read with pickle and hold compiled code, so they run code when loaded: unlike the
checkpoint, they are used only when trusted (``pipeline.trust``): signed with this user's own key (what
the user built here is signed when it is written), or when the caller passes ``trust_compiled=True``.
Everything is checked before a byte is unpickled: the file's SHA-256 against the checkpoint's record
(which the checkpoint's own checksum covers), the signature, the torch / Triton / CUDA versions, the
device it was built for and the weights it was built with. A check that fails falls back to rebuilding
with one INFO line, or raises where the caller demanded the artifacts.

Layout::

    TWEAKPIPE-COMPILED 1\\n
    hmac-sha256:<64 hex digits, or "none">\\n
    <body: a JSON header line ({"backends": {name: byte length}, ...}), then each backend's bytes in order>
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import platform
import re
import tempfile
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, Dict, Iterator, Mapping, Optional, Tuple

import torch

from pipeline import disks, private, trust
from pipeline.compile import aot, loads
from pipeline.compile import cache as compile_cache
from pipeline.compile.cost import BuildCost
from pipeline.errors import CheckpointError

log = logging.getLogger(__name__)

MAGIC = b"TWEAKPIPE-COMPILED 1\n"
SUFFIX = ".compiled"
UNSIGNED = "none"
MAX_HEADER = 1 << 20  # bytes of JSON header a file may hold
HEX = set("0123456789abcdef")


class ArtifactsRefused(CheckpointError):
    """The caller demanded compiled artifacts (``trust_compiled=True``) and they cannot be used."""


def path_for(checkpoint: Path) -> Path:
    return Path(str(checkpoint) + SUFFIX)


@dataclass
class Recorded:
    """What one backend's build put into or took from Inductor's caches: the mega-cache's bytes, and the C++
    libraries Inductor built for the CPU (path in the cache directory -> bytes; the mega-cache leaves them out,
    and a clean machine would compile them again). Empty where nothing compiled."""

    data: bytes = b""
    files: Dict[str, bytes] = field(default_factory=dict)
    # Why these entries may hold code that is not this user's own (a shared cache, a remote one, artifacts trusted
    # unsigned at load: ``compile_cache.foreign_now``), or "": then they are written unsigned.
    foreign: str = ""

    def __bool__(self) -> bool:
        return bool(self.data)


@contextlib.contextmanager
def recorded(compiles: bool) -> Iterator[Recorded]:
    """Record the Inductor cache entries the block produces or loads (the mega-cache, cleared first), and the C++
    libraries it loads, where the block ``compiles`` with Inductor (otherwise nothing is recorded, and Inductor is
    not loaded for it). Recorded apart from what the process recorded before (the user's own, for their
    ``torch.compiler.save_cache_artifacts()``, where torch can keep it apart: a load records too), which is put
    back after."""
    holder = Recorded()
    manager = _artifact_manager() if compiles else None
    if manager is None:
        yield holder
        return
    fresh = getattr(manager, "with_fresh_cache", None)
    with fresh() if callable(fresh) else contextlib.nullcontext():
        manager.clear()
        libraries = _cpp_libraries()
        try:
            yield holder
        finally:
            saved = torch.compiler.save_cache_artifacts()
            holder.data = saved[0] if saved else b""
            holder.foreign = compile_cache.foreign_now() or ""
            holder.files = _library_files({k: v for k, v in _cpp_libraries().items() if k not in libraries})
            manager.clear()


def _cpp_libraries() -> Dict[str, Any]:
    """Inductor's C++ code caches in this process: key -> the loader of its library."""
    from torch._inductor import codecache

    kinds = [getattr(codecache, n, None) for n in ("CppCodeCache", "CppPythonBindingsCodeCache", "CppWrapperCodeCache")]
    return {f"{kind.__name__}:{key}": loader for kind in kinds if kind is not None
            for key, loader in getattr(kind, "cache", {}).items()}


def _library_files(loaders: Mapping[str, Any]) -> Dict[str, bytes]:
    """The files of loaded C++ libraries that lie in the Inductor cache directory, by their path there."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    root, files = Path(cache_dir()).resolve(), {}
    for loader in loaders.values():
        try:
            lib = loader()
        except Exception:  # noqa: BLE001 -- a library that did not build is not worth carrying
            continue
        name = getattr(lib, "__file__", None) or getattr(lib, "_name", None)
        path = Path(str(name)).resolve() if name else None
        if path is not None and path.is_file() and path.is_relative_to(root):
            files[path.relative_to(root).as_posix()] = path.read_bytes()
    return files


def _artifact_manager() -> Any:
    """torch's mega-cache recorder, where this torch has one."""
    if not hasattr(torch.compiler, "save_cache_artifacts"):
        return None
    try:
        from torch.compiler._cache import CacheArtifactManager
    except ImportError:
        return None
    return CacheArtifactManager


def version_of(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "none"


def built_for(device: torch.device) -> Dict[str, Any]:
    """What compiled code depends on: torch, Triton and CUDA versions, and the device (capability or CPU)."""
    info: Dict[str, Any] = {"torch": str(torch.__version__), "triton": version_of("triton"),
                            "cuda": str(torch.version.cuda), "device_type": device.type}
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        info.update(device_name=torch.cuda.get_device_name(device), capability=f"{major}.{minor}")
    else:
        info.update(device_name=cpu_model(), capability=cpu_features())
    return info


def _cpuinfo(field_name: str) -> str:
    """The first value of ``field_name`` in /proc/cpuinfo ('' where there is none: not Linux)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == field_name:
                    return value.strip()
    except OSError:
        pass
    return ""


def cpu_model() -> str:
    return _cpuinfo("model name") or platform.processor() or platform.machine()


def cpu_features() -> str:
    """A digest of the CPU's instruction-set flags: kernels compiled for one set may not run on another."""
    flags = " ".join(sorted(_cpuinfo("flags").split())) or platform.machine()
    return f"{platform.machine()}:{hashlib.sha256(flags.encode()).hexdigest()[:16]}"


def weights_digest(state_dict: Mapping[str, torch.Tensor]) -> str:
    """A digest of the weights (names, dtypes, shapes, bytes): artifacts are bound to the weights they were built
    with, for options that fold weights into compiled code (freezing)."""
    h = hashlib.blake2b(digest_size=32)
    for key in sorted(state_dict):
        t = state_dict[key].detach().cpu().contiguous()
        h.update(f"{key}|{t.dtype}|{tuple(t.shape)}|".encode())
        if t.numel():
            h.update(memoryview(t.reshape(-1).view(torch.uint8).numpy()))
    return h.hexdigest()


def write(checkpoint: Path, blobs: Mapping[str, Recorded], device: torch.device,
          state_dict: Mapping[str, torch.Tensor], packages: Optional[Mapping[str, Any]] = None
          ) -> Optional[Dict[str, Any]]:
    """Write the routed backends' artifacts beside ``checkpoint``; the record the checkpoint keeps of them, or None
    (and no file) where no backend compiled anything.

    They are signed with this user's key only where every entry came from this user's own sources (this process's
    compiles, the user's private cache, artifacts the user signed); otherwise, or where the key is refused, they
    are written unsigned, with one warning saying why and how to trust them. ``packages`` (backend ->
    ``pipeline.compile.manifest.Package``) are the routed programs built ahead of time, carried in the same file with
    their manifests (the inputs, sizes and weights each was built for, which its native code relies on) in the
    signed header: the copy the checkpoint keeps is only a claim (:func:`pipeline.compile.manifest.claims_problem`)."""
    blobs = {name: rec for name, rec in blobs.items() if rec}
    packages = dict(packages or {})
    target = path_for(checkpoint)
    if not blobs and not packages:
        target.unlink(missing_ok=True)  # an older file would not match this checkpoint
        return None
    files = {path: data for rec in blobs.values() for path, data in sorted(rec.files.items())}
    header = {"backends": {name: len(rec.data) for name, rec in blobs.items()},
              "files": {path: len(data) for path, data in files.items()},
              **({"aot": {name: len(p.data) for name, p in packages.items()},
                  "manifests": {name: p.manifest for name, p in packages.items()}} if packages else {})}
    body = (json.dumps(header).encode() + b"\n" + b"".join(rec.data for rec in blobs.values())
            + b"".join(files.values()) + b"".join(p.data for p in packages.values()))
    write_signed(target, body, unsigned_because([*blobs.values(), *packages.values()]))
    return {"sha256": hashlib.sha256(body).hexdigest(), "backends": sorted(blobs), "built_for": built_for(device),
            "weights": weights_digest(state_dict), "bytes": len(body),
            **({"aot": {name: p.manifest for name, p in packages.items()}} if packages else {})}


def unsigned_because(blobs: Any) -> str:
    """Why artifacts made of ``blobs`` may not be signed automatically ("" where they may)."""
    foreign = sorted({rec.foreign for rec in blobs if rec.foreign})
    if foreign:
        return f"their entries came from {' and '.join(foreign)}, which others can write"
    why = trust.problem(create=True)
    return f"your key is refused: {why}" if why else ""


def write_signed(target: Path, body: bytes, unsigned: str = "") -> None:
    """``target`` holding ``body``, signed with this user's key unless ``unsigned`` says why not (then a warning);
    atomic (``disks.write_atomic``)."""
    if unsigned:
        log.warning("%s is written unsigned: %s; `tweakpipe trust %s` signs it once you have checked that what "
                    "compiled it is yours", target.name, unsigned, str(target)[:-len(SUFFIX)])
    line = f"hmac-sha256:{UNSIGNED if unsigned else trust.signature(body)}\n".encode()
    disks.write_atomic(target, MAGIC + line + body, "compiled artifacts")


def _read(target: Path, expected_bytes: int) -> Tuple[str, bytes]:
    """The signature line and the body of an artifacts file; ValueError naming what is wrong."""
    if not target.is_file():
        raise ValueError(f"{target.name} is missing")
    size = target.stat().st_size
    if size > expected_bytes + 256:
        raise ValueError(f"{target.name} holds {size} bytes, more than the checkpoint records ({expected_bytes})")
    raw = target.read_bytes()
    if not raw.startswith(MAGIC):
        raise ValueError(f"{target.name} is not a tweakpipe artifacts file")
    rest = raw[len(MAGIC):]
    line, _, body = rest.partition(b"\n")
    if not line.startswith(b"hmac-sha256:"):
        raise ValueError(f"{target.name} has no signature line")
    return line[len(b"hmac-sha256:"):].decode(errors="replace"), body


# A carried library's path in the cache directory: a few plain components, nothing that climbs out of it.
SAFE_PATH = re.compile(r"[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+){0,3}")


@dataclass(frozen=True)
class Contents:
    """An artifacts file's parts, by backend (mega-cache bytes) and by library path."""

    backends: Dict[str, bytes]
    files: Dict[str, bytes]
    aot: Dict[str, bytes] = field(default_factory=dict)  # backend -> its program built ahead of time (a package)
    # backend -> its program's manifest as signed (absent from files written before manifests were signed)
    manifests: Dict[str, Dict[str, Any]] = field(default_factory=dict)


def _contents(body: bytes, backends: Any, ahead: Any = ()) -> Contents:
    """The parts of a body whose header must name exactly the recorded backends (and programs built ahead of time)
    and describe every byte."""
    head, _, blob = body.partition(b"\n")
    if len(head) > MAX_HEADER:
        raise ValueError("its header is too long")
    header = json.loads(head)
    if not isinstance(header, dict) or set(header) - {"manifests"} != {"backends", "files", *(("aot",) if ahead else ())}:
        raise ValueError("its header does not describe its contents")
    lengths, files, programs = header["backends"], header["files"], header.get("aot", {})
    manifests = header.get("manifests", {})
    if not (isinstance(manifests, dict) and set(manifests) <= set(programs)):
        raise ValueError("its header holds manifests of programs it does not carry")
    wrong = next((f"{n}: {why}" for n, m in manifests.items() if (why := aot.manifest_problem(m))), None)
    if wrong:
        raise ValueError(f"its header holds a manifest this format does not allow ({wrong})")
    sizes = ([*lengths.values(), *files.values(), *programs.values()]
             if all(isinstance(x, dict) for x in (lengths, files, programs)) else [None])
    if (not isinstance(lengths, dict) or sorted(lengths) != sorted(backends) or not isinstance(files, dict)
            or not isinstance(programs, dict) or sorted(programs) != sorted(ahead)
            or not all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in sizes)
            or sum(sizes) != len(blob)):
        raise ValueError("its header does not describe its contents")
    unsafe = [p for p in files if not (isinstance(p, str) and SAFE_PATH.fullmatch(p) and ".." not in p.split("/"))]
    if unsafe:
        raise ValueError(f"it names files outside the cache directory: {unsafe[:3]}")
    parts, start = [], 0
    for length in sizes:
        parts.append(blob[start:start + length])
        start += length
    cut = len(lengths) + len(files)
    return Contents(dict(zip(lengths, parts[:len(lengths)])), dict(zip(files, parts[len(lengths):cut])),
                    dict(zip(programs, parts[cut:])), manifests)


@dataclass(frozen=True)
class Usable:
    """An artifacts file that passed every check: its contents, and why its code is not vouched for by this
    user's own signature ("" where it is: then loading it is the user's own code, else the caller's trust)."""

    contents: Contents
    digest: str
    foreign: str = ""


def usable(record: Mapping[str, Any], checkpoint: Path, device: torch.device, state_dict: Mapping[str, torch.Tensor],
           trust_compiled: Optional[bool]) -> Tuple[Optional[Usable], str]:
    """The artifacts, or None and why not; nothing in them is unpickled or written here.

    ``trust_compiled``: None uses artifacts signed with this user's key; True also unsigned or foreign ones;
    False never. The checksum, versions, device and weights are checked in every case."""
    if trust_compiled is False:
        return None, "not used (trust_compiled=False)"
    target = path_for(checkpoint)
    try:
        signature, body = _read(target, int(record["bytes"]))
    except ValueError as exc:
        return None, str(exc)
    if hashlib.sha256(body).hexdigest() != record["sha256"]:
        return None, f"{target.name} changed after the checkpoint was written (its SHA-256 does not match the record)"
    signed, key_why = trust.signed_by_user(body, signature)
    if trust_compiled is None and not signed:
        how = "unsigned" if signature == UNSIGNED else "not signed with your key" + (f" ({key_why})" if key_why else "")
        return None, (f"{target.name} is {how}; it runs code when loaded, so it is used only once you trust it: "
                      f"`tweakpipe trust {checkpoint}` (after checking where it came from) or "
                      f"pipeline.load(..., trust_compiled=True)")
    here = built_for(device)
    differ = [f"{k} {record['built_for'].get(k)!r} (here {v!r})" for k, v in here.items()
              if record["built_for"].get(k) != v]
    if differ:
        return None, f"{target.name} was built for another setup: " + ", ".join(differ)
    if weights_digest(state_dict) != record["weights"]:
        return None, f"{target.name} was built with other weights than the checkpoint holds"
    try:
        contents = _contents(body, record["backends"], record.get("aot", {}))
    except (ValueError, UnicodeDecodeError) as exc:
        return None, f"{target.name} is damaged: {exc}"
    foreign = "" if signed else f"the artifacts of {checkpoint.name}, trusted with trust_compiled=True but not signed with your key"
    return Usable(contents, record["sha256"], foreign), ""


@contextlib.contextmanager
def load_cache(artifacts: Optional[Usable]) -> Iterator[Path]:
    """The Inductor cache a load compiles in and installs its artifacts into, for the block: never the cache other
    loads and tunes read, so code a load brings does not outlive it there.

    With artifacts, a fresh folder of the load's own under tweakpipe's private ``loads/``
    (:func:`pipeline.compile.loads.fresh`, which raises where that folder is not private or cannot be made: the
    caller rebuilds without the artifacts); without, Inductor's usual cache where it is private to this user, else a
    temporary one (a cold compile, said in one line). Triton's cache follows Inductor's."""
    with contextlib.ExitStack() as stack:
        if artifacts is not None:
            where = stack.enter_context(loads.fresh(artifacts.digest[:16]))
        else:
            where = compile_cache.ambient_directory()
            why = private.problem(where, "Inductor's cache directory")
            if why:
                log.info("load: %s, so this load compiles in a temporary cache", why)
                where = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="tweakpipe-load-")))
        saved = os.environ.get("TRITON_CACHE_DIR")
        if saved is not None:
            os.environ["TRITON_CACHE_DIR"] = str(where / "triton")
        try:
            with compile_cache.active({"dir": str(where), "enabled": True},
                                      foreign=artifacts.foreign if artifacts is not None else None):
                yield where
        finally:
            if saved is not None:
                os.environ["TRITON_CACHE_DIR"] = saved


def install(contents: Contents, root: Path, skip: Any = ()) -> None:
    """Put trusted artifacts into the load's own Inductor cache, ``root`` (its fresh folder, :func:`load_cache`): the
    libraries it carries, each a new file that follows no link (their paths were checked by :func:`usable` first),
    then the backends' mega-cache entries, unpickled. Backends in ``skip`` (those served by programs built ahead of
    time) need none of it: where that is all of them, nothing is installed and Inductor is not even imported."""
    wanted = [data for name, data in contents.backends.items() if name not in skip]
    if not wanted:
        return
    for relative, data in contents.files.items():
        loads.create(root / relative, data)
    for data in wanted:
        torch.compiler.load_cache_artifacts(data)


def sign(checkpoint: Path, record: Optional[Mapping[str, Any]]) -> Path:
    """Sign the artifacts beside ``checkpoint`` with this user's key, after checking they are the ones its
    ``compiled`` record names (the checkpoint's verified payload: ``pipeline.route.checkpoint.sign``)."""
    if not record:
        raise ValueError("the checkpoint records no compiled artifacts (its routed backends compile nothing, or it "
                         "was written without them)")
    target = path_for(checkpoint)
    _, body = _read(target, int(record["bytes"]))
    if hashlib.sha256(body).hexdigest() != record["sha256"]:
        raise ValueError(f"{target.name} is not the file the checkpoint records (SHA-256 differs); nothing was signed")
    write_signed(target, body)
    return target


def record_problem(record: Any) -> Optional[str]:
    """Why a checkpoint's ``compiled`` record is not one this format allows, or None (the payload check)."""
    keys = {"sha256", "backends", "built_for", "weights", "bytes"}
    if not isinstance(record, dict) or set(record) - {"aot"} != keys:
        return "compiled must hold exactly sha256, backends, built_for, weights and bytes (and aot)"
    ahead = record.get("aot", {})
    if not (isinstance(ahead, dict) and all(isinstance(n, str) for n in ahead)):
        return "compiled.aot must map backend names to their programs' manifests"
    problem = next((f"compiled.aot.{n}: {why}" for n, m in ahead.items() if (why := aot.manifest_problem(m))), None)
    if problem:
        return problem
    if not (isinstance(record["sha256"], str) and len(record["sha256"]) == 64 and set(record["sha256"]) <= HEX):
        return "compiled.sha256 must be 64 hex digits"
    if not (isinstance(record["weights"], str) and len(record["weights"]) == 64 and set(record["weights"]) <= HEX):
        return "compiled.weights must be 64 hex digits"
    if not (isinstance(record["backends"], list) and (record["backends"] or ahead)
            and all(isinstance(n, str) for n in record["backends"])):  # empty where every program is ahead of time
        return "compiled.backends must list backend names"
    if not (isinstance(record["built_for"], dict) and all(isinstance(k, str) and isinstance(v, str)
                                                          for k, v in record["built_for"].items())):
        return "compiled.built_for must map names to strings"
    if isinstance(record["bytes"], bool) or not isinstance(record["bytes"], int) or not 0 < record["bytes"] <= 1 << 34:
        return "compiled.bytes must be a positive size up to 16 GiB"
    return None


@dataclass
class BackendLoad(BuildCost):
    """What rebuilding one backend cost at load: its build (:class:`~pipeline.compile.cost.BuildCost`), its
    warm-up calls, and whether its artifacts were used."""

    artifacts: str = "none"  # used | ignored: <why> | none (it compiles nothing)
    warmup_s: float = 0.0
    # ahead of time (saved, loaded: pipeline.compile.aot) | traced | exported (a runtime's model built again) | none
    program: str = "none"
    traced: bool = False  # whether Dynamo traced or Inductor compiled anything while it was built and warmed


@dataclass
class LoadReport:
    """``served.load_report``: reading and checking the files, installing artifacts, then each backend."""

    read_s: float = 0.0
    artifacts_s: float = 0.0
    artifacts: str = "none"
    backends: Dict[str, BackendLoad] = field(default_factory=dict)
    aot: Dict[str, str] = field(default_factory=dict)  # backend -> why its program built ahead of time went unused
    total_s: float = 0.0

    def to_dict(self) -> Dict[str, Any]:
        from dataclasses import asdict

        return asdict(self)

    def summary(self) -> str:
        parts = [f"{name}: {b.program} program, build {b.build_s:.2f} s (trace {b.trace_s:.2f}, compile "
                 f"{b.compile_s:.2f}, first calls {b.first_calls_s:.2f}, record {b.record_s:.2f}, {b.cache_hits} "
                 f"hit(s) {b.cache_misses} miss(es)), warm-up {b.warmup_s:.2f} s" for name, b in self.backends.items()]
        return (f"read {self.read_s:.2f} s, artifacts {self.artifacts} ({self.artifacts_s:.2f} s); "
                + "; ".join(parts))
