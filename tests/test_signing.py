"""Signed release directories: a signed release verifies, and any changed, added or removed byte
or file makes verification fail with a problem naming the file."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import stat
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from dprelease.reporting.signing import (
    FORMAT,
    MANIFEST,
    PUBLIC_KEY,
    SIGNATURE,
    SigningError,
    VerifyReport,
    generate_keypair,
    load_private_key,
    load_public_key,
    public_key_pem,
    sign_directory,
    verify_directory,
)

FACTS = {"release": "adult-2024", "epsilon": 1.5, "statistics": ["count", "mean"], "note": "Zürich — ok"}
CONTENT = {
    "data.csv": b"age,count\n30,120\n40,95\n",
    "report.html": "<html><body>Bericht für Zürich</body></html>".encode(),
    "sub/table.csv": b"a,b\n1,2\n3,4\n",
    "sub/deeper/notes.txt": b"released under DP\n",
    "sub/manifest.json": b'{"not": "the release manifest"}',  # reserved names only matter at the top
}
SIGNED_FILES = sorted([*CONTENT, MANIFEST, SIGNATURE, PUBLIC_KEY])


# --- helpers and fixtures ----------------------------------------------------------------------


@pytest.fixture
def keys(tmp_path: Path) -> tuple[Path, Path]:
    """A fresh key pair on disk: (private, public)."""
    private, public = tmp_path / "keys" / "release.key", tmp_path / "keys" / "release.pub.pem"
    generate_keypair(private, public)
    return private, public


def make_release(root: Path, private: Path, name: str = "release") -> Path:
    """A signed release directory with the files of CONTENT."""
    directory = root / name
    for rel, data in CONTENT.items():
        (directory / rel).parent.mkdir(parents=True, exist_ok=True)
        (directory / rel).write_bytes(data)
    sign_directory(directory, FACTS, load_private_key(private))
    return directory


@pytest.fixture
def release(tmp_path: Path, keys: tuple[Path, Path]) -> Path:
    return make_release(tmp_path, keys[0])


def flip_byte(path: Path, index: int | None = None) -> None:
    """Change one byte of a file (xor 0x01), by default the middle one."""
    data = bytearray(path.read_bytes())
    index = len(data) // 2 if index is None else index
    data[index] ^= 0x01
    path.write_bytes(bytes(data))


def problems_naming(report: VerifyReport, rel: str) -> list[str]:
    return [problem for problem in report.problems if rel in problem]


def all_files(directory: Path) -> list[str]:
    return sorted(p.relative_to(directory).as_posix() for p in directory.rglob("*") if p.is_file())


# --- signing and verifying ---------------------------------------------------------------------


def test_signed_release_verifies_and_facts_round_trip(release: Path, keys: tuple[Path, Path]) -> None:
    for trusted in (None, keys[1], keys[1].read_bytes(), load_public_key(keys[1])):
        report = verify_directory(release, trusted)
        assert report.ok, str(report)
        assert report.problems == []
        assert report.facts == FACTS
        assert str(report).startswith("verified")


def test_manifest_lists_every_file_with_digest_and_size(release: Path) -> None:
    manifest = json.loads((release / MANIFEST).read_bytes())
    assert manifest["format"] == FORMAT
    assert manifest["facts"] == FACTS
    assert list(manifest["files"]) == sorted(CONTENT)
    for rel, data in CONTENT.items():
        assert manifest["files"][rel] == {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}


def test_a_file_larger_than_one_read_block_is_listed_with_its_whole_size(tmp_path: Path,
                                                                        keys: tuple[Path, Path]) -> None:
    """Files are read in blocks of 1 MiB: the manifest gives a file of three blocks and 5 bytes its whole size
    (what anyone checking the release with stat and sha256sum finds), not its last block's."""
    directory = tmp_path / "r"
    directory.mkdir()
    data = os.urandom(3 * (1 << 20) + 5)
    (directory / "rows.parquet").write_bytes(data)
    sign_directory(directory, {}, load_private_key(keys[0]))
    manifest = json.loads((directory / MANIFEST).read_bytes())
    assert manifest["files"]["rows.parquet"] == {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    assert verify_directory(directory, keys[1]).ok


def test_manifest_is_canonical_json_and_returned(tmp_path: Path, keys: tuple[Path, Path]) -> None:
    directory = tmp_path / "r"
    directory.mkdir()
    (directory / "a.txt").write_text("x")
    returned = sign_directory(directory, FACTS, load_private_key(keys[0]))
    data = (directory / MANIFEST).read_bytes()
    canonical = json.dumps(returned, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    assert data == canonical
    assert "Zürich".encode() in data  # ensure_ascii=False


def test_signature_is_base64_ed25519_of_manifest_bytes(release: Path, keys: tuple[Path, Path]) -> None:
    signature = base64.b64decode((release / SIGNATURE).read_bytes().strip(), validate=True)
    assert len(signature) == 64
    load_public_key(keys[1]).verify(signature, (release / MANIFEST).read_bytes())  # raises if invalid
    assert (release / PUBLIC_KEY).read_bytes() == keys[1].read_bytes()


def test_resigning_replaces_the_signature_files(release: Path, keys: tuple[Path, Path]) -> None:
    (release / "extra.txt").write_text("late addition")
    sign_directory(release, {"version": 2}, load_private_key(keys[0]))
    report = verify_directory(release, keys[1])
    assert report.ok, str(report)
    assert report.facts == {"version": 2}


def test_empty_file_signs_and_a_new_byte_fails(tmp_path: Path, keys: tuple[Path, Path]) -> None:
    directory = tmp_path / "r"
    directory.mkdir()
    (directory / "empty.txt").write_bytes(b"")
    sign_directory(directory, {}, load_private_key(keys[0]))
    assert verify_directory(directory).ok
    (directory / "empty.txt").write_bytes(b"\0")
    assert problems_naming(verify_directory(directory), "empty.txt")


# --- tampering ---------------------------------------------------------------------------------


def test_tamper_list_covers_every_file(release: Path) -> None:
    assert all_files(release) == SIGNED_FILES


@pytest.mark.parametrize("rel", SIGNED_FILES)
def test_flipping_a_byte_of_any_file_fails_and_names_it(tmp_path: Path, keys: tuple[Path, Path], rel: str) -> None:
    release = make_release(tmp_path, keys[0])
    flip_byte(release / rel)
    for trusted in (None, keys[1]):
        report = verify_directory(release, trusted)
        assert not report.ok
        assert problems_naming(report, rel), str(report)
        assert report.facts is None or rel not in (MANIFEST, SIGNATURE)
    if rel == MANIFEST:
        assert any("signature does not match manifest.json" in p for p in report.problems)
    if rel == PUBLIC_KEY:  # the trusted key still validates the signature; the embedded key is wrong
        assert problems_naming(report, PUBLIC_KEY)
        assert any("not the trusted key" in p or "not a valid" in p or "exact form" in p for p in report.problems)


@pytest.mark.parametrize("rel", [MANIFEST, SIGNATURE, PUBLIC_KEY])
def test_every_single_byte_of_the_signature_files_matters(release: Path, keys: tuple[Path, Path], rel: str) -> None:
    path = release / rel
    original = path.read_bytes()
    for index in range(len(original)):
        flip_byte(path, index)
        for trusted in (None, keys[1]):
            report = verify_directory(release, trusted)
            assert not report.ok, f"byte {index} of {rel} changed unnoticed"
            assert problems_naming(report, rel), str(report)
            if rel == MANIFEST:
                assert any("signature does not match manifest.json" in p for p in report.problems)
        path.write_bytes(original)
    assert verify_directory(release, keys[1]).ok


def test_added_file_is_reported(release: Path) -> None:
    (release / "sub" / "new.txt").write_text("sneaked in")
    report = verify_directory(release)
    assert report.problems == ["sub/new.txt: not in the manifest (added after signing)"]


def test_deleted_file_is_reported(release: Path) -> None:
    (release / "sub" / "table.csv").unlink()
    report = verify_directory(release)
    assert not report.ok
    assert report.problems == ["sub/table.csv: missing (deleted after signing)"]


def test_truncated_file_is_reported(release: Path) -> None:
    path = release / "data.csv"
    path.write_bytes(path.read_bytes()[:5])
    report = verify_directory(release)
    assert not report.ok
    assert report.problems == [f"data.csv: size changed ({len(CONTENT['data.csv'])} bytes signed, 5 now)"]


def test_same_size_change_reports_digest(release: Path) -> None:
    flip_byte(release / "sub" / "deeper" / "notes.txt")
    report = verify_directory(release)
    assert report.problems == ["sub/deeper/notes.txt: SHA-256 differs (changed after signing)"]


def test_every_problem_is_reported_not_just_the_first(release: Path) -> None:
    (release / "added.txt").write_text("new")
    (release / "report.html").unlink()
    flip_byte(release / "data.csv")
    (release / SIGNATURE).unlink()
    report = verify_directory(release)
    assert not report.ok
    assert report.facts is None  # no valid signature: facts are not trustworthy
    for rel in ("added.txt", "report.html", "data.csv", SIGNATURE):
        assert problems_naming(report, rel), str(report)
    assert f"{len(report.problems)} problems" in str(report)


def test_a_deleted_file_does_not_hide_a_changed_file_listed_after_it(release: Path) -> None:
    """The manifest's first file deleted and its last one changed: verification goes on past the
    missing file and reports both, in path order."""
    (release / "data.csv").unlink()
    flip_byte(release / "sub" / "table.csv")
    report = verify_directory(release)
    assert report.problems == ["data.csv: missing (deleted after signing)",
                               "sub/table.csv: SHA-256 differs (changed after signing)"]


def test_missing_signature_files_are_reported(release: Path) -> None:
    for name in (MANIFEST, SIGNATURE, PUBLIC_KEY):
        (release / name).unlink()
    report = verify_directory(release)
    assert [p.split(":")[0] for p in report.problems] == [MANIFEST, PUBLIC_KEY, SIGNATURE]
    assert all("missing" in p for p in report.problems)


def test_missing_public_key_is_reported_even_with_a_trusted_key(release: Path, keys: tuple[Path, Path]) -> None:
    (release / PUBLIC_KEY).unlink()
    report = verify_directory(release, keys[1])
    assert len(report.problems) == 1 and report.problems[0].startswith(f"{PUBLIC_KEY}: missing")


def test_manifest_not_json_or_wrong_format(release: Path) -> None:
    (release / MANIFEST).write_bytes(b"{not json")
    report = verify_directory(release)
    assert any(p.startswith(f"{MANIFEST}: not valid") for p in report.problems)
    assert any("signature does not match manifest.json" in p for p in report.problems)
    (release / MANIFEST).write_bytes(json.dumps({"format": "other/9", "files": {}, "facts": {}}).encode())
    assert any("wrong format 'other/9'" in p for p in verify_directory(release).problems)


def test_signature_not_base64(release: Path) -> None:
    (release / SIGNATURE).write_bytes(b"!!! not base64 !!!\n")
    assert f"{SIGNATURE}: not valid base64" in verify_directory(release).problems


def test_a_signature_with_one_character_outside_base64_is_refused_as_not_base64(release: Path) -> None:
    """A character outside the base64 alphabet inside an otherwise valid signature is refused as
    such, not skipped over by the decoder."""
    text = (release / SIGNATURE).read_bytes()
    (release / SIGNATURE).write_bytes(text[:10] + b"*" + text[10:])
    assert f"{SIGNATURE}: not valid base64" in verify_directory(release).problems


# --- keys --------------------------------------------------------------------------------------


def test_a_key_pair_is_written_into_new_nested_directories(tmp_path: Path) -> None:
    private, public = tmp_path / "private" / "a" / "release.key", tmp_path / "public" / "b" / "c" / "release.pub.pem"
    generate_keypair(private, public)
    assert private.is_file() and public.read_bytes().startswith(b"-----BEGIN PUBLIC KEY-----")


def test_other_trusted_key_fails(release: Path, tmp_path: Path) -> None:
    other_private, other_public = tmp_path / "other" / "k", tmp_path / "other" / "k.pub"
    generate_keypair(other_private, other_public)
    report = verify_directory(release, other_public)
    assert not report.ok
    assert "public_key.pem is not the trusted key" in report.problems
    assert any("signature does not match manifest.json" in p for p in report.problems)


def test_resigned_by_an_attacker_fails_against_the_trusted_key(release: Path, keys: tuple[Path, Path]) -> None:
    (release / "data.csv").write_text("age,count\n30,999\n")
    sign_directory(release, FACTS, Ed25519PrivateKey.generate())
    assert verify_directory(release).ok  # self-consistent, but signed by someone else
    report = verify_directory(release, keys[1])
    assert not report.ok
    assert "public_key.pem is not the trusted key" in report.problems


def test_replaced_embedded_key_is_not_the_trusted_key(release: Path, keys: tuple[Path, Path]) -> None:
    (release / PUBLIC_KEY).write_bytes(public_key_pem(Ed25519PrivateKey.generate().public_key()))
    report = verify_directory(release, keys[1])
    assert report.problems == ["public_key.pem is not the trusted key"]
    assert any("signature does not match" in p for p in verify_directory(release).problems)


def test_generate_keypair_refuses_overwrite_and_sets_mode(keys: tuple[Path, Path]) -> None:
    private, public = keys
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    before = private.read_bytes()
    with pytest.raises(SigningError, match="refusing to overwrite"):
        generate_keypair(private, public.with_name("new.pub.pem"))
    assert private.read_bytes() == before
    assert not public.with_name("new.pub.pem").exists()
    assert _same_public(load_private_key(private), load_public_key(public))


def _same_public(private: Ed25519PrivateKey, public) -> bool:
    return public_key_pem(private.public_key()) == public_key_pem(public)


def test_generate_keypair_ignores_a_permissive_umask(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        generate_keypair(tmp_path / "k", tmp_path / "k.pub")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "k").stat().st_mode) == 0o600


def test_key_loading_errors_name_the_problem(tmp_path: Path, keys: tuple[Path, Path]) -> None:
    with pytest.raises(SigningError, match="does not exist"):
        load_private_key(tmp_path / "nope.key")
    with pytest.raises(SigningError, match="does not exist"):
        load_public_key(tmp_path / "nope.pem")
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n")
    with pytest.raises(SigningError, match=r"garbage\.pem: not a readable"):
        load_private_key(garbage)
    with pytest.raises(SigningError, match="not a valid PEM public key"):
        load_public_key(b"hello")
    with pytest.raises(SigningError, match="not a valid PEM public key"):
        load_public_key(keys[0])  # a private key is not a public key
    with pytest.raises(SigningError, match="cannot use a int"):
        load_public_key(42)  # type: ignore[arg-type]


def test_verify_with_a_malformed_trusted_key_is_a_usage_error(release: Path) -> None:
    with pytest.raises(SigningError, match="public key PEM"):
        verify_directory(release, b"not a key")


# --- what cannot be signed ---------------------------------------------------------------------


def test_symlinked_file_is_refused_at_signing(tmp_path: Path, keys: tuple[Path, Path]) -> None:
    directory = tmp_path / "r"
    directory.mkdir()
    (tmp_path / "outside.txt").write_text("not part of the release")
    (directory / "link.txt").symlink_to(tmp_path / "outside.txt")
    with pytest.raises(SigningError, match=r"link\.txt: a symbolic link"):
        sign_directory(directory, FACTS, load_private_key(keys[0]))
    assert not (directory / MANIFEST).exists()


def test_symlinked_directory_and_reserved_name_symlink_are_refused(tmp_path: Path, keys: tuple[Path, Path]) -> None:
    directory = tmp_path / "r"
    (directory / "sub").mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    (directory / "sub" / "dir").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    (directory / MANIFEST).symlink_to(tmp_path / "elsewhere" / "m.json")
    with pytest.raises(SigningError) as info:
        sign_directory(directory, FACTS, load_private_key(keys[0]))
    assert "sub/dir: a symbolic link" in str(info.value)
    assert f"{MANIFEST}: a symbolic link" in str(info.value)
    assert not (tmp_path / "elsewhere" / "m.json").exists()


def test_symlink_added_after_signing_is_reported(release: Path) -> None:
    (release / "sub" / "link").symlink_to(release / "data.csv")
    report = verify_directory(release)
    assert not report.ok
    assert problems_naming(report, "sub/link")


def test_signing_usage_errors(tmp_path: Path, keys: tuple[Path, Path]) -> None:
    key = load_private_key(keys[0])
    with pytest.raises(SigningError, match="does not exist or is not a directory"):
        sign_directory(tmp_path / "missing", FACTS, key)
    (tmp_path / "r").mkdir()
    with pytest.raises(SigningError, match="canonical JSON"):
        sign_directory(tmp_path / "r", {"epsilon": float("nan")}, key)
    with pytest.raises(SigningError, match="expected an Ed25519PrivateKey"):
        sign_directory(tmp_path / "r", FACTS, keys[0])  # type: ignore[arg-type]
    with pytest.raises(SigningError, match="does not exist or is not a directory"):
        verify_directory(tmp_path / "missing")
    (tmp_path / "r" / "index.html").write_text("<html></html>")  # the report's page given for its folder
    with pytest.raises(SigningError, match=rf"index.html is a file, not a release directory: give the folder .* \({tmp_path / 'r'}\)$"):
        verify_directory(tmp_path / "r" / "index.html")


def test_verify_report_text_counts_its_problems() -> None:
    """The report reads as it should for one problem and for several (the CLI prints it as is)."""
    assert str(VerifyReport(True)) == "verified: signature and all file digests match"
    assert str(VerifyReport(False, ["a.csv: digest mismatch"])) == (
        "verification FAILED (1 problem):\n  - a.csv: digest mismatch")
    assert str(VerifyReport(False, ["a", "b"])) == "verification FAILED (2 problems):\n  - a\n  - b"
    assert str(VerifyReport(False, [])) == "verification FAILED (0 problems):"


def test_key_fingerprint_is_the_grouped_sha256_of_the_raw_key(keys: tuple[Path, Path]) -> None:
    """The fingerprint a publisher announces out of band: SHA256 of the raw 32-byte key, hex in
    groups of four; the same from the key object, the PEM bytes and the PEM file."""
    from cryptography.hazmat.primitives import serialization

    from dprelease.reporting.signing import key_fingerprint

    public = load_public_key(keys[1])
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    digest = hashlib.sha256(raw).hexdigest()
    expected = "SHA256:" + ":".join(digest[i:i + 4] for i in range(0, 64, 4))
    assert key_fingerprint(public) == key_fingerprint(keys[1]) == key_fingerprint(public_key_pem(public)) == expected
    assert len(expected) == len("SHA256:") + 16 * 4 + 15
    other = Ed25519PrivateKey.generate().public_key()
    assert key_fingerprint(other) != expected


def test_decisions_recorded_at_once_are_all_kept_and_never_read_torn(tmp_path):
    """Several approvals of one release recorded from threads at once (utility signaling asks three),
    with a reader polling the file meanwhile: every decision is kept, and no read sees a torn file."""
    import threading

    from dprelease import decisions
    from dprelease.settings import Settings

    settings = Settings.from_env({"DPRELEASE_HOME": str(tmp_path / "home")})
    writers = 8
    errors: list[BaseException] = []
    done = threading.Event()

    def write(i: int) -> None:
        for k in range(25):
            decisions.record(settings, "r1", {"decision": "approve", "by": f"c{i}", "n": k}, None)

    def read() -> None:
        while not done.is_set():
            try:
                decisions.recorded(settings, "r1")
            except BaseException as err:  # noqa: BLE001 - a torn read is the failure under test
                errors.append(err)
                return

    reader = threading.Thread(target=read)
    reader.start()
    threads = [threading.Thread(target=write, args=(i,)) for i in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    done.set()
    reader.join()
    assert errors == []
    history = decisions.recorded(settings, "r1")
    assert len(history) == writers * 25
    assert {(h["by"], h["n"]) for h in history} == {(f"c{i}", k) for i in range(writers) for k in range(25)}


def test_a_key_pair_is_made_where_no_directory_exists_yet(tmp_path):
    """A key pair generated into a fresh home: every missing directory above each key is made."""
    private, public = tmp_path / "home" / "keys" / "release.key", tmp_path / "pub" / "release.pub.pem"
    generate_keypair(private, public)
    assert private.exists() and public.exists()
    assert stat.S_IMODE(private.stat().st_mode) == 0o600


def test_a_missing_public_key_says_whether_a_trusted_key_was_given(release: Path, keys: tuple[Path, Path]) -> None:
    """Without a trusted key, a release missing its public key cannot be verified at all; with one,
    the key is still missing from what was published. The problem says which."""
    (release / PUBLIC_KEY).unlink()
    assert verify_directory(release).problems[0] == f"{PUBLIC_KEY}: missing (no key to verify with)"
    assert verify_directory(release, keys[1]).problems == [
        f"{PUBLIC_KEY}: missing (the signer's public key is published with the release)"]


def test_a_new_private_key_s_directory_is_private_to_its_owner(tmp_path: Path) -> None:
    """generate_keypair creates the private key's missing directories readable by the owner only,
    whatever the umask."""
    old = os.umask(0)
    try:
        generate_keypair(tmp_path / "secrets" / "signing" / "release.key", tmp_path / "release.pub.pem")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "secrets" / "signing").stat().st_mode) == 0o700


