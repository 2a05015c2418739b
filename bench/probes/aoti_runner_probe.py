# Issue 39 probe: torch 2.11's package loader segfaulted on CUDA packages; does the container runner, given the
# package's extracted library and its kernels' directory, load and run without it? On the H200 with torch 2.11 it
# faulted too (bench/results/raw/2026-12-03/aot-h200-runner.log); run it again on a newer torch:
#     source bench/device_env.sh && python3 bench/probes/aoti_runner_probe.py
import glob, os, sys, time, zipfile, torch
from torch.export import Dim
m = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8)).cuda().eval()
x = torch.randn(4, 16, device="cuda")
ep = torch.export.export(m, (x,), dynamic_shapes=({0: Dim("batch", min=1, max=64)},))
path = "outputs/p/m.pt2"; os.makedirs("outputs/p", exist_ok=True)
t = time.perf_counter(); torch._inductor.aoti_compile_and_package(ep, package_path=path); print("built", round(time.perf_counter() - t, 1), "s", flush=True)
d = "outputs/p/x"; zipfile.ZipFile(path).extractall(d)
print(sorted(os.path.relpath(p, d) for p in glob.glob(d + "/**/*", recursive=True) if os.path.isfile(p))[:20], flush=True)
so = glob.glob(d + "/**/*.so", recursive=True)[0]
print("runner args:", torch._C._aoti.AOTIModelContainerRunnerCuda.__init__.__doc__, flush=True)
t = time.perf_counter()
R = torch._C._aoti.AOTIModelContainerRunnerCuda(so, 1, "cuda", os.path.dirname(so))
print("constructed", round((time.perf_counter() - t) * 1e3, 1), "ms", flush=True)
out = R.run([x]); print("ran", torch.allclose(out[0], m(x), atol=1e-4), flush=True)
