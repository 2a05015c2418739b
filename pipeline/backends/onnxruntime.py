"""ONNX Runtime's CPU execution provider: the model's exported graph translated by the dynamo ONNX
exporter into a temporary directory (gone once the session has loaded it) and run with the backend's
threads and graph optimisation level. Calls go through IO binding: the inputs are bound to the
caller's tensors where they lie, and the outputs ONNX Runtime allocates come back as torch tensors
over the same memory, so nothing is copied either way."""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
from typing import Any, Dict, Iterator, List

import torch

from pipeline.backends.exported import ExportedBackend

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


class OnnxRuntimeBackend(ExportedBackend):
    kind = "onnxruntime"
    packages = ("onnxruntime", "onnxscript")  # onnxscript: the dynamo exporter's translator
    extra = "onnxruntime"

    def _compile(self, program: torch.export.ExportedProgram, sample: Dict[str, torch.Tensor]) -> None:
        import onnxruntime

        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = self.threads
        options.inter_op_num_threads = 1
        options.graph_optimization_level = getattr(onnxruntime.GraphOptimizationLevel,
                                                   LEVELS[self.settings.graph_optimization_level])
        with tempfile.TemporaryDirectory(prefix="tweakpipe-onnx-") as folder, exporter_quiet():
            path = os.path.join(folder, "model.onnx")
            torch.onnx.export(program, (), dynamo=True, input_names=list(sample), verbose=False).save(path)
            self.session = onnxruntime.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        graph_inputs = [i.name for i in self.session.get_inputs()]
        if graph_inputs != list(sample):
            raise RuntimeError(f"the ONNX graph takes inputs {graph_inputs}, not the model's {list(sample)}")
        self.input_types = [t.numpy().dtype for t in sample.values()]
        self.output_names = [o.name for o in self.session.get_outputs()]

    def _run(self, inputs: List[torch.Tensor]) -> List[torch.Tensor]:
        binding = self.session.io_binding()
        for name, dtype, t in zip(self.names, self.input_types, inputs):
            binding.bind_input(name, "cpu", 0, dtype, tuple(t.shape), t.data_ptr())
        for name in self.output_names:
            binding.bind_output(name, "cpu")
        self.session.run_with_iobinding(binding)
        return [torch.from_numpy(value.numpy()) for value in binding.get_outputs()]

    def stats(self) -> Dict[str, Any]:
        """The settings the session reports it applied."""
        options = self.session.get_session_options()
        return {"threads": options.intra_op_num_threads, "graph_optimization_level": str(options.graph_optimization_level)}
