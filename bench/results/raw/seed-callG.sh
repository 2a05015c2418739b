# issue 8 fp32 seed table (callF.sh, two lanes), then issue 6's host-speed sampling on the idle host.
TAG=h200 bash .whl/callF.sh
source bench/device_env.sh >/dev/null || exit 1
mkdir -p $OUT/hs
CUDA_VISIBLE_DEVICES=0 taskset -c 0-15 timeout 200 python3 bench/host_speed.py --out $OUT/hs --phase-s 50 --every 0.25 2>&1 | tee $OUT/hs/host-speed.log
cp .whl/callG.sh .whl/callF.sh $OUT/hs/
