"""Timing on synthetic sample streams: a fake clock advanced by callables whose durations we choose.

No mocks of torch: the device is a real ``torch.device("cpu")`` (its sync is a no-op) and the
clock is injected, so every stop rule is exercised deterministically and in milliseconds.
"""

from __future__ import annotations

import gc
import itertools
import math
import random
import time
from typing import Callable, Iterable, List

import pytest
import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf

from pipeline import backends
from pipeline.context import RunContext
from pipeline.config.schema import ProfileConfig
from pipeline.measure.interleaved import device_time_ms, measure_interleaved, profile_sizes, saturated, time_call
from pipeline.measure.measurement import Measurement, agreeing_windows
from pipeline.measure.statistics import median_ci_ranks
from pipeline.backends.candidate import Candidate
from pipeline.preflight.checks import candidates_of
from stages import profile as profile_stage
from conftest import TINY

CPU = torch.device("cpu")


class FakeClock:
    """A monotonic clock in seconds that only moves when a fake call says it took some time."""

    def __init__(self) -> None:
        self.now = 0.0
        self.log: List[str] = []

    def __call__(self) -> float:
        return self.now

    def stream(self, durations_ms: Iterable[float], name: str = "") -> Callable[[], None]:
        it = iter(durations_ms)

        def call() -> None:
            self.log.append(name)
            self.now += next(it) / 1e3

        return call


def cfg(**overrides) -> dict:
    base = dict(warmup_ms=0, min_warmup_calls=0, min_samples=10, max_samples=1000, budget_ms=1e9, min_window_ms=0,
                rel_precision=0.02, noise_threshold=0.2, max_repeats=0, passes=1, cpu_settle_calls=0,
                cpu_timed_calls=1)  # one timed call a visit: the stop rules' tests count calls
    return {**base, **overrides}


def jitter(mean_ms: float, rel: float, seed: int = 0) -> Iterable[float]:
    rng = random.Random(seed)
    while True:
        yield mean_ms * (1 + rng.uniform(-rel, rel))


def test_compile_outlier_is_ignored() -> None:
    clock = FakeClock()
    fn = clock.stream(itertools.chain([500.0, 40.0], itertools.repeat(2.0)))
    m = measure_interleaved({"a": fn}, CPU, cfg(min_warmup_calls=1), clock=clock)["a"]
    assert m.first_call_ms == pytest.approx(500.0)
    assert m.warmup_calls == 1  # the second slow call (a recompile, say) is warm-up, not a sample
    assert max(m.samples_ms) == pytest.approx(2.0) and m.median == pytest.approx(2.0)
    assert not m.noisy


def test_warmup_is_a_budget_in_ms() -> None:
    clock = FakeClock()
    fn = clock.stream(itertools.chain([100.0], itertools.repeat(1.0)))
    m = measure_interleaved({"a": fn}, CPU, cfg(warmup_ms=25, min_warmup_calls=2), clock=clock)["a"]
    assert m.warmup_calls == 25  # the compile did not eat the warm-up budget


def test_precision_rule_stops_early_on_stable_samples() -> None:
    clock = FakeClock()
    fn = clock.stream(jitter(1.0, 0.001))
    m = measure_interleaved({"a": fn}, CPU, cfg(min_samples=10, max_samples=1000), clock=clock)["a"]
    assert m.count == 10 and m.rel_halfwidth <= 0.02
    assert m.repeats == 0 and not m.noisy


def test_precision_stop_waits_for_min_window_ms() -> None:
    clock = FakeClock()
    m = measure_interleaved({"a": clock.stream(jitter(0.5, 0.001))}, CPU, cfg(min_window_ms=25), clock=clock)["a"]
    assert 25 <= sum(m.samples_ms) < 25.6  # 50 stable half-millisecond calls, not the first 10


