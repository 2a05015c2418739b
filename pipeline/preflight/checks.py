"""Every check of a run's config, in one function that runs before the first model is built.

A mistake found here costs seconds, not the minutes of compiling every backend first. Where a part
already checks its own settings (``timing.Settings.of``, ``routing.check_settings``, each backend's
kind schema (``Candidate.of``) and rules (``rules.check``), ``devices.resolve``, ``store.check_store``),
that check runs here, early, rather than a second copy of it; their ``ValueError`` becomes a
:class:`ConfigError`. The checks make the run's candidates, typed, and hand them on: nothing after
them derives them again.
"""

from __future__ import annotations

import contextlib
import dataclasses
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Tuple

import torch
from omegaconf import DictConfig, OmegaConf

from pipeline import devices, disks, trust
from pipeline.backends import precision, reference, rules
from pipeline.backends.candidate import Candidate
from pipeline.compile import cache as compile_cache
from pipeline.config import attention, flags, limits
from pipeline.measure import accuracy, contention
from pipeline.route import policy as routing
from pipeline.record import store
from pipeline.config.errors import unknown_key
from pipeline.errors import ConfigError
from pipeline.config.paths import writable_problem
from pipeline.config.precisions import parse_list
from pipeline.config.schema import STAGE_NAMES, Config
from pipeline.measure.measurement import Settings

# A stage needs the ones named here to have run earlier in the same run.
NEEDS = {"capture": [], "profile": ["capture"], "route": ["profile"], "validate": ["route"]}
EXAMPLE_SIZES = "[1,8,64]"
# What to give for a value an option leaves to the command line (check_required).
GIVE = {"model.build._target_": "name your model's class (or a function that returns it), importable from where you "
                                "run, e.g. model.build._target_=mypkg.model.MyNet"}


@contextlib.contextmanager
def reported() -> Iterator[None]:
    """A reused check's ValueError as the user's ConfigError (its message already names the fix)."""
    try:
        yield
    except ConfigError:
        raise
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def added_keys(node: DictConfig, path: str = "") -> Iterator[Tuple[str, List[str]]]:
    """Keys that ``+key=value`` put into a section whose schema lacks them (Hydra lets ``+`` past the
    schema), each with the keys that section has; a dict-valued key such as ``options`` takes any."""
    kind = OmegaConf.get_type(node)
    fields = [f.name for f in dataclasses.fields(kind)] if dataclasses.is_dataclass(kind) else None
    for key, value in node.items_ex(resolve=False):
        if fields is not None and key not in fields:
            yield f"{path}{key}", fields
        elif isinstance(value, DictConfig) and not OmegaConf.is_missing(node, key) and value != None:  # noqa: E711
            yield from added_keys(value, f"{path}{key}.")


def check_required(cfg: DictConfig) -> None:
    """A value a model option leaves to the command line (``???``, as ``model=custom`` leaves its ``_target_``),
    named with what to give, before anything reads it. The inputs, or an input's shape, may be left so: they are
    derived (``pipeline.inputs``)."""
    missing = sorted(k for k in OmegaConf.missing_keys(cfg.model) if k.split(".")[:2] != ["model", "inputs"])
    if missing:
        raise ConfigError(f"{missing[0]} is missing: {GIVE.get(missing[0], f'give it, e.g. {missing[0]}=...')}")


def check_stages(stages: List[str]) -> None:
    for i, stage in enumerate(stages):
        if stage not in STAGE_NAMES:
            raise ConfigError(f"unknown stage {stage!r}; stages run in this order: {list(STAGE_NAMES)}")
        missing = [n for n in NEEDS[stage] if n not in stages[:i]]
        if missing:
            raise ConfigError(f"stage {stage!r} needs {missing} before it; e.g. stages=[capture,profile,route]")


def candidates_of(cfg: DictConfig, device: Optional[torch.device] = None) -> Dict[str, Candidate]:
    """The run's candidates (``cfg.backends`` x ``cfg.precision`` x ``cfg.attention``, twice per length where
    lengths are tuned), the reference peers' among them (one per ``reference_modes``, the later ones with cast
    weights only at bf16 and fp16: ``reference.one_form_each``) unless ``reference=false`` (what they compile
    depends on ``device``, by default ``cfg.device``'s)."""
    own = OmegaConf.to_container(cfg.backends, resolve=True)
    backends, plays = own, {}
    if cfg.get("reference", True):
        modes = cfg.get("reference_modes")
        backends, plays = reference.with_reference(own, (device or devices.resolve(cfg.device)).type,
                                                   None if modes is None else [str(m) for m in modes])
    added = set(backends) - set(own)
    made = precision.candidates(backends, parse_list(cfg.precision), bool(cfg.model.get("seq_lens")), plays,
                                attention.parse_list(cfg.get("attention", [attention.DEFAULT])), added)
    return reference.one_form_each(made, plays, added)


