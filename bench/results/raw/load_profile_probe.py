"""Probe (issue 39): where a trusted load with the tune's Inductor cache in TORCHINDUCTOR_CACHE_DIR spends the ~0.85 s
more than one with an empty cache directory: one load under cProfile, by own time and by cumulative time.
    TORCHINDUCTOR_CACHE_DIR=... python diff_profile.py CHECKPOINT OUT.json"""
import cProfile, json, pstats, sys, time
from pathlib import Path
import torch, pipeline
from hydra.utils import instantiate
from omegaconf import OmegaConf
ckpt = Path(sys.argv[1]); cfg = OmegaConf.load(ckpt.parent / "config.yaml"); torch.manual_seed(int(cfg.seed))
model = instantiate(cfg.model.build).eval()
p = cProfile.Profile(); t = time.perf_counter(); p.enable(); served = pipeline.load(ckpt, model); p.disable()
s = pstats.Stats(p).stats
row = lambda kv: {"f": f"{kv[0][0].split('site-packages/')[-1]}:{kv[0][1]}({kv[0][2]})", "own": round(kv[1][2], 3), "cum": round(kv[1][3], 3), "n": kv[1][0]}
out = {"load_s": time.perf_counter() - t, "report": served.load_report.to_dict(),
       "own": [row(kv) for kv in sorted(s.items(), key=lambda kv: kv[1][2], reverse=True)[:40]],
       "cum": [row(kv) for kv in sorted(s.items(), key=lambda kv: kv[1][3], reverse=True)[:80]]}
Path(sys.argv[2]).write_text(json.dumps(out, indent=1, default=str)); print(sys.argv[2], round(out["load_s"], 2))
