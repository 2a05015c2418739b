source bench/device_env.sh || exit 1
nproc; nvidia-smi -L
export TORCHINDUCTOR_CACHE_DIR=/tmp/diag_ind
timeout ${DIAG_S:-280} python3 .whl/diag_at.py 2>&1 | grep -v "^  triton_conv\|^  convolution\|strides:\|dtypes:" | tail -120
echo rc=$?
