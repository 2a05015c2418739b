"""Inductor's on-disk caches as one directory per project, shared by every candidate, run and sweep job.

Inductor keys its FX-graph, AOTAutograd and autotuning caches by content (the traced graph, its input
shapes and dtypes, the Inductor options, matmul precision, device and versions), so two candidates that
compile the same program, or a second run of the same model, load it instead of compiling it. Only
Inductor's compiled artifacts are shared: every backend still traces its own program with Dynamo and
keeps its own Dynamo cache and recompile budget (``pipeline.backends.program``).

:func:`active` points Inductor at ``compile_cache.dir`` for a run (through the environment, so compile
workers spawned by the run inherit it) and, with ``compile_cache.remote=redis[s]://[USER:PASSWORD@]HOST:PORT``,
turns on Inductor's Redis remote caches, so sweep jobs on other machines load what one compiled.
``compile_cache.enabled=false`` makes every compile cold. :func:`counts` reads the hit and miss counters
and compile timers that the cost account (``pipeline.compile.cost``) takes differences of.

A cache is code: Inductor imports the modules and unpickles the entries it finds there without checking
them. So the directory is the user's own (``pipeline.private``: made 0700, and one that another user owns
or others may write is refused before any work) unless the user says otherwise (``compile_cache.shared``),
and a remote cache is the user's explicit trust in every client of that server. Where either is in use,
what the run compiled may hold others' code, and :func:`foreign_now` says so: the checkpoint's compiled
artifacts are then written unsigned (``pipeline.compile.artifacts``).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import socket
import sys
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Set, Tuple
from urllib.parse import urlparse

from pipeline import disks, private
from pipeline.compile import remote_entry
from pipeline.redact import REDACTED, redacted

log = logging.getLogger(__name__)

REMOTE_SCHEMES = ("redis", "rediss")  # rediss: Redis over TLS
REDIS_EXTRA = 'pip install -e ".[redis]"'
# Seconds a Redis call may take: the check before any work, and every get and put of a compile. A server that
# stalls past it is given up for the rest of the process, and candidates compile locally.
PING_SECONDS = 2.0
CALL_SECONDS = 5.0
PASSWORD_ENV = "TWEAKPIPE_REDIS_PASSWORD"  # keeps the password off the command line, which other users can read (ps)
REDIS_FORM = "redis://[[USER]:PASSWORD@]HOST[:PORT] (rediss:// for TLS), e.g. compile_cache.remote=redis://localhost:6379"


def remote_address(url: str) -> Tuple[str, int]:
    """``redis[s]://[user:password@]HOST[:PORT]`` as (host, port); ValueError naming the expected form otherwise."""
    parsed = urlparse(url)
    if parsed.scheme not in REMOTE_SCHEMES or not parsed.hostname or parsed.path not in ("", "/", "/0"):
        raise ValueError(f"compile_cache.remote={redacted(url)!r} is not a Redis address; use {REDIS_FORM}")
    try:
        port = parsed.port or 6379
    except ValueError:
        raise ValueError(f"compile_cache.remote={redacted(url)!r} has no valid port; use {REDIS_FORM}") from None
    return parsed.hostname, port


def redis_client(url: str, seconds: float) -> Any:
    """A Redis client for ``url`` (user, password and TLS from the URL; the password from ``$TWEAKPIPE_REDIS_PASSWORD``
    where the URL has none or a redacted one) whose every call gives up after ``seconds``, without retries: a
    stalled server costs one timeout, not minutes."""
    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    parsed = urlparse(url)
    extra = {}
    if parsed.password in (None, REDACTED) and os.environ.get(PASSWORD_ENV):
        extra["password"] = os.environ[PASSWORD_ENV]  # the URL's own would win over it (redis-py's from_url)
        user = f"{parsed.username}@" if parsed.username not in (None, "", REDACTED) else ""
        url = parsed._replace(netloc=user + parsed.netloc.rpartition("@")[2]).geturl()
    return redis.Redis.from_url(url, socket_timeout=seconds, socket_connect_timeout=seconds,
                                retry=Retry(NoBackoff(), 0), **extra)


def redis_failure(url: str, exc: BaseException, seconds: float) -> str:
    """What went wrong talking to the Redis at ``url``, in words that name Redis and the fix."""
    import redis

    where = "Redis at {}:{}".format(*remote_address(url))
    if isinstance(exc, redis.exceptions.AuthenticationError) or "NOAUTH" in str(exc) or "WRONGPASS" in str(exc):
        return (f"the {where} refused the credentials ({exc}); give its password in ${PASSWORD_ENV} or in the URL "
                f"(redis://:PASSWORD@HOST:PORT; redis://USER:PASSWORD@HOST:PORT for an ACL user)")
    if isinstance(exc, redis.exceptions.TimeoutError):
        return f"the {where} stalled: no answer within {seconds:g} s ({exc})"
    if isinstance(exc, redis.exceptions.ConnectionError):
        return f"no Redis server answers at {where.split(' at ')[1]} ({type(exc).__name__}: {exc})"
    return f"the {where} failed ({type(exc).__name__}: {exc})"


