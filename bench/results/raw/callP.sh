# Call P (issue 39), one H200: which AOTInductor package of a CUDA program torch 2.11's loader can construct directly
# (call O: a segmentation fault constructing it for a package built with its weights kept out of the library).
# Each variant in its own process, with Python's fault handler on.
set -o pipefail; source bench/device_env.sh || exit 1; mkdir -p outputs/p; export PYTHONFAULTHANDLER=1
cat > outputs/p/variant.py <<'PY'
import sys, time, torch
from torch.export import Dim
in_so, keep, bind = (sys.argv[1] == "1"), (sys.argv[2] == "1"), (sys.argv[3] == "1")
m = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8)).cuda().eval()
x = torch.randn(4, 16, device="cuda")
ep = torch.export.export(m, (x,), dynamic_shapes=({0: Dim("batch", min=1, max=64)},))
cfg = {"aot_inductor.package_constants_in_so": in_so, "always_keep_tensor_constants": keep}
path = f"outputs/p/m-{int(in_so)}{int(keep)}.pt2"
t = time.perf_counter(); torch._inductor.aoti_compile_and_package(ep, package_path=path, inductor_configs=cfg)
print("built", round(time.perf_counter() - t, 1), "s", flush=True)
t = time.perf_counter(); L = torch._C._aoti.AOTIModelPackageLoader(path, "model", False, 1, 0)
print("constructed", round((time.perf_counter() - t) * 1e3, 1), "ms", sorted(L.get_constant_fqns()), flush=True)
if bind:
    L.load_constants({k: v.detach() for k, v in m.state_dict().items()}, False, True, True)
    print("bound", flush=True)
out = L.run([x])
print("ran", torch.allclose(out[0], m(x), atol=1e-4), flush=True)
PY
for v in "0 1 1" "1 1 0" "1 1 1" "0 0 1"; do
  echo "== variant in_so keep bind = $v" >> $OUT/variants.log
  timeout -s KILL 120 python3 outputs/p/variant.py $v >> $OUT/variants.log 2>&1; echo "rc=$? after ${SECONDS}s" >> $OUT/variants.log
done
grep -v "^  File\|^Thread\|^$" $OUT/variants.log | tail -40
