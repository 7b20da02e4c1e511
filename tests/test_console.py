"""The console over real HTTP (uvicorn) on a real store, archive and Prefect API: passkey enrolment
and sign-in, sessions, CSRF and roles, and the passkey-signed decision that resumes a paused release,
with every refusal the issue lists: refused, nothing published, nothing spent, one clear message.
People sign in with software passkeys (passkey_device.py); tests/test_console_browser.py drives Chromium."""

from __future__ import annotations

import json
import os
import re
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest
from console_harness import Browser, console_server, enrolment_link
from test_release_flow import start_release, wait_for_approval


@pytest.fixture(scope="module")
def platform_env(tmp_path_factory):
    """A fresh home with Adult registered (cap 10, tolerable risk 0.5), a Prefect API for the module."""
    from fresh_home import fresh_home_with_prefect

    from dprelease import admin, decisions

    with fresh_home_with_prefect(tmp_path_factory.mktemp("home")) as settings:
        data = Path(__file__).resolve().parents[1] / "examples" / "data" / "adult.csv.gz"
        admin.register_dataset(settings, "adult", data, "person_id", epsilon_cap=10, add_row_id=True,
                               risk_profile={"max_risk": 0.5})
        keys = tmp_path_factory.mktemp("controller-keys")
        decisions.create_controller(settings, "carol", keys / "carol.pem")  # the command line's key path
        os.environ["DPRELEASE_TEST_CONTROLLER_KEYS"] = str(keys)
        yield settings


@pytest.fixture(scope="module")
def console(platform_env):
    with console_server(platform_env) as origin:
        yield origin


@pytest.fixture(scope="module")
def people_in(platform_env, console):
    """alice and bob (controllers) and ana (analyst), each enrolled with a passkey and signed in."""
    signed_in = {}
    for name, role in (("alice", "controller"), ("bob", "controller"), ("ana", "analyst")):
        browser = Browser(console)
        assert browser.enrol(enrolment_link(platform_env, name, role)).status_code == 200
        signed_in[name] = browser
    return signed_in


def paused_release(platform_env, **params):
    """A release whose run is paused for a controller's decision: (release, thread, box)."""
    from dprelease.flows.approvals import wait_until_paused
    from dprelease.pipeline import Platform

    store = Platform.open(platform_env).store
    known = {r.id for r in store.list_releases()}
    thread, box = start_release(approval_timeout=600, **params)
    rel = wait_for_approval(store, known, thread=thread, box=box)
    wait_until_paused(rel.flow_run_id)
    return rel, thread, box


def untouched(platform_env, rel) -> None:
    """Refused: the run still waits, its budget is still only reserved, nothing is published."""
    from dprelease.store import Store

    store = Store(platform_env.store_url)
    assert store.get_release(rel.id).status == "awaiting_approval"
    assert store.ledger_entry(rel.id).status == "reserved"
    assert not (platform_env.publication_dir / rel.id).exists()


def one_line(response) -> str:
    message = response.json()["error"]
    assert "\n" not in message and "Traceback" not in message
    return message


