# Call N (issues 39, 36, 38), one H200: the MLP and ResNet-50 routes tuned from the command line (cold, tracking off,
# compile workers on), their checkpoints carrying each routed program built ahead of time, then loaded three ways
# in fresh processes (bench/load.py); the tune logs show the workers' cache hits and the AOT build per program.
set -o pipefail; source bench/device_env.sh || exit 1; mkdir -p outputs/n
export TWEAKPIPE_HOME=$PWD/outputs/n/home
for model in mlp resnet50; do
  limit=170; [ $model = resnet50 ] && limit=230
  timeout -s KILL $limit python3 -m pipeline model=$model device=cuda backends=gpu 'precision=[fp32,tf32,bf16]' \
      compile_cache.dir=outputs/n/cache hydra.run.dir=outputs/n/$model-cold tracking=off > $OUT/tune-$model.log 2>&1
  echo "tune $model rc=$? after ${SECONDS}s" | tee -a $OUT/tune-$model.log
done
timeout -s KILL $((570 - SECONDS)) python3 bench/load.py --out $OUT --tag h200-n --runs outputs/n \
    --checkpoints outputs/n/mlp-cold/model.tweak outputs/n/resnet50-cold/model.tweak > $OUT/load-n.log 2>&1
echo "load rc=$? after ${SECONDS}s" >> $OUT/load-n.log
tar czf $OUT/runs-n.tgz --exclude='*.tweak' --exclude='*.compiled' --exclude=cache --exclude=home --exclude='clean-*' \
    outputs/n 2>/dev/null; ls -la $OUT
