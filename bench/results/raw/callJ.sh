# Call J (issue 32), one H200, code at eec6122: the quantized precisions against the bf16 route, matmul-bound
# models first, until the bench's budget (520 s) would be passed; then the GPU tests of the quantized precisions.
set -o pipefail; source bench/device_env.sh || exit 1; mkdir -p outputs/q
timeout -s KILL 560 python3 bench/quant.py --out $OUT --tag h200 --budget-s 520 --runs outputs/q > $OUT/quant-run.log 2>&1
echo "quant rc=$?" >> $OUT/quant-run.log
timeout -s KILL 25 python3 -m pytest -q -m gpu tests/test_quantize.py > $OUT/gpu-tests-quant.log 2>&1
tar czf $OUT/quant-runs.tgz --exclude='*.tweak' --exclude='*.compiled' --exclude=cache --exclude='mlruns*' --exclude='*.db' outputs/q 2>/dev/null; ls -la $OUT
