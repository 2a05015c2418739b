"""``python -m pipeline``: compose the config with Hydra and run the stages."""

from __future__ import annotations

import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from pipeline.config_errors import config_dirs_from_argv, explain_unknown_choices
from pipeline.runner import run
from pipeline.schema import register_configs

register_configs()


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> None:
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    ctx = run(cfg, run_dir)
    print(f"run directory: {run_dir}")
    if ctx.routed is not None:
        print(f"route: {ctx.routed.extra_repr()}")


def entry() -> None:
    """Run Hydra's main; when composition fails on an unknown list choice, say which and what exists."""
    try:
        main()
    except SystemExit as exit_:
        if exit_.code not in (0, None):
            hint = explain_unknown_choices(sys.argv[1:], config_dirs_from_argv(sys.argv[1:]))
            if hint:
                print(hint, file=sys.stderr)
        raise


if __name__ == "__main__":
    entry()
