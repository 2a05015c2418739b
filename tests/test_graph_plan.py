"""The graph backend on CPU: grid, padding and chunk plans, multi-input padding, and the unsupported path."""

from __future__ import annotations

from collections import OrderedDict, namedtuple

import pytest
import torch
from torch import nn

from pipeline import backends as backend_registry
from pipeline import runner
from pipeline.backends import graph_plan
from pipeline.backends.graph import GraphBackend, concat_chunks, host_work_said, released, stage_inputs, take_rows
from pipeline.batching import BatchDims, output_batch_dims, tile
from pipeline.backends.candidate import Candidate
from conftest import TINY


@pytest.mark.parametrize("largest, cap, expected", [
    (256, 256, [1, 2, 4] + list(range(8, 257, 8))),
    (1, 256, [1]),
    (3, 256, [1, 2, 4]),
    (17, 256, [1, 2, 4, 8, 16, 24]),
    (64, 256, [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64]),
    (300, 256, [1, 2, 4] + list(range(8, 257, 8))),
    (64, 32, [1, 2, 4, 8, 16, 24, 32]),
    (100, 100, [1, 2, 4] + list(range(8, 97, 8))),
    (9, 5, [1, 2, 4]),
])
def test_grid(largest, cap, expected):
    assert graph_plan.grid(largest, cap) == expected


def test_released_outputs_alias_the_recordings_memory_without_keeping_it():
    """What a recorded graph keeps of its outputs: aliases at the same addresses, offsets and strides (a replay writes
    there), which hold no memory of their own, so the recording's tensors can go back to the pool."""
    from torch.multiprocessing.reductions import StorageWeakRef

    t = torch.arange(12.0).view(3, 4)[1:]
    kept = released({"logits": t, "pair": (t[:, :2], 5)})
    assert kept["pair"][1] == 5 and kept["logits"].data_ptr() == t.data_ptr()
    assert kept["logits"].stride() == t.stride() and kept["logits"].storage_offset() == t.storage_offset()
    t.add_(1)  # a replay's writes are what the aliases read
    assert torch.equal(kept["logits"], t) and torch.equal(kept["pair"][0], t[:, :2])
    owner = StorageWeakRef(t.untyped_storage())
    del t
    assert owner.expired()  # the aliases did not keep the memory


def test_default_cap_gives_35_graphs():
    assert len(graph_plan.grid(1000)) == 35


def test_explicit_grid_is_sorted_capped_and_stops_at_the_first_that_holds():
    assert graph_plan.grid(20, 64, [64, 1, 16, 32, 16]) == [1, 16, 32]
    assert graph_plan.grid(200, 64, [1, 16, 32, 128]) == [1, 16, 32]


@pytest.mark.parametrize("kwargs, message", [
    ({"largest": 0}, "at least 1"),
    ({"largest": 8, "cap": 0}, "max_recorded_batch_size"),
    ({"largest": 8, "sizes": [0, 8]}, "positive"),
    ({"largest": 8, "cap": 4, "sizes": [8, 16]}, "no grid size"),
])
def test_grid_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        graph_plan.grid(**kwargs)


def test_padding_table():
    table = graph_plan.padding_table([1, 2, 4, 8, 16, 24])
    assert sorted(table) == list(range(1, 25))
    assert [table[b] for b in (1, 2, 3, 4, 5, 8, 9, 16, 17, 24)] == [1, 2, 4, 4, 8, 8, 16, 16, 24, 24]
    assert graph_plan.padded_size(25, [1, 2, 4, 8, 16, 24]) is None


def test_chunk_plan():
    full = graph_plan.grid(256)
    assert graph_plan.chunk_plan(17, full) == [(17, 24)]
    assert graph_plan.chunk_plan(256, full) == [(256, 256)]
    assert graph_plan.chunk_plan(300, full) == [(256, 256), (44, 48)]
    assert graph_plan.chunk_plan(513, full) == [(256, 256), (256, 256), (1, 1)]
    assert graph_plan.chunk_plan(300, [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64]) == [(64, 64)] * 4 + [(44, 48)]
    with pytest.raises(ValueError, match="at least 1"):
        graph_plan.chunk_plan(0, full)