def test_budget_stops_a_noisy_stream_and_flags_it() -> None:
    clock = FakeClock()
    rng = random.Random(1)
    fn = clock.stream(iter(lambda: rng.lognormvariate(0, 0.8), None))
    m = measure_interleaved({"a": fn}, CPU, cfg(budget_ms=50, max_samples=10_000, rel_precision=0.001,
                                                 max_repeats=2), clock=clock)["a"]
    assert len(m.windows) == 3  # two repeats, then it is reported instead of hidden
    for w in m.windows:
        assert 50 <= sum(w) < 50 + max(w) and len(w) < 10_000
    assert m.noisy and "median known only" in m.noise


def test_min_samples_wins_over_the_budget() -> None:
    clock = FakeClock()
    m = measure_interleaved({"a": clock.stream(itertools.repeat(30.0))}, CPU, cfg(budget_ms=10, min_samples=7),
                            clock=clock)["a"]
    assert m.count == 7


def test_max_samples_stops() -> None:
    clock = FakeClock()
    rng = random.Random(2)
    fn = clock.stream(iter(lambda: rng.uniform(1, 3), None))
    m = measure_interleaved({"a": fn}, CPU, cfg(max_samples=40, rel_precision=1e-4), clock=clock)["a"]
    assert m.count == 40 and m.noisy


def interleaved_log(names: str, rounds: int) -> List[str]:
    clock = FakeClock()
    fns = {n: clock.stream(itertools.repeat(1.0), n) for n in names}
    measure_interleaved(fns, CPU, cfg(min_warmup_calls=1, min_samples=rounds), clock=clock)
    return clock.log


def test_interleaving_runs_each_once_per_round_and_varies_who_follows_whom() -> None:
    log = interleaved_log("ABC", 30)
    warm, rounds = log[:6], log[6:]
    assert warm == ["A", "A", "B", "B", "C", "C"]  # first call + one warm-up call each
    assert len(rounds) == 90 and all(sorted(rounds[i:i + 3]) == ["A", "B", "C"] for i in range(0, 90, 3))
    followers = {(a, b) for a, b in zip(rounds, rounds[1:]) if a != b}
    assert followers == {(a, b) for a in "ABC" for b in "ABC" if a != b}  # a rotation gives only 3 of the 6
    assert log == interleaved_log("ABC", 30)  # seeded: the same order in every run
    assert gc.isenabled()  # held off during the window only


def test_on_the_cpu_a_visit_settles_untimed_then_samples_back_to_back_and_a_runtimes_leftovers_fall_on_no_sample():
    """A callable that pays for what the one before it left (3 ms right after the other, 1 ms after itself) reads
    3 ms with one timed call a visit and 1 ms with a settling call first: the latency a served model's back-to-back
    calls see. A visit never takes a window past max_samples."""
    def leftovers(settle: int, timed: int, samples: int = 12):
        clock = FakeClock()

        def paying() -> None:
            clock.now += (3.0 if clock.log and clock.log[-1] != "A" else 1.0) / 1e3
            clock.log.append("A")

        fns = {"A": paying, "B": clock.stream(itertools.repeat(1.0), "B")}
        res = measure_interleaved(fns, CPU, cfg(min_samples=samples, max_samples=samples, cpu_settle_calls=settle,
                                                cpu_timed_calls=timed), clock=clock)
        return res, clock.log

    res, _ = leftovers(0, 1)
    # A follows B in every round but where one round ends with A and the next begins with it
    assert res["A"].median == pytest.approx(3.0, rel=0.01)
    res, log = leftovers(1, 4)
    assert res["A"].median == pytest.approx(1.0) and res["A"].count == res["B"].count == 12
    visits = [name for i, name in enumerate(log[2:]) if i % 5 == 0]  # after first calls, 5 calls a visit
    assert all(log[2 + 5 * i:7 + 5 * i] == [name] * 5 for i, name in enumerate(visits))
    res, _ = leftovers(1, 4, samples=14)  # visits of 4, 4, 4, then 2
    assert res["A"].count == res["B"].count == 14
    with pytest.raises(ValueError, match="cpu_timed_calls"):
        measure_interleaved({"A": lambda: None}, CPU, cfg(cpu_timed_calls=0))


