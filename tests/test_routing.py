"""The route chooser on synthetic profile tables: no timing, no torch."""

from __future__ import annotations

import pytest

from pipeline.errors import RouteError
from pipeline.route.policy import (Range, backend_for, choose_route, eager_baseline, left_behind, rests_on,
                                   sizes_owned)
from pipeline.route.table import backend_at, choose_table

ORDER = ["eager", "inductor", "graph"]
# Inductor has the best peak throughput (64 / 10 ms); graph is much faster at small sizes.
PROFILE = {
    "eager": {1: 2.0, 8: 4.0, 64: 20.0},
    "inductor": {1: 1.5, 8: 3.0, 64: 10.0},
    "graph": {1: 0.5, 8: 2.5, 64: 12.0},
}


def route(profile, order=ORDER, **kw):
    return choose_route(profile, order, **kw)


def test_router_gives_small_sizes_to_the_backend_at_least_10_percent_faster():
    assert route(PROFILE) == [Range(1, 8, "graph"), Range(9, None, "inductor")]


def test_router_boundary_exactly_10_percent_takes_the_size():
    profile = {"inductor": {1: 1.1, 64: 10.0}, "graph": {1: 1.0, 64: 20.0}}
    assert route(profile, ["inductor", "graph"]) == [Range(1, 1, "graph"), Range(2, None, "inductor")]


def test_router_boundary_9_9_percent_does_not():
    profile = {"inductor": {1: 1.099, 64: 10.0}, "graph": {1: 1.0, 64: 20.0}}
    assert route(profile, ["inductor", "graph"]) == [Range(1, None, "inductor")]


def test_min_gain_is_configurable():
    profile = {"inductor": {1: 1.05, 64: 10.0}, "graph": {1: 1.0, 64: 20.0}}
    assert route(profile, ["inductor", "graph"], min_gain=0.0)[0] == Range(1, 1, "graph")
    with pytest.raises(ValueError, match="min_gain"):
        route(profile, ["inductor", "graph"], min_gain=-0.1)


def test_challenger_must_win_at_every_profiled_size_of_its_range():
    # graph is 10% faster at 1 and 17, inductor at 8 and 64: each takes only the sizes where it wins.
    profile = {"inductor": {1: 1.1, 8: 2.0, 17: 3.3, 64: 10.0}, "graph": {1: 1.0, 8: 2.5, 17: 3.0, 64: 30.0}}
    assert route(profile, ["inductor", "graph"]) == [
        Range(1, 1, "graph"), Range(2, 8, "inductor"), Range(9, 17, "graph"), Range(18, None, "inductor")]


def test_the_incumbent_is_the_backend_that_needs_the_fewest_ranges():
    # vit_b_16 on the H200 (fp32 seed table, ms): graph has the higher peak throughput, by 5% at 64
    # only. As the incumbent it keeps 8 and 17, where graph_inductor is 7% and 2% faster, and still
    # gives up 1 and 3; graph_inductor as the incumbent serves everything, one range.
    profile = {"graph": {1: 3.20, 3: 4.60, 8: 9.28, 17: 16.78, 64: 54.91},
               "graph_inductor": {1: 2.20, 3: 4.09, 8: 8.64, 17: 16.39, 64: 57.59}}
    assert route(profile, ["graph", "graph_inductor"]) == [Range(1, None, "graph_inductor")]
    assert choose_route(profile, ["graph", "graph_inductor"], "highest_throughput") == [Range(1, None, "graph")]


def test_no_size_is_served_slower_than_the_eager_baseline():
    # vit_b_16 on the H200 (fp32 seed table, ms): graph_inductor keeps 64 against graph (4.6% faster)
    # and eager (4.0%) under the 10% rule, but eager as the baseline hands 64 to the fastest there.
    profile = {"eager": {1: 3.76, 3: 5.15, 8: 9.75, 17: 17.26, 64: 55.25},
               "graph": {1: 3.19, 3: 4.54, 8: 9.17, 17: 16.84, 64: 54.95},
               "graph_inductor": {1: 2.13, 3: 4.00, 8: 8.50, 17: 16.38, 64: 57.48}}
    order = ["eager", "graph", "graph_inductor"]
    assert route(profile, order) == [Range(1, None, "graph_inductor")]
    assert route(profile, order, baseline="eager") == [Range(1, 17, "graph_inductor"), Range(18, None, "graph")]
    # Where the baseline itself is the fastest, it takes the size.
    profile["eager"][64] = 54.0
    assert route(profile, order, baseline="eager")[-1] == Range(18, None, "eager")
    # An excluded baseline guards nothing.
    assert route(profile, order, baseline="eager", failures={"eager": "failed: x"}) == [Range(1, None, "graph_inductor")]


