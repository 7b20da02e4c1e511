"""A controller's signed decision counts only for what it was signed for (dprelease.decisions.check,
the verifier every pause of a release runs): the release, the question (one release asks several:
approve, run the utility evaluation on the output without noise, release its signal), the decision,
the controller report's fingerprint and the registered key of the controller it names. A genuine
token replayed with any one of them different is refused; so is a token whose signed content was
edited afterwards. The flow-level replay of an approval as the utility signal's is in test_utility.py."""

from __future__ import annotations

import dataclasses
import json

import pytest

FINGERPRINT = "a" * 64  # the controller report the decision was made on
ASKED = {"release_id": "r-1", "question": "approval-r-1", "fingerprint": FINGERPRINT, "above_tolerance": False,
         "form_decision": "approve", "form_controller": "alice"}


@pytest.fixture(scope="module")
def controllers(tmp_path_factory):
    """A home's store with two registered controllers, alice and bob; their private keys."""
    from dprelease import decisions
    from dprelease.reporting import signing
    from dprelease.settings import Settings
    from dprelease.store import Store

    home = tmp_path_factory.mktemp("home")
    settings = Settings.from_env({"DPRELEASE_HOME": str(home)})
    settings.ensure_dirs()
    keys = tmp_path_factory.mktemp("keys")
    for name in ("alice", "bob"):
        decisions.create_controller(settings, name, keys / f"{name}.pem")
    return Store(settings.store_url), {n: signing.load_private_key(keys / f"{n}.pem") for n in ("alice", "bob")}


def signed(key, **changes) -> str:
    """alice's approval of release r-1's first question about the report FINGERPRINT, changed as given."""
    from dprelease import decisions

    fields = {"release_id": "r-1", "question": "approval-r-1", "decision": "approve", "controller": "alice",
              "report_fingerprint": FINGERPRINT, "decided_at": "2026-11-29T01:00:00+00:00", **changes}
    return decisions.sign(decisions.Decision(**fields), key)


def verdict(store, token: str, **asked):
    from dprelease import decisions

    return decisions.check(store, token, **{**ASKED, **asked})


def test_the_genuine_decision_counts_for_exactly_what_it_was_signed_for(controllers):
    store, keys = controllers
    decision = verdict(store, signed(keys["alice"]))
    assert (decision.release_id, decision.question, decision.decision, decision.controller,
            decision.report_fingerprint) == ("r-1", "approval-r-1", "approve", "alice", FINGERPRINT)
    rejected = verdict(store, signed(keys["bob"], controller="bob", decision="reject"), form_decision="reject",
                       form_controller="bob")
    assert (rejected.decision, rejected.controller) == ("reject", "bob")


#: each binding, as (what the genuine token is signed for, what the run asks instead, the refusal):
#: one thing differs, everything else is as signed
REPLAYS = {
    # the same question's wording, another release: only the release id tells them apart
    "another release": ({}, {"release_id": "r-2"}, "for release r-1 (approval-r-1), not for r-2 (approval-r-1)"),
    # the same release: its approval replayed as the approval to compute f(raw output) ...
    "approval as utility run": ({}, {"question": "utility-run-r-1"}, "not for r-1 (utility-run-r-1)"),
    # ... as the approval to release it ...
    "approval as utility release": ({}, {"question": "utility-release-r-1"}, "not for r-1 (utility-release-r-1)"),
    # ... and the approval to compute it replayed as the approval to release it
    "utility run as utility release": ({"question": "utility-run-r-1"}, {"question": "utility-release-r-1"},
                                       "(utility-run-r-1), not for r-1 (utility-release-r-1)"),
    # a later pause of the same question (the run asks again after a refusal: key approval-r-1-1)
    "question asked again under another key": ({}, {"question": "approval-r-1-1"}, "not for r-1 (approval-r-1-1)"),
    "another report": ({}, {"fingerprint": "b" * 64}, "another version of the controller report"),
    "a reject sent as an approve": ({"decision": "reject"}, {"form_decision": "approve"},
                                    "the form says 'approve' but the signed decision says 'reject'"),
    "an approve sent as a reject": ({}, {"form_decision": "reject"},
                                    "the form says 'reject' but the signed decision says 'approve'"),
    "signed by bob, sent as alice's": ({"controller": "bob"}, {"form_controller": "alice"},
                                       "the form names 'alice' but the decision is signed by 'bob'"),
}


@pytest.mark.parametrize("signed_for, asked, refusal", REPLAYS.values(), ids=REPLAYS.keys())
def test_a_genuine_decision_replayed_with_one_binding_changed_is_refused(controllers, signed_for, asked, refusal):
    from dprelease import decisions

    store, keys = controllers
    key = keys[signed_for.get("controller", "alice")]
    token = signed(key, **signed_for)
    matching = {"form_decision": signed_for.get("decision", "approve"),
                "form_controller": signed_for.get("controller", "alice"),
                **{"question": q for q in [signed_for.get("question")] if q}}
    verdict(store, token, **matching)  # counts where it was meant to
    with pytest.raises(decisions.DecisionRefused) as refused:
        verdict(store, token, **{**matching, **asked})
    assert refusal in str(refused.value)