def test_a_window_collects_only_the_young_generations_and_holds_the_collector_off_while_it_runs() -> None:
    """A full collection holds the GIL for the whole of a big heap (0.43 s with torch, Inductor and MLflow loaded,
    once per window): beside busy loops the run's heartbeat threads went unheard for 17-40 s."""
    collected: List[int] = []

    def seen(phase: str, info: dict) -> None:
        if phase == "start":
            collected.append(info["generation"])

    clock = FakeClock()
    fns = {n: clock.stream(itertools.repeat(1.0), n) for n in "AB"}
    gc.callbacks.append(seen)
    try:
        measure_interleaved(fns, CPU, cfg(min_warmup_calls=1, min_samples=20), clock=clock)
    finally:
        gc.callbacks.remove(seen)
    assert collected and max(collected) < 2, collected  # the young generations, never the old one
    assert gc.isenabled()


def test_disagreeing_backend_is_repeated_alone_and_its_disturbed_window_dropped() -> None:
    clock = FakeClock()
    busy = [1.0, 6.0] * 10  # a window where half the calls were preempted
    a = clock.stream(itertools.chain([1.0], busy, jitter(1.0, 0.002)), "A")
    b = clock.stream(itertools.chain([1.0], jitter(2.0, 0.002, seed=3)), "B")
    res = measure_interleaved({"A": a, "B": b}, CPU, cfg(min_samples=20, max_samples=20, max_repeats=2),
                              clock=clock)
    assert all(sorted(clock.log[i:i + 2]) == ["A", "B"] for i in range(2, 42, 2))  # 20 interleaved rounds
    assert clock.log[42:] == ["A"] * 20  # only A disagreed, so only A is measured again
    m = res["A"]
    assert m.repeats == 1 and m.accepted == [1] and not m.noisy
    assert m.median == pytest.approx(1.0, rel=0.01)
    assert len(m.windows[0]) == 20  # the dropped window is kept, not thrown away
    assert res["B"].repeats == 0


def test_agreeing_windows_pools_quiet_windows_and_anchors_on_the_surest_low_one() -> None:
    rng = random.Random(4)
    quiet = [[rng.gauss(1.0, 0.01) for _ in range(50)] for _ in range(3)]
    assert agreeing_windows(quiet, 0.02) == [0, 1, 2]  # nothing disturbed: one plain median
    disturbed = [[x + 0.5 for x in quiet[0]], quiet[1], quiet[2]]
    assert agreeing_windows(disturbed, 0.02) == [1, 2]
    lucky = [[0.2, 0.3, 5.0, 5.0, 0.25, 6.0], quiet[1]]  # a lower median, but known to nothing
    assert agreeing_windows(lucky, 0.02) == [1]


def test_saturation_counts_only_measured_windows() -> None:
    clock = FakeClock()

    def make_fns(bs: int) -> dict:
        # Every new size compiles for 2 s on its first call; steady latency grows slower than bs.
        return {"grows": clock.stream(itertools.chain([2000.0], itertools.repeat(0.5 + 0.01 * bs))),
                "flat": clock.stream(itertools.chain([2000.0], itertools.repeat(0.1 * bs)))}

    prof = profile_sizes(make_fns, [1, 3, 8, 17, 64], CPU,
                         cfg(saturation_cutoff=0.05, saturation_backoff=1), clock=clock)
    assert sorted(prof["grows"]) == [1, 3, 8, 17, 64]  # the 2 s first calls never made it look saturated
    assert sorted(prof["flat"]) == [1, 3]  # constant throughput: stops after one size without growth
    for m in prof["grows"].values():
        assert m.first_call_ms == pytest.approx(2000.0) and max(m.samples_ms) < 2.0