def test_no_incumbent_keeps_a_size_the_faster_backend_could_take_by_a_route_the_intervals_prove():
    # mobilenet_v3_small on the 16-core CPU table (call BF of 2026-12-06, ms, the tune's medians and intervals):
    # OpenVINO 18-20% faster at 8 and 17, its intervals overlapping ONNX Runtime's there. ONNX Runtime as the
    # incumbent keeps every size (one range) and serves 8 and 17 that much slower; OpenVINO as the incumbent serves
    # them, and gives 1 and 64 to ONNX Runtime, faster there beyond both intervals: every switch proven.
    medians = {"openvino": {1: 1.32, 3: 1.73, 8: 2.36, 17: 3.58, 64: 10.81},
               "onnxruntime": {1: 1.14, 3: 1.85, 8: 2.79, 17: 4.28, 64: 9.33}}
    intervals = {"openvino": {1: (1.29, 1.35), 3: (1.67, 1.80), 8: (2.18, 2.48), 17: (2.96, 3.95), 64: (10.32, 11.14)},
                 "onnxruntime": {1: (1.13, 1.17), 3: (1.81, 1.90), 8: (2.40, 3.14), 17: (3.38, 4.61),
                                 64: (9.14, 9.73)}}
    order = ["openvino", "onnxruntime"]
    assert route(medians, order, intervals=intervals) == [Range(1, 1, "onnxruntime"), Range(2, 17, "openvino"),
                                                          Range(18, None, "onnxruntime")]
    assert left_behind({bs: "onnxruntime" for bs in medians["openvino"]}, medians, 0.1) == 2  # 8 and 17
    # A cell measured on a busy host (its interval unknown) leaves nothing behind: its median says where the host was.
    busy = {**intervals, "openvino": {**intervals["openvino"], 8: (0.0, float("inf"))}}
    assert left_behind({bs: "onnxruntime" for bs in medians["openvino"]}, medians, 0.1, busy) == 1  # 17 only
    # Where every incumbent leaves as many sizes behind, the fewest ranges, then the regret decide: with ONNX
    # Runtime's cells at 1 and 64 overlapping OpenVINO's, neither route proves a switch and each leaves two
    # sizes behind; OpenVINO's is the closer to the fastest (15-16% at 1 and 64 against 7-20% at 3, 8 and 17).
    wide = {**intervals, "onnxruntime": {**intervals["onnxruntime"], 1: (1.10, 1.30), 64: (9.0, 10.5)}}
    assert route(medians, order, intervals=wide) == [Range(1, None, "openvino")]
    # The (batch size x length) table decides alike, at each tuned length.
    at = {b: {(bs, 64): ms for bs, ms in per.items()} for b, per in medians.items()}
    bounds = {b: {(bs, 64): iv for bs, iv in per.items()} for b, per in intervals.items()}
    table = choose_table(at, order, [64], "router", 0.10, any_length=set(order), intervals=bounds)
    assert [backend_at(table, bs, 64) for bs in (1, 3, 8, 17, 64)] == ["onnxruntime", *["openvino"] * 3, "onnxruntime"]


def test_the_baseline_is_the_first_eager_kind_backend():
    assert eager_baseline({"graph": "graph", "eager_bf16": "eager", "eager": "eager"}) == "eager_bf16"
    assert eager_baseline({"inductor": "inductor"}) is None


def test_among_routes_with_as_few_ranges_the_one_closest_to_the_fastest_wins():
    # Either backend alone is one range. b has the higher peak throughput (64 / 9.6 ms) but loses 5%
    # at 1; a loses 4% at 64: a's route is closer to the fastest at every size.
    profile = {"a": {1: 1.0, 64: 10.0}, "b": {1: 1.05, 64: 9.6}}
    assert route(profile, ["b", "a"]) == [Range(1, None, "a")]
    assert choose_route(profile, ["b", "a"], "highest_throughput") == [Range(1, None, "b")]