def test_a_decision_naming_a_controller_verifies_only_with_that_controllers_registered_key(controllers, tmp_path):
    """The registered key binds the name: alice's name over bob's signature, or over a key nobody
    registered, is refused; so is a name nobody registered, whatever key signed it."""
    from dprelease import decisions
    from dprelease.reporting import signing

    store, keys = controllers
    with pytest.raises(decisions.DecisionRefused, match="does not verify with the registered key of 'alice'"):
        verdict(store, signed(keys["bob"]))
    signing.generate_keypair(tmp_path / "stray.pem", tmp_path / "stray.pub.pem")
    stray = signing.load_private_key(tmp_path / "stray.pem")
    with pytest.raises(decisions.DecisionRefused, match="does not verify with the registered key of 'alice'"):
        verdict(store, signed(stray))
    with pytest.raises(decisions.DecisionRefused, match="not a controller's decision"):
        verdict(store, signed(stray, controller="carol"), form_controller="carol")


@pytest.mark.parametrize("field, value", [
    ("release_id", "r-2"), ("question", "utility-run-r-1"), ("decision", "reject"), ("controller", "bob"),
    ("report_fingerprint", "b" * 64), ("decided_at", "2026-11-30T01:00:00+00:00"), ("reason", "fine"),
    ("risk_override", "accepted"),
])
def test_a_signed_decision_edited_after_signing_is_refused(controllers, field, value):
    """Every field is under the signature: the payload of alice's genuine token edited (and the run
    asking for exactly the edited content) no longer verifies."""
    from dprelease import decisions

    store, keys = controllers
    prefix, payload, signature = signed(keys["alice"]).split(".")
    content = json.loads(decisions._unb64(payload))
    assert field in content and set(content) == {f.name for f in dataclasses.fields(decisions.Decision)}
    content[field] = value
    edited = ".".join([prefix, decisions._b64(json.dumps(content, sort_keys=True, separators=(",", ":")).encode()),
                       signature])
    asked = {"release_id": content["release_id"], "question": content["question"],
             "fingerprint": content["report_fingerprint"], "form_decision": content["decision"],
             "form_controller": content["controller"]}
    with pytest.raises(decisions.DecisionRefused, match="does not verify with the registered key"):
        verdict(store, edited, **asked)


@pytest.mark.parametrize("profile", [{"risk": 0.3083, "max_risk": 0.2}, {"risk": 0.4449, "max_risk": "low"},
                                     {"risk": 0.9, "max_risk": 0.35}])
def test_an_approval_refused_for_its_risk_writes_the_risk_as_the_summary_does(profile):
    """The refusal of an approval above the tolerable risk without an override (the CLI's --approve-as, a
    pasted decision) words the risk as the summary's warning does: it once said "risk 0.308, tolerable 0.2"
    below a summary's "0.31 (above your tolerable 0.2)"."""
    from dprelease import decisions

    with pytest.raises(decisions.DecisionRefused) as refused:
        decisions.require_override("this release", profile, "")
    written = decisions.risk_written(profile)
    assert f"its risk is {written};" in str(refused.value) and written in decisions.risk_notice(profile)
    assert "(above your tolerable " in written


def test_a_process_deciding_with_controllers_keys_loads_no_webauthn(tmp_path):
    """A release and `dprelease approve` decide with controllers' keys: the modules of their path
    (the flow, the terminal's decisions) and a key-signed decision checked there load no py_webauthn
    (50-100 ms at every command's start); a passkey's token (dpw1) still goes to the passkey check,
    which refuses an unknown passkey in one line."""
    import subprocess
    import sys
    import textwrap
    from pathlib import Path

    from patience import PATIENCE_S

    code = textwrap.dedent(f"""
        import sys
        from pathlib import Path
        import dprelease.cli.deciding, dprelease.flows.release, dprelease.flows.approvals
        from dprelease import decisions
        from dprelease.reporting import signing
        from dprelease.settings import Settings
        from dprelease.store import Store
        settings = Settings.from_env({{"DPRELEASE_HOME": {str(tmp_path / "home")!r}}})
        settings.ensure_dirs()
        decisions.create_controller(settings, "alice", Path({str(tmp_path / "alice.pem")!r}))
        key = signing.load_private_key(Path({str(tmp_path / "alice.pem")!r}))
        fields = {{"release_id": "r-1", "question": "approval-r-1", "decision": "approve", "controller": "alice",
                   "report_fingerprint": {FINGERPRINT!r}, "decided_at": "2026-11-29T01:00:00+00:00"}}
        store = Store(settings.store_url)
        decision = decisions.check(store, decisions.sign(decisions.Decision(**fields), key), **{ASKED!r})
        print(decision.controller, "webauthn" in sys.modules)
        try:
            decisions.authenticated(store, "dpw1.e30.e30")
        except decisions.DecisionRefused as err:
            print("refused:", err)
    """)
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                          timeout=PATIENCE_S, env={**__import__("os").environ, "PYTHONPATH": str(root)})
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[0] == "alice False", done.stdout
    assert len(lines) == 2 and lines[1].startswith("refused: this passkey is not registered here"), done.stdout
