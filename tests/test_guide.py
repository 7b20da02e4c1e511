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
    from dprelease.cli.app import app

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

    from dprelease.cli.app import _read_request
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
    console_script = (ROOT / "docs" / "console_screenshots.py").read_text()
    for image in images:
        assert (GUIDE.parent / image).stat().st_size > 10_000, image
        if Path(image).name.startswith("prefect-"):
            assert f'"{Path(image).stem}' in script, f"docs/screenshots.py does not retake {image}"
        if Path(image).name.startswith("console-"):  # the console's pages: docs/console_screenshots.py
            assert f'"{Path(image).stem}"' in console_script, f"docs/console_screenshots.py does not retake {image}"


def test_the_guide_and_prefect_yaml_name_the_same_deployments_and_request_files():
    """Each deployment the guide names exists in prefect.yaml, and the request file and series the
    guide says a deployment runs are the ones prefect.yaml gives it (a guide once said monthly.yaml
    for a deployment that runs visits.yaml)."""
    import yaml

    text = " ".join(GUIDE.read_text().split())
    deployments = {d["name"]: d for d in yaml.safe_load((ROOT / "prefect.yaml").read_text())["deployments"]}
    named = set(re.findall(r"`(dp-[a-z-]+)`", text)) - {"dp-release"} | {"dp-release"}
    assert named <= set(deployments) | {"dp-scheduled-publication"}, named - set(deployments)
    for name, spec in deployments.items():
        request_file = (spec.get("parameters") or {}).get("request_file")
        if request_file is None:
            continue
        sentences = [x for x in re.split(r"(?<=[.;])\s", text) if f"`{name}`" in x and "examples/requests/" in x]
        assert sentences, f"the guide does not say which request file {name} runs"
        for sentence in sentences:  # the first request file a sentence names beside the deployment is its own
            first = re.search(r"examples/requests/[\w.-]+\.yaml", sentence).group(0)
            assert first == request_file, (name, first, request_file, sentence)
    assert (ROOT / deployments["dp-monthly-publication"]["parameters"]["request_file"]).exists()


def _cli_tree():
    import typer

    from dprelease.cli.app import app

    return typer.main.get_command(app)


def test_every_command_and_option_the_docs_name_exists():
    """Whatever the README and docs/ write as `dprelease <command> [--option]` (in a block or in a
    sentence, where the guide's test does not run it) is a command of the program with that option:
    the deployment guide named a `dprelease decide` that never existed."""
    top = _cli_tree()
    # `dprelease` followed by words that read as a command: lower-case words, then its options
    mention = re.compile(r"`?dprelease ((?:[a-z][a-z-]*(?: |$))+)([^`|#\n]*)")
    prose = {"publishes", "offers", "therefore", "on", "import", "measurement"}  # "dprelease publishes ...": the name
    unknown = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for number, line in enumerate(page.read_text().splitlines(), 1):
            for found in mention.finditer(line):
                words = found.group(1).split()
                if words[0] in prose or words[0] == "dprelease":
                    continue
                command, used = top, []
                for word in words:
                    sub = getattr(command, "commands", {}).get(word)
                    if sub is None:
                        break
                    command, used = sub, [*used, word]
                where = f"{page.relative_to(ROOT)}:{number}"
                if not used:
                    unknown.append(f"{where}: dprelease {' '.join(words)}")
                    continue
                options = {o for p in command.params for o in (*p.opts, *p.secondary_opts)} | {"--help", "--debug"}
                for option in re.findall(r"(?<![\w-])(--[a-z][a-z-]*)", found.group(2)):
                    if option not in options:
                        unknown.append(f"{where}: dprelease {' '.join(used)} has no {option}")
    assert not unknown, "\n".join(unknown)