def check_route(cfg: DictConfig, candidates: Dict[str, Candidate]) -> None:
    rcfg = cfg.route
    routing.check_settings(rcfg.strategy, rcfg.min_gain)
    if rcfg.strategy == "one_backend" and (OmegaConf.is_missing(rcfg, "backend") or not rcfg.backend):
        raise ConfigError("route=one_backend needs the backend to deploy: route.backend=<name>")
    names = list(candidates)
    if rcfg.strategy == "one_backend" and rcfg.backend not in names:
        raise ConfigError(f"route.backend={rcfg.backend} is not among the selected backends {names}; "
                          f"pick one of them or add it to backends")
    problem = accuracy.budget_problem(rcfg.accuracy_budget.metric, rcfg.accuracy_budget.bound)
    if problem:
        raise ConfigError(problem)
    name = rcfg.checkpoint_name
    if not name or Path(name).name != name or name in (".", ".."):
        raise ConfigError(f"route.checkpoint_name={name!r} must be a file name (it is written in the run directory); "
                          f"e.g. route.checkpoint_name=model.tweak")


def check_precision(cfg: DictConfig, backends: List[Candidate], candidates: Dict[str, Candidate],
                    device: torch.device) -> None:
    """The precision list: known names once each, no backend fixing its own, each runnable on the device."""
    precisions = parse_list(cfg.precision)
    problem = next(filter(None, (precision.conflict(backend, precisions) for backend in backends)), None)
    problem = problem or next(filter(None, (precision.device_problem(p, device) for p in precisions)), None)
    reasons = [c.unsupported_reason(device) for c in candidates.values()]  # in precision order
    if all(reasons):
        problem = (f"precision={precisions} runs nothing on {device.type}: {reasons[0]}; add fp32, e.g. "
                   f"'precision=[fp32,bf16]'")
    if problem:
        raise ConfigError(problem)
    names = list(candidates)
    if len(names) > limits.MAX_BACKENDS:
        raise ConfigError(f"{len(cfg.backends)} backends x {len(precisions)} precisions make {len(names)} candidates "
                          f"(bf16 and fp16 twice: autocast and cast weights), more than {limits.MAX_BACKENDS}; pick "
                          f"fewer backends or precisions")


def check_sizes(cfg: DictConfig, device: torch.device) -> None:
    """Batch sizes in bounds, and the inputs at the largest size (tuned or validated) within memory."""
    sizes = {"model.batch_sizes": list(cfg.model.batch_sizes),
             "validate.extra_batch_sizes": list(cfg.validate.extra_batch_sizes)}
    if not 1 <= len(sizes["model.batch_sizes"]) <= limits.MAX_TUNED_SIZES:
        raise ConfigError(f"model.batch_sizes holds {len(sizes['model.batch_sizes'])} sizes, not 1 to "
                          f"{limits.MAX_TUNED_SIZES}; e.g. model.batch_sizes={EXAMPLE_SIZES}")
    key, largest = max(((k, max(v)) for k, v in sizes.items() if v), key=lambda kv: kv[1])
    problem = limits.memory_problem(OmegaConf.to_container(cfg.model.inputs, resolve=True), largest, device)
    if problem:
        raise ConfigError(f"{key}: {problem}; lower the largest batch size, e.g. {key}={EXAMPLE_SIZES}")
    for key, values in sizes.items():
        for i, value in enumerate(values):
            problem = limits.batch_size_problem(value, f"{key}[{i}]")
            if problem:
                raise ConfigError(f"{problem}; e.g. {key}={EXAMPLE_SIZES}")


def check_lengths(cfg: DictConfig) -> None:
    """``model.seq_lens``: tuned lengths in bounds, and the inputs that carry them (well-formed specs first)."""
    lengths = list(cfg.model.seq_lens)
    if not lengths:
        return
    problem = limits.lengths_problem(lengths, "model.seq_lens")
    if problem:
        raise ConfigError(problem)
    spec = OmegaConf.to_container(cfg.model.inputs, resolve=True)
    problem = limits.inputs_problem(spec)
    if problem:
        raise ConfigError(f"model.inputs: {problem}")
    if not any(s.get("seq_dim") is not None for s in spec.values()):
        first = next(iter(spec), "input_ids")
        raise ConfigError(f"model.seq_lens={lengths} needs an input with a length dimension, and none of "
                          f"{sorted(spec)} names one; e.g. model.inputs.{first}.seq_dim=1")


def check_run_dir(run_dir: Path, resuming: bool = False) -> None:
    problem = writable_problem(run_dir)
    if problem:
        raise ConfigError(f"run directory {run_dir}: {problem}; " + (
            "make it writable to resume the run there" if resuming else
            "pick a writable one (hydra.run.dir=... on the command line, run_dir=... in pipeline.tune)"))
    problem = disks.space_problem(run_dir, "the run directory")
    if problem:
        raise ConfigError(f"{problem} (hydra.run.dir=... on the command line, run_dir=... in pipeline.tune)")


