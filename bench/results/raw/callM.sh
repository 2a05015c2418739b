# Call M (issues 31, 32), one H200, code at eec6122, the session's last device time: the T5 encoder's sequence-length
# cells, then the quantized precisions on BERT-QA in whatever time is left.
set -o pipefail; source bench/device_env.sh || exit 1; mkdir -p outputs/s outputs/q
timeout -s KILL 300 python3 bench/seq.py --out $OUT --tag h200-c --runs outputs/s --models T5EncoderModel > $OUT/seq-run-c.log 2>&1
echo "seq rc=$?" >> $OUT/seq-run-c.log
timeout -s KILL $((545 - SECONDS)) python3 bench/quant.py --out $OUT --tag h200-b --runs outputs/q --models BertForQuestionAnswering > $OUT/quant-run-b.log 2>&1
echo "quant rc=$? after ${SECONDS}s" >> $OUT/quant-run-b.log
tar czf $OUT/runs-c.tgz --exclude='*.tweak' --exclude='*.compiled' --exclude=cache --exclude='mlruns*' --exclude='*.db' outputs/s outputs/q 2>/dev/null; ls -la $OUT
