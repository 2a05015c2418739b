"""Device graphs over a batch-size grid: the host launches one graph instead of every kernel.

Launch-bound models spend most of a call launching kernels one by one; replaying a recorded
CUDA/XPU graph removes that cost. Graphs are recorded for a grid of batch sizes (``graph_plan``),
largest first into one shared memory pool, on prefix views of one static buffer per input; a call
copies its rows into the buffers, zero-pads to the smallest recorded size that holds it and
returns only its real rows. Rows lie along each input's and output's batch dimension
(:mod:`pipeline.batching`), the first unless the model says otherwise. ``compile_with_inductor``
records the kernels Inductor generates, compiled once for a dynamic batch dimension rather than
once per size. Where lengths are tuned (:mod:`pipeline.seqlen`), graphs are recorded over the batch grid at
every tuned length, in the same pool, with one static buffer per input and length; ``max_graphs`` and
``max_pool_mb`` cap how many and how much memory (capture.json says both).

``clone_outputs: false`` hands out views of the graphs' static outputs (no copy). They stay valid
only until the next call of this backend: any later replay may overwrite them.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import torch
from torch import nn

from pipeline import devices

from pipeline.backends import graph_plan
from pipeline.backends.base import Backend
from pipeline.backends.candidate import Candidate
from pipeline.batching import BatchDims, per_sample, tile
from pipeline.backends.inductor import InductorBackend
from pipeline.backends.program import dynamo_counts
from pipeline.measure.compare import Verdict, judge
from pipeline.leaves import map_outputs

log = logging.getLogger(__name__)

# Warm-up calls per recorded size before recording (the first one compiles or initialises).
WARMUP_CALLS = 2
# More compiles than this mean the batch dimension did not stay dynamic.
EXPECTED_COMPILES = 3
# torch's words when a forward works on the host between its kernels, which a device graph cannot record: a tensor
# made on the CPU copied over (GPT-Neo's forward: call BP, bench/results/README.md), a value read back (.item()).
HOST_WORK = ("Cannot copy between CPU and CUDA tensors during CUDA graph capture",
             "operation not permitted when stream is capturing")


def host_work_said(message: str, compiled: bool) -> Optional[str]:
    """``message`` (an error from recording a device graph) with its cause and the way out, where torch's words are
    of host work inside the forward (:data:`HOST_WORK`); None for any other error."""
    if not any(words in message for words in HOST_WORK):
        return None
    way_out = ("" if compiled else "graph_inductor, whose Inductor program can take such work out of the forward, "
               "may record it; or ")
    return (f"{message.strip()} [the model's forward works on the host between its kernels (a tensor made on the CPU "
            f"and copied to the device, a value read back with .item()), which a device graph cannot record: "
            f"{way_out}make that tensor on the device in the model's own code]")


def take_rows(out: Any, rows: int, size: int, clone: bool, dims: BatchDims = BatchDims()) -> Any:
    """The first ``rows`` rows of every batched output tensor of a ``size`` graph, along its batch
    dimension (``dims``); cloned, or views."""

    def one(path: str, t: torch.Tensor) -> torch.Tensor:
        dim = dims.output(path, t, size)
        if rows != size and dim is not None:
            t = t.narrow(dim, 0, rows)
        return t.clone() if clone else t

    return map_outputs(one, out)


def released(out: Any) -> Any:
    """``out``'s tensors as aliases that do not own their memory, so that the recording's own tensors can go back to
    the graphs' pool for the next (smaller) graph to record into, as its intermediates already do.

    Each graph writes its outputs at the same addresses at every replay, and a call takes (clones) its rows before
    any other replay, so graphs may share that memory as they share their intermediates. Kept, every graph's outputs
    stayed in the pool for good: 35 graphs up to 256 rows hold 16.5 times the largest graph's outputs (DistilBERT's
    masked-LM logits: 33 GB a graph candidate at batch 256, and every graph candidate out of memory on the H100).
    The aliases are built as torch's CUDA graph trees rebuild theirs (``_construct_storage_from_data_pointer``)."""

    def alias(path: str, t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        unowned = torch._C._construct_storage_from_data_pointer(storage.data_ptr(), t.device, storage.nbytes())
        return torch.empty(0, dtype=t.dtype, device=t.device).set_(unowned, t.storage_offset(), t.shape, t.stride())

    return map_outputs(alias, out)


def concat_chunks(parts: Sequence[Any], rows: Sequence[int], dims: BatchDims = BatchDims()) -> Any:
    """One output from the outputs of consecutive chunks, concatenated along each tensor's batch dimension."""

    def cat(path: str, *ts: torch.Tensor) -> torch.Tensor:
        found = {dims.output(path, t, r) for t, r in zip(ts, rows)}
        if None in found or len(found) > 1:
            raise ValueError(f"{path} does not follow the batch, so a batch above the largest recorded graph "
                             f"cannot be served in chunks; raise max_recorded_batch_size to cover it")
        return torch.cat(ts, dim=found.pop())

    return map_outputs(cat, *parts)


def stage_inputs(static: Mapping[str, torch.Tensor], inputs: Mapping[str, torch.Tensor], start: int, rows: int,
                 size: int, dims: BatchDims = BatchDims()) -> None:
    """Copy rows ``start:start+rows`` of every input into its static buffer and zero the padding up to
    ``size``, along each input's batch dimension (``dims``)."""
    if inputs.keys() != static.keys():
        raise TypeError(f"graph inputs must be {sorted(static)}, got {sorted(inputs)}")
    for name, buf in static.items():
        src, dim = inputs[name], dims.input(name)
        if src.dim() != buf.dim() or per_sample(src.shape, dim) != per_sample(buf.shape, dim) or src.dtype != buf.dtype:
            raise ValueError(f"input {name!r}: graphs were recorded for per-sample shape "
                             f"{tuple(per_sample(buf.shape, dim))} {buf.dtype} (batch in dimension {dim}), got "
                             f"{tuple(src.shape)} {src.dtype}; rebuild the backend for it")
        buf.narrow(dim, 0, rows).copy_(src.narrow(dim, start, rows))
        if rows < size:
            buf.narrow(dim, rows, size - rows).zero_()


class GraphBackend(Backend):
    kind = "graph"

    def __init__(self, candidate: Candidate) -> None:
        super().__init__(candidate)
        self._clone = self.settings.clone_outputs
        # Inductor's side (options, templates, device support) is exactly the inductor backend's.
        self._inductor = InductorBackend(candidate) if self.settings.compile_with_inductor else None
        self._api: Any = None
        self._model: Optional[nn.Module] = None
        # By length (None without tuned lengths): one static buffer per input, and a graph per recorded size.
        self._static: Dict[Optional[int], Dict[str, torch.Tensor]] = {}
        self._graphs: Dict[Tuple[int, Optional[int]], tuple] = {}
        self._recorded: List[int] = []
        self._pad: Dict[int, int] = {}
        self._stats: Dict[str, Any] = {}

    @property
    def records_cuda_graphs(self) -> bool:
        return True

    @property
    def any_length(self) -> bool:
        """Graphs are recorded at the tuned lengths only."""
        return False

    def unsupported_reason(self, device: torch.device) -> Optional[str]:
        if device.type == "xpu" and not hasattr(torch.xpu, "XPUGraph"):
            return f"torch {torch.__version__} has no torch.xpu.XPUGraph; XPU graphs need a newer torch"
        if device.type not in ("cuda", "xpu"):
            return (f"graph backends replay recorded device graphs, which need CUDA (torch.cuda.CUDAGraph) "
                    f"or XPU (torch.xpu.XPUGraph); {device.type} has none")
        return self._inductor.unsupported_reason(device) if self._inductor else super().unsupported_reason(device)

    def inductor_options(self) -> Dict[str, Any]:
        return self._inductor.effective_options() if self._inductor else {}

    @property
    def inductor_part(self) -> Optional[InductorBackend]:
        """Its Inductor side as a backend of its own (None without Inductor): the program its graphs record, which
        a compile worker builds alone where that program is standalone (``pipeline.compile.worker``)."""
        return self._inductor

    def _compiled(self, model: nn.Module) -> Any:
        if self._inductor is None:
            return model
        if self.prebuilt is not None:  # Inductor's kernels built ahead of time (a load): the graphs record those
            return self.prebuilt(model)
        self._inductor.device, self._inductor.batch_dims = self.device, self.batch_dims
        self.program = self._inductor.program_for(model)
        return self.program

    def plan(self, batch_sizes: Sequence[int]) -> Tuple[List[int], Tuple[Optional[int], ...]]:
        """The batch sizes and lengths (None without tuned lengths) to record, within ``max_graphs``."""
        recorded = graph_plan.sizes_to_record(batch_sizes, self.settings.max_recorded_batch_size, self.settings.grid,
                                              self.exact_sizes)
        lengths = self.batch_dims.seq.lengths or (None,)
        if len(recorded) * len(lengths) > self.settings.max_graphs:
            raise RuntimeError(f"{len(recorded)} batch sizes x {len(lengths)} lengths make "
                               f"{len(recorded) * len(lengths)} graphs, above max_graphs={self.settings.max_graphs}; "
                               f"set a smaller grid (grid=[...]), fewer model.seq_lens, or raise max_graphs")
        return recorded, lengths

    def _build(self, model: nn.Module, sample: Dict[str, torch.Tensor], batch_sizes: list) -> None:
        device = self.device
        api = self._api = getattr(torch, device.type)  # torch.cuda or torch.xpu: the same graph API
        graph_class = api.CUDAGraph if device.type == "cuda" else api.XPUGraph
        recorded, lengths = self.plan(batch_sizes)
        # Static buffers live outside the graph pool, one set per length; every graph records on a prefix view.
        dim, seq = self.batch_dims.input, self.batch_dims.seq
        self._static = {n: {name: tile(t.to(device), recorded[-1], dim(name))
                            for name, t in (seq.resized(sample, n) if n else sample).items()} for n in lengths}
        views = {(size, n): {name: buf.narrow(dim(name), 0, size) for name, buf in self._static[n].items()}
                 for n in lengths for size in recorded}
        # largest first: smaller graphs reuse its memory in the pool
        order = sorted(views, key=lambda key: (key[0] * (key[1] or 1), key), reverse=True)
        fn = self._compiled(model)
        if self._inductor and self.prebuilt is None:
            for inputs in views.values():  # dynamic dimensions: a few compiles, not one per size
                self._inductor.mark_dynamic(inputs)

        with self.watched():
            graphs_before, start = dynamo_counts()["graphs"], time.perf_counter()
            side = api.Stream(device=device)  # warm up off the default stream, as graph capture requires
            side.wait_stream(api.current_stream(device))
            with api.stream(side), self.autocast():
                for key in order:
                    for _ in range(WARMUP_CALLS):
                        fn(**views[key])
            api.current_stream(device).wait_stream(side)
            devices.synchronize(device)
            warmup_seconds, compiles = time.perf_counter() - start, dynamo_counts()["graphs"] - graphs_before

            with devices.graph_capture_workspace(device):  # let the last workspace go before measuring the pool
                api.empty_cache()
            reserved = api.memory_reserved(device)
            pool = api.graph_pool_handle()
            start = time.perf_counter()
            for key in order:
                graph = graph_class()
                try:
                    with devices.graph_capture_workspace(device), api.graph(graph, pool=pool), self.autocast():
                        out = fn(**views[key])
                except RuntimeError as exc:
                    said = host_work_said(str(exc), self._inductor is not None)
                    if said is None:
                        raise
                    raise RuntimeError(said) from exc
                # cloned at every call, its outputs' memory is shared with the graphs recorded after it; handed out
                # as views (clone_outputs: false), each graph keeps its own, as a view must outlive other replays
                self._graphs[key] = (graph, released(out) if self._clone and device.type == "cuda" else out)
                del out
                self.check_pool(api.memory_reserved(device) - reserved, len(self._graphs), len(order))
            devices.synchronize(device)
            record_seconds = time.perf_counter() - start
            api.empty_cache()

        self._model, self._fn = model, fn  # keep the weights and compiled kernels the graphs point at alive
        self._recorded = recorded
        self._pad = graph_plan.padding_table(recorded)
        pool_bytes = api.memory_reserved(device) - reserved
        self._stats = {
            "recorded_sizes": recorded,
            **({"recorded_lengths": list(lengths)} if seq else {}),
            "graphs": len(self._graphs),
            # the program's first calls at each size, before recording: every Inductor compile, and the device
            # libraries' set-up for each new shape (cuDNN builds a plan per convolution shape: 0.15-1.0 s for a
            # channels-last depthwise one, bench/results/plain-script-h100.md)
            "first_calls_seconds": warmup_seconds,
            "record_seconds": record_seconds,
            "compiles": compiles,
            "pool_bytes": pool_bytes,
            "static_input_bytes": sum(b.numel() * b.element_size()
                                      for per in self._static.values() for b in per.values()),
        }
        expected = EXPECTED_COMPILES * (len(lengths) if self._inductor and self._inductor.per_length else 1)
        if self._stats["compiles"] > expected:
            log.warning("backend %s: %d compiles for %d graphs: the model specialises on the batch size or length, so "
                        "graphs past Dynamo's recompile_limit fail the backend; set a smaller grid", self.name,
                        self._stats["compiles"], len(self._graphs))

    def check_pool(self, used: int, recorded: int, total: int) -> None:
        """Past ``max_pool_mb``, the backend fails with the figures (the graphs so far go with it)."""
        cap = self.settings.max_pool_mb
        if cap is not None and used > cap * 2**20:
            raise RuntimeError(f"the graph pool takes {used / 2**20:.0f} MB after {recorded} of {total} graphs, above "
                               f"max_pool_mb={cap:g}; set a smaller grid, fewer model.seq_lens, or raise max_pool_mb")

    def _replay(self, inputs: Mapping[str, torch.Tensor], start: int, rows: int, size: int, length: Optional[int],
                clone: bool) -> Any:
        stage_inputs(self._static[length], inputs, start, rows, size, self.batch_dims)
        graph, out = self._graphs[(size, length)]
        graph.replay()
        if self.device.type == "xpu":
            self._api.current_stream(self.device).synchronize()  # the stream, never the device (driver crash)
        return take_rows(out, rows, size, clone, self.batch_dims)

    def length(self, inputs: Mapping[str, torch.Tensor]) -> Optional[int]:
        """A call's length where lengths are tuned (it must be one of them), else None."""
        seq = self.batch_dims.seq
        if not seq:
            return None
        length = seq.length(inputs)
        if length not in self._static:
            raise ValueError(f"graphs were recorded at lengths {sorted(self._static)}, not {length}; pad the call to "
                             f"one of them (the routed model does)")
        return length

    def __call__(self, **inputs: torch.Tensor) -> Any:
        name, first = next(iter(inputs.items()))
        batch = int(first.shape[self.batch_dims.input(name)])
        size, length = self._pad.get(batch), self.length(inputs)
        with torch.inference_mode():
            if size is not None:
                return self._replay(inputs, 0, batch, size, length, self._clone)
            plan = graph_plan.chunk_plan(batch, self._recorded)
            parts, start = [], 0
            for rows, size in plan:  # each chunk is cloned: the next replay overwrites the static outputs
                parts.append(self._replay(inputs, start, rows, size, length, clone=True))
                start += rows
            return concat_chunks(parts, [rows for rows, _ in plan], self.batch_dims)

    def self_check(self, model: nn.Module, sample: Dict[str, torch.Tensor],
                   tolerance_scale: float = 1.0) -> Dict[str, Verdict]:
        """Every recorded graph against eager: eager runs once on the largest recorded batch (at each length),
        then each graph is compared with the matching prefix of that output, full and padded (17 rows through 24)."""
        largest = self._recorded[-1]
        dim, seq = self.batch_dims.input, self.batch_dims.seq
        verdicts: Dict[str, Verdict] = {}
        for length in self._static:
            at = seq.resized(sample, length) if length else sample
            inputs = {name: tile(t.to(self.device), largest, dim(name)) for name, t in at.items()}
            with torch.inference_mode():
                reference = model(**inputs)
            for i, size in enumerate(self._recorded):
                smallest = self._recorded[i - 1] + 1 if i else 1  # the fewest rows this graph serves
                for rows in sorted({size, smallest}, reverse=True):
                    out = self(**{name: t.narrow(dim(name), 0, rows) for name, t in inputs.items()})
                    expected = take_rows(reference, rows, largest, False, self.batch_dims)
                    where = f" at length {length}" if length else ""
                    verdicts[f"graph {size} with {rows} rows{where}"] = judge(
                        out, expected, self.candidate.compute_dtype, tolerance_scale)
        worst = max(verdicts, key=lambda label: verdicts[label].error)
        self._stats["self_check_worst"] = {"check": worst, "max_rel_error": verdicts[worst].error}
        return verdicts

    def stats(self) -> Dict[str, Any]:
        return dict(self._stats)

    def describe(self) -> Dict[str, Any]:
        """With Inductor, a template is stored as its resolved options, as the inductor backend does."""
        return self._inductor.describe() if self._inductor else super().describe()
