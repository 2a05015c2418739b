"""Does in-process precompile (compile_threads=1 for this compile only) stop the serial re-compile?"""
import faulthandler, os, sys, time, logging
out = os.environ["OUT"]
faulthandler.dump_traceback_later(30, repeat=True, file=open(f"{out}/stacks2.txt", "w"))
import torch, torchvision
import torch._inductor.config as ic
logging.getLogger("torch._inductor.select_algorithm").setLevel(logging.INFO)
h = logging.StreamHandler(open(f"{out}/select2.log", "w")); h.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
logging.getLogger("torch._inductor.select_algorithm").addHandler(h)
m = torchvision.models.resnet18().cuda().eval()
opts = {"max_autotune": True, "compile_threads": 1}
c = torch.compile(m, options=opts)
for bs in (64, 1):
    x = torch.randn(bs, 3, 224, 224, device="cuda")
    t = time.time()
    with torch.no_grad():
        y = c(x)
    torch.cuda.synchronize()
    print(f"bs{bs} compile s {time.time() - t:.1f}", flush=True)
print("global compile_threads after:", ic.compile_threads)
