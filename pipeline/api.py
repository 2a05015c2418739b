"""The Python API: tune your own model in-process with the same config tree and stages as the command line.

    tuned = pipeline.tune(model, {"x": x}, overrides=["backends=[eager,inductor]", "tracking=off"])
    pipeline.save(tuned, "model.tweak")
    served = pipeline.load("model.tweak", model)

The model is tuned on the rows of ``example_inputs`` (``pipeline.examples``), not on random data.
"""

from __future__ import annotations

from pipeline.config import SHIPPED_CONF
import contextlib
import datetime
import logging
import os
import tempfile
from pathlib import Path
from typing import Mapping, Optional, Sequence, Union

from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException, OverrideParseException
from omegaconf import DictConfig
import torch
from torch import nn

from pipeline import runner
from pipeline.copies import own_copy
from pipeline.route import checkpoint
from pipeline.route.checkpoint import save
from pipeline.config import limits
from pipeline.config.errors import explain_unknown_key, one_line
from pipeline.config.own_model import with_own_model
from pipeline.errors import ConfigError
from pipeline.examples import Examples, input_spec, pooled, spec_of
from pipeline.record import logged_model
from pipeline.route.served import RoutedModule
from pipeline.config.schema import InputSpec, TrackingConfig, register_configs
from pipeline.record.store import check_store

log = logging.getLogger(__name__)


def compose_config(overrides: Sequence[str] = ()) -> DictConfig:
    """The shipped ``config.yaml`` composed with command-line style overrides, as ``python -m pipeline`` would (your
    own ``model.build._target_`` without a ``model=`` starts from ``model=custom``: ``pipeline.config.own_model``);
    an override Hydra cannot apply is a one-line ``ConfigError`` (a misspelt key names the closest ones)."""
    register_configs()
    with initialize_config_dir(config_dir=str(SHIPPED_CONF), version_base="1.3", job_name="tweakpipe_api"):
        try:
            return compose(config_name="config", overrides=with_own_model(overrides))
        except (ConfigCompositionException, OverrideParseException) as exc:
            raise ConfigError(explain_unknown_key(exc) or one_line(exc)) from None


def default_run_dir(name: str) -> Path:
    """``outputs/api/<timestamp>_<name>``, made unique if two runs start in the same second."""
    base = Path("outputs/api") / f"{datetime.datetime.now():%Y-%m-%d_%H-%M-%S}_{name}"
    path, n = base, 1
    while path.exists():
        path, n = base.with_name(f"{base.name}-{n}"), n + 1
    return path


def tune(model: nn.Module, example_inputs: Examples, overrides: Sequence[str] = (),
         run_dir: Optional[Union[str, Path]] = None, batch_dims: Optional[Mapping[str, int]] = None,
         seq_dims: Optional[Mapping[str, int]] = None, seq_lens: Optional[Sequence[int]] = None,
         pad_values: Optional[Mapping[str, float]] = None) -> RoutedModule:
    """Run the configured stages on ``model`` in-process and return the routed module.

    ``example_inputs`` is real data: one batch (a tensor, a tuple of tensors in ``forward``'s order, or a
    dict by name) or a list of batches (dicts or tuples). Every tuned batch size is built from its rows,
    cycled, and capture, profile and validate run on them. Each input's batch is its first dimension
    unless ``batch_dims`` says otherwise (``{"x": 1}`` for a (time, batch, features) input); output
    batch dimensions are found by running the model. ``overrides`` are the strings the command line
    takes (``"backends=[eager,inductor]"``, ``"profile=quick"``, ``"tracking=off"``,
    ``"model.batch_sizes=[1,8,32]"``). ``model`` itself is left exactly as it was (its device, mode,
    weights and buffers): tuning works on a copy, which the returned module serves. The run directory
    (default ``outputs/api/<timestamp>_<name>``) holds the same files as a command-line run,
    ``model.tweak`` included (without the examples: loading warms up on random fills of the spec).

    ``seq_lens`` tunes the route over lengths too (``pipeline.seqlen``): ``seq_dims`` names each input's length
    dimension (``{"input_ids": 1, "attention_mask": 1}``), ``pad_values`` the value that pads it (the pad id for
    token ids; 0 where not given). The examples are cut to each tuned length, or padded up to it.

    Its progress, the route and the run directory are logged at INFO (on stderr, unless the program
    set up logging itself).
    """
    if isinstance(overrides, str):  # a string is a sequence too, of one-letter overrides
        raise TypeError(f"overrides={overrides!r} is a string; pass a list of overrides, e.g. overrides=[{overrides!r}]")
    cfg = compose_config(overrides)
    if "route" not in cfg.stages:
        raise ConfigError(f"tune returns the routed model, so stages must include route; got {list(cfg.stages)}")
    examples = pooled(model, example_inputs, batch_dims)
    spec = spec_of(examples, batch_dims, seq_dims, pad_values)
    cfg.model.inputs = {name: InputSpec(**entry) for name, entry in spec.items()}
    if seq_lens is not None:
        problem = limits.lengths_problem(list(seq_lens), "seq_lens")
        if problem:
            raise ConfigError(problem)
        cfg.model.seq_lens = list(seq_lens)
    if not any(o.lstrip("+").startswith("model.name=") for o in overrides):
        cfg.model.name = type(model).__name__
    cfg.model.build = {"_target_": f"{type(model).__module__}.{type(model).__qualname__}"}
    with runner.console_log():
        ctx = runner.run(cfg, Path(run_dir) if run_dir is not None else default_run_dir(cfg.model.name),
                         model=own_copy(model), examples=examples)
        log.info("tune: route %s", ctx.routed.extra_repr())
        log.info("tune: run directory %s", ctx.run_dir)
    return ctx.routed


