"""The analysts' inbox: a submitted request is written in the request-file format, so a controller
runs the inbox file as it is (`dprelease release INBOX_FILE`), and it reads back as the same request
whatever epsilon choice it makes."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "requests"


@pytest.mark.parametrize("text", [
    (EXAMPLES / "education.yaml").read_text(),
    "dataset: adult\ntitle: t\nepsilon: {pri: {p: 50}}\nsql: SELECT WITH ANONYMIZATION sex, ANON_COUNT(*, 1) AS n "
    "FROM adult GROUP BY sex\n",
    "dataset: adult\nepsilon: {risk: {trust: low, sensitivity: high, max_risk: 0.2, max_noise: 10, n: 2}}\n"
    "query: {group_by: [sex], aggregates: [{kind: count}]}\nbackend: duckdb\ndelta: 1.0e-7\n",
])
def test_an_inbox_file_reads_back_as_the_request_submitted(tmp_path, text):
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from dprelease.requests import inbox, load_request
    from dprelease.settings import Settings

    request = inbox.parse_text(text)
    path = inbox.submit(Settings.from_env({"DPRELEASE_HOME": str(tmp_path)}), request, "ana",
                        Ed25519PrivateKey.generate()).path
    again = load_request(path)
    assert json.loads(again.to_json()) == {**json.loads(request.to_json()), "requested_by": "ana"}
    # the release it becomes has the inbox request's key: the request then no longer waits
    assert inbox.request_key(json.loads(path.read_text())) == inbox.request_key(json.loads(again.to_json()))


def test_the_command_line_s_inbox_file_runs_as_it_is(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from dprelease.cli.app import app
    from dprelease.reporting import signing
    from dprelease.requests import load_request

    monkeypatch.setenv("DPRELEASE_HOME", str(tmp_path))
    signing.generate_keypair(tmp_path / "ana.pem", tmp_path / "ana.pub.pem")
    result = CliRunner().invoke(app, ["request", "submit", str(EXAMPLES / "education.yaml"), "--as", "ana",
                                      "--key", str(tmp_path / "ana.pem")])
    assert result.exit_code == 0, result.output
    (path,) = (tmp_path / "inbox").glob("*.json")
    assert load_request(path).requested_by == "ana" and path.with_suffix(".sig").exists()


SMALL_SQL = "SELECT WITH ANONYMIZATION g, ANON_COUNT(*, 1) AS n FROM small GROUP BY g"

#: requests whose release would refuse what they ask: the analyst hears it at once, nothing is written
ASKS_WHAT_NO_RELEASE_GIVES = {
    "QUALIFY": f"dataset: small\nepsilon: 1\nsql: {SMALL_SQL} QUALIFY n > 5\n",
    "a delta over the ceiling in OPTIONS": "dataset: small\nepsilon: 1\nsql: SELECT WITH ANONYMIZATION OPTIONS "
                                           "(delta = 0.5) g, ANON_COUNT(*, 1) AS n FROM small GROUP BY g\n",
    "a tiny epsilon in OPTIONS": "dataset: small\nsql: SELECT WITH ANONYMIZATION OPTIONS (epsilon = 1e-300) g, "
                                 "ANON_COUNT(*, 1) AS n FROM small GROUP BY g\n",
    "a tiny epsilon": f"dataset: small\nepsilon: 1.0e-300\nsql: {SMALL_SQL}\n",
    "grouping by the unit's position": "dataset: small\nepsilon: 1\nsql: SELECT WITH ANONYMIZATION uid, "
                                       "ANON_COUNT(*, 1) AS n FROM small GROUP BY 1\n",
    "an unknown column": "dataset: small\nepsilon: 1\nsql: SELECT WITH ANONYMIZATION nope, ANON_COUNT(*, 1) AS n "
                        "FROM small GROUP BY nope\n",
    "a spec's unknown column": "dataset: small\nepsilon: 1\nquery: {aggregates: [{kind: sum, column: y, lower: 0, "
                               "upper: 1}]}\n",
    "an unknown dataset": f"dataset: nosuch\nepsilon: 1\nsql: {SMALL_SQL.replace('small', 'nosuch')}\n",
    "Spark for escrowed data": f"dataset: small\nepsilon: 1\nbackend: spark\nsql: {SMALL_SQL}\n",
}


@pytest.fixture(scope="module")
def small_home(tmp_path_factory):
    """A home with dataset `small` registered: (settings, the folder of request files)."""
    from typer.testing import CliRunner

    from dprelease.cli.app import app
    from dprelease.settings import Settings

    root = tmp_path_factory.mktemp("inbox")
    env = {"DPRELEASE_HOME": str(root / "home"), "DPRELEASE_KEY_DIR": str(root / "keys")}
    (root / "small.csv").write_text("uid,g,x\n" + "".join(f"{i},{'ab'[i % 2]},{i % 7}\n" for i in range(1, 41)))
    for args in (["init"], ["dataset", "register", "small", str(root / "small.csv"), "--unit", "uid",
                            "--epsilon-cap", "5"],
                 ["analyst", "key", "ana", "--private-key", str(root / "ana.pem")],
                 ["analyst", "key", "bob", "--private-key", str(root / "bob.pem")]):
        assert CliRunner().invoke(app, args, env=env).exit_code == 0
    return Settings.from_env(env), env


def _key(env: dict, analyst: str) -> Path:
    """The private key of an analyst of small_home (ana's and bob's are registered)."""
    return Path(env["DPRELEASE_KEY_DIR"]).parent / f"{analyst}.pem"


@pytest.mark.parametrize("case", list(ASKS_WHAT_NO_RELEASE_GIVES))
def test_a_request_no_release_would_run_is_refused_at_submission(small_home, tmp_path, case):
    """`request submit` refuses in one line, and writes nothing, what `dprelease release` would
    refuse for what the request asks (issue 35: QUALIFY, a huge delta or a tiny epsilon waited in
    the inbox as 'submitted' until a controller ran it), with the release's own message."""
    from typer.testing import CliRunner

    from dprelease import preflight
    from dprelease.cli.app import app
    from dprelease.requests import load_request

    settings, env = small_home
    path = tmp_path / "request.yaml"
    path.write_text(ASKS_WHAT_NO_RELEASE_GIVES[case])
    result = CliRunner().invoke(app, ["request", "submit", str(path), "--as", "ana", "--key", str(_key(env, "ana"))],
                                env=env)
    with pytest.raises(Exception) as release:  # the release's verdict on the same request
        preflight.check_request(settings, load_request(path))
    assert result.exit_code == 2 and result.stderr.strip().splitlines() == [f"error: {release.value}"]
    assert not any(settings.inbox_dir.glob("*.json")), "a refused request was written to the inbox"


