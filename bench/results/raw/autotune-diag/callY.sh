# issue 3 on nvidia-h200-x2: the four max-autotune backends, two lanes, with compile_threads=1 patched around each build.
source bench/device_env.sh || exit 1
nvidia-smi -L; nproc
mkdir -p $OUT/y
lane() {  # gpu cores tag backends...
  local g=$1 c=$2 t=$3; shift 3
  CUDA_VISIBLE_DEVICES=$g TORCHINDUCTOR_CACHE_DIR=/tmp/indY$g timeout ${LANE_S:-560} taskset -c $c \
    python3 bench/templates.py --out $OUT/y --tag $t --backends "$@" --inductor-config compile_threads=1 > $OUT/y/$t.log 2>&1
  echo "$t rc=$?" >> $OUT/y/rc.txt
}
lane 0 0-15 h200-autotune-l0 inductor_max_autotune_no_cudagraphs inductor_max_autotune &
lane 1 16-31 h200-autotune-l1 inductor_max_autotune_template inductor_tma &
wait
cat $OUT/y/rc.txt; tail -8 $OUT/y/*.log