def advice(cfg: DictConfig) -> List[str]:
    """Settings a run accepts but a user rarely means, each as one warning line saying what it does."""
    lines = []
    precisions = [str(p) for p in cfg.precision]
    if "fp32" not in precisions:
        lines.append(f"precision={precisions} has no fp32: no candidate runs the model as written, so the route is "
                     f"held to route.accuracy_budget alone and 'never slower than eager' compares with "
                     f"eager at {precisions[0]}; 'precision=[fp32,{','.join(precisions)}]' keeps fp32 in the race")
    metric, bound = cfg.route.accuracy_budget.metric, cfg.route.accuracy_budget.bound
    if bound == 0:
        effect = ("admits only outputs equal to fp32 eager's, so no reduced precision will serve"
                  if metric == "max_rel_error" else f"admits every candidate whose {metric} is >= 0: almost any output")
        lines.append(f"route.accuracy_budget.bound=0 {effect}; the default is "
                     f"{accuracy.describe(metric, 0.01 if metric == 'max_rel_error' else 0.999)}")
    return lines


def check_config(cfg: DictConfig, run_dir: Optional[Path] = None) -> Dict[str, Candidate]:
    """Raise :class:`ConfigError` for the first mistake in ``cfg``; cheap checks first, nothing written. Returns
    the run's candidates, in order."""
    with reported():
        problem = flags.problem(OmegaConf.to_container(cfg, resolve=True), Config)
        if problem:
            raise ConfigError(problem)
        check_stages(list(cfg.stages))
        if OmegaConf.is_missing(cfg, "backends") or not cfg.backends:
            raise ConfigError("no backends selected; e.g. 'backends=[eager,inductor]'")
        if len(cfg.backends) > limits.MAX_BACKENDS:
            raise ConfigError(f"{len(cfg.backends)} backends selected, more than {limits.MAX_BACKENDS}; "
                              f"pick fewer, e.g. 'backends=[eager,inductor]'")
        problem = limits.inputs_problem(OmegaConf.to_container(cfg.model.inputs, resolve=True))
        if problem:
            raise ConfigError(f"model.inputs: {problem}")
        check_lengths(cfg)
        parse_list(cfg.precision)  # known names, each once (candidates_of and check_precision type them)
        problem = limits.threads_problem(cfg.threads, "threads")
        if problem:
            raise ConfigError(f"{problem}; e.g. threads=2")
        budget = cfg.tune.budget_s
        if budget is not None and (isinstance(budget, bool) or not isinstance(budget, (int, float)) or not budget > 0):
            raise ConfigError(f"tune.budget_s={budget:g} must be a positive number of seconds, or null for no limit; "
                              f"e.g. tune.budget_s=300")
        problem = reference.modes_problem(cfg.get("reference_modes"))
        if problem:
            raise ConfigError(problem)
        device = devices.resolve(cfg.device)
        candidates = candidates_of(cfg, device)
        check_route(cfg, candidates)
        Settings.of(cfg.profile)
        problem = contention.settings_problem(cfg.profile.on_busy, cfg.profile.on_busy_wait_s)
        if problem:
            raise ConfigError(problem)
        if not cfg.validate.tolerance_scale > 0:
            raise ConfigError(f"validate.tolerance_scale={cfg.validate.tolerance_scale} must be > 0; "
                              f"e.g. validate.tolerance_scale=1.0")
        backends = [Candidate.of(name, OmegaConf.to_container(bcfg, resolve=True))  # by its kind's schema
                    for name, bcfg in cfg.backends.items()]
        for backend in backends:
            rules.check(backend)
        for key, valid in added_keys(cfg):
            raise ConfigError(f"{unknown_key(key, valid)} (a + adds a key only where its section takes any, "
                              f"e.g. +backends.inductor.options.<option>=...)")
        check_precision(cfg, backends, candidates, device)
        check_sizes(cfg, device)
        if run_dir is not None:
            check_run_dir(run_dir, bool(cfg.get("resume")))
        problem = disks.temp_problem()  # Inductor's C++ compiles, exports and packages write there
        if problem:
            raise ConfigError(problem)
        cache = OmegaConf.to_container(cfg.compile_cache, resolve=True)
        problem = compile_cache.settings_problem(cache)
        if problem:
            raise ConfigError(problem)
        if "route" in cfg.stages and not compile_cache.foreign_sources(cache):  # the checkpoint's artifacts are signed
            problem = trust.problem(create=True)
            if problem:
                raise ConfigError(f"{problem} (the route stage signs the checkpoint's compiled artifacts with it)")
        if cfg.tracking.enabled:
            store.check_store(cfg.tracking.uri)
    return candidates