def remote_problem(url: str) -> Optional[str]:
    """Why ``url`` cannot serve as Inductor's remote cache (bad address, no client package, no server, refused
    credentials, a stalled server, a plain server asked for TLS), or None."""
    try:
        remote_address(url)
    except ValueError as exc:
        return str(exc)
    try:
        import redis  # noqa: F401
    except ImportError:
        return f"compile_cache.remote={redacted(url)} needs the redis package: {REDIS_EXTRA}"
    try:
        redis_client(url, PING_SECONDS).ping()
    except Exception as exc:  # noqa: BLE001 -- any failure means no usable server
        host, port = remote_address(url)
        if urlparse(url).scheme == "rediss" and answers_plain(host, port, PING_SECONDS):
            plain = redacted(url).replace("rediss://", "redis://", 1)
            return (f"compile_cache.remote={redacted(url)}: the Redis at {host}:{port} does not speak TLS (it answers "
                    f"plain Redis, and rediss:// waits for a TLS handshake); use {plain}, turn TLS on in the server "
                    f"(its tls-port), or drop compile_cache.remote")
        return (f"compile_cache.remote={redacted(url)}: {redis_failure(url, exc, PING_SECONDS)}; start one "
                f"(redis-server --port {port}), fix the URL, or drop compile_cache.remote")
    return None


def answers_plain(host: str, port: int, seconds: float) -> bool:
    """Whether a Redis without TLS listens at ``host:port``: a bare ``PING`` gets a reply in Redis's own protocol
    (``+PONG``, or ``-NOAUTH`` from a server with a password). A client that asked for TLS meets such a server
    as a stall: it waits for a handshake the server never sends."""
    try:
        with socket.create_connection((host, port), timeout=seconds) as conn:
            conn.sendall(b"PING\r\n")
            return conn.recv(1) in (b"+", b"-")
    except OSError:
        return False


def directory(cfg: Mapping[str, Any]) -> Path:
    """The cache directory, absolute (relative paths are taken from where the run starts)."""
    return Path(str(cfg["dir"])).expanduser().absolute()


def inductor_directory(cfg: Mapping[str, Any]) -> Path:
    """The directory Inductor writes and imports its generated code from during the run: ``compile_cache.dir``,
    or with the cache off, Inductor's own (``$TORCHINDUCTOR_CACHE_DIR``, else torch's default under the temporary
    directory), where it still writes each generated module before importing it."""
    if cfg.get("enabled", True):
        return directory(cfg)
    return ambient_directory()


def ambient_directory() -> Path:
    """The Inductor cache directory of this process's environment (torch's default where none is set)."""
    if os.environ.get("TORCHINDUCTOR_CACHE_DIR"):
        return Path(os.environ["TORCHINDUCTOR_CACHE_DIR"]).expanduser().absolute()
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    return Path(default_cache_dir())


def privacy_problem(cfg: Mapping[str, Any]) -> Optional[str]:
    """Why the caches this run would read hold code that others could have written, or None: a directory that is
    not the user's own alone (unless ``compile_cache.shared``), or a ``$TRITON_CACHE_DIR`` likewise."""
    if cfg.get("shared"):
        return None
    places = [(inductor_directory(cfg), "compile_cache.dir" if cfg.get("enabled", True) else
               "Inductor's cache directory (TORCHINDUCTOR_CACHE_DIR, or torch's default)")]
    if os.environ.get("TRITON_CACHE_DIR"):
        places.append((Path(os.environ["TRITON_CACHE_DIR"]), "TRITON_CACHE_DIR"))
    for path, what in places:
        problem = private.problem(path, what)
        if problem:
            return (f"{problem}: whoever can write there can run code in your runs (Inductor imports and unpickles "
                    f"what it finds). Use a directory of your own (chmod go-w it, or point compile_cache.dir "
                    f"elsewhere), or say you trust everyone who can write it: compile_cache.shared=true")
    return None


def foreign_sources(cfg: Mapping[str, Any]) -> Optional[str]:
    """Why compiled code this run loads may come from others than this user (a shared directory, a remote cache),
    or None: its artifacts are then written unsigned (``pipeline.compile.artifacts``)."""
    reasons = []
    if cfg.get("enabled", True) and cfg.get("remote"):
        reasons.append(f"the remote cache {redacted(str(cfg['remote']))} (any of its clients can write entries)")
    if cfg.get("shared") and private.problem(inductor_directory(cfg), "compile_cache.dir"):
        reasons.append(f"the shared compile_cache.dir {inductor_directory(cfg)} (compile_cache.shared=true)")
    return " and ".join(reasons) or None