def test_sizes_to_record():
    assert graph_plan.sizes_to_record(range(1, 65)) == graph_plan.grid(64)
    assert graph_plan.sizes_to_record([1, 3, 8, 17, 64]) == [1, 4, 8, 24, 64]
    # A checkpoint's backend that owns sizes 9..16 records one graph.
    assert graph_plan.sizes_to_record(range(9, 17)) == [16]
    # Above the cap: the largest graph for full chunks, and the one that holds the rest.
    assert graph_plan.sizes_to_record([300]) == [48, 256]
    assert graph_plan.sizes_to_record([3, 10], sizes=[2, 8, 32]) == [8, 32]


def test_tuned_sizes_are_recorded_exactly_besides_the_grid():
    # Capture serves every size up to the largest tuned one; the tuned 3 and 17 pay no padding.
    recorded = graph_plan.sizes_to_record(range(1, 65), exact=[1, 3, 8, 17, 64])
    assert recorded == sorted(graph_plan.grid(64) + [3, 17])
    table = graph_plan.padding_table(recorded)
    assert [table[b] for b in (3, 17, 18, 9)] == [3, 17, 24, 16]
    # Every size the router sends by a tuned size pads to at most that size.
    tuned = [1, 3, 8, 17, 64]
    for bs in range(1, 65):
        assert table[bs] <= min(t for t in tuned if t >= bs)
    # An exact size above the largest served size is not recorded; sizes served only exactly need no grid graph.
    assert graph_plan.sizes_to_record(range(1, 9), exact=[3, 17]) == [1, 2, 3, 4, 8]
    assert graph_plan.sizes_to_record([3, 10], sizes=[2, 8, 32], exact=[3, 10]) == [3, 10]


def test_a_tuned_size_above_the_cap_is_one_graph_not_chunks():
    # The lennard_jones case: tuned [1, 64, 1000] with the default cap of 256, served from 1 to 1000.
    recorded = graph_plan.sizes_to_record(range(1, 1001), exact=[1, 64, 1000])
    assert recorded == graph_plan.grid(256) + [1000]
    assert graph_plan.chunk_plan(1000, recorded) == [(1000, 1000)]
    table = graph_plan.padding_table(recorded)
    # Untuned sizes past the cap pad to the tuned size that routes them (costing at most what it measured) ...
    assert table[257] == table[999] == 1000 and table[256] == 256
    # ... and only sizes past the largest tuned one replay in chunks, of the largest recorded graph.
    assert graph_plan.chunk_plan(1300, recorded) == [(1000, 1000), (300, 1000)]
    assert graph_plan.sizes_to_record([1000], exact=[1000]) == [1000]
    # Untuned, a size past the cap still chunks over the capped grid.
    assert graph_plan.sizes_to_record([300]) == [48, 256]


def test_stage_inputs_pads_every_input_with_zeros():
    static = {"input_ids": torch.full((8, 5), 7, dtype=torch.int64), "attention_mask": torch.full((8, 5), 9)}
    inputs = {"input_ids": torch.arange(30).view(6, 5), "attention_mask": torch.ones(6, 5, dtype=torch.int64)}
    stage_inputs(static, inputs, start=3, rows=3, size=4)
    assert torch.equal(static["input_ids"][:3], inputs["input_ids"][3:6])
    assert torch.equal(static["attention_mask"][:3], torch.ones(3, 5, dtype=torch.int64))
    for buf in static.values():
        assert torch.equal(buf[3], torch.zeros(5, dtype=torch.int64))  # padding
        assert (buf[4:] != 0).all()  # beyond the graph's size: untouched


def test_stage_inputs_rejects_other_names_shapes_and_dtypes():
    static = {"x": torch.zeros(4, 3)}
    with pytest.raises(TypeError, match="inputs must be"):
        stage_inputs(static, {"y": torch.zeros(2, 3)}, 0, 2, 2)
    with pytest.raises(ValueError, match="per-sample shape"):
        stage_inputs(static, {"x": torch.zeros(2, 1)}, 0, 2, 2)  # would broadcast silently
    with pytest.raises(ValueError, match="float64"):
        stage_inputs(static, {"x": torch.zeros(2, 3, dtype=torch.float64)}, 0, 2, 2)


def test_take_rows_keeps_structure_and_cuts_only_batch_first_tensors():
    Pair = namedtuple("Pair", "a b")
    static = {"logits": torch.arange(8.0).view(4, 2), "pair": Pair(torch.ones(4), torch.tensor(3.0)),
              "list": [torch.zeros(4, 1)], "none": None}
    out = take_rows(static, rows=3, size=4, clone=True)
    assert out["logits"].shape == (3, 2) and out["logits"].data_ptr() != static["logits"].data_ptr()
    assert isinstance(out["pair"], Pair) and out["pair"].a.shape == (3,) and out["pair"].b.item() == 3.0
    assert out["list"][0].shape == (3, 1) and out["none"] is None
    view = take_rows(static["logits"], rows=3, size=4, clone=False)
    assert view.data_ptr() == static["logits"].data_ptr()  # zero-copy


