# Run on the H200 as: bash bench/results/raw/callQ.sh (with .whl/ carried); the runs went to /tmp on the host, here outputs/tune-scale.
set -o pipefail; source bench/device_env.sh || exit 1
nproc; nvidia-smi --query-gpu=name,clocks.sm --format=csv
timeout -s KILL 150 python3 bench/results/raw/regional_probe.py > $OUT/regional-probe.log 2>&1; echo "probe rc=$? ${SECONDS}s" | tee -a $OUT/regional-probe.log
timeout -s KILL $((575 - SECONDS)) python3 bench/tune_scale.py --out $OUT --tag h200-before --runs outputs/tune-scale --models gpt2_medium vit_l_16 resnet50 --warm resnet50 --budget-s $((400 - SECONDS)) > $OUT/tune-scale-before.log 2>&1
echo "bench rc=$? ${SECONDS}s" >> $OUT/tune-scale-before.log
tar czf $OUT/runs.tgz --exclude='*.tweak' --exclude='*.compiled' --exclude='cache-*' --exclude=home outputs/tune-scale 2>/dev/null; ls $OUT