#: request files that cannot be read as a request at all: name -> content (None: no such file; "dir": a folder)
UNREADABLE_REQUESTS = {
    "missing.yaml": None,
    "folder.yaml": "dir",
    "latin1.yaml": "dataset: Köln\n".encode("latin-1"),
    "not-yaml.yaml": b"dataset: [small\n",
    "a-list.yaml": b"- dataset: small\n",
    "unknown-field.yaml": f"dataset: small\nsql: {SMALL_SQL}\nepsilon: 1\ncolour: red\n".encode(),
    "epsilon-text.yaml": f"dataset: small\nsql: {SMALL_SQL}\nepsilon: abc\n".encode(),
}


@pytest.mark.parametrize("name", list(UNREADABLE_REQUESTS))
def test_submit_and_release_refuse_an_unreadable_request_file_in_the_same_line(small_home, tmp_path, name):
    """A request file that is missing, a folder, not UTF-8 or not a request: `request submit` says
    what `dprelease release` says of it (it said `[Errno 2] No such file or directory: ...`), exit 2,
    and nothing reaches the inbox."""
    from typer.testing import CliRunner

    from dprelease.cli.app import app

    settings, env = small_home
    path = tmp_path / name
    content = UNREADABLE_REQUESTS[name]
    if content == "dir":
        path.mkdir()
    elif content is not None:
        path.write_bytes(content)
    submitted = CliRunner().invoke(app, ["request", "submit", str(path), "--as", "ana", "--key", str(_key(env, "ana"))],
                                env=env)
    released = CliRunner().invoke(app, ["release", str(path), "--approve-as", "alice"], env=env)
    lines = submitted.stderr.strip().splitlines()
    assert submitted.exit_code == released.exit_code == 2, submitted.output + released.output
    assert len(lines) == 1 and lines[0].startswith("error: ") and str(path) in lines[0], submitted.stderr
    assert lines == released.stderr.strip().splitlines()
    assert not any(settings.inbox_dir.glob("*.json")), "a refused request was written to the inbox"


