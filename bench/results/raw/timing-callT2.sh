# issue 6 on nvidia-h200: the timing bench with the current router (eager baseline in the product route), outputs tarred.
source bench/device_env.sh || exit 1
mkdir -p /tmp/t
timeout 520 python3 bench/timing.py --out /tmp/t 2>&1 | tee /tmp/t/timing-h200.log | grep -v Warning | tail -60
cp .whl/callT2.sh /tmp/t/
(cd /tmp/t && tar czf $OUT/timing.tgz timing-h200.json timing-h200.log callT2.sh)