@runner.said
def load(path: Union[str, Path], model: nn.Module, device: Optional[Union[str, torch.device]] = None,
         trust_options: bool = False, trust_compiled: Optional[bool] = None) -> RoutedModule:
    """:func:`pipeline.route.checkpoint.load` (its docstring says what is checked and what is trusted), saying in
    one INFO line what it did: the route, the seconds it took, and whether the compiled artifacts were used or
    why not (``tweakpipe trust FILE.tweak`` where they were not signed with your key). The line goes to stderr
    unless the program set up logging itself (the root logger has a handler): then it goes there, as
    :func:`tune`'s lines do."""
    return checkpoint.load(path, model, device, trust_options=trust_options, trust_compiled=trust_compiled)


def artifact_name(tags: Mapping[str, str], key: str, model_id: str) -> Optional[str]:
    """A file name a tweakpipe model's tag records (None for "none"); a name with a folder in it is refused, so a
    download lands only in the folder asked for."""
    name = tags.get(key)
    if name is None:
        raise ConfigError(f"logged model {model_id} was not logged by tweakpipe (it has no {key} tag); load it with "
                          f"the loader of the flavor its MLmodel names")
    if name == logged_model.NONE:
        return None
    if Path(name).name != name or name in ("", ".", ".."):
        raise ConfigError(f"logged model {model_id}: its {key} tag is {name!r}, not a file name; it was not "
                          f"downloaded. Log the model again with a tweakpipe run")
    return name


@runner.said
def load_logged_model(model_id: str, model: nn.Module, tracking_uri: str = TrackingConfig.uri,
                      device: Optional[Union[str, torch.device]] = None, trust_options: bool = False,
                      trust_compiled: Optional[bool] = None,
                      download_to: Optional[Union[str, os.PathLike]] = None) -> RoutedModule:
    """The routed model a run logged to MLflow (``model_id``, or ``models:/<model_id>``), loaded into ``model``.

    Downloads its checkpoint and compiled artifacts, then loads them with :func:`pipeline.load` and the same
    arguments, so the same checks and trust hold as for a file on disk: the checkpoint runs no code; the compiled
    artifacts are used where signed with this user's key (``trust_compiled=None``), also unsigned
    (``True``), or never (``False``), and ``trust_options`` is as ``pipeline.load``'s. The files go to a
    temporary folder removed after the load, or to ``download_to``, kept (``pipeline.load`` reads them again there
    without MLflow). ``tracking_uri`` is the store the run logged to (tweakpipe's default store unless given).
    As ``pipeline.load_logged_model`` its INFO lines (the download, the load's one line) go to stderr unless the
    program set up logging itself, as ``pipeline.load``'s do.
    """
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient
    import mlflow.artifacts

    model_id = model_id.removeprefix("models:/")
    check_store(tracking_uri, reading=True)
    client = MlflowClient(tracking_uri=tracking_uri)
    try:
        logged = client.get_logged_model(model_id)
    except MlflowException:
        raise ConfigError(f"model_id={model_id}: {tracking_uri} holds no logged model of that id; the id is on the "
                          f"run's Models tab (or mlflow.search_logged_models), and tracking_uri= names the store "
                          f"the run logged to") from None
    tags = (logged_model.CHECKPOINT_TAG, logged_model.COMPILED_TAG)
    names = [n for n in (artifact_name(logged.tags, key, model_id) for key in tags) if n]
    with contextlib.ExitStack() as stack:
        folder = Path(download_to) if download_to is not None else Path(stack.enter_context(
            tempfile.TemporaryDirectory(prefix="tweakpipe-model-")))
        folder.mkdir(parents=True, exist_ok=True)
        for name in names:
            mlflow.artifacts.download_artifacts(artifact_uri=f"{logged.artifact_location.rstrip('/')}/{name}",
                                                dst_path=str(folder), tracking_uri=tracking_uri)
        log.info("load: logged model %s (run %s) downloaded from %s", model_id, logged.source_run_id, tracking_uri)
        return checkpoint.load(folder / names[0], model, device=device, trust_options=trust_options,
                               trust_compiled=trust_compiled)


__all__ = ["tune", "save", "load", "load_logged_model", "compose_config", "input_spec"]
