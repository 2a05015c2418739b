"""The run's process state that enters a compiled program's cache key, copied into each compile worker.

A worker is a fresh interpreter: an Inductor option the user's script set (``coordinate_descent_tuning``,
``max_autotune``...), a Dynamo or AOTAutograd option that shapes the graph Inductor is given
(``capture_scalar_outputs``, ``assume_static_by_default``...), a float32 matmul precision, TF32 or determinism
switched on before ``pipeline.tune`` would all be at torch's defaults there. Its programs would then differ from
the run's, miss the cache at capture and be compiled twice (capture warns when that still happens). :func:`taken`
reads that state in the run; :func:`put` sets in the worker what differs from its own.
"""

from __future__ import annotations

import importlib
import logging
import pickle
from typing import Any, Dict

import torch

log = logging.getLogger(__name__)


# The compiler configs whose options the worker takes from the run: Inductor's enter its cache key; Dynamo's and
# AOTAutograd's decide the graph whose code enters it.
CONFIGS = {"inductor": "torch._inductor.config", "dynamo": "torch._dynamo.config",
           "functorch": "torch._functorch.config"}


def _options(config: str) -> Dict[str, Any]:
    """A compiler config's options as its cache keys read them (private and cache-only options left out)."""
    return importlib.import_module(CONFIGS[config]).save_config_portable()


def _switches() -> Dict[str, Any]:
    return {"float32_matmul_precision": torch.get_float32_matmul_precision(),
            "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32,
            "deterministic": torch.are_deterministic_algorithms_enabled(),
            "deterministic_warn_only": torch.is_deterministic_algorithms_warn_only_enabled()}


def _sendable(options: Dict[str, Any]) -> Dict[str, Any]:
    """The options that pickle (a custom pass object may not: its uuid still enters the key, and capture then names
    the miss)."""
    kept = {}
    for key, value in options.items():
        try:
            pickle.dumps(value)
        except Exception:  # noqa: BLE001 - anything that does not pickle stays behind
            continue
        kept[key] = value
    return kept


def taken() -> Dict[str, Any]:
    """This process's state for the workers: the compiler configs' options that can be sent, and torch's precision
    switches."""
    return {**{config: _sendable(_options(config)) for config in CONFIGS}, "switches": _switches()}


def put(state: Dict[str, Any]) -> None:
    """Set in this (worker) process what differs from ``state`` (from :func:`taken` in the run)."""
    for config in CONFIGS:
        module = importlib.import_module(CONFIGS[config])
        factories = set(getattr(module, "_cache_config_factory_keys", []))
        mine = _options(config)
        differ = {k: v for k, v in state.get(config, {}).items() if k in mine and mine[k] != v and k not in factories}
        if differ:
            module.load_config(differ)
            log.debug("compile worker: the run's %s options %s", config, sorted(differ))
    switches, now = state["switches"], _switches()
    if switches["float32_matmul_precision"] != now["float32_matmul_precision"]:
        torch.set_float32_matmul_precision(switches["float32_matmul_precision"])
    if switches["cudnn_allow_tf32"] != now["cudnn_allow_tf32"]:
        torch.backends.cudnn.allow_tf32 = switches["cudnn_allow_tf32"]
    if (switches["deterministic"], switches["deterministic_warn_only"]) != (now["deterministic"],
                                                                            now["deterministic_warn_only"]):
        torch.use_deterministic_algorithms(switches["deterministic"], warn_only=switches["deterministic_warn_only"])
