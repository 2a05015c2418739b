# Call AE (issue 39; 2026-12-04, fifth session): the GPU tests of the load path (a traced load ends the compile-worker
# pool it started, keeps one that ran before); resnet50 tuned from the CLI before (abb3272^, .probe/before: git archive)
# and after the standalone loader's compile_threads change, in one call; resnet50's load (first, trusted, clean,
# untrusted, profiled) with this session's code; the overlap probe (Inductor's loader imported and hashed beside the load).
set -o pipefail; source bench/device_env.sh || exit 1; ROOT=$PWD; mkdir -p outputs/ae/keep
timeout -s INT 240 python3 -m pytest -q -n 0 -m gpu tests/test_ahead_of_time.py -p no:cacheprovider > outputs/ae/keep/gpu-tests-aot.log 2>&1; echo "pytest rc=$? at ${SECONDS}s"; tail -3 outputs/ae/keep/gpu-tests-aot.log
tune() {  # tune TREE TAG: resnet50 from the CLI with the code of TREE, its own Inductor cache
  (cd $1 && PYTHONPATH=$PWD:$PYTHONPATH timeout -s KILL 200 python3 -m pipeline model=resnet50 device=cuda backends=gpu 'precision=[fp32,tf32,bf16]' compile_cache.dir=$ROOT/outputs/ae/cache-$2 hydra.run.dir=$ROOT/outputs/ae/r50-$2 tracking=off > $ROOT/outputs/ae/keep/r50-$2-tune.log 2>&1); echo "$2 tune rc=$? at ${SECONDS}s"; grep "tune_s\|^route" outputs/ae/keep/r50-$2-tune.log | cut -c1-250
  cp outputs/ae/r50-$2/route.json outputs/ae/keep/r50-$2-route.json; cp outputs/ae/r50-$2/cost.json outputs/ae/keep/r50-$2-cost.json
}
tune .probe/before before
tune $ROOT after
timeout -s KILL 150 python3 bench/load.py --out outputs/ae/keep --tag h200-ae-resnet50 --checkpoints outputs/ae/r50-after/model.tweak --runs outputs/ae --profile > outputs/ae/keep/load-resnet50.log 2>&1; echo "load rc=$? at ${SECONDS}s"; grep -A3 "^| model" outputs/ae/keep/load-h200-ae-resnet50.md
timeout -s KILL $((585 - SECONDS)) python3 bench/results/raw/overlap_probe.py outputs/ae/r50-after/model.tweak outputs/ae/cache-after 3 > outputs/ae/keep/overlap-resnet50.json 2> outputs/ae/keep/overlap-resnet50.log; echo "overlap rc=$? at ${SECONDS}s"; cat outputs/ae/keep/overlap-resnet50.log | cut -c1-200
tar czf $OUT/call-ae.tgz -C outputs/ae/keep .
