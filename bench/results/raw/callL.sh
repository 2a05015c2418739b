# Call L (issue 31), one H200, code at eec6122: sequence length as a routed dimension, DistilBERT-QA then GPT-2
# until the bench's budget (560 s) would be passed (call M runs the T5 encoder).
set -o pipefail; source bench/device_env.sh || exit 1; mkdir -p outputs/s
timeout -s KILL 580 python3 bench/seq.py --out $OUT --tag h200-b --budget-s 560 --runs outputs/s \
    --models DistilBertForQuestionAnswering GPT2Model > $OUT/seq-run-b.log 2>&1
echo "seq rc=$?" >> $OUT/seq-run-b.log
tar czf $OUT/seq-runs-b.tgz --exclude='*.tweak' --exclude='*.compiled' --exclude=cache --exclude='mlruns*' --exclude='*.db' outputs/s 2>/dev/null; ls -la $OUT
