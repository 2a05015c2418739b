# Call T (issue 40): the suite's last Hugging Face models, with capture building again what ran out of memory beside the workers.
set -o pipefail; source bench/device_env.sh || exit 1; mkdir -p outputs/t
timeout -s INT 560 python3 bench/suite.py --out outputs/t --runs RUNS --tag h200-d --budget-s 530 \
  --models AlbertForMaskedLM ElectraForQuestionAnswering DistilBertForMaskedLM > outputs/t/suite-h200-d.log 2>&1; echo "rc=$?"
cp outputs/t/*.json outputs/t/*.md outputs/t/*.log $OUT/ 2>/dev/null
grep -h "ran out of device memory\|failed \|compile ahead\|skipped " outputs/t/suite-h200-d.log 2>/dev/null | cut -c1-300 | head -20 > $OUT/notes.txt
tail -25 outputs/t/suite-h200-d.log