def test_enrolment_signs_in_and_a_passkey_signs_in_again(platform_env, console):
    browser = Browser(console)
    answer = browser.enrol(enrolment_link(platform_env, "dora", "controller"))
    assert answer.status_code == 200, answer.text
    session = browser.cookies["dpc_session"]
    assert browser.get("/inbox").status_code == 200
    # the cookie: secure, HTTP-only, SameSite=Strict, expiring; the store keeps only its hash
    again = Browser(console, browser.device)
    signed_in = again.sign_in()
    cookie = signed_in.headers["set-cookie"]
    assert all(part in cookie for part in ("HttpOnly", "Secure", "SameSite=strict", "Max-Age="))
    from dprelease.store import Store, people

    store = Store(platform_env.store_url)
    assert people.session_of(store, session).person == "dora"
    with store.engine.connect() as connection:
        stored = [row[0] for row in connection.exec_driver_sql("SELECT token_sha256 FROM console_sessions")]
    assert session not in stored and people.sha256(session) in stored
    # a session that expired is no session
    old = people.open_session(store, people.get_person(store, "dora"), ttl=timedelta(seconds=-1))
    late = Browser(console)
    late.cookies["dpc_session"] = old
    assert late.get("/inbox").status_code == 303 and late.post("/signout", form={}).status_code == 403
    # a cross-site POST starting a ceremony without the pre-session token is refused too
    answer = Browser(console).post("/signin/options", csrf="")
    assert answer.status_code == 403 and "no valid CSRF token" in one_line(answer)
    # a copy of the passkey whose counter lags (a cloned authenticator) does not sign in
    browser.device.counter = 0
    answer = Browser(console, browser.device).sign_in()
    assert answer.status_code == 401 and "does not verify" in one_line(answer)
    # signing out ends the session on the server, not only in the browser
    assert again.get("/inbox").status_code == 200
    assert again.post("/signout", form={}).status_code == 303
    assert again.get("/inbox").status_code == 303


def test_expired_and_used_enrolment_links_are_refused(platform_env, console):
    from dprelease.store import Store, people

    expired = enrolment_link(platform_env, "eve", "controller", ttl=timedelta(seconds=-1))
    answer = Browser(console).enrol(expired)
    assert answer.status_code == 410 and "has expired" in answer.text
    link = enrolment_link(platform_env, "fay", "analyst")
    first, second = Browser(console), Browser(console)
    words = " ".join(first.get(link[link.index("/enrol/"):]).text.split())
    assert "registered as an <strong>analyst</strong>" in words and "decisions" not in words  # an analyst decides nothing
    assert first.enrol(link).status_code == 200
    answer = second.enrol(link)
    assert answer.status_code == 410 and "already used" in answer.text
    assert len(people.passkeys_of(Store(platform_env.store_url), "fay")) == 1
    assert "dpc_session" not in second.cookies


