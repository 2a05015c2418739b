# Call AB (issue 39; 2026-12-04): loads measured with Python's bytecode cache on (the image sets PYTHONDONTWRITEBYTECODE=1,
# so every fresh process compiled torch from source); torch's caching precompile probed for the reference peer.
set -o pipefail; source bench/device_env.sh || exit 1; mkdir -p outputs/ab
for i in 1 2; do /usr/bin/time -f "import torch+inductor, bytecode cache unwritten: %e s" python3 -c "import torch, torch._inductor.standalone_compile"; done 2>&1 | tee $OUT/pyc.txt
unset PYTHONDONTWRITEBYTECODE
for i in 1 2 3; do /usr/bin/time -f "import torch+inductor, bytecode cache on (run $i): %e s" python3 -c "import torch, torch._inductor.standalone_compile, torchvision, triton"; done 2>&1 | tee -a $OUT/pyc.txt
P=bench/results/raw/precompile_probe.py
{ TORCHINDUCTOR_CACHE_DIR=outputs/ab/pc-a TORCH_CACHING_PRECOMPILE=1 timeout 150 python3 $P save outputs/ab/pc.bin
  TORCHINDUCTOR_CACHE_DIR=outputs/ab/pc-b TORCH_CACHING_PRECOMPILE=1 timeout 100 python3 $P load outputs/ab/pc.bin
  TORCHINDUCTOR_CACHE_DIR=outputs/ab/pc-c timeout 100 python3 $P load outputs/ab/pc.bin
  TORCHINDUCTOR_CACHE_DIR=outputs/ab/pc-b TORCH_CACHING_PRECOMPILE=1 timeout 100 python3 $P load outputs/ab/pc.bin
} > $OUT/precompile-probe.log 2>&1; echo "probe at ${SECONDS}s"; grep -v Warning $OUT/precompile-probe.log | grep "import\|load\|save\|ready\|Error" | cut -c1-600
timeout -s KILL 170 python3 -m pipeline model=resnet50 device=cuda backends=gpu 'precision=[fp32,tf32,bf16]' compile_cache.dir=outputs/ab/cache hydra.run.dir=outputs/ab/resnet50-cold tracking=off > $OUT/resnet50-tune.log 2>&1; echo "r50 tune rc=$? at ${SECONDS}s"; grep -i "route\|tune_s\|seconds" $OUT/resnet50-tune.log | tail -4 | cut -c1-300
timeout -s KILL 130 python3 bench/load.py --out $OUT --tag h200-ab-r50 --checkpoints outputs/ab/resnet50-cold/model.tweak --runs outputs/ab --profile > $OUT/load-r50.log 2>&1; echo "r50 load rc=$? at ${SECONDS}s"; tail -4 $OUT/load-r50.log | cut -c1-600
timeout -s KILL 100 python3 -m pipeline model=mlp device=cuda backends=gpu 'precision=[fp32,tf32,bf16]' compile_cache.dir=outputs/ab/cache-mlp hydra.run.dir=outputs/ab/mlp-cold tracking=off > $OUT/mlp-tune.log 2>&1; echo "mlp tune rc=$? at ${SECONDS}s"
timeout -s KILL $((590 - SECONDS)) python3 bench/load.py --out $OUT --tag h200-ab-mlp --checkpoints outputs/ab/mlp-cold/model.tweak --runs outputs/ab --profile > $OUT/load-mlp.log 2>&1; echo "mlp load rc=$? at ${SECONDS}s"; tail -4 $OUT/load-mlp.log | cut -c1-600
for m in resnet50 mlp; do cp outputs/ab/$m-cold/route.json $OUT/$m-route.json; cp outputs/ab/$m-cold/cost.json $OUT/$m-cost.json; done 2>/dev/null
