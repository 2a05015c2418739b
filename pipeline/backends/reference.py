"""The reference peers: the user's best by-hand compile, what they would write instead of tuning, timed beside the
candidates.

The router's promise is that each batch size goes to the fastest thing on offer; the honest check of that
promise is the copy a user compiles themselves, and a performance-minded user tries more than one mode:
``torch.compile(model, mode="reduce-overhead")`` on a GPU (Inductor's kernels replayed as CUDA graphs) and
``mode="max-autotune"`` (autotuned GEMM/conv templates, with CUDA graphs), ``torch.compile(model)`` and
``mode="max-autotune"`` elsewhere: ``reference_modes`` lists them (null: :func:`default_modes`). Each mode is a
reference of its own at every precision the run tunes, compiling its own program like any candidate
(``pipeline.backends.program``). Each competes as a regular candidate (it serves where it wins), is kept through
the screen so every tuned cell has its number, and the route stage reports auto against the best of them per
cell (``pipeline.route.versus``); each is a floor the router respects. Where a backend of the run already is one
of those compiles (``inductor`` on a CPU), that backend plays it and nothing is built twice. ``reference=false``
leaves them out.

Off CUDA, torch.compile records no CUDA graphs, so ``reduce-overhead`` compiles what ``default`` does and
``max-autotune`` what ``max-autotune-no-cudagraphs`` does (the run's checks refuse CUDA-graph options there): such a
reference compiles without them, and two modes that compile one program there are one reference.

At a reduced precision (bf16, fp16) every backend competes twice, under autocast and with cast weights; the
references after the first of ``reference_modes`` (``reference_max_autotune`` by default) compile the cast-weights
form only (:func:`one_form_each`): a max-autotune compile benchmarks its GEMM/conv templates for minutes (187 s
of deit_tiny's 214 s tune: ``bench/results/references-max-autotune.md``), and of the two forms of ``reduce-overhead``
the cast-weights one was the faster in every cell of the third-party suite (16 of 16, ``bench/results/suite-h200.md``).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Collection, Dict, Mapping, Optional, Sequence, Tuple

from pipeline.backends.candidate import AUTOCAST, Candidate
from pipeline.backends.precision import SEPARATOR
from pipeline.backends.rules import MODES
from pipeline.config import backend_schema, limits
from pipeline.errors import ConfigError

NAME = "reference"
CUDA_GRAPHS = "cuda"  # the device type on which torch.compile's modes record CUDA graphs
WITHOUT_GRAPHS = {"reduce-overhead": "default", "max-autotune": "max-autotune-no-cudagraphs"}  # off CUDA
AS_WRITTEN = {"max-autotune-no-cudagraphs": "max-autotune"}  # off CUDA: the mode a user writes for that program
EXAMPLE = "'reference_modes=[reduce-overhead,max-autotune]'"


def default_modes(device_type: str) -> Tuple[str, ...]:
    """The by-hand compiles a run times where ``reference_modes`` is null: reduce-overhead and max-autotune on CUDA,
    default and max-autotune elsewhere (on a quiet 2-core CPU the max-autotune reference cost 0.3-0.4 s more for
    tiny_mlp, 7.5 s more for ResNet-18 beside 29 s for the default one: docs/config/route.md)."""
    return ("reduce-overhead", "max-autotune") if device_type == CUDA_GRAPHS else ("default", "max-autotune")


def compiled_mode(mode: str, device_type: str) -> str:
    """The mode the reference for ``mode`` compiles with on ``device_type``: ``mode`` itself on CUDA; elsewhere the
    same without CUDA graphs, as torch.compile builds it there."""
    return mode if device_type == CUDA_GRAPHS else WITHOUT_GRAPHS.get(mode, mode)


def written_mode(mode: str, device_type: str) -> str:
    """The mode a user writes for the program :func:`compiled_mode` builds on ``device_type``: off CUDA, ``default``
    for reduce-overhead and ``max-autotune`` for max-autotune-no-cudagraphs (CUDA graphs do not apply there)."""
    program = compiled_mode(mode, device_type)
    return program if device_type == CUDA_GRAPHS else AS_WRITTEN.get(program, program)


def name_for(mode: str, device_type: str) -> str:
    """The reference's name: ``reference`` for the device's first by-hand compile (reduce-overhead on CUDA, default
    elsewhere), ``reference_<mode>`` (as the user writes it, dashes as underscores: ``reference_max_autotune``) for
    the others: a backend name whose precision candidates (``reference_max_autotune.bf16``) and MLflow metric names
    work as any other's."""
    written = written_mode(mode, device_type)
    first = written_mode(default_modes(device_type)[0], device_type)
    return NAME if written == first else f"{NAME}_{written.replace('-', '_')}"


