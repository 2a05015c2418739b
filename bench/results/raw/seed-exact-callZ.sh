# issue 8 on nvidia-h200-x2: graph GPU tests, then the fp32 seed table in two lanes, tuned sizes recorded exactly.
source bench/device_env.sh || exit 1
mkdir -p $OUT/z /tmp/s
( CUDA_VISIBLE_DEVICES=0 timeout ${LANE_S:-470} taskset -c 0-15 python3 bench/seed_table.py --out /tmp/s --tag h200-a --models mlp mobilenet_v3_small resnet18 > $OUT/z/seed-h200-a.log 2>&1; echo "a rc=$?" >> $OUT/z/rc.txt ) &
( CUDA_VISIBLE_DEVICES=1 timeout 120 taskset -c 16-31 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_graph_gpu.py tests/test_checkpoint.py > $OUT/z/gpu-tests.log 2>&1; echo "tests rc=$?" >> $OUT/z/rc.txt
  CUDA_VISIBLE_DEVICES=1 timeout $(( ${LANE_S:-470} - 60 )) taskset -c 16-31 python3 bench/seed_table.py --out /tmp/s --tag h200-b --models resnet50 vit_b_16 > $OUT/z/seed-h200-b.log 2>&1; echo "b rc=$?" >> $OUT/z/rc.txt ) &
wait
cp /tmp/s/*.json /tmp/s/*.md $OUT/z/ 2>/dev/null
cat $OUT/z/rc.txt; tail -3 $OUT/z/gpu-tests.log; grep -h "Summary\|^| " $OUT/z/*.md | head -30
