# Call D: precision with cast-weight candidates (issue 20), two lanes, then the precision GPU test.
source bench/device_env.sh || exit 1
rm -rf OUT_DIR; mkdir -p OUT_DIR/logs
B="--backends eager graph graph_inductor --profile quick"
( export CUDA_VISIBLE_DEVICES=0
  timeout 470 taskset -c 0-15 python3 bench/precision.py --out OUT_DIR --tag h200-a $B --models mlp mobilenet_v3_small > OUT_DIR/logs/precision-h200-a.log 2>&1; echo "prec-a rc=$?" >> OUT_DIR/logs/rc.txt
  timeout 80 taskset -c 0-15 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_precision.py > OUT_DIR/logs/gpu-tests-precision-h200.log 2>&1; echo "pytest rc=$?" >> OUT_DIR/logs/rc.txt ) &
( export CUDA_VISIBLE_DEVICES=1
  timeout 555 taskset -c 16-31 python3 bench/precision.py --out OUT_DIR --tag h200-b $B --models resnet18 resnet50 vit_b_16 > OUT_DIR/logs/precision-h200-b.log 2>&1; echo "prec-b rc=$?" >> OUT_DIR/logs/rc.txt ) &
wait
python3 bench/precision.py --combine OUT_DIR/precision-h200-a.json OUT_DIR/precision-h200-b.json --out OUT_DIR --tag h200 > OUT_DIR/logs/combine.log 2>&1
cp .whl/callD.sh OUT_DIR/logs/
(cd OUT_DIR && tar czf $OUT/callD.tgz $(ls) 2>/dev/null)
cat OUT_DIR/logs/rc.txt; tail -3 OUT_DIR/logs/gpu-tests-precision-h200.log; tail -32 OUT_DIR/logs/combine.log