def settings_problem(cfg: Mapping[str, Any]) -> Optional[str]:
    """Why ``compile_cache`` cannot be used as configured (a directory that cannot be written or that others can,
    a remote that does not answer), or None. Run with the config's other checks, before any work."""
    from pipeline.config.paths import writable_problem

    if cfg.get("workers") is not None and int(cfg["workers"]) < 0:
        return f"compile_cache.workers={cfg['workers']} must be >= 0 (0: no compile workers), or null for one per 4 cores"
    timeout = cfg.get("job_timeout_s")  # typed a float by the schema: a number here
    if timeout is not None and (isinstance(timeout, bool) or not timeout > 0):
        return (f"compile_cache.job_timeout_s={timeout:g} must be a positive number of seconds; "
                f"e.g. compile_cache.job_timeout_s=1800")
    problem = privacy_problem(cfg)
    if problem:
        return problem
    if not cfg.get("enabled", True):
        return None
    problem = writable_problem(directory(cfg))
    if problem:
        return (f"compile_cache.dir={cfg['dir']}: {problem}; point it at a writable directory, or turn the cache off "
                f"with compile_cache.enabled=false")
    problem = disks.space_problem(directory(cfg), "compile_cache.dir")
    if problem:
        return problem
    return remote_problem(str(cfg["remote"])) if cfg.get("remote") else None


def environment(cfg: Mapping[str, Any]) -> Dict[str, str]:
    """The environment variables that point Inductor (and Triton, under it) at this run's caches (compile workers
    inherit them)."""
    env = {"TORCHINDUCTOR_CACHE_DIR": str(directory(cfg))}
    if cfg.get("remote"):
        remote_address(str(cfg["remote"]))
        env[REDIS_URL_ENV] = str(cfg["remote"])
    return env


REDIS_URL_ENV = "TORCHINDUCTOR_REDIS_URL"  # where workers (and torch's own Redis backend) read the remote's URL
# Inductor's remote caches whose Redis backend :func:`guarded_redis` replaces.
REMOTE_CACHES = ("RemoteFxGraphCache", "RemoteAOTAutogradCache", "RemoteAutotuneCache", "RemoteBundledAutotuneCache")
# Why the Redis at a URL was given up in this process (one warning each): later calls go straight to local compiles.
_REMOTE_FAILED: Dict[str, str] = {}
# The Redis keys whose values were not Inductor's entries (one warning each); each read of them is a miss.
_BAD_ENTRIES: Set[str] = set()
# Why compiled code loaded now may not be this user's own (pipeline.compile.artifacts writes such artifacts unsigned).
_FOREIGN: List[Optional[str]] = [None]


@functools.lru_cache(maxsize=None)
def guarded_redis() -> type:
    """Inductor's Redis cache backend, but with the URL's credentials and TLS, a CALL_SECONDS timeout on every call,
    and any failure (refused credentials, no server, a stall) said once, naming Redis, after which this process
    compiles locally. torch's own backend knows a host and port only, waits as long as the socket does, and
    raises a timeout that fails the compile without naming Redis. A value that is not an entry Inductor wrote
    (``pipeline.compile.remote_entry``) is named once and read as a miss: torch would fail the compile on it with
    an assertion that names no cache."""
    from torch._inductor.remote_cache import RemoteCacheBackend

    class GuardedRedis(RemoteCacheBackend):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.url = os.environ[REDIS_URL_ENV]
            self.client = None if self.url in _REMOTE_FAILED else redis_client(self.url, CALL_SECONDS)

        def _call(self, action: Callable[[Any], Any]) -> Any:
            if self.client is None or self.url in _REMOTE_FAILED:
                return None
            try:
                return action(self.client)
            except Exception as exc:  # noqa: BLE001 -- any failure costs the remote's help, never the compile
                _REMOTE_FAILED[self.url] = why = redis_failure(self.url, exc, CALL_SECONDS)
                log.warning("compile cache: %s; this process compiles locally from here on (compile_cache.remote=%s)",
                            why, redacted(self.url))
                return None

        def _get(self, key: str) -> Optional[bytes]:
            value = self._call(lambda client: client.get(key))
            if not isinstance(value, bytes):
                return None
            problem = remote_entry.problem(key, value)
            if problem is None:
                return value
            if key not in _BAD_ENTRIES:
                _BAD_ENTRIES.add(key)
                host, port = remote_address(self.url)
                log.warning("compile cache: the remote cache at Redis %s:%s holds an entry that is not a valid "
                            "Inductor cache entry (key %s: %s), damaged or written by another torch version or by "
                            "someone else; it was passed over, this process compiles that program itself and stores "
                            "it in its place. If it comes back, someone else writes that server: clear it "
                            "(redis-cli -h %s -p %s DEL %s) or drop compile_cache.remote",
                            host, port, key, problem, host, port, key)
            return None

        def _put(self, key: str, data: bytes) -> None:
            self._call(lambda client: client.set(key, data))

    return GuardedRedis


