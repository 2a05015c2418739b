# Call AA (issues 38, 39; 2026-12-04): the image's bytecode caches; the GPU test of the standalone default; ViT-L/16 under the default, warm and against --full.
set -o pipefail; source bench/device_env.sh || exit 1; mkdir -p outputs/aa
T=$(python3 -c "import torch,os;print(os.path.dirname(torch.__file__))")
{ echo "torch dir $T"; ls -ld $T $T/_inductor; ls $T/_inductor/__pycache__ 2>&1 | head -3; ls $T/_inductor/__pycache__ 2>/dev/null | wc -l; ls $T/_inductor/*.py | wc -l
  touch $T/_inductor/.w 2>&1 && echo writable && rm $T/_inductor/.w; env | grep -i "PYTHON" ;
  grep -n "caching_precompile\b" $T/_dynamo/config.py $T/_dynamo/eval_frame.py $T/compiler/__init__.py | head; ls $T/_dynamo/package.py $T/_dynamo/precompile_context.py
  for i in 1 2; do /usr/bin/time -f "import torch+inductor standalone: %e s" python3 -c "import torch, torch._inductor.standalone_compile" ; done
  python3 -X importtime -c "import torch._inductor.standalone_compile" 2> $OUT/importtime.txt; sort -t'|' -k2 -n -r $OUT/importtime.txt | head -25
} > $OUT/probe.txt 2>&1; echo "probe at ${SECONDS}s"; cat $OUT/probe.txt | head -60
timeout -s INT 150 python3 -m pytest -q -n 0 -m gpu tests/test_ahead_of_time.py -p no:cacheprovider > $OUT/gpu-tests-aot-default.log 2>&1; echo "pytest rc=$? at ${SECONDS}s"; tail -5 $OUT/gpu-tests-aot-default.log
timeout -s INT $((585 - SECONDS)) python3 bench/tune_scale.py --out outputs/aa --tag h200-vit --runs outputs/aa/ts --models vit_l_16 --warm vit_l_16 --full > outputs/aa/tune-scale-h200-vit.log 2>&1; echo "tune_scale rc=$? at ${SECONDS}s"
cp outputs/aa/*.json outputs/aa/*.md outputs/aa/*.log $OUT/ 2>/dev/null; for f in outputs/aa/ts/*/cost.json; do d=$(basename $(dirname $f)); cp $f $OUT/vit-$d-cost.json; done; tail -12 outputs/aa/tune-scale-h200-vit.log