@pytest.mark.parametrize("given", ["whole id", "a start of it", "its signed file put back"])
def test_a_decided_request_run_again_by_its_id_says_it_was_decided(small_home, given):
    """`dprelease release ID` of a request a controller already decided (moved to inbox/decided/ when its
    release was published or rejected) said the id was no request at all; it now says it was decided and
    how to ask again, exit 2, with nothing spent and nothing moved back. Its file and signature copied
    back into the inbox (still signed: anyone who can write the inbox can put them back) are refused alike."""
    from typer.testing import CliRunner

    from dprelease.cli.app import app
    from dprelease.requests import inbox
    from dprelease.store import Store

    settings, env = small_home
    submitted = inbox.submit(settings, inbox.parse_text(f"dataset: small\nepsilon: 1\nsql: {SMALL_SQL}\n"), "ana",
                             _key(env, "ana"))
    inbox.mark_decided(settings, submitted.path)  # what `dprelease release` does once it is published or rejected
    put_back = [submitted.path, submitted.path.with_suffix(".sig")] if given == "its signed file put back" else []
    for path in put_back:
        path.write_bytes((settings.inbox_dir / inbox.DECIDED / path.name).read_bytes())
    before = Store(settings.store_url).budget("small")
    words = submitted.id if given == "whole id" else submitted.id[:6]
    result = CliRunner().invoke(app, ["release", words, "--approve-as", "alice"], env=env)
    for path in put_back:
        path.unlink()
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1, result.output
    assert lines[0].startswith(f"error: request {submitted.id} of the analysts' inbox was already decided"), lines
    assert "submits it again" in lines[0]
    assert Store(settings.store_url).budget("small") == before
    assert not any(settings.inbox_dir.glob("*.json"))


def test_a_request_run_already_is_not_run_again_by_its_id(small_home):
    """`dprelease release ID` of an inbox request whose release waits for a decision started a second
    release of it, a second reservation (the first run leaves the file in the inbox until it is decided,
    and a run from the Prefect UI leaves it there for good). Refused in one line, exit 2, nothing spent,
    while its release runs or waits and once it is published or rejected; a run that failed or expired
    (refunded) may be run again; the same request submitted again afterwards is a new one."""
    from typer.testing import CliRunner

    from dprelease.cli.app import app
    from dprelease.requests import inbox
    from dprelease.store import Store

    settings, env = small_home
    store = Store(settings.store_url)
    request = inbox.parse_text(f"dataset: small\ntitle: once\nepsilon: 1\nsql: {SMALL_SQL}\n")
    submitted = inbox.submit(settings, request, "ana", _key(env, "ana"))
    run = store.add_release("small", submitted.request.to_json())  # as the flow records the run of it
    before = store.budget("small")
    for status, words in (("pending", "is Running; a request runs once (decide that release"),
                          ("awaiting_approval", "is Waiting for a decision; a request runs once (decide that release"),
                          ("published", "is Published; a request runs once (to ask again, the analyst submits"),
                          ("rejected", "is Rejected; a request runs once (to ask again, the analyst submits")):
        store.update_release(run.id, status=status)
        result = CliRunner().invoke(app, ["release", submitted.id[:6], "--approve-as", "alice"], env=env)
        lines = result.stderr.strip().splitlines()
        assert result.exit_code == 2 and len(lines) == 1, result.output
        assert lines[0].startswith(f"error: request {submitted.id} of the analysts' inbox was run already: release "
                                   f"{run.id} {words}"), lines
        assert store.budget("small") == before and submitted.path.exists()
    store.update_release(run.id, status="failed")  # refunded: this command goes on to its next check
    result = CliRunner().invoke(app, ["release", submitted.id, "--approve-as", "alice"], env=env)
    assert result.exit_code == 2 and "run already" not in result.stderr, result.output
    again = inbox.submit(settings, request, "ana", _key(env, "ana"))  # asked again: a new request, waiting for its own run
    assert inbox.run_of(again.path, json.loads(again.path.read_text()),
                        inbox.runs_by_request(store.release_requests())) is None


#: an analyst's requests whose epsilon choice reads the raw data (PRI data mode), in each form a request takes
DATA_MODE_REQUESTS = {
    "a spec aimed at one person, p = 0": "dataset: small\nepsilon: {pri: {p: 0, mode: data}}\n"
                                         "query: {group_by: [g], public_partitions: [a, b], where: \"uid = 7 AND x > 3\", "
                                         "aggregates: [{kind: count, upper: 1}]}\n",
    "SQL, p = 50": f"dataset: small\nepsilon: {{pri: {{mode: data, p: 50}}}}\nsql: {SMALL_SQL}\n",
    "JSON": json.dumps({"dataset": "small", "epsilon": {"pri": {"p": 20, "mode": "data"}},
                        "query": {"aggregates": [{"kind": "count"}]}}),
}


