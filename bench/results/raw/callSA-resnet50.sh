# Call Y (issues 38, 39; 2026-12-04): the standalone capture path on the GPU, then ResNet-50 tuned with it from a plain script.
set -o pipefail; source bench/device_env.sh || exit 1; mkdir -p outputs/y
timeout -s INT 200 python3 -m pytest -q -n 0 -m gpu tests/test_ahead_of_time.py -p no:cacheprovider > $OUT/gpu-tests-aot-standalone.log 2>&1; echo "pytest rc=$? at ${SECONDS}s"; tail -5 $OUT/gpu-tests-aot-standalone.log
timeout -s INT $((585 - SECONDS)) python3 bench/tune_scale.py --out outputs/y --tag h200-sa --runs outputs/y/ts --models resnet50 --warm resnet50 --full --overrides compile_cache.standalone=true > outputs/y/tune-scale-h200-sa.log 2>&1; echo "tune_scale rc=$? at ${SECONDS}s"
cp outputs/y/*.json outputs/y/*.md outputs/y/*.log $OUT/ 2>/dev/null; tail -12 outputs/y/tune-scale-h200-sa.log
