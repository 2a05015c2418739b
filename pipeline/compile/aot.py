"""Routed programs saved ahead of time: which form each backend takes, and whether it holds up against its own.

A checkpoint's mega-cache artifacts (``pipeline.compile.artifacts``) spare a load Inductor's compile, but Dynamo
still traces every program and Inductor still loads (seconds, on every replica's start); an ONNX Runtime or OpenVINO
backend exports and compiles its model again. Here, at save time and once per routed program, the backend's program
is saved in its form (``pipeline.compile.forms``: the interface; an AOTInductor package for CPU Inductor programs,
``aoti``; an Inductor standalone program for CUDA ones, ``standalone``; the runtime's own model for ONNX Runtime and
OpenVINO, ``runtimes``), loaded back here and held to the program it replaces (:func:`package_for`): the same outputs
and no slower, else the backend keeps its own. A load (``pipeline.route.checkpoint``) then builds the backend from
the saved program, with no trace and no compile, where the signed artifacts carry it and every check passes.

A saved program is code, or a runtime's input: it is used only where the artifacts file that carries it is trusted
(signed with the user's key, or ``trust_compiled=True``), after every check, and it trusts its inputs, so its
manifest is signed too and every call's inputs are checked against it (``pipeline.compile.manifest``).
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import torch
from torch import nn

from pipeline import devices
from pipeline.compile.aoti import AotiPackage
from pipeline.compile.cost import Stopwatch
from pipeline.compile.forms import Form, reason
from pipeline.compile.manifest import Loaded, Package, common_problem
from pipeline.compile.runtimes import OnnxModel, OpenVinoModel
from pipeline.compile.standalone import STANDALONE
from pipeline.models import make_inputs

AOTI = AotiPackage()
FORMS: Dict[str, Form] = {form.name: form for form in (AOTI, STANDALONE, OnnxModel(), OpenVinoModel())}
RUNTIME_FORMS = {form.kind: form for form in FORMS.values() if isinstance(form, (OnnxModel, OpenVinoModel))}


def inductor_form(device: torch.device) -> Optional[Form]:
    """The form of an Inductor program for ``device`` (None where it has none): the AOTInductor package on the CPU
    (it loads without importing Inductor), the standalone program on CUDA (torch 2.11's AOTInductor runtime faults
    there)."""
    return {"cpu": AOTI, "cuda": STANDALONE}.get(torch.device(device).type)


def form_for(backend: Any) -> Optional[Form]:
    """The form ``backend``'s program is saved in (None where it has none): its runtime's model for an ONNX Runtime
    or OpenVINO backend, else its device's Inductor form."""
    return RUNTIME_FORMS.get(backend.kind) or inductor_form(backend.device)


def why_not(backend: Any, form: Optional[Form] = None) -> str:
    """Why ``backend``'s program cannot be saved ahead of time ("" where it can), in ``form`` (its own where not
    given: :func:`form_for`)."""
    form = form or form_for(backend)
    if form is None:
        return f"programs for {backend.device.type} have no ahead-of-time form here (CPU and CUDA have)"
    return reason(form, backend)


def manifest_problem(manifest: Any) -> Optional[str]:
    """Why a program's manifest (from a checkpoint or an artifacts file, so anyone's) is not one its form allows,
    or None."""
    return common_problem(manifest, list(FORMS)) or FORMS[manifest["format"]].problem(manifest)


def loader_for(data: bytes, manifest: Mapping[str, Any], where: Path, device: torch.device,
               single_threaded: bool) -> Callable[[nn.Module], Loaded]:
    """What builds the backend's program from its module at load, in the manifest's form (``Form.loader``)."""
    return FORMS[manifest["format"]].loader(data, manifest, where, device, single_threaded)


# Rounds of the comparison at save time, and how much slower than the backend's own program a saved one may be at a
# tuned size before the backend keeps its own (a faster load never buys a slower route).
ROUNDS = 21
SLACK = 0.05
# ... and by more than this much a call (ms): below it two timings of one host cannot tell programs apart (a tiny MLP's
# 0.027 against 0.028 ms read as 11% slower on a busy CI host, and its route kept rebuilding at every load)
NOISE_MS = 0.005


