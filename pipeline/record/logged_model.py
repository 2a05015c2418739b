"""The routed model as an MLflow 3 logged model: what each run ships, in the experiment's Models tab, and back.

A run that routed logs its checkpoint (``model.tweak``) and the compiled artifacts beside it
(``model.tweak.compiled``, ``pipeline.compile.artifacts``) as one logged model, the run's output, with the routed
model's own metrics tied to it (``pipeline.route.figures``, and ``tune_s``). Nothing in it is pickled code: the
checkpoint is the code-free ``.tweak`` format, the compiled artifacts keep their own signature, and ``MLmodel`` is
MLflow's metadata file (flavor ``tweakpipe``: which file is which, and the loader to use). MLflow's own loaders
(``mlflow.pyfunc``) do not load it; ``pipeline.load_logged_model`` does, through ``pipeline.load`` and its trust
rules. What is written is here; the loader is an entry point's (``pipeline.api``), so the recorder imports no code that
loads or builds a route.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterator, List, Mapping, Optional

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
    checkpoint_format: Optional[int] = None  # the checkpoint's (pipeline.route.checkpoint.FORMAT), in MLmodel

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
                      "loader": "pipeline.load_logged_model", "checkpoint_format": self.checkpoint_format}
            Model(artifact_path=logged.artifact_location, run_id=logged.source_run_id, model_uuid=logged.model_id,
                  model_id=logged.model_id, flavors={FLAVOR: flavor}).save(str(folder / "MLmodel"))
            yield folder


def routed_files(name: str, checkpoint_path: Path, artifacts: Optional[Path], checkpoint_format: Optional[int],
                 metrics: Mapping[str, float], params: Mapping[str, Any]) -> LoggedFiles:
    """The logged model of a run's checkpoint (of ``checkpoint_format``): it and its compiled ``artifacts`` where
    it has them (the route stage's ``RouteReport`` names both)."""
    files = [checkpoint_path] + ([artifacts] if artifacts is not None else [])
    tags = {CHECKPOINT_TAG: checkpoint_path.name, COMPILED_TAG: artifacts.name if artifacts is not None else NONE}
    return LoggedFiles(name, files, dict(metrics), {k: str(v) for k, v in params.items()}, tags,
                       checkpoint_format=checkpoint_format)