def modes_problem(modes: Any) -> Optional[str]:
    """Why ``reference_modes`` (null, or a list of torch.compile modes) is not one, in one line naming the valid
    modes; None where it is."""
    if modes is None:
        return None
    problem = limits.choices_problem("reference_modes", list(modes), MODES, "torch.compile mode", EXAMPLE)
    return f"{problem} (reference=false leaves the reference out)" if problem and not modes else problem


def peer_configs(device_type: str, modes: Optional[Sequence[str]] = None) -> Dict[str, Dict[str, Any]]:
    """Name -> backend config of each reference on ``device_type`` (``modes``, null: :func:`default_modes`), in the
    order listed; modes that compile one program there are one reference, named for the first listed."""
    out: Dict[str, Dict[str, Any]] = {}
    for mode in modes or default_modes(device_type):
        written, program = written_mode(mode, device_type), compiled_mode(mode, device_type)
        if any(cfg["mode"] == program for cfg in out.values()):
            continue
        bare = "" if program == written else f' (on {device_type}, without CUDA graphs: mode="{program}")'
        out[name_for(mode, device_type)] = {
            "kind": "inductor", "mode": program,
            "description": f'reference: torch.compile(model, mode="{written}"), as a user writes it by hand{bare}'}
    return out


def same_program(name: str, cfg: Mapping[str, Any], peer: Mapping[str, Any]) -> bool:
    """Whether backend ``name`` (``cfg``) compiles exactly what the reference would: its kind's settings equal,
    description aside."""
    if cfg.get("kind") != peer["kind"]:
        return False
    mine, theirs = backend_schema.settings(name, cfg), backend_schema.settings(NAME, peer)
    return dataclasses.replace(mine, description="") == dataclasses.replace(theirs, description="")


def with_reference(backends: Mapping[str, Mapping[str, Any]], device_type: str,
                   modes: Optional[Sequence[str]] = None) -> Tuple[Dict[str, Any], Dict[str, str]]:
    """The run's backends with the references among them, and which backend plays which by-hand compile (name ->
    the mode as the user writes it): one of the run's own where it compiles the same program, else the added
    reference (after the run's backends, in the order of ``modes``)."""
    out = {str(n): dict(cfg) for n, cfg in backends.items()}
    plays: Dict[str, str] = {}
    for name, peer in peer_configs(device_type, modes).items():
        written = written_mode(peer["mode"], device_type)
        same = next((n for n, cfg in backends.items() if same_program(str(n), cfg, peer)), None)
        if same is not None:
            plays[str(same)] = written
            continue
        if name in out:
            raise ConfigError(f"a backend is named {name!r}, the name of a reference peer (torch.compile as a user "
                              f"writes it); rename it, or set reference=false")
        out[name], plays[name] = peer, written
    return out, plays


def one_form_each(candidates: Mapping[str, Candidate], plays: Mapping[str, str],
                  added: Collection[str]) -> Dict[str, Candidate]:
    """``candidates`` less the autocast forms of the references ``plays`` (backend -> mode, in the order of the
    modes) names after its first, where :func:`with_reference` added them (``added``): at bf16 and fp16 those
    compile with cast weights only (module docstring). A backend of the run's own that plays a reference keeps both
    its forms."""
    later = [n for n in list(plays)[1:] if n in added]

    def autocast_twin(c: Candidate) -> bool:
        return c.name.split(SEPARATOR, 1)[0] in later and c.precision in AUTOCAST and not c.settings.cast_weights
    return {n: c for n, c in candidates.items() if not autocast_twin(c)}