@pytest.mark.parametrize("case", list(DATA_MODE_REQUESTS))
def test_an_analyst_cannot_submit_an_epsilon_chosen_from_the_data(small_home, tmp_path, case):
    """PRI data mode chooses epsilon from the people's own PRIs, and fails (refunded) when no candidate
    passes: with p = 0 and a filter selecting one person, it failed exactly when that person matched
    the filter (every PRI equal passes at once; one person inside the count never does), a fact the
    analyst read as "Failed (refunded)" before any approval, for nothing. The analysts' inbox refuses
    it, from the command line and in the console (both write through the inbox's one writer), writing
    nothing."""
    from typer.testing import CliRunner

    from dprelease.cli.app import app
    from dprelease.requests import inbox, load_request

    settings, env = small_home
    waiting = sorted(settings.inbox_dir.glob("*.json"))
    path = tmp_path / ("request.json" if case == "JSON" else "request.yaml")
    path.write_text(DATA_MODE_REQUESTS[case])
    result = CliRunner().invoke(app, ["request", "submit", str(path), "--as", "ana", "--key", str(_key(env, "ana"))],
                                env=env)
    assert result.exit_code == 2 and result.stderr.strip().splitlines() == [f"error: {inbox.DATA_MODE_REFUSAL}"]
    with pytest.raises(inbox.RequestError, match="epsilon.pri.mode: data chooses epsilon"):
        inbox.submit(settings, load_request(path), "ana", _key(env, "ana"))
    assert sorted(settings.inbox_dir.glob("*.json")) == waiting, "a refused request was written to the inbox"


def _tamper(path: Path, **fields) -> None:
    """Change fields of an inbox request file after it was signed (as anyone who can write the inbox can)."""
    path.write_text(json.dumps({**json.loads(path.read_text()), **fields}, indent=2) + "\n")


def _unsigned(settings, env) -> Path:
    """A request file dropped into the inbox by hand, in the request format, with no signature."""
    path = settings.inbox_dir / "0dd0dd0dd0dd.json"
    path.write_text(json.dumps({"dataset": "small", "epsilon": 1, "sql": SMALL_SQL, "requested_by": "ana"}))
    return path


def _analyst_side(env: dict) -> dict:
    """The environment of an analyst given the inbox alone: the home's inbox, no store to read."""
    return {**env, "DPRELEASE_STORE_URL": f"sqlite:///{Path(env['DPRELEASE_KEY_DIR']).parent / 'no-store.db'}"}


def _as_another(settings, env) -> Path:
    """bob submits as ana, signed with his own key, from the inbox alone (the command line lets him
    type any name, and with no store to read, nothing there can tell)."""
    from typer.testing import CliRunner

    from dprelease.cli.app import app

    request = settings.inbox_dir.parent / "mine.yaml"
    request.write_text(f"dataset: small\ntitle: as another\nepsilon: 1\nsql: {SMALL_SQL}\n")
    result = CliRunner().invoke(app, ["request", "submit", str(request), "--as", "ana", "--key", str(_key(env, "bob"))],
                                env=_analyst_side(env))
    assert result.exit_code == 0, result.output  # the check is on the controller's side
    return settings.inbox_dir / f"{result.stdout.split('submitted request ')[1].split()[0]}.json"


def _signed(settings, env, analyst="ana", key="ana", epsilon=1):
    """A request submitted with the Python API, from the inbox alone (no store: nothing checked yet)."""
    from dprelease.requests import inbox
    from dprelease.settings import Settings

    return inbox.submit(Settings.from_env(_analyst_side(env)), inbox.parse_text(
        f"dataset: small\nepsilon: {epsilon}\nsql: {SMALL_SQL}\n"), analyst, _key(env, key)).path


def _renamed(settings, env) -> Path:
    """bob's own signed request whose file is then made to name ana (her policy)."""
    path = _signed(settings, env, "bob", "bob")
    _tamper(path, requested_by="ana")
    return path


def _epsilon_raised(settings, env) -> Path:
    """ana's signed request with its epsilon raised after signing."""
    path = _signed(settings, env, epsilon=0.5)
    _tamper(path, epsilon=4)
    return path


def _copied(settings, env) -> Path:
    """ana's signed request and its signature copied under another id (the same request run twice)."""
    path = _signed(settings, env)
    copy = settings.inbox_dir / "c0c0c0c0c0c0.json"
    copy.write_bytes(path.read_bytes())
    copy.with_suffix(".sig").write_bytes(path.with_suffix(".sig").read_bytes())
    path.unlink()
    path.with_suffix(".sig").unlink()
    return copy


def _no_registered_key(settings, env) -> Path:
    """cy signs with a key of her own that no controller registered."""
    from dprelease.reporting import signing

    signing.generate_keypair(_key(env, "cy"), _key(env, "cy").with_name("cy.pub.pem"))
    return _signed(settings, env, "cy", "cy")