def test_take_rows_on_a_transformers_model_output():
    outputs = pytest.importorskip("transformers.modeling_outputs")
    static = outputs.SequenceClassifierOutput(logits=torch.randn(8, 3), hidden_states=(torch.randn(8, 4, 2),))
    out = take_rows(static, rows=5, size=8, clone=True)
    assert type(out) is type(static) and out.logits.shape == (5, 3) and out["logits"].shape == (5, 3)
    assert out.hidden_states[0].shape == (5, 4, 2) and out.loss is None


def test_concat_chunks():
    parts = [OrderedDict(y=torch.ones(4, 2)), OrderedDict(y=torch.zeros(3, 2))]
    out = concat_chunks(parts, [4, 3])
    assert isinstance(out, OrderedDict) and out["y"].shape == (7, 2) and out["y"][:4].eq(1).all()
    with pytest.raises(ValueError, match=r"output does not follow the batch"):
        concat_chunks([torch.ones(2), torch.ones(2)], [4, 3])


def test_tile_repeats_rows_into_fresh_memory():
    t = torch.arange(3).view(3, 1)
    assert tile(t, 7).flatten().tolist() == [0, 1, 2, 0, 1, 2, 0]
    assert tile(t, 3).data_ptr() != t.data_ptr()
    assert tile(t.view(1, 3), 4, dim=1, start=2).tolist() == [[2, 0, 1, 2]]  # along dimension 1, from row 2


# A sequence-first RNN: input (time, batch, features); outputs (time, batch, hidden) and (layers, batch, hidden),
# and a scalar that does not follow the batch.
SEQUENCE_FIRST = BatchDims({"x": 1}, {"output[0]": 1, "output[1]": 1, "output[2]": None})


def test_stage_inputs_pads_along_the_batch_dimension():
    static = {"x": torch.full((5, 8, 3), 7.0)}
    x = torch.arange(5 * 6 * 3.0).view(5, 6, 3)
    stage_inputs(static, {"x": x}, start=2, rows=3, size=4, dims=SEQUENCE_FIRST)
    assert torch.equal(static["x"][:, :3], x[:, 2:5])
    assert static["x"][:, 3].eq(0).all() and static["x"][:, 4:].eq(7).all()  # padding, then untouched
    with pytest.raises(ValueError, match=r"per-sample shape \(5, 3\).*batch in dimension 1"):
        stage_inputs(static, {"x": torch.zeros(4, 6, 3)}, 0, 2, 2, SEQUENCE_FIRST)


def test_take_rows_and_concat_chunks_follow_each_outputs_batch_dimension():
    static = (torch.randn(5, 4, 2), torch.randn(2, 4, 2), torch.tensor(1.5))
    out = take_rows(static, rows=3, size=4, clone=True, dims=SEQUENCE_FIRST)
    assert torch.equal(out[0], static[0][:, :3]) and torch.equal(out[1], static[1][:, :3]) and out[2].item() == 1.5
    first, second = (torch.randn(5, 4, 2), torch.randn(2, 4, 2)), (torch.randn(5, 3, 2), torch.randn(2, 3, 2))
    joined = concat_chunks([first, second], [4, 3], SEQUENCE_FIRST)
    assert torch.equal(joined[0], torch.cat([first[0], second[0]], 1)) and joined[1].shape == (2, 7, 2)
    with pytest.raises(ValueError, match=r"output\[2\] does not follow the batch"):
        concat_chunks([static, out], [4, 3], SEQUENCE_FIRST)


def test_output_batch_dims_are_found_by_running_the_model(caplog):
    lstm = nn.LSTM(3, 4, num_layers=2)  # sequence-first: (time, batch, 3) -> (out, (h_n, c_n))
    dims = output_batch_dims(lstm.eval(), lambda bs: {"input": torch.randn(6, bs, 3)})
    assert dims == {"output[0]": 1, "output[1][0]": 1, "output[1][1]": 1}

    class Odd(nn.Module):
        def forward(self, x):
            return {"rows": x.flatten(), "mean": x.mean(), "logits": x * 2}

    assert output_batch_dims(Odd(), lambda bs: {"x": torch.randn(bs, 5)}) == {
        "output.rows": None, "output.mean": None, "output.logits": 0}
    assert "along no single dimension" in caplog.text and "output.rows (10,) -> (15,)" in caplog.text


