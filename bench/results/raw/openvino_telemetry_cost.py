"""Probe (2026-12-04, sixth session): the tune (every stage) and load seconds of an eager/OpenVINO CPU route of the
tiny MLP, and how many times the process forked, with the code of the tree TREE (its own pipeline package, asserted),
in a fresh process. Before/after OpenVINO's telemetry was declined (f06acb3), alternating, with HOME an empty folder
(no OpenVINO consent file: its default, sending):

    git worktree add .probe/before-ov 9cdc7f2
    for i in 1 2 3; do for t in .probe/before-ov .; do HOME=$(mktemp -d) python bench/results/raw/openvino_telemetry_cost.py $t; done; done
"""
import json, os, sys, tempfile, time
sys.path.insert(0, sys.argv[1])
forks = []
os.register_at_fork(before=lambda: forks.append(1))
import torch
from pipeline.api import compose_config
from pipeline.runner import run
from pathlib import Path
import pipeline as _p; assert _p.__file__.startswith(os.path.abspath(sys.argv[1])), _p.__file__
run_dir = tempfile.mkdtemp()
start = time.perf_counter()
ctx = run(compose_config(["model=tiny_mlp", "tracking=off", "backends=[eager,openvino]", "device=cpu",
                          "model.batch_sizes=[1,4]", "route=one_backend", "route.backend=openvino"]), Path(run_dir, "r"))
tune_s = time.perf_counter() - start
import pipeline
served = pipeline.load(os.path.join(run_dir, "r", "model.tweak"), ctx.model)
print(json.dumps({"tree": os.path.basename(os.path.abspath(sys.argv[1])), "tune_s": round(tune_s, 2),
                  "load_s": round(served.load_seconds, 3), "forks": len(forks), "route": served.extra_repr()}))
