"""A compile-worker pool that a load starts ends with the load; one that was running before is left alone.

Dynamo's Inductor backend starts the pool only where Triton is installed (the GPU host: the load tests of
``test_ahead_of_time.py``); here each case starts Inductor's real pool itself, as that backend does, through
``AsyncCompile.process_pool`` with two compile threads."""

from __future__ import annotations

import os
import time

import pytest
import torch._inductor.async_compile as async_compile
import torch._inductor.config as inductor_config

from pipeline.compile import pool


def alive(pid: int) -> bool:
    """Whether process ``pid`` still runs (a zombie, exited but not yet reaped, counts as ended)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def ended_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@pytest.fixture
def two_threads():
    """Inductor with two compile threads (its pool exists only above one), and no pool before or after the case."""
    pool.end()
    with inductor_config.patch(compile_threads=2):
        yield
    pool.end()


def started() -> object:
    """Inductor's compile-worker pool as Dynamo's backend starts it, after it ran one job in a worker."""
    workers = async_compile.AsyncCompile.process_pool()
    assert workers.submit(os.getpid).result(timeout=120) != os.getpid()  # it ran in a worker process
    return workers


def test_a_pool_started_inside_is_ended_on_leaving_and_the_next_compile_starts_a_fresh_one(two_threads):
    with pool.none_left_behind():
        first = started()
        assert pool.running() == 1
    assert pool.running() == 0  # forgotten at once: the load returns without waiting for the processes
    assert ended_within(first.process.pid, 60), "the pool's process outlived the block"
    second = started()
    assert second is not first and pool.running() == 1


def test_a_pool_running_before_is_left_running(two_threads):
    theirs = started()
    with pool.none_left_behind():
        pass
    assert pool.running() == 1 and async_compile.AsyncCompile.process_pool() is theirs
    assert alive(theirs.process.pid)


def test_a_pool_started_inside_is_ended_when_the_block_raises(two_threads):
    with pytest.raises(RuntimeError, match="the build failed"):
        with pool.none_left_behind():
            first = started()
            raise RuntimeError("the build failed")
    assert pool.running() == 0 and ended_within(first.process.pid, 60)


def test_a_pool_that_cannot_be_ended_stays_with_a_warning_and_the_block_stands(two_threads, monkeypatch, caplog):
    """Another torch whose pool internals differ from those pool.end knows: the work inside is kept, the pool stays,
    and a warning names why."""
    monkeypatch.delattr(async_compile, "after_fork")
    with pool.none_left_behind():
        first = started()
    assert "could not be ended (AttributeError" in caplog.text and "it stays running" in caplog.text
    assert pool.running() == 1 and alive(first.process.pid)
    monkeypatch.undo()  # pool.end can end it again (the fixture does)
