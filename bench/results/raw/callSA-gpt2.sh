# Call G (issue 38; 2026-12-04): GPT-2 medium tuned from a plain script with standalone capture, and the full tune in the same rounds.
set -o pipefail; source bench/device_env.sh || exit 1; mkdir -p outputs/g
timeout -s INT $((590 - SECONDS)) python3 bench/tune_scale.py --out outputs/g --tag h200-sa-gpt2 --runs outputs/g/ts --models gpt2_medium --full --overrides compile_cache.standalone=true > outputs/g/tune-scale-h200-sa-gpt2.log 2>&1; echo "tune_scale rc=$? at ${SECONDS}s"
cp outputs/g/*.json outputs/g/*.md outputs/g/*.log $OUT/ 2>/dev/null; for f in outputs/g/ts/*/cost.json; do echo $f; cp $f $OUT/$(basename $(dirname $f))-cost.json; done; tail -14 outputs/g/tune-scale-h200-sa-gpt2.log
