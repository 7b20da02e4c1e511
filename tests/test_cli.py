"""The command line: init, registration, budget, policy, verify (exit codes and messages)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from dprelease.cli import app

DATA = Path(__file__).resolve().parents[1] / "examples" / "data" / "adult.csv.gz"


@pytest.fixture()
def env(tmp_path, monkeypatch):
    monkeypatch.setenv("DPRELEASE_HOME", str(tmp_path / "home"))
    return tmp_path


def run(*args):
    result = CliRunner().invoke(app, list(args))
    return result.exit_code, result.output


def test_init_register_budget_policy(env):
    code, out = run("init")
    assert code == 0 and "escrow key created" in out and "signing key pair created" in out
    code, out = run("dataset", "register", "adult", str(DATA), "--unit", "person_id", "--add-row-id", "--epsilon-cap", "3")
    assert code == 0 and "registered 'adult'" in out
    code, out = run("dataset", "register", "adult", str(DATA), "--unit", "person_id", "--add-row-id", "--epsilon-cap", "3")
    assert code == 2 and "already registered" in out
    code, out = run("dataset", "register", "other", str(DATA), "--unit", "nobody", "--epsilon-cap", "3")
    assert code == 2 and "nobody" in out
    code, out = run("budget")
    assert code == 0 and "adult" in out and "3" in out
    code, out = run("policy", "add", "monthly", "--dataset", "adult", "--max-epsilon", "0.1", "--approval", "auto")
    assert code == 0
    code, out = run("policy", "list", "adult")
    assert "monthly" in out and "auto" in out
    code, out = run("pending")
    assert code == 0


def test_verify_names_the_changed_file(env):
    from dprelease import signing

    run("init")
    key_dir = env / "home" / "keys"
    release = env / "release"
    release.mkdir()
    (release / "index.html").write_text("<html>report</html>")
    (release / "results.csv").write_text("a,b\n1,2\n")
    signing.sign_directory(release, {"release_id": "x"}, signing.load_private_key(key_dir / "signing_ed25519.pem"))
    code, out = run("verify", str(release), "--key", str(key_dir / "signing_ed25519.pub.pem"))
    assert code == 0 and "OK" in out
    data = bytearray((release / "results.csv").read_bytes())
    data[2] ^= 1
    (release / "results.csv").write_bytes(bytes(data))
    code, out = run("verify", str(release), "--key", str(key_dir / "signing_ed25519.pub.pem"))
    assert code == 1 and "results.csv" in out and "FAILED" in out


def test_help_has_examples():
    code, out = run("--help")
    assert code == 0 and "release" in out and "verify" in out
    code, out = run("verify", "--help")
    assert "Example" in out
