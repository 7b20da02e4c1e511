"""A mistake in a command's arguments (an unknown option, a missing argument, a value of the wrong
type) is the person's, not a bug: one `error:` line naming the command and its --help, exit 2, no
traceback, and nothing written (no bug report in the home), for every command of `dprelease`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from patience import PATIENCE_S
from typer.testing import CliRunner

from dprelease.cli.app import app


def _leaf_commands(group, path=()):
    """Every runnable command of the app, as its words after `dprelease`."""
    for name, command in group.commands.items():
        if hasattr(command, "commands"):
            yield from _leaf_commands(command, path + (name,))
        else:
            yield path + (name,)


COMMANDS = sorted(_leaf_commands(typer.main.get_command(app)))


def _refused_in_one_line(code: int, output: str, home: Path, words: tuple[str, ...]) -> None:
    lines = [line for line in output.splitlines() if line.strip()]
    assert code == 2, output
    assert len(lines) == 1 and lines[0].startswith("error: "), output
    assert "a bug" not in output and "Traceback" not in output, output
    assert f"dprelease {' '.join(words)}".strip() + " --help" in output, output
    assert not home.exists(), "a refused command wrote into the home"


@pytest.mark.parametrize("words", COMMANDS, ids=" ".join)
def test_an_unknown_option_of_any_command_is_one_line(words, tmp_path, monkeypatch):
    home = tmp_path / "home"
    monkeypatch.setenv("DPRELEASE_HOME", str(home))
    result = CliRunner().invoke(app, [*words, "--no-such-option"], prog_name="dprelease")
    _refused_in_one_line(result.exit_code, result.output, home, words)


@pytest.mark.parametrize("args, words", [
    (["dataset", "register", "x", "data.csv", "--unit", "uid", "--epsilon-cap", "abc"], ("dataset", "register")),
    (["dataset", "register", "x", "data.csv", "--unit", "uid", "--epsilon-cap", "1", "--delta-cap", "tiny"],
     ("dataset", "register")),
    (["dataset", "register", "x", "data.csv", "--unit", "uid", "--epsilon-cap", "1", "--sensitive-values", "two"],
     ("dataset", "register")),
    (["dataset", "register"], ("dataset", "register")),
    (["approve"], ("approve",)),
    (["no-such-command"], ()),
    (["--no-such-option"], ()),
])
def test_a_wrong_or_missing_value_is_one_line(args, words, tmp_path, monkeypatch):
    home = tmp_path / "home"
    monkeypatch.setenv("DPRELEASE_HOME", str(home))
    result = CliRunner().invoke(app, args, prog_name="dprelease")
    _refused_in_one_line(result.exit_code, result.output, home, words)


def test_the_program_refuses_a_text_epsilon_cap_in_one_line(tmp_path):
    """The installed program, as a person runs it: stderr holds the one line, stdout nothing."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DPRELEASE_", "PREFECT_"))}
    env["DPRELEASE_HOME"] = str(tmp_path / "home")
    done = subprocess.run([str(Path(sys.executable).with_name("dprelease")), "dataset", "register", "adult",
                           "adult.csv", "--unit", "person_id", "--epsilon-cap", "abc"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=PATIENCE_S)
    assert done.stdout == ""
    _refused_in_one_line(done.returncode, done.stderr, tmp_path / "home", ("dataset", "register"))
    assert "'--epsilon-cap'" in done.stderr


@pytest.mark.parametrize("option, value, library_name", [
    ("--epsilon-cap", "-1", "epsilon_cap"),
    ("--delta-cap", "0.5", "delta_cap"),
    ("--max-risk", "5", "max_risk"),
])
def test_a_refused_value_is_named_by_the_option_the_person_typed(option, value, library_name, tmp_path, monkeypatch):
    """The library names its parameters as Python does (epsilon_cap); on the command line the refusal
    names the option (--epsilon-cap), and nothing is registered."""
    home = tmp_path / "home"
    monkeypatch.setenv("DPRELEASE_HOME", str(home))
    runner = CliRunner()
    assert runner.invoke(app, ["init"], prog_name="dprelease").exit_code == 0
    data = tmp_path / "data.csv"
    data.write_text("uid,x\n1,2\n2,3\n")
    args = ["dataset", "register", "d", str(data), "--unit", "uid", "--epsilon-cap", "1", option, value]
    result = runner.invoke(app, args, prog_name="dprelease")
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error: "), result.output
    assert option in result.output and library_name not in result.output, result.output
    listed = runner.invoke(app, ["dataset", "list"], prog_name="dprelease")
    assert " d " not in listed.output and "│ d" not in listed.output, listed.output


@pytest.mark.parametrize("words", [(), *COMMANDS], ids=" ".join)
def test_help_shows_no_value_type_on_a_flag(words):
    """A flag takes no value: help lists `--debug`, `--help`, `--public` without a `<bool>` after them."""
    result = CliRunner().invoke(app, [*words, "--help"], prog_name="dprelease", terminal_width=120)
    assert result.exit_code == 0, result.output
    assert "--help" in result.output and "<bool>" not in result.output, result.output
