"""``python -m pipeline``: compose the config with Hydra and run the stages."""

from __future__ import annotations

import logging
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from pipeline.runner import run
from pipeline.schema import register_configs

log = logging.getLogger("pipeline")
register_configs()


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> None:
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    ctx = run(cfg, run_dir)
    print(f"run directory: {run_dir}")
    if ctx.routed is not None:
        print(f"route: {ctx.routed.extra_repr()}")


if __name__ == "__main__":
    main()
