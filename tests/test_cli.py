"""The command line: init, registration, budget, policy, verify (exit codes and messages)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.app import app

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
    from dprelease.reporting import signing

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


def test_verify_without_a_trusted_key_does_not_claim_who_signed(env, tmp_path, monkeypatch):
    from dprelease.reporting import signing

    monkeypatch.setenv("DPRELEASE_HOME", str(tmp_path / "empty-home"))  # no keys anywhere
    release = tmp_path / "pub" / "r1"
    release.mkdir(parents=True)
    (release / "index.html").write_text("<html>report</html>")
    signing.generate_keypair(tmp_path / "k.pem", tmp_path / "k.pub.pem")
    signing.sign_directory(release, {"release_id": "r1"}, signing.load_private_key(tmp_path / "k.pem"))
    code, out = run("verify", str(release))
    assert code == 1 and "SIGNER UNKNOWN" in out
    # with the publisher's key at the publication root, a release re-signed by someone else fails
    signing.generate_keypair(tmp_path / "pub_key.pem", tmp_path / "pub_key.pub.pem")
    (tmp_path / "pub" / "public_key.pem").write_bytes((tmp_path / "pub_key.pub.pem").read_bytes())
    code, out = run("verify", str(release))
    assert code == 1 and "FAILED" in out


def test_the_data_engine_never_spills_to_disk():
    import pandas as pd

    from dp_core.backend import DuckDBBackend

    backend = DuckDBBackend.for_input(pd.DataFrame({"a": [1]}))
    assert backend.run("SELECT current_setting('temp_directory') AS t")["t"].iloc[0] == ""
