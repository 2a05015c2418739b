#!/usr/bin/env bash
# Fetch, on the development machine, the wheels the GPU machine lacks into the git-ignored .whl/ (carried by
# the device tool; bench/device_env.sh installs them there). The GPU host has Python 3.12, torch 2.11 and no
# network; it already holds numpy, requests, pyyaml, protobuf and the other packages of the device README's list,
# which are removed here so that its own versions stay in force.
#   bash bench/device_wheels.sh            # hydra, omegaconf, MLflow's SQLite store, torchao, redis
#   bash bench/device_wheels.sh openvino   # OpenVINO, hydra and omegaconf alone, for bench/cpu_table.py on the
#                                          # host's CPU cores with --tracking off: OpenVINO's wheel is 57 MB of the
#                                          # 64 MiB a call carries, so MLflow and the rest stay behind
set -euo pipefail
cd "$(dirname "$0")/.."
out=.whl
mkdir -p "$out"
rm -f "$out"/*.whl  # one set at a time: both would not fit in what a call carries
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
platform=(--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
          --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64
          --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any)
# omegaconf needs antlr4's runtime at exactly 4.9.3, published only as a source archive: build its pure wheel.
python3 -m pip wheel -q --no-deps -w "$out" antlr4-python3-runtime==4.9.3
wanted=("hydra-core>=1.3,<1.4" "omegaconf>=2.3,<2.4")
if [ "${1:-}" = openvino ]; then
    wanted+=("openvino==$(python3 -c 'import openvino; print(openvino.__version__.split("-")[0])')")
else
    wanted+=("mlflow-skinny==$(python3 -c 'import mlflow; print(mlflow.__version__)')" sqlalchemy alembic
             "torchao==0.18.0" redis)
fi
python3 -m pip download -q "${platform[@]}" --find-links "$out" -d "$out" "${wanted[@]}"
# Already on the GPU machine (the device README's package list): keep its versions.
for name in annotated_doc anyio certifi charset_normalizer click cloudpickle h11 idna markupsafe numpy packaging \
            protobuf pyyaml requests typing_extensions urllib3 zipp; do
    rm -f "$out"/"$name"-*.whl
done
ls "$out"
du -sh "$out"
