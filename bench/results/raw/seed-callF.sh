# issue 8 on nvidia-h200-x2: the seed table in two lanes (one per GPU, cores split), outputs tarred into one file.
# AC=bfloat16 for the autocast table; TAG names the files.
source bench/device_env.sh || exit 1
TAG=${TAG:-h200}; AC=${AC:+--autocast $AC}
rm -rf /tmp/s /tmp/torchinductor_*; mkdir -p /tmp/s/logs
( CUDA_VISIBLE_DEVICES=0 timeout ${LANE_S:-560} taskset -c 0-15 python3 bench/seed_table.py --out /tmp/s --tag $TAG-a $AC --models mlp mobilenet_v3_small resnet18 > /tmp/s/logs/seed-$TAG-a.log 2>&1; echo "a rc=$?" >> /tmp/s/logs/rc.txt ) &
( CUDA_VISIBLE_DEVICES=1 timeout ${LANE_S:-560} taskset -c 16-31 python3 bench/seed_table.py --out /tmp/s --tag $TAG-b $AC --models resnet50 vit_b_16 > /tmp/s/logs/seed-$TAG-b.log 2>&1; echo "b rc=$?" >> /tmp/s/logs/rc.txt ) &
wait
cp .whl/callF.sh /tmp/s/logs/
python3 bench/seed_table.py --combine /tmp/s/seed-table-$TAG-a.*.json /tmp/s/seed-table-$TAG-b.*.json --out /tmp/s --tag $TAG > /tmp/s/logs/combine.log 2>&1
(cd /tmp/s && tar czf $OUT/seed-$TAG.tgz seed-table-*.json seed-table-*.md logs)
cat /tmp/s/logs/rc.txt; cat /tmp/s/logs/combine.log | tail -20; du -sh /tmp/s; ls /tmp/s
