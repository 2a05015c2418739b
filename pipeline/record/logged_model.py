"""The routed model as an MLflow 3 logged model: what each run ships, in the experiment's Models tab, and back.

A run that routed logs its checkpoint (``model.tweak``) and the compiled artifacts beside it
(``model.tweak.compiled``, ``pipeline.compile.artifacts``) as one logged model, the run's output, with the routed
model's own metrics tied to it (``pipeline.record.routed``, and ``tune_s``). Nothing in it is pickled code: the
checkpoint is the code-free ``.tweak`` format, the compiled artifacts keep their own signature, and ``MLmodel`` is
MLflow's metadata file (flavor ``tweakpipe``: which file is which, and the loader to use). MLflow's own loaders
(``mlflow.pyfunc``) do not load it; :func:`load_logged_model` does, through ``pipeline.load`` and its trust rules.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterator, List, Mapping, Optional, Union

import torch
from torch import nn

from pipeline.compile import artifacts as compiled
from pipeline.config.schema import TrackingConfig
from pipeline.errors import ConfigError
from pipeline.record.store import check_store
from pipeline.route import checkpoint
from pipeline.route.served import RoutedModule

log = logging.getLogger(__name__)

FLAVOR = "tweakpipe"
MODEL_TYPE = "tweakpipe-routed"
CHECKPOINT_TAG = "tweakpipe.checkpoint"  # the checkpoint's file name among the model's artifacts
COMPILED_TAG = "tweakpipe.compiled"  # the compiled artifacts' file name, or "none"
NONE = "none"


@dataclass
class LoggedFiles:
    """A logged model to be: its name, the files that are its artifacts, and what MLflow shows beside it."""

    name: str
    files: List[Path]
    metrics: Dict[str, float] = field(default_factory=dict)
    params: Dict[str, str] = field(default_factory=dict)
    tags: Dict[str, str] = field(default_factory=dict)
    model_type: str = MODEL_TYPE

    @contextlib.contextmanager
    def staged(self, logged: Any) -> Iterator[Path]:
        """A folder beside the files holding them (linked, else copied) and the ``MLmodel`` of ``logged`` (MLflow's
        ``LoggedModel``), removed afterwards: MLflow uploads a logged model's artifacts as one folder."""
        from mlflow.models import Model

        with tempfile.TemporaryDirectory(prefix=".mlflow-model-", dir=self.files[0].parent) as tmp:
            folder = Path(tmp)
            for path in self.files:
                try:
                    os.link(path, folder / path.name)
                except OSError:  # a file system without hard links
                    shutil.copy2(path, folder / path.name)
            flavor = {"checkpoint": self.tags[CHECKPOINT_TAG], "compiled": self.tags[COMPILED_TAG],
                      "loader": "pipeline.load_logged_model", "checkpoint_format": checkpoint.FORMAT}
            Model(artifact_path=logged.artifact_location, run_id=logged.source_run_id, model_uuid=logged.model_id,
                  model_id=logged.model_id, flavors={FLAVOR: flavor}).save(str(folder / "MLmodel"))
            yield folder


def routed_files(name: str, checkpoint_path: Path, metrics: Mapping[str, float], params: Mapping[str, Any]
                 ) -> LoggedFiles:
    """The logged model of a run's checkpoint: it and its compiled artifacts where it has them."""
    artifacts = compiled.path_for(checkpoint_path)
    files = [checkpoint_path] + ([artifacts] if artifacts.is_file() else [])
    tags = {CHECKPOINT_TAG: checkpoint_path.name, COMPILED_TAG: artifacts.name if artifacts.is_file() else NONE}
    return LoggedFiles(name, files, dict(metrics), {k: str(v) for k, v in params.items()}, tags)


def artifact_name(tags: Mapping[str, str], key: str, model_id: str) -> Optional[str]:
    """A file name a tweakpipe model's tag records (None for "none"); a name with a folder in it is refused, so a
    download lands only in the folder asked for."""
    name = tags.get(key)
    if name is None:
        raise ConfigError(f"logged model {model_id} was not logged by tweakpipe (it has no {key} tag); load it with "
                          f"the loader of the flavor its MLmodel names")
    if name == NONE:
        return None
    if Path(name).name != name or name in ("", ".", ".."):
        raise ConfigError(f"logged model {model_id}: its {key} tag is {name!r}, not a file name; it was not "
                          f"downloaded. Log the model again with a tweakpipe run")
    return name


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
    names = [n for n in (artifact_name(logged.tags, key, model_id) for key in (CHECKPOINT_TAG, COMPILED_TAG)) if n]
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