def test_the_worked_example_of_the_route_docs():
    # docs/config/route.md's worked example, ResNet-18 on the Arc B70 (seed release): graph_inductor as the
    # incumbent would need three ranges.
    profile = {"inductor": {1: 0.83, 3: 1.34, 8: 2.66, 17: 7.84, 64: 20.77},
               "graph_inductor": {1: 0.63, 3: 1.49, 8: 2.68, 17: 7.53, 64: 21.04}}
    order = ["inductor", "graph_inductor"]
    assert route(profile, order) == [Range(1, 1, "graph_inductor"), Range(2, None, "inductor")]
    # At 3%, inductor as the incumbent gives up 17 too (four ranges); graph_inductor needs three.
    assert route(profile, order, min_gain=0.03) == [Range(1, 1, "graph_inductor"), Range(2, 3, "inductor"),
                                                    Range(4, None, "graph_inductor")]


def test_ties_go_to_the_earlier_backend_in_config_order():
    same = {1: 1.0, 8: 4.0}
    assert route({"a": same, "b": same}, ["a", "b"]) == [Range(1, None, "a")]
    assert route({"a": same, "b": same}, ["b", "a"]) == [Range(1, None, "b")]
    # Two challengers equally faster than the incumbent: the earlier challenger takes the size.
    profile = {"inc": {1: 2.0, 64: 1.0}, "c1": {1: 1.0, 64: 9.0}, "c2": {1: 1.0, 64: 9.0}}
    assert route(profile, ["inc", "c2", "c1"])[0] == Range(1, 1, "c2")
    assert choose_route(profile, ["inc", "c1", "c2"], "highest_throughput") == [Range(1, None, "inc")]


def test_sizes_between_and_above_profiled_sizes():
    r = route(PROFILE)
    # Between profiled sizes: the owner of the next profiled size above (padded toward it).
    assert [backend_for(r, bs) for bs in (1, 2, 7, 8, 9, 63, 64)] == ["graph"] * 4 + ["inductor"] * 3
    # Above the largest tuned size: the owner of the largest.
    assert backend_for(r, 65) == backend_for(r, 10_000) == "inductor"
    assert sizes_owned(r, "graph", range(1, 11)) == list(range(1, 9))
    with pytest.raises(ValueError, match="outside the route"):
        backend_for(r, 0)


def spread(profile, rel):
    """Each median's interval, +-``rel`` of it."""
    return {b: {bs: (ms * (1 - rel), ms * (1 + rel)) for bs, ms in per.items()} for b, per in profile.items()}


def test_no_split_on_a_difference_within_both_cells_uncertainty():
    # A loaded 2-core machine: by the medians each backend wins somewhere by 15-20%, so the route has three
    # ranges; but each median is known only to +-15%, and one backend serves everything.
    profile = {"eager": {1: 1.0, 8: 1.2, 64: 5.0}, "inductor": {1: 1.15, 8: 1.0, 64: 5.75}}
    order = ["eager", "inductor"]
    assert route(profile, order) == [Range(1, 1, "eager"), Range(2, 8, "inductor"), Range(9, None, "eager")]
    assert route(profile, order, intervals=spread(profile, 0.15)) == [Range(1, None, "eager")]
    # Known to +-5%, the intervals are apart everywhere (at 8: 1.05 < 1.14): the splits stand.
    assert route(profile, order, intervals=spread(profile, 0.05)) == route(profile, order)


def test_with_intervals_the_10_percent_rule_stays_the_floor():
    # Intervals wholly apart, but graph only 5% faster: not enough to take the size.
    profile = {"inductor": {1: 1.05, 64: 10.0}, "graph": {1: 1.0, 64: 20.0}}
    tight = spread(profile, 0.001)
    assert route(profile, ["inductor", "graph"], intervals=tight) == [Range(1, None, "inductor")]
    assert route(profile, ["inductor", "graph"], intervals=tight, min_gain=0.05)[0] == Range(1, 1, "graph")


def test_the_eager_baseline_takes_a_size_only_when_clearly_faster():
    profile = {"eager": {1: 1.0, 64: 9.0}, "graph": {1: 0.5, 64: 10.0}}
    order = ["eager", "graph"]
    assert route(profile, order, baseline="eager", min_gain=0.5)[-1] == Range(2, None, "eager")
    # eager 10% faster at 64, each median +-10%: within the noise, so graph keeps its single range.
    assert route(profile, order, baseline="eager", min_gain=0.5, intervals=spread(profile, 0.1)) == [
        Range(1, None, "graph")]


