"""The command line: init, registration, budget, policy, verify (exit codes and messages)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from dprelease.cli.app import app

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


def test_a_forged_publication_fails_verify_with_and_without_key(env, tmp_path, monkeypatch):
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
    # the key shipped with the files, given as --key however it is spelt, is the forger's: it establishes no signer
    monkeypatch.chdir(root)
    for shipped in (release / "public_key.pem", root / "r1" / ".." / "r1" / "public_key.pem", Path("r1/public_key.pem"),
                    root / "public_key.pem", Path("public_key.pem")):  # in the release, or beside it at the root
        code, out = run("verify", "r1", "--key", str(shipped))
        assert code == 1 and "OK" not in out and "signer not established" in out, (shipped, out)
        assert signing.verify_directory(release, shipped) == signing.verify_directory(release)


def test_server_refuses_to_listen_beyond_localhost_without_auth(monkeypatch):
    monkeypatch.delenv("PREFECT_SERVER_API_AUTH_STRING", raising=False)
    code, out = run("server", "--host", "0.0.0.0")
    assert code == 2 and "refusing to listen on 0.0.0.0 without authentication" in out.replace("\n", " ")
    assert "PREFECT_SERVER_API_AUTH_STRING" in out.replace("\n", "")


LONG = {"dataset": "household_income_by_region_2026", "unit": "household_identifier",
        "controller": "alexandra.controller@statistics.example.org",
        "analyst": "an.analyst.with.a.long.name@example.org",
        "policy": "the_long_standing_household_policy"}


@pytest.fixture()
def pasted(tmp_path):
    """A home with long names everywhere a person pastes one: a dataset, its unit, a policy, a
    controller, an analyst's inbox request and releases waiting for a decision (ids sharing a start)."""
    import uuid

    from dprelease import admin, decisions
    from dprelease.requests import inbox, parse_request, signed
    from dprelease.settings import Settings
    from dprelease.store import Store

    settings = Settings.from_env({"DPRELEASE_HOME": str(tmp_path / "home")})
    admin.init(settings)
    (tmp_path / "h.csv").write_text(f"{LONG['unit']},region\n" + "".join(f"{i},r{i % 3}\n" for i in range(30)))
    admin.register_dataset(settings, LONG["dataset"], tmp_path / "h.csv", LONG["unit"], 1.0)
    decisions.create_controller(settings, LONG["controller"], tmp_path / "c.pem")
    store = Store(settings.store_url)
    store.add_policy(LONG["policy"], LONG["dataset"], max_epsilon_per_release=1.0, analyst=LONG["analyst"])
    request = parse_request({"dataset": LONG["dataset"], "epsilon": 0.5, "sql": "SELECT WITH ANONYMIZATION region, "
                             f"ANON_COUNT(*, 1) AS n FROM {LONG['dataset']} GROUP BY region"})
    signed.create_key(settings, LONG["analyst"], tmp_path / "a.pem")
    submitted = inbox.submit(settings, request, LONG["analyst"], tmp_path / "a.pem")
    waiting = [f"3f2a{i}{uuid.uuid4().hex[5:8]}-0000-4000-8000-{uuid.uuid4().hex[:12]}" for i in range(2)]
    for release_id in waiting:
        store.add_release(LONG["dataset"], request.to_json(), release_id=release_id, status="awaiting_approval",
                          flow_run_id=release_id)
    published = store.add_release(LONG["dataset"], request.to_json(), status="published").id
    return {"home": settings.home, "request": submitted.id, "waiting": waiting, "published": published,
            "key": tmp_path / "c.pem"}


