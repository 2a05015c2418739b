# Call H (issues 27, 28, 32 GPU tests), one H200, code at ebaf21c, right after call G on the same machine. An earlier
# call with `pytest -m gpu tests/` ran into the six-model HF-suite sweep test and its 600 s limit, so this one names
# the GPU test files that cover the changed paths.
set -o pipefail; source bench/device_env.sh || exit 1; mkdir -p outputs/b
timeout -s KILL 100 python3 -m pytest -q -x -m gpu -p no:cacheprovider tests/test_graph_gpu.py tests/test_precision.py tests/test_checkpoint.py tests/test_quantize.py > $OUT/gpu-tests.log 2>&1
timeout -s KILL 240 python3 bench/tune_cost.py --out $OUT --tag h200-b --models vit_b_16 --warm --runs outputs/b > $OUT/tune-cost-b.log 2>&1
timeout -s KILL 90 python3 bench/load.py --out $OUT --tag h200-b --checkpoints outputs/b/vit_b_16-cold/model.tweak --runs outputs/b > $OUT/load-b.log 2>&1
