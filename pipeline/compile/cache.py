"""Inductor's on-disk caches as one directory per project, shared by every candidate, run and sweep job.

Inductor keys its FX-graph, AOTAutograd and autotuning caches by content (the traced graph, its input
shapes and dtypes, the Inductor options, matmul precision, device and versions), so two candidates that
compile the same program, or a second run of the same model, load it instead of compiling it. Only
Inductor's compiled artifacts are shared: every backend still traces its own program with Dynamo and
keeps its own Dynamo cache and recompile budget (``pipeline.backends.program``).

:func:`active` points Inductor at ``compile_cache.dir`` for a run (through the environment, so compile
workers spawned by the run inherit it) and, with ``compile_cache.remote=redis://HOST:PORT``, turns on
Inductor's Redis remote caches, so sweep jobs on other machines load what one compiled.
``compile_cache.enabled=false`` makes every compile cold. :func:`counts` reads the hit and miss counters
and compile timers that the cost account (``pipeline.compile.cost``) takes differences of.
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, Mapping, Optional, Tuple
from urllib.parse import urlparse

REMOTE_SCHEMES = ("redis",)
REDIS_EXTRA = 'pip install -e ".[redis]"'
PING_SECONDS = 2.0


def remote_address(url: str) -> Tuple[str, int]:
    """``redis://HOST:PORT`` as (host, port); ValueError naming the expected form otherwise."""
    parsed = urlparse(url)
    if parsed.scheme not in REMOTE_SCHEMES or not parsed.hostname or parsed.path not in ("", "/"):
        raise ValueError(f"compile_cache.remote={url!r} is not a Redis address; use redis://HOST:PORT, "
                         f"e.g. compile_cache.remote=redis://localhost:6379")
    try:
        port = parsed.port or 6379
    except ValueError:
        raise ValueError(f"compile_cache.remote={url!r} has no valid port; use redis://HOST:PORT, "
                         f"e.g. compile_cache.remote=redis://localhost:6379") from None
    return parsed.hostname, port


def remote_problem(url: str) -> Optional[str]:
    """Why ``url`` cannot serve as Inductor's remote cache (bad address, no client package, no server), or None."""
    try:
        host, port = remote_address(url)
    except ValueError as exc:
        return str(exc)
    try:
        import redis
    except ImportError:
        return f"compile_cache.remote={url} needs the redis package: {REDIS_EXTRA}"
    try:
        redis.Redis(host=host, port=port, socket_connect_timeout=PING_SECONDS, socket_timeout=PING_SECONDS).ping()
    except Exception as exc:  # noqa: BLE001 -- any failure means no usable server
        return (f"compile_cache.remote={url}: no Redis server answers there ({type(exc).__name__}: {exc}); start "
                f"one (redis-server --port {port}) or drop compile_cache.remote")
    return None


def settings_problem(cfg: Mapping[str, Any]) -> Optional[str]:
    """Why ``compile_cache`` cannot be used as configured (a directory that cannot be written, a remote that does
    not answer), or None. Run with the config's other checks, before any work."""
    from pipeline.config.paths import writable_problem

    if cfg.get("workers") is not None and int(cfg["workers"]) < 0:
        return f"compile_cache.workers={cfg['workers']} must be >= 0 (0: no compile workers), or null for one per 4 cores"
    if not cfg.get("enabled", True):
        return None
    problem = writable_problem(directory(cfg))
    if problem:
        return (f"compile_cache.dir={cfg['dir']}: {problem}; point it at a writable directory, or turn the cache off "
                f"with compile_cache.enabled=false")
    return remote_problem(str(cfg["remote"])) if cfg.get("remote") else None


def directory(cfg: Mapping[str, Any]) -> Path:
    """The cache directory, absolute (relative paths are taken from where the run starts)."""
    return Path(str(cfg["dir"])).expanduser().absolute()