def two_passes(clock: FakeClock, pass_ms: List[float]) -> Callable[[int], dict]:
    """``make_fns`` whose callable takes ``pass_ms[k]`` (+-0.1%) on its k-th call per size: one call per pass."""
    calls: dict = {}

    def make_fns(bs: int) -> dict:
        k = calls[bs] = calls.get(bs, -1) + 1
        return {"a": clock.stream(jitter(pass_ms[k] * bs, 0.001, seed=k))}

    return make_fns


def test_passes_that_agree_pool_into_one_cell_whose_interval_spans_both() -> None:
    clock = FakeClock()
    steps: List[tuple] = []
    prof = profile_sizes(two_passes(clock, [1.0, 1.005]), [1, 2], CPU, cfg(passes=2), clock=clock,
                         on_step=lambda p, bs: steps.append((p, bs)))
    assert steps == [(0, 1), (0, 2), (1, 1), (1, 2)]  # every size once per pass, ascending each time
    m = prof["a"][1]
    assert m.passes == [0, 1] and m.accepted == [0, 1] and not m.noisy and m.summary()["passes"] == 2
    lo, hi = m.interval
    assert lo <= 1.0 and hi >= 1.005 and hi / lo < 1.01  # both passes' medians, and no wider than they need


def test_a_cell_whose_median_moves_between_passes_is_flagged_and_its_interval_spans_them() -> None:
    clock = FakeClock()
    m = profile_sizes(two_passes(clock, [1.0, 1.5]), [1], CPU, cfg(passes=2), clock=clock)["a"][1]
    assert m.noisy and "median moved between passes (1-1.5 ms over 2 passes)" in m.noise
    assert m.accepted == [0, 1] and 1.0 < m.median < 1.5  # no pass is the truth: the estimate pools both
    lo, hi = m.interval
    assert lo <= 1.0 and hi >= 1.49  # and a re-run may land in either state: the interval says so


def test_a_resumed_profile_measures_only_the_passes_a_cell_lacks() -> None:
    clock = FakeClock()
    first = profile_sizes(two_passes(clock, [1.0]), [1], CPU, cfg(passes=1), clock=clock)["a"][1]
    steps: List[tuple] = []
    prof = profile_sizes(two_passes(clock, [1.0, 1.0]), [1], CPU, cfg(passes=2), clock=clock,
                         known={"a": {1: first}}, on_step=lambda p, bs: steps.append((p, bs)))
    assert steps == [(1, 1)] and prof["a"][1].passes == [0, 1]


def test_saturated_rule() -> None:
    assert not saturated([100, 200, 400], 0.05, 1)
    assert saturated([100, 200, 204], 0.05, 1)
    assert not saturated([100, 200, 204], 0.05, 2)
    assert saturated([100, 200, 204, 190], 0.05, 2)
    assert not saturated([100, 200, 204], 0.05, 0)  # disabled
    assert not saturated([100, float("nan"), 300], 0.05, 1)  # an unmeasured size says nothing


def test_median_ci_ranks_are_exact_and_distribution_free() -> None:
    assert median_ci_ranks(5) is None
    assert median_ci_ranks(6) == (0, 5)
    assert median_ci_ranks(100) == (39, 60)
    for n in (6, 10, 30, 101, 300):
        lo, hi = median_ci_ranks(n)
        coverage = sum(math.comb(n, i) for i in range(lo + 1, hi + 1)) / 2 ** n
        assert coverage >= 0.95
    lo, hi = median_ci_ranks(1000)
    assert sum(math.comb(1000, i) for i in range(lo + 1, hi + 1)) / 2 ** 1000 >= 0.95


