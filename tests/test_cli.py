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
    assert code == 2 and "--deployment" in out
    code, out = run("policy", "add", "monthly", "--dataset", "adult", "--max-epsilon", "0.1", "--approval", "auto",
                    "--deployment", "dp-monthly-publication")
    assert code == 0
    code, out = run("policy", "list", "adult")
    assert "monthly" in out and "auto" in out
    code, out = run("pending")
    assert code == 0


def test_a_public_table_is_registered_listed_and_budgeted_as_public(env):
    """`dataset register --public` (issue 16): no unit, no cap; `dataset list` and `budget` say public."""
    run("init")
    levels = env / "levels.csv"
    levels.write_text("education,level\nBachelors,0\nHS-grad,1\n")
    code, out = run("dataset", "register", "levels", str(levels), "--public", "--unit", "level")
    assert code == 2 and "not both" in out
    code, out = run("dataset", "register", "levels", str(levels), "--public")
    assert code == 0 and "public (no privacy unit, never charged)" in " ".join(out.split())
    code, out = run("dataset", "list")
    assert code == 0 and next(line for line in out.splitlines() if "levels" in line).split("│")[2].strip() == "public"
    for args in (("budget",), ("budget", "levels")):
        code, out = run(*args)
        row = [cell.strip() for cell in next(line for line in out.splitlines() if "levels" in line).split("│")[1:-1]]
        assert code == 0 and row == ["levels", "public", "-", "-", "-", "-"], out


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
    assert code == 1 and "intact, signer not established" in out
    assert signing.key_fingerprint(tmp_path / "k.pub.pem") in out.replace("\n", "")
    code, out = run("verify", str(release), "--key", str(tmp_path / "k.pub.pem"))
    assert code == 0 and "OK" in out


def test_a_forged_publication_fails_verify_with_and_without_key(env, tmp_path):
    """A number changed, the manifest re-signed with a new key, that key put at the publication
    root (and in the release): never OK, never exit 0."""
    from dprelease.reporting import signing

    signing.generate_keypair(tmp_path / "publisher.pem", tmp_path / "publisher.pub.pem")
    root = tmp_path / "published"
    release = root / "r1"
    release.mkdir(parents=True)
    (release / "results.csv").write_text("group,people\nA,1203\n")
    signing.sign_directory(release, {"release_id": "r1"}, signing.load_private_key(tmp_path / "publisher.pem"))
    (root / "public_key.pem").write_bytes((tmp_path / "publisher.pub.pem").read_bytes())
    # the forgery
    (release / "results.csv").write_text("group,people\nA,9203\n")
    signing.generate_keypair(tmp_path / "forger.pem", tmp_path / "forger.pub.pem")
    signing.sign_directory(release, {"release_id": "r1"}, signing.load_private_key(tmp_path / "forger.pem"))
    (root / "public_key.pem").write_bytes((tmp_path / "forger.pub.pem").read_bytes())
    code, out = run("verify", str(release))
    assert code == 1 and "OK" not in out and "signer not established" in out
    code, out = run("verify", str(release), "--key", str(tmp_path / "publisher.pub.pem"))
    assert code == 1 and "FAILED" in out and "not the trusted key" in out


def test_server_refuses_to_listen_beyond_localhost_without_auth(monkeypatch):
    monkeypatch.delenv("PREFECT_SERVER_API_AUTH_STRING", raising=False)
    code, out = run("server", "--host", "0.0.0.0")
    assert code == 2 and "refusing to listen on 0.0.0.0 without authentication" in out.replace("\n", " ")
    assert "PREFECT_SERVER_API_AUTH_STRING" in out.replace("\n", "")
