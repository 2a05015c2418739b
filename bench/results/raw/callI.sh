# Call I (issue 28), one H200, code at ebaf21c, right after call H: mlp tuned once more from the command line (cold,
# tracking off), then its checkpoint loaded three ways.
source bench/device_env.sh >/dev/null 2>&1 || exit 1; mkdir -p outputs/c
timeout -s KILL 110 python3 -m pipeline model=mlp device=cuda backends=gpu 'precision=[fp32,tf32,bf16]' compile_cache.dir=outputs/c/cache hydra.run.dir=outputs/c/mlp-cold tracking=off > $OUT/mlp-tune.log 2>&1
timeout -s KILL 75 python3 bench/load.py --out $OUT --tag h200-c --checkpoints outputs/c/mlp-cold/model.tweak --runs outputs/c > $OUT/load-c.log 2>&1
