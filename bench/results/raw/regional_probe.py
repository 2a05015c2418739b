"""Probe: nested_compile_region on torch 2.11 CUDA: compile seconds full vs regional, CUDA-graph replay, latency."""
import sys, time, torch, transformers, torchvision
sys.path.insert(0, "bench/results/raw")
import importlib.util
spec = importlib.util.spec_from_file_location("rv", "bench/results/raw/regional_probe_view.py")
src = open("bench/results/raw/regional_probe_view.py").read().split("def run(")[0]
ns = {}; exec(src, ns); regional_view = ns["regional_view"]
import torch._dynamo
from torch._dynamo.utils import counters
dev = torch.device("cuda")

def bench(fn, x, n=50):
    for _ in range(3): fn(**x)
    torch.cuda.synchronize(); t = time.perf_counter()
    for _ in range(n): fn(**x)
    torch.cuda.synchronize(); return (time.perf_counter() - t) / n * 1e3

def graphed(fn, x):
    s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2): fn(**x)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g): out = fn(**x)
    return lambda **kw: g.replay()

for label, model, mk in [
    ("gpt2_12x1024", transformers.GPT2Model(transformers.GPT2Config(n_layer=12, n_embd=1024, n_head=16, use_cache=False)),
     lambda b: {"input_ids": torch.randint(0, 50000, (b, 128), device=dev)}),
    ("resnet50", torchvision.models.resnet50(), lambda b: {"x": torch.randn(b, 3, 224, 224, device=dev)}),
]:
    model = model.eval().to(dev).to(torch.bfloat16)
    for regional in (False, True):
        torch._dynamo.reset(); counters.clear()
        m = regional_view(model)[0] if regional else model
        f = torch.compile(m)
        t = time.perf_counter()
        with torch.inference_mode():
            x8 = mk(8); torch._dynamo.maybe_mark_dynamic(x8[next(iter(x8))], 0)
            f(**x8); f(**mk(1))
        comp = time.perf_counter() - t
        with torch.inference_mode():
            ref = model(**mk(8)) if False else None
            lat = {b: bench(graphed(f, mk(b)), mk(b)) for b in (1, 8, 32)}
            lat_nog = bench(f, mk(8))
        print(label, "regional" if regional else "full", f"compile {comp:.1f}s", "graphs", counters["stats"]["unique_graphs"],
              "breaks", sum(counters["graph_break"].values()), "cudagraph ms", {b: round(v, 3) for b, v in lat.items()},
              "nograph bs8", round(lat_nog, 3), flush=True)
