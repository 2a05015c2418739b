"""Probe (issue 39, 2026-12-04): how much of a trusted CUDA load is Inductor's loader (its imports and its cache-key
hashes of torch's and Triton's sources), and how much of it a thread started with the load would hide behind the
checkpoint's read, hash and copy. Fresh processes, alternating the modes, each loading CHECKPOINT as
``bench/load.py``'s trusted way does (the tune's Inductor cache, the artifacts signed by this user):

- ``plain``: ``pipeline.load`` as shipped;
- ``preloaded``: the imports and hashes done before the load (``prep_s``), so ``load_s`` is the load without them;
- ``overlap``: a thread doing them starts as ``pipeline.load`` is called (``load_s`` includes whatever it did not hide);
- ``libs_first`` and ``libs_overlap``: the same with the device's libraries instead (cuDNN and cuBLAS loaded by a tiny
  convolution and matmul in fp32 and bf16: a profile of the load shows 1.1 s in its first convolutions);
- ``all_first``: both before the load (what the load costs without either).

    python bench/probes/overlap_probe.py RUNS/resnet50-cold/model.tweak CACHE_DIR ROUNDS [MODES] > OUT/overlap.json
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MODES = ("plain", "preloaded", "overlap")


def prep() -> float:
    """Import what loading a standalone Inductor program imports and compute Inductor's source keys: its seconds."""
    start = time.perf_counter()
    import torch._inductor.async_compile  # noqa: F401 -- what the generated program imports
    import torch._inductor.codecache as codecache
    import torch._inductor.select_algorithm  # noqa: F401
    import torch._inductor.standalone_compile  # noqa: F401 -- CompiledArtifact.load
    import torch.utils._triton as triton_utils

    codecache.torch_key()
    try:
        triton_utils.triton_hash_with_backend()
    except RuntimeError:  # no GPU driver (a CPU machine): Inductor's own call skips it the same way
        pass
    return time.perf_counter() - start


def libraries() -> float:
    """Load the device's convolution and matmul libraries with one tiny call of each in fp32 and bf16 (on a stream of
    its own): its seconds."""
    import torch

    start = time.perf_counter()
    device, stream = torch.device("cuda"), torch.cuda.Stream()
    with torch.cuda.stream(stream), torch.inference_mode():
        for dtype in (torch.float32, torch.bfloat16):
            x = torch.randn(1, 3, 16, 16, device=device, dtype=dtype).to(memory_format=torch.channels_last)
            w = torch.randn(8, 3, 3, 3, device=device, dtype=dtype).to(memory_format=torch.channels_last)
            torch.nn.functional.conv2d(x, w)
            a = torch.randn(16, 16, device=device, dtype=dtype)
            a @ a
    stream.synchronize()
    return time.perf_counter() - start


def child(checkpoint: Path, mode: str) -> None:
    sys.path.insert(0, str(ROOT))
    import pipeline
    from bench import load as bench_load

    figures = {"mode": mode}
    work = {"libs": libraries, "all": lambda: prep() + libraries()}.get(mode.split("_")[0], prep)
    if mode in ("preloaded", "libs_first", "all_first"):
        figures["prep_s"] = work()
    elif mode in ("overlap", "libs_overlap"):
        shipped = pipeline.load

        def load_with_thread(*args, **kwargs):
            done = {}
            thread = threading.Thread(target=lambda: done.update(thread_s=work()), daemon=True)
            thread.start()
            try:
                return shipped(*args, **kwargs)
            finally:
                thread.join()
                figures.update(done)

        pipeline.load = load_with_thread
    result = bench_load.load_once(checkpoint, None)
    figures.update(load_s=result["load_s"], outputs_ok=result["outputs_ok"],
                   traced=bench_load.traced(result), report=result["report"])
    print(json.dumps(figures, default=str))


def main() -> None:
    if sys.argv[1] == "--one":
        child(Path(sys.argv[2]), sys.argv[3])
        return
    checkpoint, cache, rounds = Path(sys.argv[1]).resolve(), sys.argv[2], int(sys.argv[3])
    modes = tuple(sys.argv[4].split(",")) if len(sys.argv) > 4 else MODES
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(Path(cache).resolve())}
    runs = []
    for i in range(rounds):
        for mode in (modes if i % 2 == 0 else modes[::-1]):
            proc = subprocess.run([sys.executable, __file__, "--one", str(checkpoint), mode], cwd=ROOT, env=env,
                                  capture_output=True, text=True)
            runs.append(json.loads(proc.stdout.strip().splitlines()[-1]) if proc.returncode == 0 else
                        {"mode": mode, "error": proc.stderr[-2000:]})
            print(mode, runs[-1].get("load_s"), runs[-1].get("prep_s", runs[-1].get("thread_s")),
                  runs[-1].get("error", "")[-300:], file=sys.stderr, flush=True)
    medians = {}
    for mode in modes:
        values = sorted(r["load_s"] for r in runs if r["mode"] == mode and "load_s" in r)
        medians[mode] = values[len(values) // 2] if values else None
    print(json.dumps({"checkpoint": checkpoint.parent.name, "median_load_s": medians, "runs": runs}, indent=1))


if __name__ == "__main__":
    main()