#: inbox requests that are not proven their analyst's: case -> (how it is made, what the refusal says)
NOT_PROVEN = {
    "unsigned, dropped in the inbox": (_unsigned, "is not signed"),
    "bob as ana with his own key": (_as_another, "does not verify with the registered key of 'ana'"),
    "bob's request renamed ana's": (_renamed, "names 'ana' as its analyst but is signed as 'bob'"),
    "epsilon raised after signing": (_epsilon_raised, "does not verify with the registered key of 'ana'"),
    "copied under another id": (_copied, "does not verify with the registered key of 'ana'"),
    "no registered key": (_no_registered_key, "'cy', who has no registered analyst key"),
}


@pytest.mark.parametrize("case", list(NOT_PROVEN))
def test_an_inbox_request_not_proven_its_analyst_s_is_refused(small_home, case):
    """The name an analyst submits with was taken on trust: one could submit as another, under her
    policy, and any file written into the inbox ran as whoever it named. A controller's `release ID`
    now runs an inbox request only when its signature verifies with the key the store registered for
    the analyst it names; otherwise one line, exit 2, the same words as the Python API
    (signed.require), nothing spent, the request left waiting; `request list` shows it refused."""
    from typer.testing import CliRunner

    from dprelease.cli.app import app
    from dprelease.requests import RequestError, signed
    from dprelease.store import Store

    settings, env = small_home
    make, words = NOT_PROVEN[case]
    path = make(settings, env)
    with pytest.raises(RequestError) as refused:
        signed.require(settings, path)
    assert words in str(refused.value) and str(refused.value).startswith(f"request {path.stem} of the analysts' inbox")
    before = Store(settings.store_url).budget("small")
    for words_given in (path.stem, path.stem[:7], str(path)):
        result = CliRunner().invoke(app, ["release", words_given, "--approve-as", "alice"], env=env)
        assert result.exit_code == 2 and result.stderr.strip().splitlines() == [f"error: {refused.value}"], \
            result.output
    assert Store(settings.store_url).budget("small") == before and path.exists()
    listed = CliRunner().invoke(app, ["request", "list"], env={**env, "COLUMNS": "300"})
    row = next(line for line in listed.stdout.splitlines() if path.stem in line and "REFUSED" in line)
    assert row and str(refused.value) in listed.stdout.replace("\n", " ")
    path.unlink()
    path.with_suffix(".sig").unlink(missing_ok=True)


def test_an_honestly_signed_request_is_its_analyst_s(small_home):
    """The honest path: ana's request signed with her registered key (the command line) and one she
    submitted in the console (the console's record) are hers, in the Python API and `request list`
    alike; a console request changed afterwards is not."""
    from typer.testing import CliRunner

    from dprelease.cli.app import app
    from dprelease.requests import RequestError, inbox, signed
    from dprelease.store import Store

    settings, env = small_home
    request = settings.inbox_dir.parent / "honest.yaml"
    request.write_text(f"dataset: small\ntitle: honest\nepsilon: 1\nsql: {SMALL_SQL}\n")
    result = CliRunner().invoke(app, ["request", "submit", str(request), "--as", "ana"],
                                env={**env, "DPRELEASE_ANALYST_KEY": str(_key(env, "ana"))})
    assert result.exit_code == 0, result.output
    by_key = settings.inbox_dir / f"{result.stdout.split('submitted request ')[1].split()[0]}.json"
    in_console = inbox.submit_in_console(settings, Store(settings.store_url), inbox.parse_text(request.read_text()),
                                         "bob").path
    assert signed.require(settings, by_key) == "ana" and signed.require(settings, in_console) == "bob"
    listed = CliRunner().invoke(app, ["request", "list"], env={**env, "COLUMNS": "300"})
    assert "REFUSED" not in listed.stdout, listed.stdout
    assert [line for line in listed.stdout.splitlines() if by_key.stem in line and "with their key" in line]
    assert [line for line in listed.stdout.splitlines() if in_console.stem in line and "in the console" in line]
    _tamper(in_console, epsilon=4)
    with pytest.raises(RequestError, match="was changed after 'bob' submitted it in the console"):
        signed.require(settings, in_console)
    for path in (by_key, in_console):
        inbox.mark_decided(settings, path)
    assert not by_key.with_suffix(".sig").exists(), "a decided request's signature stayed in the inbox"
    assert (settings.inbox_dir / "decided" / f"{by_key.stem}.sig").exists()


