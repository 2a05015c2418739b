# Run on the H200 as: bash bench/results/raw/callS.sh (with .whl/ carried), on a fresh machine, once gpu.yaml no longer held graph_inductor_regional.
set -o pipefail; source bench/device_env.sh || exit 1
timeout -s KILL 75 python3 -m pytest -q -n 0 -p no:cacheprovider -m gpu tests/test_graph_gpu.py -k regional > $OUT/gpu-tests-regional.log 2>&1; echo "gpu tests rc=$? ${SECONDS}s" | tee -a $OUT/gpu-tests-regional.log
timeout -s KILL $((455 - SECONDS)) python3 bench/tune_scale.py --out $OUT --tag h200 --runs outputs/tune-scale --models vit_l_16 gpt2_medium resnet50 --budget-s 250 > $OUT/tune-scale-call4.log 2>&1
echo "bench rc=$? ${SECONDS}s" >> $OUT/tune-scale-call4.log
tar czf $OUT/runs4.tgz --exclude='*.tweak' --exclude='*.compiled' --exclude='cache-*' --exclude=home --exclude=mlartifacts --exclude=mlflow.db outputs/tune-scale; ls -la $OUT