def test_a_route_rests_on_its_owners_cells_and_on_those_within_their_noise():
    profile = {"eager": {1: 2.0, 8: 5.0}, "inductor": {1: 1.0, 8: 3.9}, "graph": {1: 5.0, 8: 3.0}}
    intervals = spread(profile, 0.05)
    r = [Range(1, 1, "inductor"), Range(2, None, "graph")]
    # At 1 inductor owns and nothing is near it; at 8 graph owns, inductor 30% and eager 67% away.
    assert rests_on(r, profile, intervals) == [("inductor", 1), ("graph", 8)]
    wide = spread(profile, 0.2)  # now inductor at 8 (3.12-4.68) overlaps graph's 2.4-3.6
    assert rests_on(r, profile, wide) == [("inductor", 1), ("graph", 8), ("inductor", 8)]


def test_a_backend_missing_some_sizes_competes_only_where_measured():
    # graph was not profiled at 64 (e.g. saturated): inductor keeps 64 without competition.
    profile = {"inductor": {1: 2.0, 8: 3.0, 64: 10.0}, "graph": {1: 1.0, 8: 1.0}}
    assert route(profile, ["inductor", "graph"]) == [Range(1, 8, "graph"), Range(9, None, "inductor")]
    # The incumbent missing a size: the fastest backend measured there owns it.
    profile = {"inductor": {1: 2.0, 8: 1.0}, "eager": {1: 1.0, 8: 8.0, 64: 50.0}}
    assert route(profile, ["inductor", "eager"]) == [Range(1, 1, "eager"), Range(2, 8, "inductor"),
                                                     Range(9, None, "eager")]


def test_a_backend_failing_validation_never_serves():
    failures = {"graph": "failed: output differs from eager: max relative error 0.3 > tolerance 0.005"}
    assert route(PROFILE, failures=failures) == [Range(1, None, "inductor")]
    assert choose_route(PROFILE, ORDER, "first_wins", failures={"eager": "failed: boom"}) == [Range(1, None, "inductor")]


def test_highest_throughput_uses_one_backend_by_peak_throughput():
    assert choose_route(PROFILE, ORDER, "highest_throughput") == [Range(1, None, "inductor")]


def test_first_wins_takes_the_first_working_backend_in_order():
    assert choose_route(PROFILE, ["graph", "eager", "inductor"], "first_wins") == [Range(1, None, "graph")]
    skipped = {"graph": "skipped: graph backend needs a CUDA or XPU device"}
    profile = {k: v for k, v in PROFILE.items() if k != "graph"}
    assert choose_route(profile, ["graph", "eager", "inductor"], "first_wins", failures=skipped) == [Range(1, None, "eager")]


def test_one_backend_serves_everything_with_the_named_backend():
    assert choose_route(PROFILE, ORDER, "one_backend", backend="eager") == [Range(1, None, "eager")]


def test_one_backend_raises_the_named_backends_own_error():
    failures = {"inductor": "failed: BackendCompilerFailed: inductor raised RuntimeError: no compiler"}
    profile = {k: v for k, v in PROFILE.items() if k != "inductor"}
    with pytest.raises(RouteError, match="route.backend=inductor was excluded: failed: BackendCompilerFailed"):
        choose_route(profile, ORDER, "one_backend", backend="inductor", failures=failures)
    with pytest.raises(ValueError, match="needs route.backend"):
        choose_route(PROFILE, ORDER, "one_backend")
    with pytest.raises(ValueError, match="not among the selected backends"):
        choose_route(PROFILE, ORDER, "one_backend", backend="tensorrt")


def test_errors_name_the_problem():
    with pytest.raises(ValueError, match="unknown route.strategy 'fastest'"):
        choose_route(PROFILE, ORDER, "fastest")
    with pytest.raises(ValueError, match="every backend failed.*eager: failed: x"):
        choose_route({}, ["eager"], failures={"eager": "failed: x"})
    with pytest.raises(ValueError, match="not a positive finite latency"):
        choose_route({"eager": {1: float("nan")}}, ["eager"])
