"""Evidence that a sweep runs one job per GPU at the same time (hydra/launcher=joblib_fresh).

    python bench/two_gpu_sweep.py --out bench/results/two_gpu_sweep     # 2 GPUs; about 3-5 minutes on 2 x H200

Runs a 2-job sweep (resnet18, resnet50; eager and Inductor; quick profile) through the fresh-process
launcher into a SQLite store in OUT while sampling ``nvidia-smi`` every 0.5 s, then writes
``OUT/evidence.json`` (the MLflow export: parent and child runs with pid, CUDA_VISIBLE_DEVICES, GPU
uuid, start/end, metrics) and keeps the job logs, run files and the sweep's report. Checkpoints and
the MLflow store are removed afterwards (they are large and the export holds what they say).
Exits 1 unless both jobs finished, on different GPUs, with overlapping time windows.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import command_line  # noqa: E402


def export(uri: str) -> dict:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("tweakpipe")
    runs = client.search_runs([exp.experiment_id], max_results=100)
    return {"runs": [{"run_id": r.info.run_id, "name": r.info.run_name, "status": r.info.status,
                      "start_ms": r.info.start_time, "end_ms": r.info.end_time, "tags": r.data.tags,
                      "metrics": r.data.metrics} for r in runs]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--models", default="resnet18,resnet50")
    args = parser.parse_args()
    out = args.out.resolve()
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    uri = f"sqlite:///{out / 'mlflow.db'}"
    smi = subprocess.Popen(["nvidia-smi", "--query-gpu=timestamp,index,uuid,utilization.gpu,memory.used",
                            "--format=csv", "-lms", "500"], stdout=(out / "nvidia_smi.csv").open("w"))
    cmd = [sys.executable, "-m", "pipeline", "-m", "hydra/launcher=joblib_fresh", f"model={args.models}",
           "device=cuda", "backends=[eager,inductor]", "profile=quick", f"tracking.uri={uri}",
           f"hydra.sweep.dir={out / 'sweep'}"]
    with (out / "sweep_stdout.log").open("w") as log:
        log.write(" ".join(cmd) + "\n")
        log.flush()
        rc = subprocess.run(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT).returncode
    smi.terminate()
    evidence = export(uri)
    evidence["command"] = command_line()
    evidence["returncode"] = rc
    children = sorted((r for r in evidence["runs"] if "mlflow.parentRunId" in r["tags"]),
                      key=lambda r: r["tags"]["hydra.job.num"])
    evidence["checks"] = checks = {
        "children_finished": len(children) == 2 and all(r["status"] == "FINISHED" for r in children),
        "distinct_gpus": len({r["tags"].get("gpu") for r in children}) == len(children) == 2,
        "overlap_s": (min(r["end_ms"] for r in children) - max(r["start_ms"] for r in children)) / 1e3
        if len(children) == 2 else None,
    }
    (out / "evidence.json").write_text(json.dumps(evidence, indent=2, default=str))
    for path in [*out.rglob("*.tweak"), out / "mlflow.db", out / "mlflow.db.lock"]:
        path.unlink(missing_ok=True)
    shutil.rmtree(out / "mlartifacts", ignore_errors=True)
    for r in children:
        t = r["tags"]
        print(f"job {t['hydra.job.num']} {r['name']}: pid {t['pid']} CUDA_VISIBLE_DEVICES={t.get('cuda_visible_devices')} "
              f"gpu {t.get('gpu')} {r['start_ms']}..{r['end_ms']}")
    ok = checks["children_finished"] and checks["distinct_gpus"] and (checks["overlap_s"] or 0) > 0
    print(f"{'OK' if ok else 'FAILED'}: {checks}; evidence in {out}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