def median(values: Sequence[float]) -> float:
    return sorted(values)[len(values) // 2]


def _timed(fn: Callable[[], Any], device: torch.device, times: list) -> None:
    devices.synchronize(device)
    start = time.perf_counter()
    fn()
    devices.synchronize(device)
    times.append((time.perf_counter() - start) * 1e3)


def package_for(backend: Any, spec: Mapping[str, Any], sizes: Sequence[int], largest: int) -> Tuple[Optional[Package], Dict]:
    """``backend``'s program ahead of time, or None, and why: built in its form, loaded here, and held to the
    program it replaces (the backend as built) at each tuned size ``sizes`` it serves (``spec``: the inputs' spec):
    the same outputs (within its precision's tolerance) and no slower beyond SLACK (and NOISE_MS a call), by the
    median over interleaved rounds of each round's ratio (``ratio`` in the report), else the backend keeps its own. A
    form that is the backend's very program serialised (``Form.same_program``) is held to its outputs only."""
    from pipeline.measure.compare import judge

    form = form_for(backend)
    why = why_not(backend, form)
    if why:
        return None, {"used": False, "why": why}
    device, own = backend.device, backend.own_program()
    with scratch() as tmp:
        attempt = Stopwatch()
        try:
            package = form.build(backend, make_inputs(spec, 2, device, 0), largest, Path(tmp))
            program = form.loader(package.data, package.manifest, Path(tmp), device, False)(backend.module)
        except Exception as exc:  # noqa: BLE001 -- export, AOTInductor or the runtime cannot take it: it keeps its own
            first = (str(exc).strip().splitlines() or [""])[0][:300]
            return None, {"build_s": round(attempt.seconds, 3), "used": False,  # the attempt's cost too
                          "why": f"it could not be built ahead of time ({type(exc).__name__}: {first})"}
        report: Dict[str, Any] = {"build_s": round(package.build_s, 3), "aot_ms": {}, "traced_ms": {}}
        ratios: Dict[int, float] = {}
        with torch.inference_mode(), backend.autocast():
            for bs in sorted({1, *sizes}):  # batch 1 too: a size a dynamic program may treat apart
                inputs = make_inputs(spec, bs, device, 1)
                verdict = judge(program(**inputs), own(**inputs), backend.candidate.compute_dtype)
                if not verdict.ok:
                    return None, {**report, "used": False, "why": f"its outputs differ at batch {bs}: {verdict.reason}"}
                if bs not in sizes or form.same_program:
                    continue
                times: Dict[str, list] = {"aot": [], "traced": []}
                for i in range(ROUNDS):
                    for name in (("aot", "traced") if i % 2 else ("traced", "aot")):
                        _timed(lambda: (program if name == "aot" else own)(**inputs), device, times[name])
                for name, values in times.items():
                    report[f"{name}_ms"][bs] = round(median(values), 4)
                # paired: each round's two calls ran back to back, so a busy moment slows both, not one median
                ratios[bs] = median([a / t for a, t in zip(times["aot"], times["traced"])])
        if form.same_program:
            return package, {"build_s": report["build_s"], "used": True, "why": "",
                             "timed": "no: it is the program the profile timed"}
        report["ratio"] = {bs: round(r, 4) for bs, r in ratios.items()}
        slower = slower_at(ratios, report["traced_ms"])
        if slower:
            return None, {**report, "used": False, "why": f"it is slower than the program it replaces at batch {slower}"}
        return package, {**report, "used": True, "why": ""}


def slower_at(ratios: Mapping[int, float], traced_ms: Mapping[int, float]) -> List[int]:
    """The sizes where a saved program is slower than the one it replaces: its paired ratio beyond ``1 + SLACK`` and
    the time it adds a call beyond ``NOISE_MS``."""
    return [bs for bs, ratio in ratios.items() if ratio > 1 + SLACK and (ratio - 1) * traced_ms[bs] > NOISE_MS]


def activity() -> Dict[str, int]:
    """Dynamo's frames and Inductor's cache lookups so far (zeros while neither was imported): a load that
    differs in none of them traced and compiled nothing."""
    if "torch._dynamo.utils" not in sys.modules:
        return {"frames": 0, "compiles": 0}
    from torch._dynamo.utils import counters

    return {"frames": int(counters["frames"]["total"]),
            "compiles": int(counters["inductor"]["fxgraph_cache_hit"] + counters["inductor"]["fxgraph_cache_miss"])}


def scratch() -> tempfile.TemporaryDirectory:
    """A private directory for one build's program (removed after)."""
    return tempfile.TemporaryDirectory(prefix="tweakpipe-aot-")