def environment(cfg: Mapping[str, Any]) -> Dict[str, str]:
    """The environment variables that point Inductor (and Triton, under it) at this run's caches."""
    env = {"TORCHINDUCTOR_CACHE_DIR": str(directory(cfg))}
    if cfg.get("remote"):
        host, port = remote_address(str(cfg["remote"]))
        env.update(TORCHINDUCTOR_REDIS_HOST=host, TORCHINDUCTOR_REDIS_PORT=str(port))
    return env


def _config_flags(cfg: Mapping[str, Any]) -> Dict[Tuple[Any, str], Any]:
    """(config module, attribute) -> value for this run: every cache off, or the remote caches on. The local
    caches are on by torch's defaults, so a default run imports no compiler config (a run without a compiling
    backend never loads Inductor)."""
    if cfg.get("enabled", True) and not cfg.get("remote"):
        return {}
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    if not cfg.get("enabled", True):
        return {(inductor_config, "force_disable_caches"): True}
    flags = {(inductor_config, "fx_graph_remote_cache"): True, (inductor_config, "autotune_remote_cache"): True,
             (functorch_config, "enable_remote_autograd_cache"): True}
    return {key: value for key, value in flags.items() if hasattr(*key)}


def clear_in_memory() -> None:
    """Drop what Inductor holds in memory from the previous cache directory (its modules and lookups), where
    Inductor is loaded at all."""
    if "torch._inductor.utils" not in sys.modules:
        return
    from torch._inductor import utils

    clear = getattr(utils, "clear_caches", None) or getattr(utils, "clear_inductor_caches", None)
    if clear is not None:
        clear()


def apply(cfg: Mapping[str, Any]) -> Callable[[], None]:
    """Point Inductor at ``cfg``'s (``compile_cache``) caches now; returns what puts the previous settings back."""
    env = environment(cfg) if cfg.get("enabled", True) else {}
    saved_env = {key: os.environ.get(key) for key in env}
    flags = _config_flags(cfg)
    saved_flags = {key: getattr(*key) for key in flags}
    os.environ.update(env)
    for (module, attr), value in flags.items():
        setattr(module, attr, value)
    if env:
        directory(cfg).mkdir(parents=True, exist_ok=True)
    clear_in_memory()

    def restore() -> None:
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        for (module, attr), value in saved_flags.items():
            setattr(module, attr, value)
        clear_in_memory()

    return restore


@contextlib.contextmanager
def active(cfg: Mapping[str, Any]) -> Iterator[Path]:
    """Inductor's caches at ``cfg`` (``compile_cache``) for the block; the previous settings come back after."""
    restore = apply(cfg)
    try:
        yield directory(cfg)
    finally:
        restore()


# torch's compile timers (torch._dynamo.utils.compilation_time_metrics) the cost account reads: Dynamo's whole
# compile of a frame, and the backend compile inside it (AOTAutograd and Inductor, cache loads included).
DYNAMO_TIMER = "_compile.compile_inner"
BACKEND_TIMER = "OutputGraph.call_user_compiler"


def counts() -> Dict[str, float]:
    """Process-wide totals so far: FX-graph cache hits and misses, and seconds in Dynamo and in Inductor (all
    zero while Dynamo is not loaded: nothing has compiled)."""
    if "torch._dynamo.utils" not in sys.modules:
        return {"cache_hits": 0, "cache_misses": 0, "trace_s": 0.0, "compile_s": 0.0}
    from torch._dynamo.utils import compilation_time_metrics, counters

    dynamo = sum(compilation_time_metrics.get(DYNAMO_TIMER, ()))
    backend = sum(compilation_time_metrics.get(BACKEND_TIMER, ()))
    return {"cache_hits": counters["inductor"]["fxgraph_cache_hit"],
            "cache_misses": counters["inductor"]["fxgraph_cache_miss"],
            "trace_s": max(0.0, dynamo - backend), "compile_s": backend}