def _config_flags(cfg: Mapping[str, Any]) -> Dict[Tuple[Any, str], Any]:
    """(config module or class, attribute) -> value for this run: every cache off, or the remote caches on, through
    :func:`guarded_redis`. The local caches are on by torch's defaults, so a default run imports no compiler config
    (a run without a compiling backend never loads Inductor)."""
    if cfg.get("enabled", True) and not cfg.get("remote"):
        return {}
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    if not cfg.get("enabled", True):
        return {(inductor_config, "force_disable_caches"): True}
    from torch._inductor import remote_cache

    flags = {(inductor_config, "fx_graph_remote_cache"): True, (inductor_config, "autotune_remote_cache"): True,
             (functorch_config, "enable_remote_autograd_cache"): True,
             **{(getattr(remote_cache, name), "backend_override_cls"): guarded_redis()
                for name in REMOTE_CACHES if hasattr(getattr(remote_cache, name, None), "backend_override_cls")}}
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


def apply(cfg: Mapping[str, Any], foreign: Optional[str] = None) -> Callable[[], None]:
    """Point Inductor at ``cfg``'s (``compile_cache``) caches now (a new directory made private); returns what puts
    the previous settings back. ``foreign`` (else :func:`foreign_sources`) says why what is compiled or loaded
    meanwhile may not be this user's own."""
    env = environment(cfg) if cfg.get("enabled", True) else {}
    saved_env = {key: os.environ.get(key) for key in env}
    flags = _config_flags(cfg)
    saved_flags = {key: getattr(*key) for key in flags}
    os.environ.update(env)
    for (module, attr), value in flags.items():
        setattr(module, attr, value)
    if env:
        private.make_dir(directory(cfg))
    _FOREIGN.append(foreign or foreign_sources(cfg))
    clear_in_memory()

    def restore() -> None:
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        for (module, attr), value in saved_flags.items():
            setattr(module, attr, value)
        _FOREIGN.pop()
        clear_in_memory()

    return restore


@contextlib.contextmanager
def active(cfg: Mapping[str, Any], foreign: Optional[str] = None) -> Iterator[Path]:
    """Inductor's caches at ``cfg`` (``compile_cache``) for the block; the previous settings come back after."""
    restore = apply(cfg, foreign)
    try:
        yield directory(cfg)
    finally:
        restore()


def foreign_now() -> Optional[str]:
    """Why compiled code loaded in this process now may not be this user's own, or None (see :func:`apply`)."""
    return _FOREIGN[-1]


# torch's compile timers (torch._dynamo.utils.compilation_time_metrics) the cost account reads: Dynamo's whole
# compile of a frame, and the backend compile inside it (AOTAutograd and Inductor, cache loads included).
DYNAMO_TIMER = "_compile.compile_inner"
BACKEND_TIMER = "OutputGraph.call_user_compiler"


def counts() -> Dict[str, float]:
    """Process-wide totals so far: FX-graph cache hits and misses, AOTAutograd's cache misses (a standalone program,
    ``torch._inductor.standalone_compile(aot=True)``, bundles its Inductor graph into AOTAutograd's entry: only
    these count its compile), and seconds in Dynamo and in Inductor (all zero while Dynamo is not loaded: nothing has
    compiled)."""
    if "torch._dynamo.utils" not in sys.modules:
        return {"cache_hits": 0, "cache_misses": 0, "autograd_misses": 0, "trace_s": 0.0, "compile_s": 0.0}
    from torch._dynamo.utils import compilation_time_metrics, counters

    dynamo = sum(compilation_time_metrics.get(DYNAMO_TIMER, ()))
    backend = sum(compilation_time_metrics.get(BACKEND_TIMER, ()))
    autograd = counters["aot_autograd"]
    return {"cache_hits": counters["inductor"]["fxgraph_cache_hit"],
            "cache_misses": counters["inductor"]["fxgraph_cache_miss"],
            "autograd_misses": autograd["autograd_cache_miss"] + autograd["autograd_cache_bypass"],
            "trace_s": max(0.0, dynamo - backend), "compile_s": backend}
