# Call B: the timing bench (issue 19) alone on a 1-GPU machine, then the timing GPU test.
source bench/device_env.sh || exit 1
rm -rf OUT_DIR; mkdir -p OUT_DIR/logs
timeout 470 python3 bench/timing.py --out OUT_DIR --models resnet18 mobilenet_v3_small > OUT_DIR/logs/timing-h200.log 2>&1; echo "timing rc=$?" >> OUT_DIR/logs/rc.txt
timeout 60 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_timing.py > OUT_DIR/logs/gpu-tests-timing-h200.log 2>&1; echo "pytest rc=$?" >> OUT_DIR/logs/rc.txt
cp .whl/callB.sh OUT_DIR/logs/
(cd OUT_DIR && tar czf $OUT/callB.tgz $(ls) 2>/dev/null)
cat OUT_DIR/logs/rc.txt; tail -3 OUT_DIR/logs/gpu-tests-timing-h200.log; tail -40 OUT_DIR/logs/timing-h200.log
