"""A compile worker process: this module run as ``__main__`` with ``SETUP RESULTS_FD PARENT_PID`` (:func:`command`).

Started by :mod:`pipeline.compile.ahead` through tweakpipe's own entry point, never through
multiprocessing's ``spawn`` or ``forkserver``, which import the parent's ``__main__`` in every child: a
user's script that calls ``pipeline.tune`` at top level (no ``if __name__ == "__main__":``) would run again
in each worker. Nor through ``python -m``, which puts the current directory first on ``sys.path``: run from a
folder others can write (``/tmp``), a ``json.py`` planted there would run inside the worker. The worker imports
from exactly the run's own ``sys.path`` (:data:`BOOT`). Here the worker's ``__main__`` is this module; it reads the run's setup file (the build spec,
the inputs at every tuned cell, the cache settings, the run's process state: ``compile.state``), then compiles one job per line of its standard input (a
JSON object: the candidate's name and settings), built and warmed as capture will (``pipeline.compile.build``;
a graph candidate's standalone program by its Inductor side alone, no graphs recorded), and answers each with one
JSON line on the file descriptor ``RESULTS_FD``: the seconds and cache counts and the device memory it still holds
once the candidate is dropped, or the error.

It dies with its run: the kernel sends it SIGKILL when the run's process ends (Linux's
``PR_SET_PDEATHSIG``), a thread watches ``PARENT_PID`` where that is missing, and an end of standard input
ends it too. SIGINT is ignored: a Ctrl-C in the terminal stops the run, and the run stops its workers.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import sys
import threading
import time
import traceback
from dataclasses import replace
from pathlib import Path
from typing import Any, Dict, List, Optional

PR_SET_PDEATHSIG = 1
PARENT_POLL_S = 1.0

# What the worker's interpreter runs first (``python -c BOOT PATH ...``), before it imports anything that is not
# built in: it drops the entry ``-c`` puts first on Python 3.10 (the current directory; 3.11's ``-P`` adds none),
# sets ``sys.path`` to the run's own (a JSON list: the user's script's folder where the run is a script, and no
# folder the run did not import from), then runs this module as ``__main__``.
BOOT = ("import sys\n"
        "if not getattr(sys.flags, 'safe_path', False): del sys.path[0]\n"
        "import json, runpy\n"
        "sys.path[:] = json.loads(sys.argv.pop(1))\n"
        "runpy.run_module('pipeline.compile.worker', run_name='__main__', alter_sys=True)\n")


def command(*args: str) -> List[str]:
    """The command line that starts a worker with ``args``: this interpreter with the run's own interpreter flags
    (isolated, no user site, no environment, where the run has them), never the current directory's modules
    (``-P`` where Python has it, :data:`BOOT` else), and the run's ``sys.path``."""
    flags = [flag for flag, on in (("-I", sys.flags.isolated), ("-s", sys.flags.no_user_site and not sys.flags.isolated),
                                   ("-E", sys.flags.ignore_environment and not sys.flags.isolated),
                                   ("-P", sys.version_info >= (3, 11))) if on]
    return [sys.executable, *flags, "-c", BOOT, json.dumps(sys.path), *args]


