"""A real redis-server for the tests of Inductor's remote cache (Debian's redis-server; .ci/run installs it)."""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import time
from typing import Iterator, Optional

import pytest


def free_port() -> int:
    """A loopback port nothing listens on once this returns."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def redis_server(password: Optional[str] = None) -> Iterator[subprocess.Popen]:
    """A real redis-server on a free loopback port (``.port`` on the process), nothing saved to disk, asking for
    ``password`` where one is given."""
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed (Debian: apt-get install redis-server; .ci/run installs it)")
    pytest.importorskip("redis", reason='the redis package is missing: pip install -e ".[redis]"')
    import redis

    port = free_port()
    auth = ["--requirepass", password] if password else []
    proc = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no", *auth], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    proc.port = port  # type: ignore[attr-defined]
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                redis.Redis(port=port, password=password).ping()
                break
            except redis.ConnectionError:
                assert time.monotonic() < deadline, "redis-server did not start"
                time.sleep(0.1)
        yield proc
    finally:
        proc.kill()  # also where a test stopped it (SIGSTOP): a stopped process still dies of SIGKILL
        proc.wait(timeout=10)
