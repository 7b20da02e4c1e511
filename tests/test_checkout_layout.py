"""From a checkout, dprelease.cli, dprelease.flows and dprelease.tasks are the top-level cli/, flows/
and tasks/ beside the dprelease package that was imported (dprelease/checkout_layout.py;
docs/architecture.md, "One import name"), never another checkout's: a copy of the packages (a
second worktree sharing the venv, `make mutants`' mutants/) imports its own files, though the venv's
editable install maps those names to the checkout it was installed from. Nothing else becomes a
subpackage of dprelease.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from patience import PATIENCE_S

ROOT = Path(__file__).resolve().parents[1]
PACKAGE_DIRS = ["dp_core", "dprelease", "flows", "tasks", "cli", "templates"]


@pytest.fixture(scope="module")
def copy_of_the_checkout(tmp_path_factory) -> Path:
    copy = tmp_path_factory.mktemp("second_checkout")
    for name in PACKAGE_DIRS:
        shutil.copytree(ROOT / name, copy / name, ignore=shutil.ignore_patterns("__pycache__"))
    return copy


def _python(cwd: Path, code: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=PATIENCE_S)


@pytest.mark.parametrize("module", ["dprelease.cli.app", "dprelease.flows.release", "dprelease.tasks.release_steps",
                                    "dprelease.cli.console.app"])
def test_a_copy_of_the_checkout_imports_its_own_subpackages(copy_of_the_checkout, module):
    done = _python(copy_of_the_checkout, f"import {module} as m, dprelease\nprint(m.__file__)\nprint(dprelease.__file__)")
    assert done.returncode == 0, done.stderr
    imported, platform = map(Path, done.stdout.split())
    assert platform.is_relative_to(copy_of_the_checkout)
    assert imported.is_relative_to(copy_of_the_checkout), f"{module} came from {imported}, not from the copy"


@pytest.mark.parametrize("name", ["dp_core", "tests", "dprelease", "examples", "checkout_layout_missing"])
def test_no_other_directory_becomes_a_subpackage_of_dprelease(copy_of_the_checkout, name):
    (copy_of_the_checkout / "tests").mkdir(exist_ok=True)
    (copy_of_the_checkout / "tests" / "__init__.py").write_text("")
    done = _python(copy_of_the_checkout, f"import dprelease.{name}")
    assert done.returncode != 0 and f"No module named 'dprelease.{name}'" in done.stderr, done.stdout + done.stderr
