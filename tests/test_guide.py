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
    outputs = {}
    for command in commands:
        assert "<" not in command, command
        result = CliRunner().invoke(app, shlex.split(command)[1:])
        assert result.exit_code == 0, f"{command}\n{result.output}"
        outputs[command] = result.output
    assert (tmp_path / "controller-keys" / "alice.pem").exists()
    _the_submitted_request_is_what_release_reads(tmp_path / "home", outputs)


def _the_submitted_request_is_what_release_reads(home: Path, outputs: dict[str, str]) -> None:
    """The analyst's request waits in the inbox as a request file of the analyst's, which `dprelease
    release ID` (the id `request submit` printed and `request list` shows) reads as the file asked
    (tests/test_operations.py releases one)."""
    from dataclasses import replace

    from cli.app import _read_request
    from dprelease.requests import load_request
    from dprelease.settings import Settings

    submitted = [(c, out) for c, out in outputs.items() if c.startswith("dprelease request submit")]
    assert submitted, "the guide shows an analyst submitting a request"
    for command, out in submitted:
        request_id = re.search(r"submitted request (\w+) ", out).group(1)
        assert any(request_id in listed for c, listed in outputs.items() if c == "dprelease request list")
        words = shlex.split(command)
        request, inbox_file = _read_request(Settings.from_env({"DPRELEASE_HOME": str(home)}), Path(request_id))
        assert inbox_file == home / "inbox" / f"{request_id}.json"
        analyst = words[words.index("--as") + 1]
        assert request == replace(load_request(ROOT / words[3]), requested_by=analyst)


def test_the_guides_screenshots_exist_and_the_script_retakes_each_one():
    """Every image the guide shows is in docs/img, and docs/screenshots.py writes each Prefect one."""
    images = re.findall(r"!\[[^\]]*\]\((img/[^)]+)\)", GUIDE.read_text())
    assert len(images) >= 4
    script = (ROOT / "docs" / "screenshots.py").read_text()
    for image in images:
        assert (GUIDE.parent / image).stat().st_size > 10_000, image
        if Path(image).name.startswith("prefect-"):
            assert f'"{Path(image).stem}' in script, f"docs/screenshots.py does not retake {image}"
