"""A Hydra launcher for parallel sweeps: every job in a fresh process, one job per GPU at a time.

Hydra's joblib launcher hands jobs to loky's *reusable* worker pool, so one job's CUDA context,
allocator pools and Dynamo/Inductor caches stay alive in the next job of the same worker, and
``CUDA_VISIBLE_DEVICES`` cannot move a worker whose CUDA is already initialised. This launcher
runs the same job function (``hydra_joblib_launcher``'s ``execute_job``), each job in a one-shot
loky process whose environment is set before anything is imported.

Job ``N`` runs in lane ``N mod n_jobs``; a lane runs its jobs one after another, each pinned to
the lane's GPU (``CUDA_VISIBLE_DEVICES``), so no GPU ever runs two jobs at once. Configured by
``conf/hydra/launcher/joblib_fresh.yaml``.
"""

from __future__ import annotations

import logging
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, configure_log, filter_overrides, setup_globals
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig

log = logging.getLogger(__name__)


def visible_gpus() -> List[str]:
    """The CUDA device ids this process may hand out: ``CUDA_VISIBLE_DEVICES`` if set, else every GPU."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [d.strip() for d in listed.split(",") if d.strip()]
    import torch

    return [str(i) for i in range(torch.cuda.device_count())]


class FreshProcessLauncher(Launcher):
    """``n_jobs`` lanes (0: one per visible GPU, or one without a GPU); ``pin_gpus`` sets each job's GPU."""

    def __init__(self, n_jobs: int = 0, pin_gpus: bool = True) -> None:
        self.n_jobs = n_jobs
        self.pin_gpus = pin_gpus
        self.config: Optional[DictConfig] = None
        self.task_function: Optional[TaskFunction] = None
        self.hydra_context: Optional[HydraContext] = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config, self.task_function, self.hydra_context = config, task_function, hydra_context

    def job_env(self, lane: int, lanes: int, gpus: Sequence[str]) -> Dict[str, str]:
        env = {"TWEAK_PROGRESS": "0"} if lanes > 1 else {}  # parallel jobs share one terminal
        if gpus:
            env["CUDA_VISIBLE_DEVICES"] = gpus[lane % len(gpus)]
        return env

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        from hydra_plugins.hydra_joblib_launcher._core import execute_job
        from joblib.externals.loky import ProcessPoolExecutor

        assert self.config is not None and self.hydra_context is not None and self.task_function is not None
        setup_globals()
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        Path(str(self.config.hydra.sweep.dir)).mkdir(parents=True, exist_ok=True)
        gpus = visible_gpus() if self.pin_gpus else []
        lanes = self.n_jobs if self.n_jobs > 0 else max(len(gpus), 1)
        state = Singleton.get_state()
        jobs = [(initial_job_idx + i, list(o)) for i, o in enumerate(job_overrides)]
        log.info("launching %d job(s) in %d lane(s), a fresh process each%s", len(jobs), lanes,
                 f", GPUs {','.join(gpus)}" if gpus else "")
        for idx, overrides in jobs:
            env = self.job_env(idx % lanes, lanes, gpus)
            log.info("\t#%d : %s%s", idx, " ".join(filter_overrides(overrides)),
                     f"  (CUDA_VISIBLE_DEVICES={env['CUDA_VISIBLE_DEVICES']})" if "CUDA_VISIBLE_DEVICES" in env else "")

        def run_lane(lane: int) -> List[Tuple[int, JobReturn]]:
            done = []
            for idx, overrides in jobs:
                if idx % lanes != lane:
                    continue
                try:
                    with ProcessPoolExecutor(max_workers=1, env=self.job_env(lane, lanes, gpus)) as pool:
                        ret = pool.submit(execute_job, idx, overrides, self.hydra_context, self.config,
                                          self.task_function, state).result()
                except Exception as exc:  # the job's process died (killed, out of memory, segfault)
                    ret = JobReturn(overrides=overrides, status=JobStatus.FAILED, _return_value=exc)
                done.append((idx, ret))
            return done

        with ThreadPoolExecutor(max_workers=lanes) as threads:
            results = sorted((r for rs in threads.map(run_lane, range(lanes)) for r in rs), key=lambda r: r[0])
        return [ret for _, ret in results]

