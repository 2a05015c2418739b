# Call AC (issue 39; 2026-12-04): the GPU tests of the load path (a fresh-process CUDA load leaves no compile-worker
# pool); resnet50 and mlp tuned from the CLI and loaded (a first load apart, then trusted / clean / untrusted, profiled),
# with Python's bytecode cache on as on a user's machine (bench/device_env.sh).
set -o pipefail; source bench/device_env.sh || exit 1; mkdir -p outputs/ac/keep
timeout -s INT 150 python3 -m pytest -q -n 0 -m gpu tests/test_ahead_of_time.py -p no:cacheprovider > outputs/ac/keep/gpu-tests-aot.log 2>&1; echo "pytest rc=$? at ${SECONDS}s"; tail -3 outputs/ac/keep/gpu-tests-aot.log
for m in resnet50 mlp; do
  timeout -s KILL 170 python3 -m pipeline model=$m device=cuda backends=gpu 'precision=[fp32,tf32,bf16]' compile_cache.dir=outputs/ac/cache-$m hydra.run.dir=outputs/ac/$m-cold tracking=off > outputs/ac/keep/$m-tune.log 2>&1; echo "$m tune rc=$? at ${SECONDS}s"; grep "tune_s\|^route" outputs/ac/keep/$m-tune.log | cut -c1-250
  cp outputs/ac/$m-cold/route.json outputs/ac/keep/$m-route.json; cp outputs/ac/$m-cold/cost.json outputs/ac/keep/$m-cost.json
  timeout -s KILL $((590 - SECONDS)) python3 bench/load.py --out outputs/ac/keep --tag h200-ac-$m --checkpoints outputs/ac/$m-cold/model.tweak --runs outputs/ac --profile > outputs/ac/keep/load-$m.log 2>&1; echo "$m load rc=$? at ${SECONDS}s"; grep -A3 "^| model" outputs/ac/keep/load-h200-ac-$m.md
done
tar czf $OUT/call-ac.tgz -C outputs/ac/keep .
