"""A Hydra launcher for parallel sweeps: every job in a fresh process, one job per GPU at a time.

Why our own (evaluated with real 4-job sweeps, parent seeing GPUs 0,1): ``submitit_local`` runs each
job in a fresh process but starts every job at once and pins each to the same GPUs
(``range(gpus_per_node)``: all four on GPU 0); Hydra's joblib launcher, with loky or
multiprocessing, reuses its workers (jobs 0 and 2 in one process, CUDA context and Dynamo/Inductor
caches carried over) and gives every job all GPUs; the Ray launcher can do it (``num_gpus: 1``,
``max_calls: 1``) but needs ``cloudpickle<3``, which conflicts with the joblib that
hydra-joblib-launcher installs, and a Ray runtime. So jobs here run Hydra's public ``run_job``,
each in a one-shot loky process whose environment is set before anything is imported.

Job ``N`` runs in lane ``N mod n_jobs``; a lane runs its jobs one after another, each pinned to
the lane's GPU (``CUDA_VISIBLE_DEVICES``), so no GPU ever runs two jobs at once. Configured by
``conf/hydra/launcher/joblib_fresh.yaml``.
"""

from __future__ import annotations

import logging
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from hydra.core.hydra_config import HydraConfig
from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, configure_log, filter_overrides, run_job, setup_globals
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, open_dict

log = logging.getLogger(__name__)


def visible_gpus() -> List[str]:
    """The CUDA device ids this process may hand out: ``CUDA_VISIBLE_DEVICES`` if set, else every GPU."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [d.strip() for d in listed.split(",") if d.strip()]
    import torch

    return [str(i) for i in range(torch.cuda.device_count())]


def run_one(idx: int, overrides: Sequence[str], hydra_context: HydraContext, config: DictConfig,
            task_function: TaskFunction, singleton_state: Dict[Any, Any]) -> JobReturn:
    """Job ``idx`` of the sweep, in the calling process: its sweep config, then Hydra's ``run_job``."""
    setup_globals()
    Singleton.set_state(singleton_state)
    sweep_config = hydra_context.config_loader.load_sweep_config(config, list(overrides))
    with open_dict(sweep_config):
        sweep_config.hydra.job.id = f"{sweep_config.hydra.job.name}_{idx}"
        sweep_config.hydra.job.num = idx
    HydraConfig.instance().set_config(sweep_config)
    return run_job(hydra_context=hydra_context, task_function=task_function, config=sweep_config,
                   job_dir_key="hydra.sweep.dir", job_subdir_key="hydra.sweep.subdir")


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
                        ret = pool.submit(run_one, idx, overrides, self.hydra_context, self.config,
                                          self.task_function, state).result()
                except Exception as exc:  # the job's process died (killed, out of memory, segfault)
                    ret = JobReturn(overrides=overrides, status=JobStatus.FAILED, _return_value=exc)
                done.append((idx, ret))
            return done

        with ThreadPoolExecutor(max_workers=lanes) as threads:
            results = sorted((r for rs in threads.map(run_lane, range(lanes)) for r in rs), key=lambda r: r[0])
        return [ret for _, ret in results]

