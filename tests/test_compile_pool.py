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
from pipeline.record.store import process_alive


def ended_within(pid: int, seconds: float) -> bool:
    """Whether process ``pid`` is gone (ended and reaped: the thread that ends the pool waits for it) within
    ``seconds``."""
    deadline = time.monotonic() + seconds
    while process_alive(pid, ""):
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
    assert process_alive(theirs.process.pid, "")


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
    assert pool.running() == 1 and process_alive(first.process.pid, "")
    monkeypatch.undo()  # pool.end can end it again (the fixture does)
