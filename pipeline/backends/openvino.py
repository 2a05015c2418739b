"""OpenVINO on the CPU: the model's exported graph converted by ``openvino.convert_model`` (every
dimension fixed but the batch, and the length where lengths are tuned) and compiled by the CPU plugin with the
backend's threads, performance hint and precision. A call runs one infer request on the caller's tensors (shared,
not copied) and copies the outputs out, since the request's next call overwrites them."""

from __future__ import annotations

from typing import Any, Dict, List

import torch

from pipeline.backends.exported import ExportedBackend, dynamic_dims

PERFORMANCE_HINTS = ("LATENCY", "THROUGHPUT")
# A candidate's precision -> OpenVINO's INFERENCE_PRECISION_HINT (tf32 has no CPU counterpart: skipped).
HINTS = {"fp32": "f32", "bf16": "bf16", "fp16": "f16"}


class OpenVinoBackend(ExportedBackend):
    kind = "openvino"
    packages = ("openvino",)
    extra = "openvino"
    precisions = tuple(HINTS)

    def _compile(self, program: torch.export.ExportedProgram, sample: Dict[str, torch.Tensor]) -> None:
        import openvino

        shapes = []
        for name, t in sample.items():  # every dimension as traced but the batch (and the length)
            dims = list(t.shape)
            for d in dynamic_dims(name, self.batch_dims):
                dims[d] = -1
            shapes.append(openvino.PartialShape(dims))
        converted = openvino.convert_model(program, input=shapes)
        self.compiled = openvino.Core().compile_model(converted, "CPU", {
            "INFERENCE_NUM_THREADS": self.threads, "PERFORMANCE_HINT": self.cfg["performance_hint"],
            "INFERENCE_PRECISION_HINT": HINTS[self.precision]})
        self.request = self.compiled.create_infer_request()

    def _run(self, inputs: List[torch.Tensor]) -> List[torch.Tensor]:
        result = self.request.infer([t.numpy() for t in inputs], share_inputs=True, share_outputs=False)
        return [torch.from_numpy(array) for array in result.to_tuple()]

    def stats(self) -> Dict[str, Any]:
        """The settings the CPU plugin reports it applied."""
        return {key.lower(): str(self.compiled.get_property(key))
                for key in ("INFERENCE_NUM_THREADS", "PERFORMANCE_HINT", "INFERENCE_PRECISION_HINT")}
