"""The config layer: schemas, every check run before any work, limits, Inductor options, errors.

``SHIPPED_CONF`` is the config tree: ``conf/`` at the top of the source tree, where users read it
and keep their own templates beside it, shipped inside the installed package as ``pipeline/conf``
(``pyproject.toml`` maps it, no second copy). Hydra composes from it, so ``pip install .`` works from
any folder; a user's own directories come first on the search path (``--config-dir``,
``hydra.searchpath``).
"""

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parents[1]
# Installed: site-packages/pipeline/conf. From the source tree (an editable install): <checkout>/conf.
SHIPPED_CONF = next((p for p in (_PACKAGE / "conf", _PACKAGE.parent / "conf") if (p / "config.yaml").is_file()),
                    _PACKAGE / "conf")