def test_two_enrolments_racing_with_one_link_register_one_passkey(platform_env, console):
    """Both browsers got past the page and the options; exactly one registers its passkey."""
    from dprelease.store import Store, people

    link = enrolment_link(platform_env, "gus", "controller")
    path = "/enrol/" + link.rsplit("/", 1)[-1]
    browsers = [Browser(console), Browser(console)]
    credentials = []
    for b in browsers:
        b.get(path)
        credentials.append(b.device.create(b.post(f"{path}/options").json()["options"]))
    answers = [None, None]

    def finish(i):
        answers[i] = browsers[i].post(f"{path}/finish", {"credential": credentials[i]})

    threads = [threading.Thread(target=finish, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(a.status_code for a in answers) == [200, 410]
    assert len(people.passkeys_of(Store(platform_env.store_url), "gus")) == 1


def test_roles_sessions_and_csrf_are_enforced_on_the_server(platform_env, console, people_in):
    rel, thread, box = paused_release(platform_env, title="Roles")
    nobody = Browser(console)
    # no session: pages send to sign-in, state changes are refused
    assert nobody.get("/inbox").status_code == 303
    assert nobody.get(f"/releases/{rel.id}").headers["location"].startswith("/signin")
    answer = nobody.post(f"/releases/{rel.id}/decision/options", {"decision": "approve"})
    assert answer.status_code == 401 and "sign in first" in one_line(answer)
    # an analyst's session on every controller route: refused, and no controller number shown
    ana = people_in["ana"]
    for path in ("/inbox", f"/releases/{rel.id}", "/budget", "/budget/adult",
                 f"/releases/{rel.id}/controller/controller.html"):
        page = ana.get(path)
        assert page.status_code == 403 and "for controllers" in page.text, path
        assert "Approve" not in page.text and "partition" not in page.text
    answer = ana.decide(rel.id, "approve")
    assert answer.status_code == 403 and "signed in as analyst 'ana'" in one_line(answer)
    # a cross-site POST without the page's CSRF token, and one from another origin with it
    alice = people_in["alice"]
    alice.get("/inbox")
    answer = alice.post(f"/releases/{rel.id}/decision/options", {"decision": "approve"}, csrf="")
    assert answer.status_code == 403 and "no valid CSRF token" in one_line(answer)
    answer = alice.post(f"/releases/{rel.id}/decision/options", {"decision": "approve"}, origin="https://evil.example")
    assert answer.status_code == 403 and "not from the console" in one_line(answer)
    answer = alice.post("/signout", form={}, csrf="forged")
    assert answer.status_code == 403
    untouched(platform_env, rel)
    # a controller sees the inbox with it: dataset, epsilon, risk; the Prefect UI's Resume dialog links its page
    inbox = alice.get("/inbox")
    assert inbox.status_code == 200 and "Roles" in inbox.text and f"/releases/{rel.id}" in inbox.text
    row = inbox.text.split(f"/releases/{rel.id}", 1)[1].split("</tr>", 1)[0]
    assert "<td>adult</td>" in row and "<td>1</td>" in row and re.search(r"<span[^>]*>\d\.\d\d</span>", row), row
    from dprelease.cli.interactive import _pause_description

    assert f"({platform_env.console_url}/releases/{rel.id})" in _pause_description(rel.flow_run_id)
    answer = alice.decide(rel.id, "reject", "not today")
    assert answer.status_code == 200, answer.text
    thread.join(180)
    assert box["result"]["status"] == "rejected"


def test_a_passkey_decision_publishes_and_verifies_like_a_key_decision(platform_env, console, people_in):
    from dprelease import decisions
    from dprelease.reporting import signing
    from dprelease.store import Store

    rel, thread, box = paused_release(platform_env, title="Approved in the console")
    alice = people_in["alice"]
    page = alice.get(f"/releases/{rel.id}")
    assert "Controller summary" in page.text and "Would be released" in page.text
    answer = alice.decide(rel.id, "approve", "numbers look right")
    assert answer.status_code == 200, answer.text
    thread.join(180)
    assert box["result"]["status"] == "published", box
    assert signing.verify_directory(platform_env.publication_dir / rel.id, platform_env.public_key_file).ok
    (entry,) = decisions.recorded(platform_env, rel.id)
    assert entry["controller"] == "alice" and entry["reason"] == "numbers look right"
    assert entry["signed_decision"].startswith("dpw1.")
    assert set(entry) == {"release_id", "question", "decision", "controller", "report_fingerprint", "decided_at",
                          "reason", "risk_override", "signed_decision"}  # as a key-signed decision's
    audit = decisions.audit(platform_env, Store(platform_env.store_url), rel.id)
    assert audit == [(True, audit[0][1])] and "alice's registered passkey" in audit[0][1]
    page = alice.get(f"/releases/{rel.id}")
    assert "Published" in page.text and "registered passkey" in page.text
    # a recorded decision altered afterwards (its reason) no longer verifies
    path = platform_env.archive_dir / rel.id / decisions.DECISION_FILE
    original = path.read_text()
    path.write_text(original.replace("numbers look right", "numbers look wrong"))
    ((ok, line),) = decisions.audit(platform_env, Store(platform_env.store_url), rel.id)
    assert not ok and "differs from what was signed" in line
    path.write_text(original)


def test_only_a_controller_s_own_passkey_makes_a_decision(platform_env, console, people_in):
    """Whoever holds the server alone cannot decide: an analyst's passkey, another controller's
    passkey naming alice, a passkey nobody registered, an unverified user: all refused by the check
    the run makes (decisions.authenticated)."""
    from passkey_device import PasskeyDevice

    from dprelease import decisions, passkeys
    from dprelease.store import Store

    store = Store(platform_env.store_url)
    content = decisions.Decision(release_id="r1", question="approval-r1", decision="approve", controller="alice",
                                 report_fingerprint="0" * 64, decided_at="2026-11-29T00:00:00+00:00")

    def made_by(device, decision=content, **options) -> str:
        payload = decisions.payload_of(decision)
        challenge = passkeys.b64url(passkeys.decision_challenge(payload))
        return passkeys.make_token(payload, device.get({"challenge": challenge}, **options))

    assert decisions.authenticated(store, made_by(people_in["alice"].device)) == content
    as_ana = decisions.Decision(**{**content.__dict__, "controller": "ana"})
    with pytest.raises(decisions.DecisionRefused, match="'ana', who is not a controller"):
        decisions.authenticated(store, made_by(people_in["ana"].device, as_ana))
    with pytest.raises(decisions.DecisionRefused, match="made with the passkey of 'bob'"):
        decisions.authenticated(store, made_by(people_in["bob"].device))
    with pytest.raises(decisions.DecisionRefused, match="not registered here"):
        decisions.authenticated(store, made_by(PasskeyDevice(console, "localhost")))
    with pytest.raises(decisions.DecisionRefused, match="does not verify"):
        decisions.authenticated(store, made_by(people_in["alice"].device, user_verified=False))
    with pytest.raises(decisions.DecisionRefused, match="does not verify"):
        decisions.authenticated(store, made_by(people_in["alice"].device, origin="https://evil.example"))


def test_the_console_s_address_must_be_a_secure_context(platform_env):
    """Passkeys need https or localhost, and an RP id the origin belongs to: said in one line, exit 2."""
    import subprocess
    import sys

    from dprelease.cli.console.server import relying_party

    assert relying_party(8400, None, None).origin == "http://localhost:8400"
    rp = relying_party(8400, "example.org", "https://console.example.org")
    assert (rp.rp_id, rp.origin) == ("example.org", "https://console.example.org")
    for origin, rp_id, words in (("http://console.example.org", None, "passkeys need https"),
                                 ("https://console.example.org", "other.org", "must be the origin's host")):
        done = subprocess.run([sys.executable, "-m", "dprelease.cli.app", "console", "--origin", origin,
                               *(["--rp-id", rp_id] if rp_id else [])], capture_output=True, text=True)
        assert done.returncode == 2 and words in done.stderr and len(done.stderr.strip().splitlines()) == 1, done


def test_replayed_stale_and_late_decisions_are_refused(platform_env, console, people_in):
    from dprelease import decisions, passkeys
    from dprelease.flows.approvals import answer as resume
    from dprelease.reporting import signing
    from dprelease.store import Store

    first, t1, b1 = paused_release(platform_env, title="First")
    second, t2, b2 = paused_release(platform_env, title="Second")
    alice = people_in["alice"]
    # an assertion made for the first release, replayed on the second's page
    options = alice.decision_options(first.id, "approve").json()
    assertion = alice.device.get(options["options"])
    answer = alice.post(f"/releases/{second.id}/decision", {"credential": assertion})
    assert answer.status_code == 409 and "does not belong to a ceremony of this page" in one_line(answer)
    # ... and handed to the second release's run directly (a console server that lies): the run refuses it
    payload = decisions.payload_of(decisions.Decision(**options["decision"]))
    token = passkeys.make_token(payload, assertion)
    refused = platform_env.archive_dir / second.id / decisions.REFUSED_FILE
    resume(second.flow_run_id, "approve", "alice", "", signed_decision=token)
    while not refused.exists():
        time.sleep(0.2)
    assert f"is for release {first.id}" in refused.read_text()
    untouched(platform_env, second)
    # a decision whose payload was changed after the passkey signed it: the assertion no longer verifies
    forged = dict(options["decision"], release_id=second.id)
    token = passkeys.make_token(decisions.payload_of(decisions.Decision(**forged)), assertion)
    with pytest.raises(decisions.DecisionRefused, match="does not verify"):
        decisions.authenticated(Store(platform_env.store_url), token)
    # an assertion made before the controller report changed
    options = alice.decision_options(first.id, "approve").json()
    controller = platform_env.archive_dir / first.id / "controller"
    (controller / "controller.html").write_text((controller / "controller.html").read_text() + "<!-- revised -->")
    signing.sign_directory(controller, {"release_id": first.id, "kind": "controller-report"},
                           signing.load_private_key(platform_env.signing_key_file))
    answer = alice.post(f"/releases/{first.id}/decision", {"credential": alice.device.get(options["options"])})
    assert answer.status_code == 409 and "another version of the controller report" in one_line(answer)
    untouched(platform_env, first)
    # a decision for a release that is not waiting
    assert alice.decide(second.id, "reject", "no").status_code == 200
    t2.join(180)
    answer = alice.decide(second.id, "approve")
    assert answer.status_code == 409 and "is Rejected, not waiting for a decision" in one_line(answer)
    assert Store(platform_env.store_url).ledger_entry(second.id).status == "refunded"
    assert not (platform_env.publication_dir / second.id).exists()
    from dprelease.cli.deciding import decide

    decide(platform_env, first.id, "reject", Path(os.environ["DPRELEASE_TEST_CONTROLLER_KEYS"]) / "carol.pem", "tidy")
    t1.join(180)


def test_two_controllers_deciding_at_once_make_exactly_one_decision(platform_env, console, people_in):
    from dprelease import decisions

    rel, thread, box = paused_release(platform_env, title="Raced")
    alice, bob = people_in["alice"], people_in["bob"]
    ready = [(alice, alice.decision_options(rel.id, "approve", "yes").json()),
             (bob, bob.decision_options(rel.id, "reject", "no").json())]
    signed = [(who, who.device.get(options["options"])) for who, options in ready]
    answers = [None, None]
    go = threading.Barrier(2)

    def send(i):
        who, credential = signed[i]
        go.wait()
        answers[i] = who.post(f"/releases/{rel.id}/decision", {"credential": credential})

    threads = [threading.Thread(target=send, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(a.status_code for a in answers) == [200, 409], [a.text for a in answers]
    loser = next(a for a in answers if a.status_code == 409)
    assert "at the same time" in one_line(loser) or "not waiting for a decision" in one_line(loser)
    thread.join(180)
    assert len(decisions.recorded(platform_env, rel.id)) == 1


def test_a_question_is_claimed_by_exactly_one_of_many_at_once(platform_env):
    """The store's claim behind "exactly one decision": of eight claims at once one wins, the others
    are told who decided; a claim given back (the run refused the decision) can be taken again."""
    from dprelease.store import Store, people

    store = Store(platform_env.store_url)
    outcomes: list = []
    go = threading.Barrier(8)

    def claim(i):
        go.wait()
        try:
            people.claim_decision(store, "r-claimed", "approval-r-claimed", f"controller{i}")
            outcomes.append("won")
        except people.ConsoleRefused as err:
            outcomes.append(str(err))

    threads = [threading.Thread(target=claim, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert outcomes.count("won") == 1 and all("at the same time" in o for o in outcomes if o != "won")
    people.drop_claim(store, "r-claimed", "approval-r-claimed")
    people.claim_decision(store, "r-claimed", "approval-r-claimed", "controller9")


def test_budgets_and_histories_show_every_release_with_its_state(platform_env, console, people_in):
    """After the releases above: the cap and what is committed, reserved and left, the spending chart,
    each release's state in words (Rejected says Rejected) and its signed reports."""
    from dprelease.store import Store

    store = Store(platform_env.store_url)
    budget = store.budget("adult")
    alice = people_in["alice"]
    page = alice.get("/budget")
    assert page.status_code == 200
    row = page.text.split('href="/budget/adult"', 1)[1].split("</tr>", 1)[0]
    cells = re.findall(r"<td>([^<]*)</td>", row)
    assert cells[:4] == ["10", f"{budget['epsilon_committed']:.4g}", f"{budget['epsilon_reserved']:.4g}",
                         f"{budget['epsilon_remaining']:.4g}"]
    history = alice.get("/budget/adult").text
    assert "<polyline" in history and f"{budget['epsilon_committed']:.4g} of 10" in history
    for rel in store.list_releases(dataset="adult"):
        line = history.split(f'href="/releases/{rel.id}"', 1)[1].split("</tr>", 1)[0]
        word = {"published": "Published", "rejected": "Rejected"}.get(rel.status)
        if word:
            assert f">{word}<" in line, (rel.status, line)
        if rel.status == "published":
            assert f"/published/{rel.id}/index.html" in line and "/controller/controller.html" in line
        if rel.status == "rejected":
            assert "(refunded)" in line


def test_a_risk_above_tolerance_asks_the_override_s_reason_on_the_page(platform_env, console, people_in):
    """Adult's default profile tolerates 0.2; epsilon 1 gives about 0.31: the page warns, approving
    without a reason for the override is refused, with one the run publishes and archives it."""
    from test_release_flow import SQL

    from dprelease import admin, decisions

    data = Path(__file__).resolve().parents[1] / "examples" / "data" / "adult.csv.gz"
    admin.register_dataset(platform_env, "risky", data, "person_id", epsilon_cap=10, add_row_id=True)
    rel, thread, box = paused_release(platform_env, dataset="risky", sql=SQL.replace("FROM adult", "FROM risky"))
    alice = people_in["alice"]
    page = alice.get(f"/releases/{rel.id}").text
    assert "above your tolerable risk" in page and "Why approve above the tolerable risk" in page
    # the summary's warning says what to do on this page, not in the Resume form ("the form has no override field")
    assert "needs your reason for the override, in <em>Why approve above the tolerable risk</em> below" in page
    assert "--override-risk" not in page and "override field" not in page
    answer = alice.decide(rel.id, "approve", "fine")
    assert answer.status_code == 400 and "needs your reason" in one_line(answer)
    # the risk reads alike on the page, in its summary and in the refusal (a refusal once said 0.308 beside 0.31)
    written = decisions.risk_written(decisions.read_context(platform_env, rel.id))
    assert written.endswith("(above your tolerable 0.2)") and page.count(written) >= 2 and written in one_line(answer)
    untouched(platform_env, rel)
    answer = alice.decide(rel.id, "approve", "fine", "aggregate table, recipient under contract")
    assert answer.status_code == 200, answer.text
    thread.join(180)
    assert box["result"]["status"] == "published", box
    (entry,) = decisions.recorded(platform_env, rel.id)
    assert entry["risk_override"] == "aggregate table, recipient under contract"
    # decided, the page no longer sends the controller to a field it no longer has
    page = alice.get(f"/releases/{rel.id}").text
    assert "Why approve above the tolerable risk" not in page and "above your tolerable risk" in page
    assert "[risk override: aggregate table, recipient under contract]" in page


def test_a_series_budget_and_history(platform_env, console, people_in):
    """A series of two monthly snapshots under one cap: its row on the budgets page, and its page with
    the periods' spending, the chart and its releases."""
    from dprelease.store import Store
    from dprelease.store import series as store_series

    store = Store(platform_env.store_url)
    store_series.add_series(store, "visits", privacy_unit="person_id", schema={"age": "BIGINT"},
                            budget_mode="series_cap", epsilon_cap=3, delta_cap=1e-5)
    for month, status in (("2026-01", "published"), ("2026-02", "rejected")):
        name = store_series.snapshot_dataset_name("visits", month)
        store.add_dataset(name, privacy_unit="person_id", blob_path="-", fingerprint="0" * 64, file_format="csv",
                          schema={"age": "BIGINT"}, epsilon_cap=3, delta_cap=1e-5)
        store_series.add_snapshot(store, "visits", month, name)
        rel = store.add_release(name, '{"title": "Visits ' + month + '"}')
        store.reserve(name, rel.id, 0.5, 1e-7)
        (store.commit if status == "published" else store.refund)(rel.id)
        store.update_release(rel.id, status=status)
    alice = people_in["alice"]
    row = alice.get("/budget").text.split('href="/budget/series/visits"', 1)[1].split("</tr>", 1)[0]
    assert "series cap (sequential)" in row and "<td>3</td>" in row and "<td>0.5</td>" in row and "<td>2.5</td>" in row
    page = alice.get("/budget/series/visits").text
    assert "one cap for all periods" in page and "2026-01: 0.5" in page and "<polyline" in page
    assert ">Published<" in page.split("Visits 2026-01", 1)[1] and ">Rejected<" in page.split("Visits 2026-02", 1)[1]
    assert people_in["ana"].get("/budget/series/visits").status_code == 403
    store_series.add_series(store, "quiet", privacy_unit="person_id", schema={"age": "BIGINT"},
                            budget_mode="series_cap", epsilon_cap=3, delta_cap=1e-5)
    assert "<dt>Periods</dt><dd>none published yet</dd>" in alice.get("/budget/series/quiet").text  # not blank
    # its signed page, published beside the releases, is on the analysts' Published page too, and served
    from dprelease.reporting import signing

    folder = platform_env.publication_dir / "series" / "visits"
    folder.mkdir(parents=True)
    (folder / "index.html").write_text("<html>every period</html>")
    (folder / "series.csv").write_text("snapshot,people\n2026-01,100\n")
    signing.sign_directory(folder, {"kind": "series", "series": "visits", "title": "Visits by month",
                                    "epsilon_total": 0.5}, signing.load_private_key(platform_env.signing_key_file))
    ana = people_in["ana"]
    row = ana.get("/published").text.split('href="/published/series/visits/index.html"', 1)[1].split("</tr>", 1)[0]
    assert "Visits by month (every period)" in row and "<td>0.5</td>" in row and "series.csv?download=1" in row
    assert ana.get("/published/series/visits/index.html").text == "<html>every period</html>"
    assert ana.get("/published/series/visits/series.csv").status_code == 200
    for path in ("/published/series/%2E%2E/index.html", "/published/series/%2E%2E/series/visits/index.html",
                 "/published/series/visits/manifest.sig"):
        assert ana.get(path).status_code == 404, path
    # a mistyped address or method: the console's page with one line (JSON to the pages' scripts), not the
    # framework's {"detail": "Not Found"}
    page = alice.get("/budgets")
    assert page.status_code == 404 and "there is no page /budgets in the console" in page.text and "<html" in page.text
    assert one_line(alice.post("/budget", {})).startswith("/budget does not answer POST")


def test_the_administrator_s_commands_for_console_people(platform_env, console, people_in):
    """Enrolment links from the command line, the lists, and bad names in one line, exit 2."""
    import subprocess
    import sys

    def run(*args):
        return subprocess.run([sys.executable, "-m", "dprelease.cli.app", *args], capture_output=True, text=True)

    done = run("analyst", "add", "hal", "--passkey")
    assert done.returncode == 0 and "expires in 24 h" in done.stdout
    assert f"{platform_env.console_url}/enrol/" in done.stdout
    listing = run("analyst", "list").stdout
    assert "ana" in listing and "1 passkey(s)" in listing and "hal" in listing and "not registered yet" in listing
    assert "alice" in run("controller", "list").stdout
    for args, words in ((("controller", "add", "ana", "--passkey"), "already registered as an analyst"),
                        (("analyst", "add", " ana"), "without surrounding spaces")):
        done = run(*args)
        assert done.returncode == 2 and words in done.stderr and len(done.stderr.strip().splitlines()) == 1, done


def test_an_analyst_s_request_in_the_controllers_inbox(platform_env, console, people_in):
    """Submitted in the console: the controllers' inbox lists it with its requester, its page says
    what it asks, that the console vouches for its analyst, and how to run it (a file dropped into the
    inbox is shown refused instead); the analyst's page says it waits, and the controllers' page refuses her."""
    ana, alice = people_in["ana"], people_in["alice"]
    ana.get("/requests")
    sent = ana.post("/requests", form={"request": "dataset: adult\ntitle: Ages by sex, please\nepsilon: {pri: {p: 50}}\n"
                                                  "sql: SELECT WITH ANONYMIZATION sex, ANON_COUNT(*, 1) AS n "
                                                  "FROM adult GROUP BY sex\n"})
    assert sent.status_code == 303
    request_id = sent.headers["location"].rsplit("=", 1)[1]
    row = alice.get("/inbox").text.split(f"/inbox/requests/{request_id}", 1)[1].split("</tr>", 1)[0]
    assert "Ages by sex, please" in row and "<td>ana</td>" in row and "chosen by the platform" in row
    page = alice.get(f"/inbox/requests/{request_id}").text
    assert "ANON_COUNT" in page and f"dprelease release {platform_env.inbox_dir / (request_id + '.json')}" in page
    assert "(signed in the console)" in page and 'id="refused"' not in page
    # a file written into the inbox by hand names ana but is nobody's: shown as such, with what to do
    dropped = platform_env.inbox_dir / "d0d0d0d0d0d0.json"
    dropped.write_text(json.dumps({"dataset": "adult", "title": "Dropped in", "epsilon": 1, "requested_by": "ana",
                                   "sql": "SELECT WITH ANONYMIZATION sex, ANON_COUNT(*, 1) AS n FROM adult GROUP BY sex"}))
    try:
        row = alice.get("/inbox").text.split("/inbox/requests/d0d0d0d0d0d0", 1)[1].split("</tr>", 1)[0]
        assert "request d0d0d0d0d0d0 of the analysts&#39; inbox is not signed" in row, row
        page = alice.get("/inbox/requests/d0d0d0d0d0d0").text
        assert "(not proven theirs)" in page and 'id="refused"' in page and "dprelease release" not in page
        assert "Dropped in" not in ana.get("/requests").text  # nor is it listed as one of hers
    finally:
        dropped.unlink()
    assert "Ages by sex, please" in ana.get("/requests").text
    assert ana.get(f"/inbox/requests/{request_id}").status_code == 403
    bad = ana.post("/requests", form={"request": "dataset: adult\nepsilon: 1\n"})
    assert bad.status_code == 400 and "give exactly one of `sql`" in bad.text
    # what its release would refuse is refused at once, as `request submit` refuses it (test_request_inbox.py)
    waiting = sorted(platform_env.inbox_dir.glob("*.json"))
    for options, asks, words in (("", "QUALIFY n > 5", "QUALIFY in a DP SELECT is not supported"),
                                 ("OPTIONS (delta = 0.5) ", "", "delta = 0.5 is above the maximum 0.001")):
        bad = ana.post("/requests", form={"request": f"dataset: adult\nepsilon: 1\nsql: SELECT WITH ANONYMIZATION "
                                                     f"{options}sex, ANON_COUNT(*, 1) AS n FROM adult GROUP BY sex {asks}\n"})
        assert bad.status_code == 400 and words in bad.text
    data_mode = ana.post("/requests", form={"request": "dataset: adult\nepsilon: {pri: {p: 0, mode: data}}\nsql: SELECT "
                                                       "WITH ANONYMIZATION sex, ANON_COUNT(*, 1) AS n FROM adult GROUP BY sex\n"})
    assert data_mode.status_code == 400 and "epsilon.pri.mode: data chooses epsilon" in data_mode.text
    assert sorted(platform_env.inbox_dir.glob("*.json")) == waiting
