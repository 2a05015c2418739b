# Call Z (issue 39; 2026-12-04): resnet50 from the CLI with standalone capture, then its load three ways and profiled (the mlp's load form is unchanged: measured in call V).
set -o pipefail; source bench/device_env.sh || exit 1; mkdir -p outputs/z
timeout -s KILL 300 python3 -m pipeline model=resnet50 device=cuda backends=gpu 'precision=[fp32,tf32,bf16]' compile_cache.standalone=true compile_cache.dir=outputs/z/cache hydra.run.dir=outputs/z/resnet50-cold tracking=off > $OUT/resnet50-tune.log 2>&1; echo "tune rc=$? at ${SECONDS}s"
timeout -s KILL $((585 - SECONDS)) python3 bench/load.py --out $OUT --tag h200-z --checkpoints outputs/z/resnet50-cold/model.tweak --runs outputs/z --profile > $OUT/load-z.log 2>&1; echo "load rc=$? at ${SECONDS}s"; tail -8 $OUT/load-z.log
