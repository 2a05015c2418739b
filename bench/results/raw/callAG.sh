# Call AG (issue 39; 2026-12-04, fifth session): mlp tuned from the CLI and loaded with this session's code (first,
# trusted, clean cache, untrusted, profiled), as call AC did before the traced load's pool change.
set -o pipefail; source bench/device_env.sh || exit 1; mkdir -p outputs/ag/keep
timeout -s KILL 200 python3 -m pipeline model=mlp device=cuda backends=gpu 'precision=[fp32,tf32,bf16]' compile_cache.dir=outputs/ag/cache-mlp hydra.run.dir=outputs/ag/mlp-cold tracking=off > outputs/ag/keep/mlp-tune.log 2>&1; echo "mlp tune rc=$? at ${SECONDS}s"; grep "tune_s\|^route" outputs/ag/keep/mlp-tune.log | cut -c1-250
cp outputs/ag/mlp-cold/route.json outputs/ag/keep/mlp-route.json; cp outputs/ag/mlp-cold/cost.json outputs/ag/keep/mlp-cost.json
timeout -s KILL $((590 - SECONDS)) python3 bench/load.py --out outputs/ag/keep --tag h200-ag-mlp --checkpoints outputs/ag/mlp-cold/model.tweak --runs outputs/ag --profile > outputs/ag/keep/load-mlp.log 2>&1; echo "mlp load rc=$? at ${SECONDS}s"; grep -A3 "^| model" outputs/ag/keep/load-h200-ag-mlp.md
tar czf $OUT/call-ag.tgz -C outputs/ag/keep .
