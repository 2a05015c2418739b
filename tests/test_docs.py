"""The README is a quickstart and docs/ the reference: the site builds with ``mkdocs build --strict`` (a broken
link, a page missing from mkdocs.yml's nav or a docstring mkdocstrings cannot render fails it), the README stays
short enough to scan and its links lead somewhere, and its "Set up and test" lines are the ones CI runs."""

from __future__ import annotations

import logging
import re
import shlex
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
README_MAX_LINES = 300  # issue 41: a quickstart, the rest in docs/

# [text](target): the target up to its closing parenthesis or a title; images too.
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


def build_site(config_file: Path, site_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    """``mkdocs build --strict -f config_file -d site_dir``, in this process; a strict failure names its warnings."""
    pytest.importorskip("mkdocs", reason='MkDocs is missing: pip install -e ".[dev]" (mkdocs-material)')
    pytest.importorskip("material", reason='MkDocs Material is missing: pip install -e ".[dev]"')
    pytest.importorskip("mkdocstrings_handlers.python", reason='mkdocstrings is missing: pip install -e ".[dev]"')
    from mkdocs.commands.build import build
    from mkdocs.config import load_config
    from mkdocs.exceptions import Abort

    config = load_config(config_file=str(config_file), site_dir=str(site_dir), strict=True)
    with caplog.at_level(logging.WARNING, logger="mkdocs"):
        try:
            build(config)
        except Abort as exc:
            warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
            pytest.fail(f"{exc}: " + " | ".join(warnings), pytrace=False)


def test_the_docs_site_builds_strict(tmp_path, caplog):
    build_site(ROOT / "mkdocs.yml", tmp_path / "site", caplog)
    api = (tmp_path / "site" / "api" / "index.html").read_text()
    # mkdocstrings rendered the docstrings, not just the page's prose.
    assert "Run the configured stages on" in api and "Rebuild only the routed backends of a checkpoint" in api
    profile = (tmp_path / "site" / "config" / "profile" / "index.html").read_text()
    assert "rel_precision" in profile and "screen_budget_ms" in profile
    # docs/js/open-schemas.js unfolds those listings by the class mkdocstrings gives them.
    opener = (ROOT / "docs" / "js" / "open-schemas.js").read_text()
    (listing_class,) = re.findall(r'querySelectorAll\("details\.([\w-]+)"\)', opener)
    assert f'<details class="{listing_class}"' in profile


def test_a_broken_docs_link_fails_the_build(tmp_path, caplog):
    # The strictness the first test relies on: a link to a page that does not exist is an error, not a note.
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    shutil.copy(ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    (tmp_path / "pipeline").symlink_to(ROOT / "pipeline")  # mkdocstrings reads the code beside mkdocs.yml
    with (tmp_path / "docs" / "index.md").open("a") as page:
        page.write("\nSee [the missing page](no-such-page.md).\n")
    with pytest.raises(pytest.fail.Exception, match="no-such-page.md"):
        build_site(tmp_path / "mkdocs.yml", tmp_path / "site", caplog)


def test_the_readme_is_a_short_quickstart():
    lines = README.read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; move reference text into docs/"


def test_every_relative_link_in_the_readme_points_to_a_file():
    targets = LINK.findall(README.read_text())
    relative = [t for t in targets if not re.match(r"^[a-z][a-z0-9+.-]*:", t) and not t.startswith("#")]
    assert relative, "README.md links into docs/"
    missing = [t for t in relative if not (README.parent / t.split("#")[0]).exists()]
    assert not missing, f"README.md links to files that do not exist: {missing}"


def set_up_lines() -> list:
    """The commands of the first bash block under README's "## Set up and test", comments dropped."""
    section = README.read_text().split("## Set up and test", 1)[1].split("\n## ", 1)[0]
    block = section.split("```bash", 1)[1].split("```", 1)[0]
    return [line.split("#", 1)[0].strip() for line in block.splitlines() if line.split("#", 1)[0].strip()]


def test_ci_installs_and_tests_as_the_readme_says():
    readme = set_up_lines()
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]

    def packages(line: str) -> set:
        words = shlex.split(line.split("apt-get install", 1)[1].split("&&")[0])
        return {w for w in words if not w.startswith("-")}

    readme_apt = next(line for line in readme if "apt-get install" in line)
    ci_apt = next(line for line in ci if "apt-get install" in line)
    assert packages(readme_apt) == packages(ci_apt)
    readme_pip = next(line for line in readme if line.startswith("pip install"))
    assert readme_pip == 'pip install -e ".[dev]"'
    assert any(line.endswith('install -q -e ".[dev]"') and "pip" in line for line in ci)
    # CI's test command is README's first one, the whole suite.
    assert next(line for line in readme if line.startswith("pytest")) == "pytest" == ci[-1]
