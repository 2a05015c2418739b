# Call W (issues 39, 38): resnet50's CLI checkpoint (call V) loaded three ways; then ResNet-50 from a plain script, cold and warm.
set -o pipefail; source bench/device_env.sh || exit 1; mkdir -p outputs/w
timeout -s KILL 200 python3 bench/load.py --out $OUT --tag h200-w --checkpoints outputs/v/resnet50-cold/model.tweak --runs outputs/v > $OUT/load-w.log 2>&1; echo "r50 load rc=$? at ${SECONDS}s"; tail -6 $OUT/load-w.log
timeout -s INT $((585 - SECONDS)) python3 bench/tune_scale.py --out outputs/w --tag h200-e --runs outputs/w/ts --models resnet50 --warm resnet50 --full > outputs/w/tune-scale-h200-e.log 2>&1; echo "tune_scale rc=$? at ${SECONDS}s"
cp outputs/w/*.json outputs/w/*.md outputs/w/*.log $OUT/ 2>/dev/null
(cd outputs/w && tar czf $OUT/runs-w.tgz --exclude='*.pt' --exclude='*.tweak' --exclude='*.db' --exclude='mlruns' --exclude='cache*' ts 2>/dev/null)
tail -12 outputs/w/tune-scale-h200-e.log
