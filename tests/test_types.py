"""dp_core's public API type-checks (issue 40): mypy, as configured in pyproject.toml ([tool.mypy]:
the modules a user of `import dp_core` and dp_core.sql calls, every function annotated), finds
nothing; and the check can fail: a copy of the engine with a planted wrong annotation, or a public
function left unannotated, is reported. dp_core ships py.typed, so these types are what a user's
own type checker reads.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from patience import PATIENCE_S

ROOT = Path(__file__).resolve().parents[1]


def _mypy(cwd: Path, cache: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", str(cache), "--no-error-summary"],
                          cwd=cwd, capture_output=True, text=True, timeout=PATIENCE_S)


def test_the_public_api_of_dp_core_type_checks(tmp_path):
    done = _mypy(ROOT, tmp_path / "cache")
    assert done.returncode == 0, done.stdout + done.stderr
    assert (ROOT / "dp_core" / "py.typed").is_file()


def test_the_type_check_reports_a_wrong_or_missing_annotation(tmp_path):
    copy = tmp_path / "checkout"
    copy.mkdir()
    shutil.copy2(ROOT / "pyproject.toml", copy / "pyproject.toml")
    shutil.copytree(ROOT / "dp_core", copy / "dp_core", ignore=shutil.ignore_patterns("__pycache__"))
    query = copy / "dp_core" / "query.py"
    text = query.read_text()
    planted = text.replace("    def label(self) -> str:", "    def label(self) -> int:", 1)
    planted = planted.replace("def _plain_value(value: object) -> bool:", "def _plain_value(value):", 1)
    assert planted.count("-> int:") > text.count("-> int:") and "def _plain_value(value):" in planted
    query.write_text(planted)
    said = _mypy(copy, tmp_path / "cache").stdout
    assert "dp_core/query.py" in said and "[return-value]" in said, said
    assert "[no-untyped-def]" in said, said
