"""The config layer: schemas, every check run before any work, limits, Inductor options, errors.

``SHIPPED_CONF`` is the config tree installed with the package (``pipeline/conf``): Hydra composes
from it, so ``pip install .`` works from any folder; a user's own directories come first on the
search path (``--config-dir``, ``hydra.searchpath``).
"""

from pathlib import Path

SHIPPED_CONF = Path(__file__).resolve().parents[1] / "conf"
