"""ONNX Runtime's CPU execution provider: the model's exported graph translated by the dynamo ONNX
exporter into a temporary directory (gone once the session has loaded it) and run with the backend's
threads and graph optimisation level. Calls go through IO binding: the inputs are bound to the
caller's tensors where they lie, and the outputs ONNX Runtime allocates come back as torch tensors
over the same memory, so nothing is copied either way.

The session writes the graph as it optimised it (``serialized``): a checkpoint carries those bytes
(``pipeline.compile.runtimes``), and a load opens a session over them with optimisation off
(:func:`runner_from`), with no export, no translation and no optimisation pass (most of a rebuild's
seconds). Optimised at the ``all`` level the graph may hold layouts for this CPU, which the load checks."""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
from typing import Any, Dict, Iterator, List, Mapping, Optional

import torch

from pipeline.backends.exported import ExportedBackend
from pipeline.measure.contention import usable_cores

# graph_optimization_level -> onnxruntime.GraphOptimizationLevel
LEVELS = {"disable": "ORT_DISABLE_ALL", "basic": "ORT_ENABLE_BASIC", "extended": "ORT_ENABLE_EXTENDED",
          "all": "ORT_ENABLE_ALL"}
# The exporter's translator logs every pass at INFO, into the run's log; its warnings still pass.
EXPORTER_LOGGERS = ("onnxscript", "onnx_ir")


@contextlib.contextmanager
def exporter_quiet() -> Iterator[None]:
    loggers = [logging.getLogger(name) for name in EXPORTER_LOGGERS]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


# ONNX Runtime's session entry for its threads' spinning (``allow_spinning``), "1" or "0"
SPINNING = "session.intra_op.allow_spinning"


def session_options(threads: int, level: str, entries: Mapping[str, str]) -> Any:
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.graph_optimization_level = getattr(onnxruntime.GraphOptimizationLevel, LEVELS[level])
    for key, value in entries.items():
        options.add_session_config_entry(key, value)
    return options


def spins(allow_spinning: Optional[bool], threads: int) -> bool:
    """Whether a session's threads spin after a call, waiting for the next: ``allow_spinning`` where set; null (the
    default) only where this process's cores hold the spinning threads and as many again for whatever runs next.
    On 2 cores (2 threads) eager PyTorch timed right after a spinning session read 18.3 ms where it runs in 7.1
    alone; on 16 cores (4 threads) it ran no slower beside one, and sleeping threads made the session itself 10-25%
    slower at batch 1 (``bench/probes/ort_session_probe.py``, ``spinning_probe.py``)."""
    return allow_spinning if allow_spinning is not None else 2 * threads <= usable_cores()


def entries_of(settings: Any, threads: int) -> Dict[str, str]:
    """The session's config entries from the backend's settings and its thread count."""
    return {SPINNING: "1" if spins(settings.allow_spinning, threads) else "0"}


def numpy_dtype(dtype: torch.dtype, known: Dict[torch.dtype, Any] = {}) -> Any:  # noqa: B006 -- a cache
    """numpy's dtype of ``dtype`` (a tensor's memory is bound as what it is: the session checks it against its graph,
    as it checks the shape, and refuses a call it was not built for)."""
    if dtype not in known:
        known[dtype] = torch.empty(0, dtype=dtype).numpy().dtype
    return known[dtype]


class Runner:
    """Flat CPU tensors in, flat tensors out, through one session's IO binding."""

    def __init__(self, session: Any, names: List[str]) -> None:
        graph_inputs = [i.name for i in session.get_inputs()]
        if graph_inputs != names:
            raise RuntimeError(f"the ONNX graph takes inputs {graph_inputs}, not the model's {names}")
        self.session, self.names = session, names
        self.output_names = [o.name for o in session.get_outputs()]

    def __call__(self, inputs: List[torch.Tensor]) -> List[torch.Tensor]:
        binding = self.session.io_binding()
        for name, t in zip(self.names, inputs):
            binding.bind_input(name, "cpu", 0, numpy_dtype(t.dtype), tuple(t.shape), t.data_ptr())
        for name in self.output_names:
            binding.bind_output(name, "cpu")
        self.session.run_with_iobinding(binding)
        return [torch.from_numpy(value.numpy()) for value in binding.get_outputs()]


def runner_from(data: bytes, names: List[str], threads: int, entries: Mapping[str, str]) -> Runner:
    """A session over a graph this backend optimised and serialised (``OnnxRuntimeBackend.serialized``), with
    optimisation off (it is done) and the session's config ``entries`` (:func:`entries_of`; none in checkpoints
    saved before they were kept, which open with ONNX Runtime's defaults, as they were tuned)."""
    import onnxruntime

    session = onnxruntime.InferenceSession(data, session_options(threads, "disable", entries),
                                           providers=["CPUExecutionProvider"])
    return Runner(session, names)


class OnnxRuntimeBackend(ExportedBackend):
    kind = "onnxruntime"
    packages = ("onnxruntime",)
    export_packages = ("onnxscript",)  # the dynamo exporter's translator
    extra = "onnxruntime"

    def _compile(self, program: torch.export.ExportedProgram, sample: Dict[str, torch.Tensor]) -> None:
        import onnxruntime

        options = session_options(self.threads, self.settings.graph_optimization_level,
                                  entries_of(self.settings, self.threads))
        with tempfile.TemporaryDirectory(prefix="tweakpipe-onnx-") as folder, exporter_quiet():
            path = os.path.join(folder, "model.onnx")
            torch.onnx.export(program, (), dynamo=True, input_names=list(sample), verbose=False).save(path)
            options.optimized_model_filepath = os.path.join(folder, "optimized.onnx")
            # errors only: saving the optimised graph makes ONNX Runtime warn on stderr, in every run, that its
            # NCHWc layout may hold this CPU's block size; the checkpoint's artifacts are bound to this CPU's
            # instruction-set flags (pipeline.compile.artifacts.built_for), and another CPU rebuilds the backend
            options.log_severity_level = 3
            session = onnxruntime.InferenceSession(path, options, providers=["CPUExecutionProvider"])
            with open(options.optimized_model_filepath, "rb") as f:
                self.optimized = f.read()
        self.runner = Runner(session, list(sample))

    def serialized(self) -> bytes:
        """The graph as the session optimised it: what a load opens with optimisation off."""
        return self.optimized

    def entries(self) -> Dict[str, str]:
        """The config entries the session reports it applied: what a checkpoint's saved model opens with (spinning
        as it was tuned, wherever it loads)."""
        return {SPINNING: self.runner.session.get_session_options().get_session_config_entry(SPINNING)}

    def stats(self) -> Dict[str, Any]:
        """The settings the session reports it applied."""
        options = self.runner.session.get_session_options()
        return {"threads": options.intra_op_num_threads,
                "graph_optimization_level": str(options.graph_optimization_level),
                "allow_spinning": self.entries()[SPINNING]}
