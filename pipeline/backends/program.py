"""One compiled program per backend: its own Dynamo cache, recompile budget and CUDA-graph tree.

Dynamo keeps compiled code on the *code object* of the frame it compiles, with one recompile
budget (``recompile_limit``, 8) per code object. Every ``torch.compile(model)`` of one model, or of
two models of one class, compiles the same ``forward`` code object: the backends of a run share one
cache and one budget, and once it is spent Dynamo silently runs that code eagerly, so an "Inductor"
timing is eager's. A :class:`Program` compiles a function whose code object is made for it alone,
so its cache entries (and the resume functions of its graph breaks) belong to it and die with it;
and its Inductor backend equals no other program's (:class:`OwnInductor`), so the frames a graph
break leaves to Dynamo (the model's ``forward``) are compiled for it too, not borrowed.

Inductor's CUDA graphs (``triton.cudagraphs``: ``reduce-overhead``, ``max-autotune``) live in a
CUDA-graph tree that torch keeps per device and thread for *every* compiled function; a program
that records them gets a tree of its own, so one backend's graphs, memory pool and generations
never meet another's.

A program also proves that it served compiled code: its entry counts the calls that ran outside
compiled code (``torch.compiler.is_compiling()`` is false only there; the count is dropped from
the compiled graph), and while :meth:`Program.watched` is active hitting a recompile limit raises
instead of falling back to eager.
"""

from __future__ import annotations

import contextlib
import itertools
import sys
import types
from dataclasses import asdict, dataclass
from typing import Any, Callable, Dict, Iterator, Mapping, Optional

import torch
from torch import nn


@dataclass
class CompileEvidence:
    """What Dynamo did for one program while watched: graphs compiled, graph breaks, frames seen."""

    graphs: int = 0
    graph_breaks: int = 0
    frames: int = 0
    eager_calls: int = 0  # calls that ran outside compiled code (should stay 0)

    def to_dict(self) -> Dict[str, int]:
        return asdict(self)


def dynamo_counts() -> Dict[str, int]:
    """Process-wide Dynamo counters: compiled graphs, graph breaks and frames handed to Dynamo (zeros while Dynamo
    is not loaded: nothing has been traced, and a load of ahead-of-time programs does not pay its import)."""
    if "torch._dynamo.utils" not in sys.modules:
        return {"graphs": 0, "graph_breaks": 0, "frames": 0}
    from torch._dynamo.utils import counters

    return {"graphs": int(counters["stats"]["unique_graphs"]),
            "graph_breaks": int(sum(counters["graph_break"].values())),
            "frames": int(counters["frames"]["total"])}


class RecompileLimitHit(RuntimeError):
    """A program would have fallen back to eager code: the backend fails with this reason."""


def strict_compiles() -> contextlib.AbstractContextManager:
    """Compiles in this block raise when they hit a Dynamo recompile limit, instead of running eagerly."""
    return torch._dynamo.config.patch(fail_on_recompile_limit_hit=True)


class _EagerCalls:
    count = 0


def _entry_for(model: nn.Module, eager: _EagerCalls) -> Callable[..., Any]:
    def entry(**inputs: torch.Tensor) -> Any:
        if not torch.compiler.is_compiling():
            eager.count += 1
        return model(**inputs)

    return entry


_PROGRAMS = itertools.count(1)


def own_entry(model: nn.Module, eager: _EagerCalls, owner: str) -> Callable[..., Any]:
    """``model(**inputs)`` as a function whose code object no other program shares, nor its name: Dynamo keeps the
    sizes a frame has seen (its automatic-dynamic history) under the code's file, line and name, so a program named
    as an earlier one of the process (the same backend of another model or run, a reload) compiled its very first
    call with a dynamic batch, as neither the earlier program nor a fresh process does."""
    template = _entry_for(model, eager)
    name = f"tweakpipe_{''.join(c if c.isalnum() else '_' for c in owner)}_{next(_PROGRAMS)}"
    code = template.__code__.replace(co_name=name, co_qualname=name)  # a new code object, always
    return types.FunctionType(code, template.__globals__, name, None, template.__closure__)


@contextlib.contextmanager
def own_cudagraph_trees(trees: Dict[int, Any], device_index: int) -> Iterator[None]:
    """Run with ``trees``' CUDA-graph tree for ``device_index`` in place of the thread's shared one.

    Inductor binds a compiled graph to the tree current at its first run, so swapping the tree
    around every call keeps all of a program's graphs in its own tree (and its own memory pool).
    """
    from torch._inductor import cudagraph_trees

    containers = cudagraph_trees.get_obj(cudagraph_trees.local, "tree_manager_containers")
    if device_index not in trees:
        trees[device_index] = cudagraph_trees.TreeManagerContainer(device_index)
    shared = containers.get(device_index)
    containers[device_index] = trees[device_index]
    try:
        yield
    finally:
        if shared is None:
            containers.pop(device_index, None)
        else:
            containers[device_index] = shared


