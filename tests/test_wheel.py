"""The wheel installs like a library (issue 40): `python -m build --wheel` of the checkout, installed
into a fresh virtual environment outside it, puts exactly two import names into site-packages,
`dp_core` (the engine) and `dprelease` (the platform, with dprelease.cli, dprelease.flows and
dprelease.tasks inside it, and the top-level templates/ as its reports' templates:
docs/architecture.md, "One import name"), every module and data file of
the checkout is in it, and `dprelease demo` runs from a directory that is not the checkout.

Offline and quick: the wheel is built without build isolation (the test venv's setuptools) from a
copy of the files it needs (nothing written into the checkout), and installed with --no-deps into
a venv without pip that sees the test venv's site-packages through a .pth line (after its own, so
the wheel's dprelease, not the editable one, is what it imports).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest
from patience import PATIENCE_S

pytestmark = [pytest.mark.xdist_group("wheel"),  # one worker builds the wheel and its venv once (--dist loadgroup)
              pytest.mark.runs_first]  # 2-3 min on one worker, started first (conftest.py)
ROOT = Path(__file__).resolve().parents[1]
#: what the wheel is built from: the import packages' directories, and what pyproject.toml names
BUILD_INPUTS = ["pyproject.toml", "README.md", "dp_core", "dprelease", "flows", "tasks", "cli", "templates", "examples/data"]
#: where each directory of the checkout lands inside site-packages
INSTALLED_AS = {"dp_core": "dp_core", "dprelease": "dprelease", "tasks": "dprelease/tasks",
                "flows": "dprelease/flows", "cli": "dprelease/cli", "templates": "dprelease/reporting/templates",
                "examples/data": "dprelease/cli/demo_data"}


def _run(args: list, **kwargs) -> subprocess.CompletedProcess:
    done = subprocess.run(args, capture_output=True, text=True, timeout=PATIENCE_S, **kwargs)
    assert done.returncode == 0, f"{args}: {done.stdout}\n{done.stderr}"
    return done


def _clean_env(**extra: str) -> dict[str, str]:
    """The environment without the checkout's or a release home's settings."""
    env = {k: v for k, v in os.environ.items()
           if k not in {"PYTHONPATH", "VIRTUAL_ENV"} and not k.startswith(("DPRELEASE_", "PREFECT_"))}
    return {**env, **extra}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel `python -m build --wheel` makes of the checkout's files."""
    source = tmp_path_factory.mktemp("source")
    for name in BUILD_INPUTS:
        origin = ROOT / name
        if origin.is_dir():
            shutil.copytree(origin, source / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(origin, source / name)
    out = tmp_path_factory.mktemp("dist")
    _run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(out), str(source)],
         cwd=source, env=_clean_env())
    [built] = out.glob("dprelease-*.whl")
    return built


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> Path:
    """A fresh venv outside the checkout with the wheel installed (--no-deps); returns its root."""
    root = tmp_path_factory.mktemp("venv") / "env"
    venv.EnvBuilder(with_pip=False, symlinks=True).create(root)
    python = root / "bin" / "python"
    site = Path(_run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                     env=_clean_env()).stdout.strip())
    # the dependencies: the test venv's site-packages, after the new venv's own (a .pth line appends)
    (site / "test_venv_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    _run([sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--no-deps",
          "--no-index", str(wheel)], env=_clean_env())
    return root


def test_the_wheel_has_two_import_names_and_every_file_of_the_checkout(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    top_level = {name.split("/")[0] for name in names}
    assert top_level == {"dp_core", "dprelease", wheel.name.split("-py")[0] + ".dist-info"}, top_level
    expected = set()
    for directory, inside in INSTALLED_AS.items():
        for path in (ROOT / directory).rglob("*"):
            relative = path.relative_to(ROOT / directory).as_posix()
            if path.is_file() and "__pycache__" not in path.parts:
                expected.add(f"{inside}/{relative}")
    missing = sorted(expected - names)
    assert not missing, f"files of the checkout missing from the wheel (pyproject.toml's packages?): {missing}"
    assert "dp_core/py.typed" in names and "dprelease/cli/demo_data/adult.csv.gz" in names


def test_site_packages_holds_dp_core_and_dprelease_only(installed):
    python = installed / "bin" / "python"
    site = Path(_run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                     env=_clean_env()).stdout.strip())
    entries = {p.name for p in site.iterdir()} - {"test_venv_dependencies.pth", "__pycache__"}
    assert {e for e in entries if not e.endswith(".dist-info")} == {"dp_core", "dprelease"}, entries
    assert [e for e in entries if e.endswith(".dist-info")] == ["dprelease-0.1.0.dist-info"], entries


def test_the_installed_packages_import_from_outside_the_checkout(installed, tmp_path):
    """Run from a directory that is not the checkout: every name resolves inside the new venv."""
    python = installed / "bin" / "python"
    probe = ("import dp_core, dprelease.flows, dprelease.tasks.release_steps, dprelease.cli.app\n"
             "from dprelease.flows.release import release_flow\n"
             "for module in (dp_core, dprelease.flows, dprelease.tasks, dprelease.cli):\n"
             "    print(module.__file__)\n")
    shown = _run([str(python), "-c", probe], cwd=tmp_path, env=_clean_env()).stdout.split()
    assert len(shown) == 4 and all(Path(p).is_relative_to(installed) for p in shown), shown
    # the checkout's top-level names are not importable from the wheel
    bare = subprocess.run([str(python), "-c", "import flows"], cwd=tmp_path, env=_clean_env(),
                          capture_output=True, text=True, timeout=PATIENCE_S)
    assert bare.returncode != 0 and "No module named 'flows'" in bare.stderr, bare.stderr


def test_the_installed_dprelease_demo_runs_outside_the_checkout_from_nothing(installed, tmp_path):
    """`make demo`'s command from nothing (no settings, no terminal: it approves automatically and says
    so) ends with a verified, signed publication and the controller's report in the archive: the
    suite's one demo from nothing (tests/test_demo.py runs it with settings exported)."""
    done = subprocess.run([str(installed / "bin" / "dprelease"), "demo"], cwd=tmp_path, stdin=subprocess.DEVNULL,
                          env=_clean_env(), capture_output=True, text=True, timeout=PATIENCE_S)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "no terminal: approved automatically" in done.stdout
    assert "verify: OK, signature and every file intact" in done.stdout
    assert len(list((tmp_path / "demo-output" / "published").glob("*/index.html"))) == 1
    controller = list((tmp_path / "demo-output" / "archive").glob("*/controller/controller.html"))
    assert len(controller) == 1 and "partition" in controller[0].read_text().lower()
