# Call E: the precision table again at 47168a0 (autocast inside the call, outputs in the model's dtype),
# two lanes; lane a then runs the suite's GPU tests on GPU 0 (the two-GPU sweep test skips there).
source bench/device_env.sh || exit 1
rm -rf OUT_DIR; mkdir -p OUT_DIR/logs
B="--backends eager graph graph_inductor --profile quick"
( export CUDA_VISIBLE_DEVICES=0
  timeout 400 taskset -c 0-15 python3 bench/precision.py --out OUT_DIR --tag h200-a $B --models mlp mobilenet_v3_small > OUT_DIR/logs/precision-h200-a.log 2>&1; echo "prec-a rc=$?" >> OUT_DIR/logs/rc.txt
  (echo "commit 47168a0"; timeout 150 taskset -c 0-15 python3 -m pytest -q -m gpu -p no:cacheprovider tests/) > OUT_DIR/logs/gpu-tests-h200.log 2>&1; echo "pytest rc=$?" >> OUT_DIR/logs/rc.txt ) &
( export CUDA_VISIBLE_DEVICES=1
  timeout 545 taskset -c 16-31 python3 bench/precision.py --out OUT_DIR --tag h200-b $B --models resnet18 resnet50 vit_b_16 > OUT_DIR/logs/precision-h200-b.log 2>&1; echo "prec-b rc=$?" >> OUT_DIR/logs/rc.txt ) &
wait
python3 bench/precision.py --combine OUT_DIR/precision-h200-a.json OUT_DIR/precision-h200-b.json --out OUT_DIR --tag h200 > OUT_DIR/logs/combine.log 2>&1
cp .whl/callE.sh OUT_DIR/logs/
(cd OUT_DIR && tar czf $OUT/callE.tgz $(ls) 2>/dev/null)
cat OUT_DIR/logs/rc.txt; tail -3 OUT_DIR/logs/gpu-tests-h200.log; tail -32 OUT_DIR/logs/combine.log
