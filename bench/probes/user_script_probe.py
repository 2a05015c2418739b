"""Probe (issue 39, 2026-12-04): a user's plain script, no ``if __name__ == "__main__":`` guard, tunes a model none of
our configs name (torchvision's RegNetY-400MF, random weights) on CUDA with compile workers on (the default), then
the same file loads the checkpoint in a fresh process: the tune's seconds and route, the load's seconds, report,
what it left running, and its outputs against the user's own model.

    python bench/probes/user_script_probe.py tune RUN_DIR    # then:
    python bench/probes/user_script_probe.py load RUN_DIR
"""
import json
import os
import sys
import time

import torch
import torchvision

import pipeline

print("TOP-LEVEL ran in pid", os.getpid(), flush=True)
torch.manual_seed(0)
model = torchvision.models.regnet_y_400mf().eval()
if sys.argv[1] == "tune":
    start = time.perf_counter()
    tuned = pipeline.tune(model, torch.randn(32, 3, 224, 224), run_dir=sys.argv[2],
                          overrides=["device=cuda", "backends=gpu", "precision=[bf16]", "model.batch_sizes=[1,8,32]",
                                     "tracking=off"])
    print(json.dumps({"pid": os.getpid(), "tune_s": time.perf_counter() - start, "route": tuned.extra_repr()}))
else:
    served = pipeline.load(os.path.join(sys.argv[2], "model.tweak"), model)
    sys.path.insert(0, os.getcwd())
    from bench.load import left_behind

    errors = {}
    with torch.inference_mode():
        for bs in (1, 5, 32):
            x = torch.randn(bs, 3, 224, 224, device="cuda")
            ours, theirs = served(x).float(), model.cuda()(x)
            errors[bs] = float((ours - theirs).norm() / theirs.norm())
    print(json.dumps({"load_s": served.load_seconds, "report": served.load_report.to_dict(),
                      "children": left_behind(), "relative_error": errors}))
