# Source on the GPU machine: installs the carried wheels (hydra, omegaconf, mlflow-skinny, ..., and torchao for the
# quantized precisions of bench/quant.py) and puts the repo on PYTHONPATH. Wheels are prepared on the dev machine into
# .whl/ (see bench/results/README.md); torchao's, for the GPU host's Python 3.12 and torch 2.11:
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#       --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 -d .whl torchao==0.18.0
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || return 1
# The image sets PYTHONDONTWRITEBYTECODE=1: every fresh process (a run, each compile worker, each load) would compile
# torch from source (import torch + Inductor 6.1-6.3 s against 2.2-2.3 s with the bytecode cache a user's install has).
unset PYTHONDONTWRITEBYTECODE
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
python3 -c "import torch, hydra; print('torch', torch.__version__, 'gpus', torch.cuda.device_count())"
python3 -c "import mlflow" 2>/dev/null || echo "mlflow not carried (the OpenVINO set): run with tracking off"
python3 -c "import torchao; print('torchao', torchao.__version__)" 2>/dev/null \
    || echo "torchao not carried: the int8 and fp8 precisions are skipped (bench/quant.py needs it)"