def test_partial_config_takes_defaults_and_bad_one_fails_early() -> None:
    clock = FakeClock()
    old_style = dict(warmup_ms=0, min_warmup_calls=1, min_samples=10, max_samples=50, budget_ms=100, rel_precision=0.02)
    m = measure_interleaved({"a": clock.stream(itertools.repeat(1.0))}, CPU, old_style, clock=clock)["a"]
    # min_window_ms and the visits take the schema's defaults: that many 1 ms samples, in visits of cpu_timed_calls.
    default = ProfileConfig()
    assert m.count == math.ceil(default.min_window_ms / default.cpu_timed_calls) * default.cpu_timed_calls
    assert m.repeats == 0
    with pytest.raises(ValueError, match="min_samples"):
        measure_interleaved({"a": clock.stream(itertools.repeat(1.0))}, CPU, cfg(min_samples=20, max_samples=10))


def test_summary_has_median_spread_and_count() -> None:
    m = Measurement(samples_ms=[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0], first_call_ms=40.0)
    s = m.summary()
    assert (s["median_ms"], s["samples"], s["first_call_ms"]) == (6.0, 11, 40.0)
    assert s["p10_ms"] == pytest.approx(2.0) and s["p90_ms"] == pytest.approx(10.0)


def busy_wait(ms: float) -> Callable[[], None]:
    def spin() -> None:
        end = time.perf_counter() + ms / 1e3
        while time.perf_counter() < end:
            pass

    return spin


def test_times_a_callable_of_known_duration_on_cpu() -> None:
    assert time_call(busy_wait(2.0), CPU) >= 2.0
    m = measure_interleaved({"spin": busy_wait(2.0)}, CPU,
                            dict(warmup_ms=5, min_warmup_calls=1, min_samples=15, max_samples=60, budget_ms=150,
                                 rel_precision=0.02, max_repeats=1))["spin"]
    # Never less than the call takes; the upper bound only catches a unit slip (a loaded CI host can
    # preempt a busy-wait for a millisecond or more, so a tight one would be a timing test).
    assert 2.0 <= m.median < 10.0, m.summary()
    assert m.quantile(0.1) >= 2.0


def test_profile_stage_hands_on_every_tuned_size_as_it_is_measured(compose_cfg, tmp_path) -> None:
    config = compose_cfg([*TINY, "model.batch_sizes=[1,8]"])
    torch.manual_seed(0)
    model = instantiate(config.model.build).eval()
    inputs = OmegaConf.to_container(config.model.inputs, resolve=True)
    seen = []
    ctx = RunContext(cfg=config, run_dir=tmp_path, device=CPU, model=model, inputs=inputs,
                     candidates=candidates_of(config),
                     on_cell=lambda name, bs, m, phase: seen.append((name, bs, m.count)))
    eager = backends.create(Candidate.of("eager", {"kind": "eager"}))
    eager.build(model, {}, CPU, [1, 8])
    ctx.backends = {"eager": eager}
    profile_stage.run(ctx)
    assert [(name, bs) for name, bs, _ in seen] == [("eager", 1), ("eager", 8)]  # each cell, as it was measured
    assert all(count >= 6 for _, _, count in seen)
    assert set(ctx.profile["eager"]) == {1, 8}
    for m in ctx.profile["eager"].values():
        assert m.first_call_ms > 0 and m.count >= 6 and isinstance(m.noisy, bool)
    assert not list(tmp_path.iterdir())  # a stage does no I/O: the recorder writes the files


@pytest.mark.gpu
def test_device_time_cross_check_on_cuda() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    dev = torch.device("cuda")
    x = torch.randn(1024, 1024, device=dev)

    def mm() -> torch.Tensor:
        return x @ x @ x

    res = measure_interleaved({"mm": mm}, dev, cfg(warmup_ms=5, min_samples=10, max_samples=200, budget_ms=200),
                              device_check=["mm"])
    m = res["mm"]
    assert m.device_ms > 0 and m.device_ms <= m.median * 1.05
    assert device_time_ms(lambda: x.sum().item(), dev) is None  # a host sync cannot be captured
    assert torch.isfinite((x @ x).sum()).item()  # and the failed capture left CUDA usable
