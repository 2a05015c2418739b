"""Diagnose slow max-autotune benchmarking on torch 2.11: where does the time go?"""
import faulthandler, os, sys, time, logging
out = os.environ["OUT"]
faulthandler.dump_traceback_later(12, repeat=True, file=open(f"{out}/stacks.txt", "w"))
import torch, torchvision, triton
import torch._inductor.config as ic
print("torch", torch.__version__, "triton", triton.__version__, "py", sys.version)
for k in ("compile_threads", "autotune_in_subproc", "autotune_local_cache", "pipeline_max_autotune_gemm",
          "max_autotune_conv_backends", "max_autotune_gemm_search_space", "benchmark_epilogue_fusion",
          "autotune_multi_device", "search_autotune_cache"):
    print(k, getattr(ic, k, "<absent>"))
from torch._inductor.select_algorithm import get_num_workers
print("num_workers", get_num_workers(), "affinity", len(os.sched_getaffinity(0)))
logging.getLogger("torch._inductor.select_algorithm").setLevel(logging.DEBUG)
h = logging.StreamHandler(open(f"{out}/select.log", "w")); h.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
logging.getLogger("torch._inductor.select_algorithm").addHandler(h)
m = torchvision.models.resnet18().cuda().eval()
x = torch.randn(64, 3, 224, 224, device="cuda")
c = torch.compile(m, mode="max-autotune-no-cudagraphs")
t = time.time()
with torch.no_grad():
    c(x)
torch.cuda.synchronize()
print("compile s", time.time() - t)