def test_unsupported_on_cpu_before_any_work():
    backend = backend_registry.create(Candidate.of("graph", {"kind": "graph"}))
    assert isinstance(backend, GraphBackend)
    assert "CUDA" in backend.unsupported_reason(torch.device("cpu"))


@pytest.mark.parametrize("cfg, message", [
    ({"kind": "graph", "mode": "default"}, "compile_with_inductor"),
    ({"kind": "graph", "compile_with_inductor": True, "mode": "reduce-overhead"}, "records CUDA graphs"),
    ({"kind": "graph", "compile_with_inductor": True, "options": {"triton.cudagraphs": True}}, "records CUDA graphs"),
    ({"kind": "graph", "compile_with_inductor": True, "mode": "default", "options": {"a": 1}}, "mutually exclusive"),
    ({"kind": "graph", "compile_with_inductor": True, "template": "cudagraphs"}, "records CUDA graphs"),
    ({"kind": "graph", "max_recorded_batch_size": 0}, "max_recorded_batch_size"),
    ({"kind": "graph", "grid": [0, 8]}, "positive"),
])
def test_config_errors_name_the_backend(cfg, message):
    with pytest.raises(ValueError, match=message):
        backend_registry.create(Candidate.of("g", cfg))


def test_graph_inductor_stores_a_template_as_its_options():
    cfg = {"kind": "graph", "compile_with_inductor": True, "template": "freezing"}
    described = backend_registry.create(Candidate.of("g", cfg)).describe()
    assert described["kind"] == "graph" and described["template"] is None and described["options"]
    rebuilt = Candidate.of("g", {k: v for k, v in described.items() if k != "name"})
    backend_registry.create(rebuilt)  # rebuilt without conf/


def test_backend_sets_compose(compose_cfg):
    assert list(compose_cfg(["backends=gpu"]).backends) == ["eager", "inductor", "graph", "graph_inductor"]
    assert list(compose_cfg(["backends=gpu_all"]).backends)[-1] == "inductor_reduce_overhead"
    cfg = compose_cfg(["backends=[graph_inductor]"])
    assert cfg.backends.graph_inductor.compile_with_inductor and cfg.backends.graph_inductor.kind == "graph"


def test_graph_is_skipped_on_cpu_and_the_run_goes_on(compose_cfg, tmp_path):
    cfg = compose_cfg(TINY + ["backends=[eager,graph,graph_inductor]", "device=cpu", "reference=false"])
    ctx = runner.run(cfg, tmp_path)
    for name in ("graph", "graph_inductor"):
        assert ctx.outcomes[name].status == "skipped"
        assert "CUDA" in ctx.outcomes[name].reason
    assert ctx.outcomes["eager"].status == "ok"
    assert set(ctx.backends) == {"eager"} and ctx.validation


# torch 2.11's words recording GPT-Neo's forward, which copies a tensor made on the CPU to the GPU (call BP)
GPT_NEO_SAID = ("Cannot copy between CPU and CUDA tensors during CUDA graph capture unless the CPU tensor is pinned. "
                "Please use tensor.pin_memory() or allocate the tensor with pin_memory=True.")


def test_a_forward_that_works_on_the_host_fails_its_graph_with_the_cause_and_the_way_out():
    """Torch's own words stay first; the cause and the way out follow: graph_inductor where the graph replays eager
    (its Inductor program can take the copy out of the forward: GPT-Neo's graph_inductor recorded where graph failed),
    the model's own code either way. Any other error is left as torch said it. (On a GPU: tests/test_graph_gpu.py.)"""
    eager = host_work_said(GPT_NEO_SAID, compiled=False)
    assert eager.startswith(GPT_NEO_SAID) and "works on the host between its kernels" in eager
    assert "graph_inductor" in eager and "make that tensor on the device in the model's own code" in eager
    compiled = host_work_said("CUDA error: operation not permitted when stream is capturing", compiled=True)
    assert "works on the host" in compiled and "graph_inductor" not in compiled
    assert host_work_said("CUDA out of memory. Tried to allocate 2.00 GiB", compiled=False) is None
