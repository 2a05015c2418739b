# Call G (issues 27 and 28), one H200, code at ebaf21c: tune cost of mlp and resnet50 (resnet50 again, warm),
# each route against the previous code's, then resnet50's and mlp's checkpoints loaded three ways.
# (The load step's 140 s limit ended it after resnet50; mlp's load is call I.)
set -o pipefail; source bench/device_env.sh || exit 1; mkdir -p outputs/b
timeout 420 python3 bench/tune_cost.py --out $OUT --tag h200 --models mlp resnet50 --warm resnet50 --runs outputs/b > $OUT/tune-cost-run.log 2>&1
timeout 140 python3 bench/load.py --out $OUT --tag h200 --checkpoints outputs/b/resnet50-cold/model.tweak outputs/b/mlp-cold/model.tweak --runs outputs/b > $OUT/load-run.log 2>&1
