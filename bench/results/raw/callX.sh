# Call X (issue 38): GPT-2 medium from a plain script, cold, then with screens and regional off, both routes timed together.
set -o pipefail; source bench/device_env.sh || exit 1; mkdir -p outputs/x
timeout -s INT $((560 - SECONDS)) python3 bench/tune_scale.py --out outputs/x --tag h200-f --runs outputs/x/ts --models gpt2_medium --full > outputs/x/tune-scale-h200-f.log 2>&1; echo "tune_scale rc=$? at ${SECONDS}s"
cp outputs/x/*.json outputs/x/*.md outputs/x/*.log $OUT/ 2>/dev/null
for f in outputs/x/ts/*/cost.json outputs/x/ts/*/route.json; do d=$(basename $(dirname $f)); cp $f $OUT/$d-$(basename $f); done 2>/dev/null
tail -12 outputs/x/tune-scale-h200-f.log