class OwnInductor(torch._TorchCompileInductorWrapper):
    """Inductor exactly as ``torch.compile`` calls it, but equal only to itself.

    Dynamo reuses a frame's compiled code for an *equal* backend, and Inductor's wrappers are equal when
    their settings are. After a graph break the model's own frames (``forward``, its resume functions)
    are compiled on code objects every program shares, so two programs of one model with equal settings
    (a backend and its reload) shared those graphs: the second compiled none, as if it ran eagerly."""

    def __eq__(self, other: object) -> bool:
        return self is other

    __hash__ = object.__hash__


def compiled(fn: Callable[..., Any], compile_kwargs: Mapping[str, Any]) -> Callable[..., Any]:
    """``torch.compile(fn, **compile_kwargs)``, with Inductor as a backend no other program's equals."""
    kwargs = dict(compile_kwargs)
    if kwargs.pop("backend", "inductor") != "inductor":
        raise ValueError(f"a program compiles with Inductor, not {compile_kwargs['backend']!r}")
    backend = OwnInductor(kwargs.pop("mode", None), dict(kwargs.pop("options", None) or {}) or None,
                          kwargs.get("dynamic"))
    return torch._dynamo.optimize(backend=backend, nopython=bool(kwargs.get("fullgraph")),
                                  dynamic=kwargs.get("dynamic"))(fn)


class Program:
    """``torch.compile`` of ``model`` for the backend ``owner``, isolated from every other compile."""

    def __init__(self, model: nn.Module, owner: str, compile_kwargs: Mapping[str, Any],
                 device: torch.device, records_cuda_graphs: bool = False) -> None:
        self.owner = owner
        self._eager = _EagerCalls()
        self._compiled = compiled(own_entry(model, self._eager, owner), compile_kwargs)
        self._device_index = (device.index if device.index is not None else torch.cuda.current_device()) \
            if records_cuda_graphs and device.type == "cuda" else None
        self._trees: Dict[int, Any] = {}
        self._watching = False
        self.evidence = CompileEvidence()

    def __call__(self, **inputs: torch.Tensor) -> Any:
        if self._device_index is None:
            return self._compiled(**inputs)
        with own_cudagraph_trees(self._trees, self._device_index):
            return self._compiled(**inputs)

    @contextlib.contextmanager
    def watched(self) -> Iterator[None]:
        """Account every compile in the block to this program; a recompile limit hit raises.

        Calls outside the block (the profile's timed calls) pay nothing; their eager calls are
        still counted, and :meth:`fallback_reason` reports them. Nested blocks count once.
        """
        if self._watching:
            yield
            return
        before, self._watching = dynamo_counts(), True
        try:
            with strict_compiles():
                yield
        except torch._dynamo.exc.FailOnRecompileLimitHit as exc:
            raise RecompileLimitHit(
                f"{self.owner}: Dynamo hit its recompile limit (torch._dynamo.config.recompile_limit="
                f"{torch._dynamo.config.recompile_limit}) compiling this backend's program, and would run the "
                f"model eagerly from here on; the model specialises on something that changes between calls "
                f"(often the batch size: tune fewer sizes, or set dynamic: true on the backend)") from exc
        finally:
            self._watching = False
            after = dynamo_counts()
            for key, value in after.items():
                setattr(self.evidence, key, getattr(self.evidence, key) + value - before[key])
            self.evidence.eager_calls = self._eager.count

    def fallback_reason(self) -> Optional[str]:
        """Why this program served code other than its compiled graphs, or None."""
        self.evidence.eager_calls = self._eager.count
        if self._eager.count:
            return (f"{self._eager.count} call(s) ran the model eagerly instead of the compiled program "
                    f"(Dynamo skipped or gave up on the frame); its timings would be eager's")
        if self.evidence.frames and not self.evidence.graphs:
            return "Dynamo compiled no graph for the model, so every call runs it eagerly"
        return None


class PerLength:
    """One :class:`Program` per tuned length, each compiled for its length alone (its batch dynamic): Inductor's
    kernels for a static length, where one program over a dynamic length serves them all. A call runs the
    program of its length; an untuned length has none (the routed model pads it to a tuned one)."""

    def __init__(self, programs: Mapping[int, Program], length_of: Callable[[Mapping[str, torch.Tensor]], int]) -> None:
        self.programs = dict(programs)
        self._length_of = length_of

    def __call__(self, **inputs: torch.Tensor) -> Any:
        length = self._length_of(inputs)
        program = self.programs.get(length)
        if program is None:
            raise ValueError(f"this backend compiled lengths {sorted(self.programs)} only, not {length}; pad the call "
                             f"to one of them (the routed model does)")
        return program(**inputs)

    @contextlib.contextmanager
    def watched(self) -> Iterator[None]:
        """Every program watched (:meth:`Program.watched`)."""
        with contextlib.ExitStack() as stack:
            for program in self.programs.values():
                stack.enter_context(program.watched())
            yield

    def fallback_reason(self) -> Optional[str]:
        return next((f"length {n}: {why}" for n, p in self.programs.items() if (why := p.fallback_reason())), None)

    @property
    def evidence(self) -> CompileEvidence:
        """The programs' evidence, summed."""
        total = CompileEvidence()
        for program in self.programs.values():
            for key, value in program.evidence.to_dict().items():
                setattr(total, key, getattr(total, key) + value)
        return total
