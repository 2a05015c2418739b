source bench/device_env.sh || exit 1
timeout 170 python3 bench/router_overhead.py --device cuda --model mlp --backend graph_inductor --batch-size 1 --windows 5 2>&1 | grep -v Warning | tee $OUT/router-overhead-h200.log | tail -8
