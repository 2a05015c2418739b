# Call AF (issue 39; 2026-12-04, fifth session): resnet50 tuned from the CLI after, then before (abb3272^, .probe/before:
# git archive) the standalone loader's compile_threads change (call AE ran them in the other order); then both tunes'
# checkpoints loaded with this session's code (first, trusted, clean cache, untrusted): whatever each tune routed.
set -o pipefail; source bench/device_env.sh || exit 1; ROOT=$PWD; mkdir -p outputs/af/keep
tune() {  # tune TREE TAG: resnet50 from the CLI with the code of TREE, its own Inductor cache
  (cd $1 && PYTHONPATH=$PWD:$PYTHONPATH timeout -s KILL 200 python3 -m pipeline model=resnet50 device=cuda backends=gpu 'precision=[fp32,tf32,bf16]' compile_cache.dir=$ROOT/outputs/af/cache-$2 hydra.run.dir=$ROOT/outputs/af/r50-$2 tracking=off > $ROOT/outputs/af/keep/r50-$2-tune.log 2>&1); echo "$2 tune rc=$? at ${SECONDS}s"; grep "tune_s\|^route" outputs/af/keep/r50-$2-tune.log | cut -c1-250
  cp outputs/af/r50-$2/route.json outputs/af/keep/r50-$2-route.json; cp outputs/af/r50-$2/cost.json outputs/af/keep/r50-$2-cost.json
}
tune $ROOT after
tune .probe/before before
for t in after before; do
  timeout -s KILL $((590 - SECONDS)) python3 bench/load.py --out outputs/af/keep --tag h200-af-r50-$t --checkpoints outputs/af/r50-$t/model.tweak --runs outputs/af > outputs/af/keep/load-r50-$t.log 2>&1; echo "load $t rc=$? at ${SECONDS}s"; grep -A3 "^| model" outputs/af/keep/load-h200-af-r50-$t.md
done
tar czf $OUT/call-af.tgz -C outputs/af/keep .
