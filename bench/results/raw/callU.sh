# Call U (issues 40, 38): DistilBERT MLM in the suite with outputs judged on the device in chunks; ViT-L/16 tuned from a plain script.
set -o pipefail; source bench/device_env.sh || exit 1; mkdir -p outputs/u
timeout -s INT 290 python3 bench/suite.py --out outputs/u --runs RUNS --tag h200-e --budget-s 280 \
  --models DistilBertForMaskedLM > outputs/u/suite-h200-e.log 2>&1; echo "suite rc=$? at ${SECONDS}s"
cp outputs/u/*.json outputs/u/*.md outputs/u/*.log $OUT/ 2>/dev/null
timeout -s INT $((585 - SECONDS)) python3 bench/tune_scale.py --out outputs/u --tag h200-d --runs outputs/u/ts --models vit_l_16 \
  > outputs/u/tune-scale-h200-d.log 2>&1; echo "tune_scale rc=$? at ${SECONDS}s"
cp outputs/u/*.json outputs/u/*.md outputs/u/*.log $OUT/ 2>/dev/null
(cd outputs/u && tar czf $OUT/runs-u.tgz --exclude='*.pt' --exclude='*.tweak' --exclude='*.db' --exclude='mlruns' ts runs 2>/dev/null)
tail -8 outputs/u/suite-h200-e.log; tail -15 outputs/u/tune-scale-h200-d.log