@pytest.mark.parametrize("problem", ["no key", "a key file that does not exist", "a public key"])
def test_submit_without_a_usable_key_is_one_line_and_writes_nothing(small_home, problem):
    """`request submit` signs with the analyst's key: without one, or with a file that holds none,
    one line saying how to give it (as the Python API says it), exit 2, and nothing in the inbox."""
    from typer.testing import CliRunner

    from dprelease.cli.app import app
    from dprelease.requests import RequestError, inbox

    settings, env = small_home
    waiting = sorted(settings.inbox_dir.glob("*"))
    key = {"no key": [], "a key file that does not exist": ["--key", str(_key(env, "nobody"))],
           "a public key": ["--key", str(_key(env, "ana").with_name("ana.pub.pem"))]}[problem]
    request = settings.inbox_dir.parent / "keyless.yaml"
    request.write_text(f"dataset: small\nepsilon: 1\nsql: {SMALL_SQL}\n")
    result = CliRunner().invoke(app, ["request", "submit", str(request), "--as", "ana", *key], env=env)
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1 and "dprelease analyst key" in lines[0], result.output
    if key:  # the Python API's verdict on the same key file, in the same words
        with pytest.raises(RequestError) as api:
            inbox.submit(settings, inbox.parse_text(request.read_text()), "ana", Path(key[1]))
        assert lines == [f"error: {api.value}"]
    assert sorted(settings.inbox_dir.glob("*")) == waiting


def test_an_analyst_key_belongs_to_one_analyst_and_is_replaced_by_registering_again(small_home, tmp_path):
    """`analyst key NAME --public-key FILE` registers the key an analyst made herself; ana's key cannot be
    registered as bob's too (one line, exit 2); registering ana again replaces hers (a lost key), after
    which requests signed with the old one no longer count."""
    from typer.testing import CliRunner

    from dprelease.cli.app import app
    from dprelease.reporting import signing
    from dprelease.requests import RequestError, signed

    settings, env = small_home
    taken = CliRunner().invoke(app, ["analyst", "key", "bob", "--public-key", str(_key(env, "ana").with_name(
        "ana.pub.pem"))], env=env)
    assert taken.exit_code == 2 and "already registered to analyst 'ana'" in taken.stderr, taken.output
    old = _signed(settings, env)
    signing.generate_keypair(tmp_path / "new.pem", tmp_path / "new.pub.pem")
    again = CliRunner().invoke(app, ["analyst", "key", "ana", "--public-key", str(tmp_path / "new.pub.pem")], env=env)
    assert again.exit_code == 0 and "replacing the key registered before" in again.stdout, again.output
    try:
        with pytest.raises(RequestError, match="does not verify with the registered key of 'ana'"):
            signed.require(settings, old)
    finally:
        CliRunner().invoke(app, ["analyst", "key", "ana", "--public-key", str(_key(env, "ana").with_name(
            "ana.pub.pem"))], env=env)
        old.unlink()
        old.with_suffix(".sig").unlink()


def test_an_epsilon_a_controller_chooses_in_the_console_keeps_the_request_its_analyst_s(small_home):
    """The console's DPP tool writes a controller's chosen epsilon into a waiting request: that broke
    the analyst's signature, and her request would then be refused as changed after signing. The
    console now records the rewritten file as hers in the store, and rewrites only a request proven
    its analyst's: an unsigned one is refused, unchanged, rather than made to look vouched for."""
    from dprelease.requests import RequestError, inbox, signed
    from dprelease.store import Store

    settings, env = small_home
    store = Store(settings.store_url)
    path = _signed(settings, env)
    chosen = {**json.loads(path.read_text()), "epsilon": {"risk": {"trust": "low", "sensitivity": "high",
                                                                    "max_risk": 0.2, "max_noise": 10, "n": 2}}}
    inbox.rewrite_in_console(settings, store, path, chosen, "dora")
    assert signed.require(settings, path) == "ana" and inbox.read(path).epsilon_mode == "risk"
    dropped = _unsigned(settings, env)
    before = dropped.read_bytes()
    with pytest.raises(RequestError, match="is not signed"):
        inbox.rewrite_in_console(settings, store, dropped, chosen, "dora")
    assert dropped.read_bytes() == before
    for done in (path, dropped):
        inbox.mark_decided(settings, done)


