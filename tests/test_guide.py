"""The controller guide's commands run as written: every `dprelease ...` line of its fenced
blocks, in order, from the repository root, in a fresh home (a real store, real keys)."""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

from typer.testing import CliRunner

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "controller-guide.md"


def guide_commands() -> list[str]:
    """The commands of the guide's plain fenced blocks (```sh / ```bash blocks are examples that name
    the reader's own tables and servers; each fence is paired with its own closing one)."""
    blocks = re.findall(r"^```(\w*)\n(.*?)^```", GUIDE.read_text(), flags=re.DOTALL | re.MULTILINE)
    return [line.strip() for lang, block in blocks if not lang for line in block.splitlines()
            if line.strip().startswith("dprelease ")]


def test_the_guides_commands_run_as_written(tmp_path, monkeypatch):
    from cli.app import app

    commands = guide_commands()
    assert len(commands) >= 8 and any("controller add" in c for c in commands)
    monkeypatch.setenv("DPRELEASE_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("DPRELEASE_KEY_DIR", raising=False)
    monkeypatch.chdir(tmp_path)
    for name in ("examples",):  # the guide's paths are relative to the repository root
        os.symlink(ROOT / name, tmp_path / name)
    for command in commands:
        assert "<" not in command, command
        result = CliRunner().invoke(app, shlex.split(command)[1:])
        assert result.exit_code == 0, f"{command}\n{result.output}"
    assert (tmp_path / "controller-keys" / "alice.pem").exists()
    assert list((tmp_path / "home" / "inbox").glob("*.json"))


def test_the_guides_screenshots_exist_and_the_script_retakes_each_one():
    """Every image the guide shows is in docs/img, and docs/screenshots.py writes each Prefect one."""
    images = re.findall(r"!\[[^\]]*\]\((img/[^)]+)\)", GUIDE.read_text())
    assert len(images) >= 4
    script = (ROOT / "docs" / "screenshots.py").read_text()
    console_script = (ROOT / "docs" / "console_screenshots.py").read_text()
    for image in images:
        assert (GUIDE.parent / image).stat().st_size > 10_000, image
        if Path(image).name.startswith("prefect-"):
            assert f'"{Path(image).stem}' in script, f"docs/screenshots.py does not retake {image}"
        if Path(image).name.startswith("console-"):  # the console's pages: docs/console_screenshots.py
            assert f'"{Path(image).stem}"' in console_script, f"docs/console_screenshots.py does not retake {image}"
