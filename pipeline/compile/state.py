"""The run's process state that enters a compiled program's cache key, copied into each compile worker.

A worker is a fresh interpreter: an Inductor option the user's script set (``coordinate_descent_tuning``,
``max_autotune``...), a float32 matmul precision, TF32 or determinism switched on before ``pipeline.tune``
would all be at torch's defaults there. Its programs would then differ from the run's, miss the cache at
capture and be compiled twice (capture warns when that still happens). :func:`taken` reads that state in the
run; :func:`put` sets in the worker what differs from its own.
"""

from __future__ import annotations

import logging
import pickle
from typing import Any, Dict

import torch

log = logging.getLogger(__name__)


def _inductor_options() -> Dict[str, Any]:
    """Inductor's options as its FX-graph cache key reads them (private and cache-only options left out)."""
    import torch._inductor.config as inductor_config

    return inductor_config.save_config_portable()


def _switches() -> Dict[str, Any]:
    return {"float32_matmul_precision": torch.get_float32_matmul_precision(),
            "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32,
            "deterministic": torch.are_deterministic_algorithms_enabled(),
            "deterministic_warn_only": torch.is_deterministic_algorithms_warn_only_enabled()}


def taken() -> Dict[str, Any]:
    """This process's state for the workers: Inductor's options that can be sent (a custom pass object may not
    pickle; its uuid still enters the key, and capture then names the miss) and torch's precision switches."""
    options = {}
    for key, value in _inductor_options().items():
        try:
            pickle.dumps(value)
        except Exception:  # noqa: BLE001 - anything that does not pickle stays behind
            continue
        options[key] = value
    return {"inductor": options, "switches": _switches()}


def put(state: Dict[str, Any]) -> None:
    """Set in this (worker) process what differs from ``state`` (from :func:`taken` in the run)."""
    import torch._inductor.config as inductor_config

    factories = set(getattr(inductor_config, "_cache_config_factory_keys", []))
    mine = _inductor_options()
    differ = {k: v for k, v in state["inductor"].items() if k in mine and mine[k] != v and k not in factories}
    if differ:
        inductor_config.load_config(differ)
        log.debug("compile worker: the run's Inductor options %s", sorted(differ))
    switches, now = state["switches"], _switches()
    if switches["float32_matmul_precision"] != now["float32_matmul_precision"]:
        torch.set_float32_matmul_precision(switches["float32_matmul_precision"])
    if switches["cudnn_allow_tf32"] != now["cudnn_allow_tf32"]:
        torch.backends.cudnn.allow_tf32 = switches["cudnn_allow_tf32"]
    if (switches["deterministic"], switches["deterministic_warn_only"]) != (now["deterministic"],
                                                                            now["deterministic_warn_only"]):
        torch.use_deterministic_algorithms(switches["deterministic"], warn_only=switches["deterministic_warn_only"])