@pytest.mark.parametrize("case", ["bob as ana with his own key", "a name with no registered key"])
def test_submitting_where_the_store_can_be_read_refuses_another_s_key_at_once(small_home, case):
    """Where this home's store can be read (as `request submit` checks what a request asks), a key
    that is not the one registered for the name given is refused at once, in the same line from the
    command line and the Python API, exit 2, nothing in the inbox: the controller's check would refuse
    the request anyway."""
    from typer.testing import CliRunner

    from dprelease.cli.app import app
    from dprelease.requests import RequestError, inbox

    settings, env = small_home
    name, key, words = {"bob as ana with his own key": ("ana", "bob", "--key is not the key registered for 'ana'"),
                        "a name with no registered key": ("dee", "bob", "'dee' has no registered analyst key")}[case]
    request = settings.inbox_dir.parent / "early.yaml"
    request.write_text(f"dataset: small\nepsilon: 1\nsql: {SMALL_SQL}\n")
    waiting = sorted(settings.inbox_dir.glob("*"))
    result = CliRunner().invoke(app, ["request", "submit", str(request), "--as", name, "--key", str(_key(env, key))],
                                env=env)
    with pytest.raises(RequestError) as api:
        inbox.submit(settings, inbox.parse_text(request.read_text()), name, _key(env, key))
    assert words in str(api.value)
    assert result.exit_code == 2 and result.stderr.strip().splitlines() == [f"error: {api.value}"], result.output
    assert sorted(settings.inbox_dir.glob("*")) == waiting


#: unprivileged user ids with no passwd entry: the controller who owns the home, two analysts, their group
CONTROLLER_UID, ANA_UID, BOB_UID, ANALYSTS_GID = 61000, 61001, 61002, 61010

#: the start of a process run as another Unix user: root's interpreter and standard library may be
#: root's alone (here under /root, mode 0700: `subprocess.run(user=...)` cannot exec it), so the process
#: starts as root, loads what its commands use, then becomes the user (argv: uid, gid, the rest)
AS_USER = """
import json, os, sqlite3, sys
from pathlib import Path
from dprelease.cli import app, tables
from dprelease.requests import inbox, signed
from dprelease.settings import Settings
from dprelease.store import database, opened
uid, gid = int(sys.argv.pop(1)), int(sys.argv.pop(1))
os.setgroups([gid])
os.setgid(gid)
os.setuid(uid)
os.umask(0o002)  # a group's umask: files it writes are writable by the group unless made otherwise
"""

#: the command line, as the `dprelease` program runs it
CLI = AS_USER + "sys.argv[0] = 'dprelease'\napp.main()\n"

#: what another analyst tries on ana's files in the inbox, each answered by the OS: what -> "refused",
#: "done", or the error that stopped it otherwise (the file gone after an earlier attempt)
OTHERS_ATTEMPTS = AS_USER + """
inbox, *theirs = sys.argv[1:]
mine = os.path.join(inbox, "bob-s-own")
open(mine, "w").write("{}")
done = {}
def attempt(name, act):
    try:
        act()
        done[name] = "done"
    except PermissionError:
        done[name] = "refused"
    except OSError as err:
        done[name] = type(err).__name__
for path in theirs:
    attempt(f"overwrite {os.path.basename(path)}", lambda: open(path, "r+b").write(b"{}"))
    attempt(f"replace {os.path.basename(path)} by his own", lambda: os.replace(mine, path))
    attempt(f"rename {os.path.basename(path)}", lambda: os.rename(path, os.path.join(inbox, "taken")))
    attempt(f"rm {os.path.basename(path)}", lambda: os.unlink(path))
os.path.exists(mine) and os.unlink(mine)
print(json.dumps(done))
"""

#: a controller's `release ID` up to where it needs Prefect (the request read, proven hers, not decided),
#: then the move of a decided request into inbox/decided/
RELEASE_AND_DECIDE = AS_USER + """
settings = Settings.from_env()
request, path = app._read_request(settings, Path(sys.argv[1]))
inbox.mark_decided(settings, path)
print(request.requested_by)
"""


def _as_user(uid: int, code: str, args: list[str], env: dict, root: Path) -> subprocess.CompletedProcess:
    """A process of its own run as `uid` of the analysts' group (no passwd entry), with a HOME of its own."""
    (root / str(uid)).mkdir(exist_ok=True)
    os.chown(root / str(uid), uid, ANALYSTS_GID)
    return subprocess.run([sys.executable, "-c", code, str(uid), str(ANALYSTS_GID), *args], capture_output=True,
                          env={**env, "HOME": str(root / str(uid)), "COLUMNS": "300"}, text=True, cwd=root / str(uid),
                          timeout=120)


def _submit_as(uid: int, analyst: str, root: Path, env: dict) -> str:
    """`dprelease request submit` by an analyst given the inbox alone (no store to read): the request's id."""
    spec = root / f"{analyst}.yaml"
    spec.write_text(f"dataset: small\ntitle: {analyst}'s\nepsilon: 1\nsql: {SMALL_SQL}\n")
    result = _as_user(uid, CLI, ["request", "submit", str(spec), "--as", analyst, "--key", str(root / f"{analyst}.pem")],
                      _analyst_side(env), root)
    assert result.returncode == 0, result.stderr
    return result.stdout.split("submitted request ")[1].split()[0]


