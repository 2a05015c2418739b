"""Probe (issue 56, after call AQ of 2026-12-05): DistilBERT's masked-LM at batch 256 on the H100 - every graph
candidate ran out of device memory, also after the compile workers stopped, with 76.6 GiB allocated by the run's own
process (21.2 GiB of it in private pools). Which code holds that memory? PyTorch's allocator history is recorded
through capture; at the first out-of-memory failure in capture, and again when capture ends, the live blocks are
summed by the first frame of tweakpipe's (or, failing that, any) code that allocated them, and by pool. Arguments:
more overrides.

Run on the GPU host from the repository root: ``python bench/probes/device_memory_probe.py``."""
import collections
import pathlib
import sys
import tempfile

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))
from bench.suite import SUITE  # noqa: E402
from pipeline.api import compose_config  # noqa: E402
from pipeline.runner import run  # noqa: E402
import stages.capture as capture  # noqa: E402

OURS = ("/pipeline/", "/stages/", "/bench/")


def site(frames):
    for f in frames:
        if any(p in f["filename"] for p in OURS):
            return f"{f['filename'].split('/')[-2]}/{f['filename'].split('/')[-1]}:{f['line']} {f['name']}"
    f = frames[0] if frames else {"filename": "?", "line": 0, "name": "?"}
    return f"{f['filename'].split('/')[-1]}:{f['line']} {f['name']}"


def report(when):
    snap = torch.cuda.memory._snapshot()
    by_site, by_pool = collections.Counter(), collections.Counter()
    for seg in snap["segments"]:
        pool = str(seg.get("segment_pool_id", (0, 0)))
        for block in seg["blocks"]:
            if block["state"] == "active_allocated":
                by_site[site(block.get("frames", []))] += block["size"]
                by_pool[pool] += block["size"]
    total = sum(by_site.values())
    print(f"\n== {when}: {total / 2**30:.1f} GiB live in this process; "
          f"reserved {torch.cuda.memory_reserved() / 2**30:.1f} GiB", flush=True)
    for s, b in by_site.most_common(14):
        print(f"  {b / 2**30:6.2f} GiB  {s}")
    print("  by pool:", {p: round(b / 2**30, 2) for p, b in by_pool.most_common(8)}, flush=True)


real_one, seen = capture.capture_one, []


def watched(ctx, backend, references):
    out = real_one(ctx, backend, references)
    print(f"-- {backend.name}: {out.status} {out.reason[:80]}; allocated "
          f"{torch.cuda.memory_allocated() / 2**30:.1f} GiB", flush=True)
    if out.status == "failed" and "OutOfMemoryError" in out.reason and not seen:
        seen.append(1)
        report(f"first out-of-memory ({backend.name})")
    return out


capture.capture_one = watched
entry = SUITE["DistilBertForMaskedLM"]
torch.cuda.memory._record_memory_history(max_entries=200000)
overrides = [*entry.overrides, "device=cuda", "profile=quick", "precision=[bf16]", "model.batch_sizes=[1,256]",
             "backends=gpu", "stages=[capture]", "tracking=off", *sys.argv[1:]]
ctx = run(compose_config(overrides), pathlib.Path(tempfile.mkdtemp(prefix="mem-probe-")))
report("capture ended")
