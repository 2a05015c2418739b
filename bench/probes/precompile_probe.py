"""Probe (issue 39): does torch's caching precompile (TORCH_CACHING_PRECOMPILE=1) let the reference peer,
torch.compile(mode="reduce-overhead"), start in a fresh process without a Dynamo trace, from the mega-cache bytes alone?
    python bench/probes/precompile_probe.py save|load PATH  (the env: precompile on/off, the Inductor cache dir)"""
import os, sys, time
mode, path = sys.argv[1], sys.argv[2]
t_import = time.perf_counter()
import torch, torchvision
from torch._dynamo.utils import counters
print("import", round(time.perf_counter() - t_import, 2), "precompile", torch._dynamo.config.caching_precompile, flush=True)
torch.manual_seed(0)
m = torchvision.models.resnet50().eval().cuda().to(torch.bfloat16)
x = torch.randn(64, 3, 224, 224, device="cuda", dtype=torch.bfloat16)
t0 = time.perf_counter()
if mode == "load":
    t = time.perf_counter(); info = torch.compiler.load_cache_artifacts(open(path, "rb").read())
    print("load_cache_artifacts", round(time.perf_counter() - t, 2), info, flush=True)
c = torch.compile(m, mode="reduce-overhead")
with torch.inference_mode():
    t = time.perf_counter(); y = c(x); torch.cuda.synchronize(); first = time.perf_counter() - t
    for bs in (8, 64, 64, 64):
        y = c(x[:bs])
    torch.cuda.synchronize()
    ref = m(x)
print(mode, "to ready", round(time.perf_counter() - t0, 2), "first call", round(first, 2), "frames", dict(counters["frames"]),
      "stats", dict(counters["stats"]), "inductor", dict(counters["inductor"]),
      "max err", (y.float() - ref.float()).abs().max().item(), flush=True)
try:
    from torch._dynamo.utils import compile_times
    print(compile_times(repr="str")[:1500])
except Exception as e:
    print("compile_times", e)
if mode == "save":
    art = torch.compiler.save_cache_artifacts(); open(path, "wb").write(art[0]); print("saved", len(art[0]), art[1])
