# Call AJ (issue 39; 2026-12-04, fifth session): a user's plain script without a main guard tunes RegNetY-400MF (named
# by none of our configs) on CUDA with compile workers on, then loads its checkpoint in a fresh process.
set -o pipefail; source bench/device_env.sh || exit 1; mkdir -p outputs/aj
timeout -s KILL 150 python3 bench/results/raw/user_script_probe.py tune outputs/aj/run > $OUT/aj-tune.log 2>&1; echo "tune rc=$? at ${SECONDS}s"; grep "TOP-LEVEL\|workers\|tune_s\|^{" $OUT/aj-tune.log | cut -c1-300
timeout -s KILL 60 python3 bench/results/raw/user_script_probe.py load outputs/aj/run > $OUT/aj-load.json 2> $OUT/aj-load.log; echo "load rc=$? at ${SECONDS}s"; cut -c1-600 $OUT/aj-load.json; cp outputs/aj/run/cost.json $OUT/aj-cost.json; cp outputs/aj/run/route.json $OUT/aj-route.json
