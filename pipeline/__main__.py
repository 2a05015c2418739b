"""``python -m pipeline``: compose the config with Hydra and run the stages.

A mistake of the user's (a config check's :class:`ConfigError`, or Hydra failing to compose the
config) is one line on stderr and exit code 2, and a run that fails its checks leaves no run
directory; a run that ends without its result (:class:`RunFailed`: no backend survived, a route
refused by ``route.require_confident``, a failed validation) is one line and exit code 1; Ctrl-C or
SIGTERM, one line in the log saying where the files are and how to resume, exit code 130 or 143;
a traceback means a bug of tweakpipe's. ``HYDRA_FULL_ERROR=1`` shows Hydra's own report.

In a sweep (``-m``) a job that fails so is recorded FAILED with that line and the sweep runs its other jobs; at the
end one line says how many failed, exit code 1 (2 where no job could run for mistakes in their configs).
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import traceback
from pathlib import Path
from typing import NoReturn

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.errors import ConfigCompositionException, OverrideParseException
from hydra.types import RunMode
from omegaconf import DictConfig

from pipeline.config import SHIPPED_CONF
from pipeline.config.errors import composition_problem, config_dirs_from_argv, fail, one_line
from pipeline.config.own_model import with_own_model
from pipeline.errors import ConfigError, JobFailed, RunFailed
from pipeline.preflight.jobs import SweepFailed, SweepRefused
from pipeline.redact import redacted
from pipeline.runner import resumed_config, run
from pipeline.config.resolvers import model_label
from pipeline.config.schema import register_configs
from pipeline import disks, stops

register_configs()
log = logging.getLogger("pipeline")  # not __main__, the name python -m gives this module
FULL_ERROR = "HYDRA_FULL_ERROR"
STOPPED = {KeyboardInterrupt: 130, stops.Terminated: 143}  # the exit codes of a shell's job killed by the signal


def remove_if_unused(run_dir: Path) -> None:
    """Remove a run directory that holds nothing but what Hydra wrote before ``main`` (``.hydra/``, the log)
    and the run's lock."""
    if run_dir.is_dir() and all(p.name == ".hydra" or p.suffix in (".log", ".lock") for p in run_dir.iterdir()):
        shutil.rmtree(run_dir)


def raised_in_main(exc: BaseException) -> bool:
    """Whether ``exc`` came from the run itself rather than from Hydra setting up the job."""
    return any(frame.f_code is main.__wrapped__.__code__ for frame, _ in traceback.walk_tb(exc.__traceback__))


def ended_without_result(message: str, code: int) -> NoReturn:
    """A run prints ``message`` in one line and exits ``code`` (a SystemExit passes through Hydra, which would log
    and print an Exception); a sweep job logs it and raises :class:`JobFailed`, which Hydra records as the job's
    FAILED result, as it does any job's error, and the sweep goes on to its other jobs."""
    if HydraConfig.get().mode == RunMode.MULTIRUN:
        log.error("this job failed: %s", redacted(message))
        raise JobFailed(redacted(message), code) from None
    fail(message, code)


@hydra.main(version_base="1.3", config_path=str(SHIPPED_CONF), config_name="config")
def main(cfg: DictConfig) -> None:
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    try:
        if cfg.resume:
            cfg = resumed_config(run_dir, HydraConfig.get().overrides.task)
        else:  # someone else's model is not the default's mlp (the run directory is named so too)
            overrides = HydraConfig.get().overrides.task
            cfg.model.name = model_label(cfg.model.name, cfg.model.build.get("_target_"), overrides)
        ctx = run(cfg, run_dir, resume=bool(cfg.resume))
    except ConfigError as exc:
        remove_if_unused(run_dir)
        ended_without_result(str(exc), code=2)
    except RunFailed as exc:
        ended_without_result(f"{exc} (run directory: {run_dir})", code=1)
    except (KeyboardInterrupt, stops.Terminated) as exc:  # the run logged where its files are and how to resume
        raise SystemExit(STOPPED[type(exc)]) from None
    except OSError as exc:
        if not disks.is_full(exc):
            raise
        why = str(exc) if isinstance(exc, disks.DiskFull) else \
            f"{disks.full_reason(run_dir, 'the run directory')} ({one_line(exc)[:300]})"
        resume = f"; python -m pipeline resume={run_dir} continues the run" if (run_dir / "run.json").exists() else ""
        ended_without_result(f"{why}; what was measured is in {run_dir}{resume}", code=1)
    print(f"run directory: {run_dir}")
    if ctx.routed is not None:
        print(f"route: {ctx.routed.extra_repr()}")


def entry() -> None:
    """Run Hydra's main; a config Hydra cannot compose is reported in one line (unknown choices with what exists)."""
    full_error = os.environ.get(FULL_ERROR) == "1"
    os.environ[FULL_ERROR] = "1"  # Hydra then raises composition errors to us instead of printing its report
    for arg in sys.argv[1:]:  # Hydra makes resume= the run directory: a file there would fail it obscurely
        target = Path(arg.split("=", 1)[1]) if arg.lstrip("+").startswith("resume=") else None
        if target is not None and target.exists() and not target.is_dir():
            fail(f"resume={target} is a file; resume takes the directory of an interrupted run, "
                 f"e.g. resume=outputs/runs/<time>_<model>_<pid>")
    sys.argv[1:] = with_own_model(sys.argv[1:])  # your model.build._target_ alone starts from model=custom
    try:
        main()
    except (ConfigCompositionException, OverrideParseException) as exc:
        if full_error:
            raise
        argv = sys.argv[1:]
        fail(f"{composition_problem(exc, argv, config_dirs_from_argv(argv))} (python -m pipeline --help lists every "
             f"group and option)")
    except SweepRefused as exc:  # every sweep job's config, checked before the sweep starts
        fail(str(exc))
    except (SweepFailed, JobFailed) as exc:  # jobs of the sweep failed, each named in the log and the parent run (or,
        fail(str(exc), code=exc.code)       # under Hydra's own basic sweeper, the first failed job's error at its end)
    except KeyboardInterrupt:  # before the run began (a run logs its own stop and exits 130)
        fail("stopped by SIGINT (Ctrl-C) before the run began; nothing was measured", code=130)
    except BrokenPipeError:  # the reader went away (python -m pipeline --help | head): nothing to report
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # as Python's docs advise for SIGPIPE
        raise SystemExit(0) from None
    except OSError as exc:  # Hydra could not make the run directory (read-only, a file in the way)
        if full_error or raised_in_main(exc):
            raise
        fail(f"{exc}; pick a writable run directory, e.g. hydra.run.dir=outputs/runs/mine")


if __name__ == "__main__":
    entry()
