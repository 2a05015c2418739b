"""The interface of a compiled form: how a routed program is saved ahead of time and loaded back.

A load that rebuilds a backend traces and compiles its program again (seconds, on every replica's start). A form
saves what the backend serves as bytes at save time and loads those bytes back, with nothing to trace or compile, in
the way vLLM's ``CompilerInterface`` has a compile and a load: each form

- says why a backend's program does not fit it (:meth:`Form.unfit`, before anything is built),
- builds the program's bytes and its manifest from the built backend (:meth:`Form.build`),
- checks a manifest it is handed beyond what every form records (:meth:`Form.problem`; the common part is
  ``pipeline.compile.manifest.common_problem``), and
- loads the bytes back into what the backend calls instead of its own program (:meth:`Form.loader`), the weights
  bound from the user's model where the form holds none, every call's inputs checked (``manifest.Loaded``).

The forms (``pipeline.compile.aot`` holds the registry and picks one per backend): an AOTInductor package for CPU
Inductor programs (``aoti``), an Inductor standalone program for CUDA ones (``standalone``), and the runtime's own
model for ONNX Runtime and OpenVINO backends (``runtimes``). The bytes are code, or a native runtime's input, so they
travel only inside the signed artifacts file (``pipeline.compile.artifacts``), under its trust.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, ClassVar, Mapping, Optional

import torch
from torch import nn

from pipeline.compile.manifest import Loaded, Package

# Inductor options that cannot hold in a program saved ahead of time (it records no CUDA graphs of its own: a graph
# backend records them over the loaded program); a backend setting one keeps its traced program.
NOT_AHEAD = ("triton.cudagraphs",)


class Form:
    """One compiled form (``name``: its format in a manifest, ``"aoti/1"``)."""

    name: ClassVar[str] = ""
    # True where the saved form is the backend's very program serialised (a runtime's own model): it is held to the
    # backend's outputs but not timed against it (two timings of one program differ only by the machine's noise,
    # which on a busy host made a route keep rebuilding at load for nothing)
    same_program: ClassVar[bool] = False

    def unfit(self, backend: Any) -> str:
        """Why ``backend``'s program cannot take this form, known before it is built ("" where it can)."""
        raise NotImplementedError

    def build(self, backend: Any, sample: Mapping[str, torch.Tensor], largest: int, directory: Path) -> Package:
        """The built ``backend``'s program in this form, for batch sizes 1 to ``largest``, any files it needs made
        under ``directory``; raises what the builder raises."""
        raise NotImplementedError

    def problem(self, manifest: Mapping[str, Any]) -> Optional[str]:
        """Why ``manifest`` (anyone's) is not one this form allows beyond the common checks, or None."""
        return None

    def loader(self, data: bytes, manifest: Mapping[str, Any], where: Path, device: torch.device,
               single_threaded: bool) -> Callable[[nn.Module], Loaded]:
        """What builds the backend's program from its module at load: ``data`` written under ``where`` (the load's own
        folder) where the form loads from a file, checked after it is written. ``single_threaded``: device graphs are
        recorded over it. Raises ValueError where ``data`` is not a program of this form."""
        raise NotImplementedError


class InductorForm(Form):
    """A form of an Inductor program (the AOTInductor package, the standalone program)."""

    # Inductor settings a program of this form cannot hold -> why (after "its Inductor setting <key>"); a form adds
    # its own to these
    refused: ClassVar[Mapping[str, str]] = {key: "has no ahead-of-time form" for key in NOT_AHEAD}

    def unfit(self, backend: Any) -> str:
        candidate = backend.candidate
        if not candidate.compiles:
            return "it compiles nothing"
        if candidate.quantizes:
            return f"{candidate.precision} weights are tensor subclasses a package cannot bind"
        held = [key for key in self.refused if backend.inductor_options().get(key)]
        return f"its Inductor setting {held[0]} {self.refused[held[0]]}" if held else ""


def reason(form: Form, backend: Any) -> str:
    """Why ``backend``'s program cannot be saved in ``form`` ("" where it can): what the form refuses, a backend not
    built, and tuned lengths (a saved program takes one length; its length dimension stays traced)."""
    why = form.unfit(backend)
    if why:
        return why
    if getattr(backend, "module", None) is None:
        return "it was not built"
    return "lengths are tuned (its length dimension stays traced)" if backend.batch_dims.seq else ""