def test_a_public_key_that_is_not_pem_is_refused_naming_what_it_was_given(tmp_path: Path) -> None:
    with pytest.raises(SigningError) as caught:
        load_public_key(b"not a key")
    assert str(caught.value).startswith("public key PEM: not a valid PEM public key (")


def test_a_reserved_name_taken_by_a_directory_and_a_missing_public_key_file_are_refused_word_for_word(
        tmp_path: Path, keys: tuple[Path, Path]) -> None:
    """A directory at the top of a release under a signature file's name is refused as such (nothing is
    signed); a public key file that does not exist is named as the public key file."""
    directory = tmp_path / "r"
    (directory / MANIFEST).mkdir(parents=True)
    (directory / "data.csv").write_bytes(b"a\n1\n")
    with pytest.raises(SigningError) as info:
        sign_directory(directory, FACTS, load_private_key(keys[0]))
    assert str(info.value) == (f"refusing to sign {directory}: {MANIFEST}: a directory, but the name is reserved for "
                               "the signature files")
    missing = tmp_path / "nope.pem"
    with pytest.raises(SigningError) as info:
        load_public_key(missing)
    assert str(info.value) == f"public key file {missing} does not exist"


def test_a_private_key_of_another_kind_is_refused_naming_the_kind_it_holds(tmp_path: Path) -> None:
    """A readable PEM private key that is not Ed25519 (here X25519, a key-agreement key on the same
    curve, an easy mix-up): signing refuses it, and the message says which kind of key the file holds
    so the operator knows what was given instead of an Ed25519 signing key."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

    path = tmp_path / "agreement.key"
    path.write_bytes(X25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    path.chmod(0o600)
    with pytest.raises(SigningError) as caught:
        load_private_key(path)
    assert str(caught.value) == f"{path}: holds a X25519PrivateKey, expected an Ed25519 private key"


def test_a_public_key_of_another_kind_is_refused_naming_the_kind_it_holds(tmp_path: Path) -> None:
    """A readable PEM public key that is not Ed25519 (an X25519 key-agreement key): refused, from a file
    or from bytes, and the message names the kind of key it holds and where it came from."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

    pem = X25519PrivateKey.generate().public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    path = tmp_path / "agreement.pem"
    path.write_bytes(pem)
    with pytest.raises(SigningError) as caught:
        load_public_key(path)
    assert str(caught.value) == f"{path}: holds a X25519PublicKey, expected an Ed25519 public key"
    with pytest.raises(SigningError) as caught:
        load_public_key(pem)
    assert str(caught.value) == "public key PEM: holds a X25519PublicKey, expected an Ed25519 public key"


