# Call K (issue 31), one H200, code at eec6122: sequence length as a routed dimension, all four models in order
# until the bench's budget (540 s) would be passed (call L runs the rest).
set -o pipefail; source bench/device_env.sh || exit 1; mkdir -p outputs/s
timeout -s KILL 580 python3 bench/seq.py --out $OUT --tag h200-a --budget-s 540 --runs outputs/s \
    --models BertForQuestionAnswering DistilBertForQuestionAnswering GPT2Model T5EncoderModel > $OUT/seq-run-a.log 2>&1
echo "seq rc=$?" >> $OUT/seq-run-a.log
tar czf $OUT/seq-runs-a.tgz --exclude='*.tweak' --exclude='*.compiled' --exclude=cache --exclude='mlruns*' --exclude='*.db' outputs/s 2>/dev/null; ls -la $OUT