def die_with_parent(parent: int) -> None:
    """End this process when ``parent`` ends: at once through the kernel where it can (Linux), else within
    PARENT_POLL_S seconds (a thread polling the parent's pid)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:  # the parent ended before the kernel was told
        os._exit(1)

    def watch() -> None:
        while True:
            time.sleep(PARENT_POLL_S)
            if os.getppid() != parent:
                os._exit(1)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def start(setup_path: str) -> Dict[str, Any]:
    """The worker's state: the run's caches first, then the build spec and the tuned cells' inputs, on the run's
    device."""
    import torch

    setup = torch.load(setup_path, map_location="cpu", weights_only=False)  # written by this run a moment ago
    from pipeline.compile import standalone
    from pipeline.compile import cache as compile_cache
    from pipeline.compile import state as process_state

    process_state.put(setup["state"])  # the run's Inductor options and precision switches (same cache keys)
    compile_cache.apply(setup["cache"])  # for the worker's life (the remote's guard, the private directory)
    spec = setup["spec"]
    if setup["threads"]:
        torch.set_num_threads(setup["threads"])
    on = lambda inputs: {n: t.to(spec.device) for n, t in inputs.items()}  # noqa: E731
    return {"spec": replace(spec, model=spec.model.eval().to(spec.device), sample=on(spec.sample)),
            "cells": [on(cell) for cell in setup["cells"].values()],
            "standalone": standalone.standalone_wanted(setup["cache"].get("standalone"), spec.device),
            "directory": Path(setup_path).parent}


def program_builder(backend: Any) -> Any:
    """The backend a worker builds for a standalone program: a graph backend's Inductor side alone. That program
    serves every size, so recording the graph backend's device graphs in the worker compiled nothing more and only
    repeated, beside capture and the references' autotuning, the device work capture does again in its own process
    (cuDNN's plans at each of 36 recorded sizes: mobilenetv3's graph job took 72 s warm on an H100)."""
    return getattr(backend, "inductor_part", None) or backend


def compile_one(state: Dict[str, Any], name: str, settings: Dict[str, Any]) -> Dict[str, Any]:
    """Build the candidate as capture will and call it at every tuned cell: its programs enter the cache. With
    ``compile_cache.standalone``, its program is built in the standalone form where it has one (a graph candidate's
    by its Inductor side alone: :func:`program_builder`), and sent back (capture loads it instead of tracing)."""
    from pipeline import backends
    from pipeline.backends.candidate import Candidate
    from pipeline.compile import cache as compile_cache
    from pipeline.compile import standalone
    from pipeline.compile.build import build_and_warm
    from pipeline.compile.cost import BuildCost, Stopwatch

    watch, counted, spec, candidate = Stopwatch(), BuildCost(), state["spec"], Candidate.stored(name, settings)
    backend, built = backends.create(candidate), []
    unfit = standalone.standalone_unfit(backend, bool(spec.dims.seq)) if state["standalone"] else "off"
    if not unfit:
        backend = program_builder(backend)
        backend.prebuilt = standalone.compiled_here(backend, spec.sample, state["directory"], built.append)
    warm = lambda backend: [backend(**cell) for cell in state["cells"]]  # noqa: E731
    before = compile_cache.counts()
    try:
        build_and_warm(backend, spec, counted, warm)
    except Exception as exc:  # noqa: BLE001 -- no standalone program (a graph break, say): the traced one, as ever
        if backend.prebuilt is None:
            raise
        unfit, built = f"its standalone build failed ({type(exc).__name__}: {str(exc).strip()[:300]})", []
        counted = BuildCost()
        build_and_warm(backends.create(candidate), spec, counted, warm)
    # the programs it compiled: a standalone one's compile is AOTAutograd's cache miss, a traced one's the FX graph's
    compiled = compile_cache.counts()["autograd_misses"] - before["autograd_misses"] if built else counted.cache_misses
    return {"seconds": watch.seconds, "cache_hits": counted.cache_hits, "cache_misses": counted.cache_misses,
            "compiled": int(compiled),
            **({"standalone": standalone.answer_of(built[0])} if built else {}),
            **({"standalone_unfit": unfit} if state["standalone"] and unfit else {})}


def main(argv: Optional[List[str]] = None) -> int:
    from pipeline import devices

    setup_path, results_fd, parent = (argv or sys.argv[1:])[:3]
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    die_with_parent(int(parent))
    results = os.fdopen(int(results_fd), "w", buffering=1)
    state = start(setup_path)
    results.write(json.dumps({"ready": True}) + "\n")
    for line in sys.stdin:
        job = json.loads(line)
        try:
            answer = {"name": job["name"], **compile_one(state, job["name"], job["cfg"])}
        except Exception as exc:  # noqa: BLE001 -- the run compiles this candidate itself
            answer = {"name": job["name"], "error": f"{type(exc).__name__}: {str(exc).strip()[:500]}",
                      "traceback": traceback.format_exc()[-4000:]}
        # the candidate is dropped: its programs are in the cache; its weights, graphs and outputs go back
        answer["reserved_after_bytes"] = devices.release_memory(state["spec"].device)
        results.write(json.dumps(answer) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
