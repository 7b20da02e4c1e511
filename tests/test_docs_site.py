"""The documentation site (mkdocs.yml, docs/): it builds with `mkdocs build --strict` (no broken link,
no page left out of the navigation, no docstring the API reference cannot render), and every Python
example on its pages (fenced ```python) runs as written, page by page, from the repository's root. An
example that needs a system the tests do not have (a Spark cluster reading a lake) is fenced ```py."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]


def _site_pages() -> list[Path]:
    """The Markdown pages of the site's navigation, in order."""
    nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"]
    pages = []
    for entry in nav:
        pages += list(entry.values()) if isinstance(entry, dict) else [entry]
    return [ROOT / "docs" / page for page in pages]


def test_the_site_builds_strict(tmp_path):
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(tmp_path / "site")],
                          cwd=ROOT, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    built = {p.relative_to(tmp_path / "site").as_posix() for p in (tmp_path / "site").rglob("index.html")}
    for page in _site_pages():  # every page of the navigation is on the site
        name = page.stem
        assert ("index.html" if name == "index" else f"{name}/index.html") in built, name
    api = (tmp_path / "site" / "api" / "index.html").read_text()
    assert "dp_core.query" in api and "execute" in api  # the reference was generated from the docstrings


PYTHON_BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


PAGES_WITH_EXAMPLES = [p.relative_to(ROOT).as_posix() for p in [*_site_pages(), ROOT / "README.md"]
                       if PYTHON_BLOCK.search(p.read_text())]


@pytest.mark.parametrize("page", PAGES_WITH_EXAMPLES)
def test_every_python_example_on_the_site_runs(page, monkeypatch):
    """Each page's Python blocks (the README's too) run in order in one namespace, as a reader
    would paste them."""
    monkeypatch.chdir(ROOT)
    namespace: dict = {"__name__": f"docs_{page}"}
    blocks = PYTHON_BLOCK.findall((ROOT / page).read_text())
    for number, code in enumerate(blocks, 1):
        try:
            exec(compile(code, f"{page} (example {number})", "exec"), namespace)
        except Exception as err:  # noqa: BLE001 - the failure names the page and the example
            pytest.fail(f"{page}, example {number} of {len(blocks)}: {type(err).__name__}: {err}")
