"""bench/load.py's account of where a load's seconds go (issue 39): its profile of the heaviest functions and the
processes a load leaves running (Inductor's compile workers, say), checked on this machine so that the GPU call that
reads them cannot fail for a silly reason."""

from __future__ import annotations

import cProfile
import subprocess
import time

from bench import load


def slow_part() -> float:
    time.sleep(0.05)
    return sum(range(10_000))


def test_the_profile_names_the_heaviest_functions_first_without_machine_paths():
    profiler = cProfile.Profile()
    profiler.enable()
    slow_part()
    profiler.disable()
    rows = load.heaviest(profiler, top=5)
    assert len(rows) <= 5 and rows == sorted(rows, key=lambda r: r["cum_s"], reverse=True)
    mine = next(r for r in rows if r["function"].endswith("(slow_part)"))
    assert mine["function"].startswith("tests/test_bench_load.py:") and mine["cum_s"] >= 0.04 and mine["calls"] == 1


def test_a_process_left_running_is_listed_and_one_that_ended_is_not():
    child = subprocess.Popen(["sleep", "30"])
    try:
        # until the child has exec'd, its command line is still this process's (seen once on a busy machine)
        deadline = time.monotonic() + 10
        while not any(c.startswith("sleep 30") for c in load.children()) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert any(c.startswith("sleep 30") for c in load.children())
    finally:
        child.kill()
        child.wait()
    assert not any(c.startswith("sleep 30") for c in load.children())
