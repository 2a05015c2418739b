# Call F: mobilenet_v3_small's precision cells at 47168a0, on the machine of call E (callD.sh with lane a cut at 400 s; it stopped in
# mobilenet_v3_small, after mlp), alone on GPU 0.
source bench/device_env.sh || exit 1
rm -rf OUT_DIR; mkdir -p OUT_DIR/logs
B="--backends eager graph graph_inductor --profile quick"
CUDA_VISIBLE_DEVICES=0 timeout 520 taskset -c 0-15 python3 bench/precision.py --out OUT_DIR --tag h200-c $B --models mobilenet_v3_small > OUT_DIR/logs/precision-h200-c.log 2>&1; echo "prec-c rc=$?" >> OUT_DIR/logs/rc.txt
cp .whl/callF.sh OUT_DIR/logs/
(cd OUT_DIR && tar czf $OUT/callF.tgz $(ls) 2>/dev/null)
cat OUT_DIR/logs/rc.txt; tail -12 OUT_DIR/logs/precision-h200-c.log
