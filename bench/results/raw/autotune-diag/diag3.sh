source bench/device_env.sh || exit 1
export TORCHINDUCTOR_CACHE_DIR=/tmp/diag_ind3 PYTHONFAULTHANDLER=1
timeout ${DIAG_S:-400} python3 .whl/diag_at2.py > $OUT/diag3.log 2>&1
echo "python rc=$?"
grep -v "^E1129\|^I1129\|^  triton_\|^  convolution\|strides:\|dtypes:\|^  addmm\|^  bias_addmm\|Choices Stats\|^{" $OUT/diag3.log | tail -60
