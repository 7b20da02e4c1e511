"""How the repository's top-level flows/, tasks/ and cli/ import as dprelease.flows, dprelease.tasks
and dprelease.cli when the code runs from a checkout (tests, `python -m dprelease.cli.app`, mutants/).

The built wheel needs none of this: setuptools' package-dir (pyproject.toml) copies the three
directories inside the dprelease package. In a checkout they sit beside dprelease/, so this finder
maps exactly those three names to the directories beside the dprelease package that was imported
(never to another checkout's: setuptools' editable finder maps them to the checkout it was installed
from, which is a different one when a virtualenv is shared). It is installed first on
sys.meta_path by dprelease/__init__.py and answers for nothing else (docs/architecture.md,
"One import name").
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

#: the platform's subpackages that live at the repository's top level
TOP_LEVEL_SUBPACKAGES = ("flows", "tasks", "cli")
PARENT = "dprelease"


class CheckoutSubpackages(importlib.abc.MetaPathFinder):
    """Finds dprelease.flows/tasks/cli in the directories beside the imported dprelease package,
    when they are not inside it (a checkout, not an installed wheel)."""

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        parent, _, name = fullname.rpartition(".")
        if parent != PARENT or name not in TOP_LEVEL_SUBPACKAGES or not path:
            return None
        for package_dir in map(Path, path):
            if (package_dir / name).exists():
                return None  # installed inside the package (a wheel): the ordinary finder's
            beside = package_dir.parent / name
            if (beside / "__init__.py").is_file():
                return importlib.util.spec_from_file_location(
                    fullname, beside / "__init__.py", submodule_search_locations=[str(beside)])
        return None


def install() -> None:
    """Put the finder first on sys.meta_path, once per process."""
    if not any(isinstance(finder, CheckoutSubpackages) for finder in sys.meta_path):
        sys.meta_path.insert(0, CheckoutSubpackages())
