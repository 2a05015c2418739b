# Call A: the HF suite in two lanes (issue 18), then the GPU tests on lane 0 (issues 15, 18).
source bench/device_env.sh || exit 1
rm -rf OUT_DIR; mkdir -p OUT_DIR/logs
( export CUDA_VISIBLE_DEVICES=0
  timeout 430 taskset -c 0-15 python3 bench/hf_suite.py --out OUT_DIR --tag h200-a --models BertForQuestionAnswering ElectraForQuestionAnswering DistilBertForQuestionAnswering > OUT_DIR/logs/hf-suite-h200-a.log 2>&1; echo "hf-a rc=$?" >> OUT_DIR/logs/rc.txt
  timeout 115 taskset -c 0-15 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_graph_gpu.py tests/test_isolation.py > OUT_DIR/logs/gpu-tests-h200.log 2>&1; echo "pytest rc=$?" >> OUT_DIR/logs/rc.txt ) &
( export CUDA_VISIBLE_DEVICES=1
  timeout 550 taskset -c 16-31 python3 bench/hf_suite.py --out OUT_DIR --tag h200-b --models GPT2Model T5EncoderModel ViTForImageClassification > OUT_DIR/logs/hf-suite-h200-b.log 2>&1; echo "hf-b rc=$?" >> OUT_DIR/logs/rc.txt ) &
wait
python3 bench/hf_suite.py --combine OUT_DIR/hf-suite-h200-a.json OUT_DIR/hf-suite-h200-b.json --out OUT_DIR --tag h200 > OUT_DIR/logs/combine.log 2>&1
cp .whl/callA.sh OUT_DIR/logs/
(cd OUT_DIR && tar czf $OUT/callA.tgz *.json *.md logs 2>/dev/null)
cat OUT_DIR/logs/rc.txt; tail -3 OUT_DIR/logs/gpu-tests-h200.log; cat OUT_DIR/logs/combine.log | tail -30