def test_a_private_key_path_that_is_missing_or_a_directory_is_refused_naming_the_private_key_file(
        tmp_path: Path) -> None:
    """A private key file that does not exist, and one that cannot be read (here a directory), are each
    named as the private key file, with the reason the system gives; a public key path likewise."""
    missing, folder = tmp_path / "gone.key", tmp_path / "folder.key"
    folder.mkdir()
    with pytest.raises(SigningError) as caught:
        load_private_key(missing)
    assert str(caught.value) == f"private key file {missing} does not exist"
    with pytest.raises(SigningError) as caught:
        load_private_key(folder)
    assert str(caught.value) == f"cannot read private key file {folder}: Is a directory"
    with pytest.raises(SigningError) as caught:
        load_public_key(folder)
    assert str(caught.value) == f"cannot read public key file {folder}: Is a directory"


def test_signing_with_something_other_than_a_private_key_is_refused_naming_what_was_given(
        tmp_path: Path, keys: tuple[Path, Path]) -> None:
    """A key file's path, or the public half of the key, given where the Ed25519 private key belongs:
    refused before anything is written, the message naming the type that was given."""
    directory = tmp_path / "r"
    directory.mkdir()
    (directory / "data.csv").write_bytes(CONTENT["data.csv"])
    for given, name in ((keys[0], type(keys[0]).__name__),
                        (load_private_key(keys[0]).public_key(), "Ed25519PublicKey")):
        with pytest.raises(SigningError) as caught:
            sign_directory(directory, FACTS, given)
        assert str(caught.value) == f"expected an Ed25519PrivateKey, got {name} (use load_private_key)"
    assert sorted(p.name for p in directory.iterdir()) == ["data.csv"]
