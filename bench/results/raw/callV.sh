# Call V (issue 39, then 38): the standalone form's GPU test; mlp tuned from the CLI and loaded three ways; resnet50 tuned cold from the CLI.
set -o pipefail; source bench/device_env.sh || exit 1; mkdir -p outputs/v
timeout -s INT 200 python3 -m pytest -q -n 0 -m gpu tests/test_ahead_of_time.py -p no:cacheprovider > $OUT/gpu-tests-aot.log 2>&1; echo "pytest rc=$? at ${SECONDS}s"; tail -30 $OUT/gpu-tests-aot.log
timeout -s KILL 130 python3 -m pipeline model=mlp device=cuda backends=gpu 'precision=[fp32,tf32,bf16]' compile_cache.dir=outputs/v/cache hydra.run.dir=outputs/v/mlp-cold tracking=off > $OUT/mlp-tune.log 2>&1; echo "mlp tune rc=$? at ${SECONDS}s"
timeout -s KILL 110 python3 bench/load.py --out $OUT --tag h200-v --checkpoints outputs/v/mlp-cold/model.tweak --runs outputs/v > $OUT/load-v.log 2>&1; echo "mlp load rc=$? at ${SECONDS}s"; tail -8 $OUT/load-v.log
timeout -s KILL $((585 - SECONDS)) python3 -m pipeline model=resnet50 device=cuda backends=gpu 'precision=[fp32,tf32,bf16]' compile_cache.dir=outputs/v/cache-r50 hydra.run.dir=outputs/v/resnet50-cold tracking=off > $OUT/resnet50-tune.log 2>&1; echo "resnet50 tune rc=$? at ${SECONDS}s"
(cd outputs/v && tar czf $OUT/runs-v.tgz --exclude='*.pt' --exclude='*.tweak' --exclude='*.db' --exclude='mlruns' --exclude='cache*' --exclude='clean-*' . 2>/dev/null)
tail -5 $OUT/resnet50-tune.log