def _cli(home: Path, *args: str, columns: int) -> tuple[int, str]:
    """The real `dprelease` in a terminal of `columns` columns (Rich reads COLUMNS)."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "DPRELEASE_HOME": str(home), "COLUMNS": str(columns)}
    env.pop("DPRELEASE_CONTROLLER_KEY", None)
    done = subprocess.run([str(Path(sys.executable).with_name("dprelease")), *args], env=env, capture_output=True,
                          text=True, check=False, stdin=subprocess.DEVNULL)
    return done.returncode, done.stdout + done.stderr


@pytest.mark.parametrize("columns", [60, 200])
def test_every_table_prints_what_a_person_pastes_whole(pasted, columns):
    """Ids, names, paths and fingerprints are never cut or wrapped (issue 35): each is whole on one
    line of every table that shows it, in a narrow terminal (60 columns) as in a wide one."""
    from dprelease.evaluators import catalogue
    from dprelease.reporting import signing

    fingerprint = signing.key_fingerprint(pasted["key"].with_name("c.pub.pem"))
    tables = {
        ("dataset", "list"): [LONG["dataset"], LONG["unit"]],
        ("policy", "list", LONG["dataset"]): [LONG["policy"], LONG["analyst"]],
        ("budget",): [LONG["dataset"]],
        ("controller", "list"): [LONG["controller"], fingerprint],
        ("analyst", "list"): [LONG["analyst"], signing.key_fingerprint(pasted["home"].parent / "a.pub.pem")],
        ("request", "list"): [pasted["request"], LONG["dataset"], LONG["analyst"], str(pasted["home"] / "inbox")],
        ("pending",): [*pasted["waiting"], LONG["dataset"]],
        ("evaluators",): sorted(catalogue()),
    }
    for args, values in tables.items():
        code, out = _cli(pasted["home"], *args, columns=columns)
        assert code == 0, out
        assert "…" not in out, f"{args} cut a value at {columns} columns:\n{out}"
        lines = out.splitlines()
        for value in values:
            assert any(value in line for line in lines), f"{args}: {value!r} not whole at {columns} columns:\n{out}"


def test_a_release_id_is_taken_whole_or_by_a_start_only_one_release_has(pasted):
    first, second = pasted["waiting"]
    published = pasted["published"]
    for command in (("approve", published[:6]), ("reject", published[:6], "--reason", "no"),
                    ("decision", "sign", published[:6], "approve", "--key", str(pasted["key"]))):
        code, out = _cli(pasted["home"], *command, columns=80)
        # the whole id: the release found by its start; each command says the release asks nothing now
        assert code == 2 and f"release {published} is published, not awaiting approval" in " ".join(out.split()), out
    code, out = _cli(pasted["home"], "approve", "3f2a", "--key", str(pasted["key"]), columns=80)
    lines = out.strip().splitlines()
    assert code == 2 and len(lines) == 1, out
    assert lines[0].startswith("error: '3f2a' is the start of 2 releases") and first in lines[0] and second in lines[0]
    code, out = _cli(pasted["home"], "approve", "no-such-release", columns=80)
    assert code == 2 and "unknown release 'no-such-release'" in out
    # a series run's releases share its id, `<run>` for its first snapshot and `<run>@<label>` for the next: a
    # start of it names the one that waits for a decision (every start was the start of 2 releases)
    from dprelease.settings import Settings
    from dprelease.store import Store

    store, run = Store(Settings.from_env({"DPRELEASE_HOME": str(pasted["home"])}).store_url), "9fa835d3-79a6-4b90"
    store.add_release(store.get_release(published).dataset, "{}", release_id=run, status="published")
    store.add_release(store.get_release(published).dataset, "{}", release_id=f"{run}@2026-04", status="awaiting_approval")
    for command in (("reject", run[:4], "--reason", "no"), ("decision", "sign", run[:8], "reject", "--key",
                                                              str(pasted["key"]))):
        code, out = _cli(pasted["home"], *command, columns=200)
        assert code == 2 and f"release {run}@2026-04" in out and "start of" not in out, out


@pytest.mark.parametrize("console_url", ["http://localhost:8400", "https://console.example.org"])
def test_a_release_that_cannot_ask_here_names_every_place_to_decide(console_url):
    """`dprelease release` without a key or a terminal waits for a decision made elsewhere: its line
    named the Prefect UI and `dprelease approve` but not the console, where the guide decides; it now
    names the console's decision page of that release (a page the console serves), the commands and
    the Prefect UI."""
    import re

    from starlette.routing import compile_path

    from dprelease.cli.console import deciding
    from dprelease.cli.interactive import where_to_decide
    from dprelease.settings import Settings

    settings = Settings.from_env({"DPRELEASE_HOME": "/nonexistent", "DPRELEASE_CONSOLE_URL": console_url})
    release_id = "6f1c0a52-5d1e-4a7b-9c1d-2e3f4a5b6c7d"
    for why in ("no controller key (--key or DPRELEASE_CONTROLLER_KEY)", "no terminal to ask"):
        line = where_to_decide(settings, release_id, why)
        assert line.startswith(f"{why}: decide in the console ({console_url}/releases/{release_id}")
        assert f"dprelease approve|reject {release_id} --key" in line and "Prefect UI" in line
        page = re.search(rf"{re.escape(console_url)}(/releases/\S+?),", line)[1]
        served = [route for route in deciding.router.routes if getattr(route, "methods", None) == {"GET"}
                  and compile_path(route.path)[0].fullmatch(page)]
        assert served, f"the console serves no page at {page}"
