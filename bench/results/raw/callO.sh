# Call O (issue 39), one H200: where call N's tunes died (a segmentation fault after the route, building or loading
# the routed program ahead of time): a tiny MLP routed to inductor, then to graph_inductor, with Python's fault
# handler on, so a crash names its frame.
set -o pipefail; source bench/device_env.sh || exit 1; mkdir -p outputs/o
export TWEAKPIPE_HOME=$PWD/outputs/o/home PYTHONFAULTHANDLER=1
for backend in inductor graph_inductor; do
  timeout -s KILL 200 python3 -m pipeline model=tiny_mlp device=cuda "backends=[eager,$backend]" profile=quick \
      route=one_backend route.backend=$backend compile_cache.dir=outputs/o/cache hydra.run.dir=outputs/o/$backend \
      tracking=off > $OUT/tiny-$backend.log 2>&1
  echo "tune $backend rc=$? after ${SECONDS}s" | tee -a $OUT/tiny-$backend.log
  cp outputs/o/$backend/route.json $OUT/route-$backend.json 2>/dev/null
done
