# Source on the GPU machine: installs the carried wheels (hydra, omegaconf, mlflow-skinny, ...) and
# puts the repo on PYTHONPATH. Wheels are prepared on the dev machine into .whl/ (see bench/results/README.md).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || return 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
python3 -c "import torch, hydra, mlflow; print('torch', torch.__version__, 'gpus', torch.cuda.device_count())"
