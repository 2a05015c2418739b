# Call AD (issue 39; 2026-12-04): why a trusted load with the tune's Inductor cache is ~0.85 s slower than one with an empty cache.
set -o pipefail; source bench/device_env.sh || exit 1; mkdir -p outputs/ad/keep
timeout -s KILL 150 python3 -m pipeline model=mlp device=cuda backends=gpu 'precision=[fp32,tf32,bf16]' compile_cache.dir=outputs/ad/cache hydra.run.dir=outputs/ad/mlp tracking=off > outputs/ad/keep/mlp-tune.log 2>&1; echo "tune rc=$? at ${SECONDS}s"
C=outputs/ad/mlp/model.tweak; du -sh outputs/ad/cache; find outputs/ad/cache | wc -l
for i in 1 2; do
TORCHINDUCTOR_CACHE_DIR=$PWD/outputs/ad/cache timeout 60 python3 bench/results/raw/load_profile_probe.py $C outputs/ad/keep/tune-cache-$i.json
mkdir -p outputs/ad/empty$i; TORCHINDUCTOR_CACHE_DIR=$PWD/outputs/ad/empty$i timeout 60 python3 bench/results/raw/load_profile_probe.py $C outputs/ad/keep/empty-cache-$i.json
done
tar czf $OUT/call-ad.tgz -C outputs/ad/keep .
