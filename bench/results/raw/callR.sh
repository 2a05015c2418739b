# Run on the H200 as: bash bench/results/raw/callR.sh (with .whl/ carried), right after callQ.sh on a fresh machine.
set -o pipefail; source bench/device_env.sh || exit 1
timeout -s KILL 560 python3 bench/tune_scale.py --out $OUT --tag h200 --runs outputs/tune-scale --models gpt2_medium resnet50 vit_l_16 --warm resnet50 --continue --budget-s 420 > $OUT/tune-scale-call2.log 2>&1
echo "bench rc=$? ${SECONDS}s" >> $OUT/tune-scale-call2.log
tar czf $OUT/runs2.tgz --exclude='*.tweak' --exclude='*.compiled' --exclude='cache-*' --exclude=home --exclude=mlartifacts --exclude=mlflow.db outputs/tune-scale; ls -la $OUT
