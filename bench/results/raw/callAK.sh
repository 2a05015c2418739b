# Call AK (issue 39; 2026-12-04, sixth session): six more rounds of the overlap probe's lead from call AI, on resnet50
# tuned from the CLI: its load with cuDNN and cuBLAS warmed by a thread beside it (libs_overlap) against the load as
# shipped (plain), alternating.
set -o pipefail; source bench/device_env.sh || exit 1; mkdir -p outputs/ak/keep
timeout -s KILL 200 python3 -m pipeline model=resnet50 device=cuda backends=gpu 'precision=[fp32,tf32,bf16]' compile_cache.dir=outputs/ak/cache hydra.run.dir=outputs/ak/r50 tracking=off > outputs/ak/keep/r50-tune.log 2>&1; echo "tune rc=$? at ${SECONDS}s"; grep "tune_s\|^route" outputs/ak/keep/r50-tune.log | cut -c1-250
timeout -s KILL $((${AK_BUDGET:-590} - SECONDS)) python3 bench/results/raw/overlap_probe.py outputs/ak/r50/model.tweak outputs/ak/cache 6 plain,libs_overlap > outputs/ak/keep/overlap-libs-resnet50.json 2> outputs/ak/keep/overlap-libs-resnet50.log; echo "probe rc=$? at ${SECONDS}s"; cut -c1-200 outputs/ak/keep/overlap-libs-resnet50.log
tar czf $OUT/call-ak.tgz -C outputs/ak/keep .
