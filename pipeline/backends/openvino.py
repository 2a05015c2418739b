"""OpenVINO on the CPU: the model's exported graph converted by ``openvino.convert_model`` (every
dimension fixed but the batch, and the length where lengths are tuned) and compiled by the CPU plugin with the
backend's threads, performance hint and precision. A call runs one infer request on the caller's tensors (shared,
not copied) and copies the outputs out, since the request's next call overwrites them.

The compiled model exports itself (``serialized``): a checkpoint carries those bytes (``pipeline.compile.runtimes``),
and a load imports them with the same properties (:func:`runner_from`), with no export, conversion or compile."""

from __future__ import annotations

import contextlib
import ctypes
import io
import os
import sys
from typing import Any, Dict, Iterator, List

import torch

from pipeline.backends.exported import ExportedBackend, dynamic_dims
from pipeline.config.precisions import Precision

PERFORMANCE_HINTS = ("LATENCY", "THROUGHPUT")
# A candidate's precision -> OpenVINO's INFERENCE_PRECISION_HINT (tf32 has no CPU counterpart: skipped).
HINTS: Dict[Precision, str] = {"fp32": "f32", "bf16": "bf16", "fp16": "f16"}


class SignalStack(ctypes.Structure):
    """``stack_t`` of ``sigaltstack(2)``."""

    _fields_ = [("ss_sp", ctypes.c_void_p), ("ss_flags", ctypes.c_int), ("ss_size", ctypes.c_size_t)]


@contextlib.contextmanager
def signal_stack_kept() -> Iterator[None]:
    """Keep the calling thread's alternate signal stack as it was around the block.

    OpenVINO's ``compile_model`` installs a small alternate signal stack on the calling thread and puts
    back the one it found when that compiled model is freed. With two compiled models freed in another
    order than they were made, the thread is left pointing at a freed stack, and the next signal handled
    on it (Ctrl-C, SIGTERM: Python's handlers run on the alternate stack) crashes the process with a
    segmentation fault. Putting the stack back right after the compile keeps every later swap harmless."""
    libc = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None
    kept = SignalStack()
    if libc is None or libc.sigaltstack(None, ctypes.byref(kept)) != 0:
        yield
        return
    try:
        yield
    finally:
        libc.sigaltstack(ctypes.byref(kept), None)


@contextlib.contextmanager
def telemetry_declined() -> Iterator[None]:
    """OpenVINO's telemetry declined around the block: ``import openvino`` and ``openvino.convert_model``.

    OpenVINO sends usage events to Google Analytics unless its user ran ``opt_in_out --opt_out``: ``import
    openvino`` writes a client id under ``~/intel`` and sends one, every conversion sends more, and each is sent by
    a fork of the calling process (cut off after 3 s) from a pool thread that Python joins at exit: 12 forks of the
    user's process in one capture of a small MLP (one OpenVINO candidate). That is a network call the user never
    configured and a fork of a process full of runtime threads mid-run (a full test run's Ctrl-C test printed that
    it stopped, then sat at its 600 s timeout, with those threads and forks in the process). So the block runs with
    the switch the converter's telemetry honours to decline (``CI=true``: it passes ``disable_in_ci=True``), and a
    telemetry object configured before the block (the user's own conversions in this process) sends nothing from
    it either. The user's consent file is never touched, the environment and that object's consent are as they
    were after the block, and OpenVINO's own sends outside it are the user's."""
    kept = os.environ.get("CI")
    configured = configured_telemetry()
    consent = getattr(configured, "consent", None)
    os.environ["CI"] = "true"
    if configured is not None:
        configured.consent = False
    try:
        yield
    finally:
        if kept is None:
            os.environ.pop("CI", None)
        else:
            os.environ["CI"] = kept
        if configured is not None:
            configured.consent = consent


def configured_telemetry() -> Any:
    """OpenVINO's telemetry object where one was configured in this process (it is a singleton), else None."""
    try:
        from openvino_telemetry import Telemetry
        return Telemetry()  # raises RuntimeError where none was configured yet
    except (ImportError, RuntimeError):
        return None


class Runner:
    """Flat CPU tensors in, flat tensors out, through one infer request of a compiled model."""

    def __init__(self, compiled: Any) -> None:
        self.compiled, self.request = compiled, compiled.create_infer_request()

    def __call__(self, inputs: List[torch.Tensor]) -> List[torch.Tensor]:
        result = self.request.infer([t.numpy() for t in inputs], share_inputs=True, share_outputs=False)
        return [torch.from_numpy(array) for array in result.to_tuple()]


def runner_from(data: bytes, properties: Dict[str, Any]) -> Runner:
    """A compiled model this backend exported (``OpenVinoBackend.serialized``), imported with the properties it was
    compiled with (without them the CPU plugin picks its own precision: bf16 where the CPU has it)."""
    with telemetry_declined():
        import openvino
    with signal_stack_kept():
        return Runner(openvino.Core().import_model(io.BytesIO(data), "CPU", dict(properties)))


class OpenVinoBackend(ExportedBackend):
    kind = "openvino"
    packages = ("openvino",)
    extra = "openvino"
    precisions = tuple(HINTS)

    def import_package(self, package: str) -> None:
        with telemetry_declined():
            super().import_package(package)

    def _compile(self, program: torch.export.ExportedProgram, sample: Dict[str, torch.Tensor]) -> None:
        with telemetry_declined():
            import openvino

            shapes = []
            for name, t in sample.items():  # every dimension as traced but the batch (and the length)
                dims = list(t.shape)
                for d in dynamic_dims(name, self.batch_dims):
                    dims[d] = -1
                shapes.append(openvino.PartialShape(dims))
            converted = openvino.convert_model(program, input=shapes)
        with signal_stack_kept():
            self.runner = Runner(openvino.Core().compile_model(converted, "CPU", self.properties()))

    def properties(self) -> Dict[str, Any]:
        """What the CPU plugin compiles with: the threads, the performance hint and the precision."""
        return {"INFERENCE_NUM_THREADS": self.threads, "PERFORMANCE_HINT": self.settings.performance_hint,
                "INFERENCE_PRECISION_HINT": HINTS[self.candidate.precision]}

    def serialized(self) -> bytes:
        """The compiled model as OpenVINO exports it: what a load imports."""
        return self.runner.compiled.export_model().getvalue()

    def stats(self) -> Dict[str, Any]:
        """The settings the CPU plugin reports it applied."""
        return {key.lower(): str(self.runner.compiled.get_property(key))
                for key in ("INFERENCE_NUM_THREADS", "PERFORMANCE_HINT", "INFERENCE_PRECISION_HINT")}