@pytest.mark.skipif(getattr(os, "geteuid", lambda: -1)() != 0,
                    reason="runs analysts as two other Unix users: needs root (as in CI) and POSIX")
def test_an_analyst_cannot_delete_rename_or_rewrite_another_s_request():
    """Every analyst may write the inbox folder, to submit: another analyst could delete or rename
    ana's request (or its signature, which makes it refused) and no one learned of it. The inbox is
    now sticky (only a file's owner, the folder's owner or root may delete or rename a file) and its
    files are not writable by the group: bob's rm, rename, replace and overwrite of ana's request and
    signature are refused by the OS, in processes of their own as two Unix users of one group, while
    his own submission works, the controller's `request list` shows both proven, and ana's is still
    run by its id (the release's check before Prefect) and moved to decided/ by the controller. An
    inbox of an earlier version (no bit) is named with its fix by a command of someone who may not
    fix it, and gains the bit at its owner's (or root's) next command."""
    import tempfile

    from typer.testing import CliRunner

    from dprelease.cli.app import app
    from dprelease.requests import inbox
    from dprelease.settings import Settings

    root = Path(tempfile.mkdtemp(prefix="two-analysts-"))  # pytest's own folder is root's alone (0700)
    try:
        os.chmod(root, 0o755)
        env = {"DPRELEASE_HOME": str(root / "home"), "DPRELEASE_KEY_DIR": str(root / "keys"),
               "PATH": os.environ["PATH"], "PYTHONDONTWRITEBYTECODE": "1"}
        for args in (["init"], ["analyst", "key", "ana", "--private-key", str(root / "ana.pem")],
                     ["analyst", "key", "bob", "--private-key", str(root / "bob.pem")]):
            assert CliRunner().invoke(app, args, env=env).exit_code == 0
        settings = Settings.from_env(env)
        for folder, _, files in [*os.walk(root / "home"), *os.walk(root / "keys")]:  # the controller's, as `init` made
            for path in [folder, *(os.path.join(folder, name) for name in files)]:
                os.chown(path, CONTROLLER_UID, CONTROLLER_UID)
        for uid, analyst in ((ANA_UID, "ana"), (BOB_UID, "bob")):
            os.chown(root / f"{analyst}.pem", uid, ANALYSTS_GID)
        settings.inbox_dir.mkdir(exist_ok=True)  # the guide's set-up: the analysts' group may write the inbox,
        os.chown(settings.inbox_dir, CONTROLLER_UID, ANALYSTS_GID)  # here as an earlier version left it (no bit)
        os.chmod(settings.inbox_dir, stat.S_IMODE(settings.inbox_dir.stat().st_mode) & ~stat.S_ISVTX | stat.S_IRWXG)
        unfixed = _as_user(ANA_UID, CLI, ["request", "list"], _analyst_side(env), root)  # she may not fix it
        assert unfixed.returncode == 0 and unfixed.stdout.replace("\n", "").count(
            f"without the sticky bit: any analyst could delete or rename another's request; run `chmod +t "
            f"{settings.inbox_dir}` as its owner or root") == 1, unfixed.stdout
        assert inbox.folder_problems(settings) == []  # the owner's (here root's) next command sets the bit
        assert settings.inbox_dir.stat().st_mode & 0o7777 == 0o1775

        ana = _submit_as(ANA_UID, "ana", root, env)
        theirs = [settings.inbox_dir / f"{ana}.json", settings.inbox_dir / f"{ana}.sig"]
        assert all(not path.stat().st_mode & 0o022 for path in theirs), "ana's files are writable by others"
        attempts = _as_user(BOB_UID, OTHERS_ATTEMPTS, [str(settings.inbox_dir), *map(str, theirs)], env, root)
        assert attempts.returncode == 0, attempts.stderr
        assert set(json.loads(attempts.stdout).values()) == {"refused"}, f"bob changed ana's request: {attempts.stdout}"
        bob = _submit_as(BOB_UID, "bob", root, env)

        listed = _as_user(CONTROLLER_UID, CLI, ["request", "list"], env, root)
        assert listed.returncode == 0, listed.stderr
        for request_id in (ana, bob):
            assert [line for line in listed.stdout.splitlines() if request_id in line and "with their key" in line], \
                listed.stdout
        assert "REFUSED" not in listed.stdout and "sticky" not in listed.stdout, listed.stdout
        released = _as_user(CONTROLLER_UID, RELEASE_AND_DECIDE, [ana], env, root)
        assert released.returncode == 0 and released.stdout.split() == ["ana"], released.stderr
        assert sorted(p.name for p in (settings.inbox_dir / "decided").iterdir()) == [f"{ana}.json", f"{ana}.sig"]
    finally:
        shutil.rmtree(root)
