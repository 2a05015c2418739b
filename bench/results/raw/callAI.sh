# Call AI (issue 39; 2026-12-04, fifth session): resnet50 tuned from the CLI, then the overlap probe's library modes: its
# load with cuDNN and cuBLAS loaded before it (libs_first), by a thread beside it (libs_overlap), and with Inductor's
# loader imported too (all_first), against the load as shipped (plain), alternating, three rounds.
set -o pipefail; source bench/device_env.sh || exit 1; mkdir -p outputs/ai/keep
timeout -s KILL 200 python3 -m pipeline model=resnet50 device=cuda backends=gpu 'precision=[fp32,tf32,bf16]' compile_cache.dir=outputs/ai/cache hydra.run.dir=outputs/ai/r50 tracking=off > outputs/ai/keep/r50-tune.log 2>&1; echo "tune rc=$? at ${SECONDS}s"; grep "tune_s\|^route" outputs/ai/keep/r50-tune.log | cut -c1-250
timeout -s KILL $((590 - SECONDS)) python3 bench/results/raw/overlap_probe.py outputs/ai/r50/model.tweak outputs/ai/cache 3 plain,libs_first,libs_overlap,all_first > outputs/ai/keep/overlap-libs-resnet50.json 2> outputs/ai/keep/overlap-libs-resnet50.log; echo "probe rc=$? at ${SECONDS}s"; cut -c1-200 outputs/ai/keep/overlap-libs-resnet50.log
tar czf $OUT/call-ai.tgz -C outputs/ai/keep .
