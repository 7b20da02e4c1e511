"""Signed release directories: `manifest.json` lists every file of a release with its SHA-256 and
size plus the release facts; `manifest.sig` is an Ed25519 signature of the exact manifest bytes;
`public_key.pem` is the signer's public key.

Invariant: a published release verifies, and any changed byte makes verification fail. Hence the
signature files themselves are checked strictly too: the signature must be in the exact base64
form we write and the embedded key in the exact PEM form we write, so no byte of them can change
unnoticed (e.g. base64 padding bits, PEM whitespace).

- `generate_keypair`, `load_private_key`, `load_public_key`: key files (PEM).
- `sign_directory`: write the manifest, signature and public key into a release directory.
- `verify_directory`: check everything and report every problem found, each naming the file.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

MANIFEST = "manifest.json"
SIGNATURE = "manifest.sig"
PUBLIC_KEY = "public_key.pem"
FORMAT = "dprelease-manifest/1"

_RESERVED = frozenset({MANIFEST, SIGNATURE, PUBLIC_KEY})  # only at the top of a release directory
_SIGNATURE_BYTES = 64
_SHA256_HEX = re.compile(r"[0-9a-f]{64}")
_CHUNK = 1 << 20

PublicKeySource = Ed25519PublicKey | bytes | str | os.PathLike


class SigningError(Exception):
    """A usage error: bad key file, unusable directory, content that cannot be signed."""


# --- keys -------------------------------------------------------------------------------------


def generate_keypair(private_path: Path, public_path: Path) -> None:
    """Create a new Ed25519 key pair as PEM files (private: PKCS8, mode 0o600; public: SPKI).
    Refuses to overwrite an existing private key: losing it would orphan published releases."""
    private_path, public_path = Path(private_path), Path(public_path)
    if private_path.absolute() == public_path.absolute():
        raise SigningError(f"private and public key paths are the same file: {private_path}")
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    _write_new_private_file(private_path, pem)
    public_path.parent.mkdir(parents=True, exist_ok=True)
    public_path.write_bytes(public_key_pem(key.public_key()))


def generate_keypair_beside(private_path: Path) -> Path:
    """A new key pair for a person (a controller, an analyst): the private key at `private_path`
    (mode 0o600), the public key beside it as `<name>.pub.pem`, whose path is returned."""
    private_path = Path(private_path)
    public_path = private_path.with_name(private_path.name.removesuffix(".pem") + ".pub.pem")
    generate_keypair(private_path, public_path)
    return public_path


def _write_new_private_file(path: Path, data: bytes) -> None:
    """Create `path` exclusively with mode 0o600 (never readable by others, not even briefly)."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise SigningError(
            f"refusing to overwrite the existing private key {path} (move it away first if you mean to replace it)"
        ) from None
    try:
        os.fchmod(fd, 0o600)  # the umask may have removed owner bits
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
    except BaseException:
        path.unlink(missing_ok=True)
        raise


def public_key_pem(key: Ed25519PublicKey) -> bytes:
    """The canonical PEM (SubjectPublicKeyInfo) of a public key: the form published with releases."""
    return key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


def key_fingerprint(key: PublicKeySource) -> str:
    """A public key's fingerprint: "SHA256:" and the hex SHA-256 of its raw 32 bytes, in groups of
    four. Readers compare it with the one the publisher announced out of band, then pin that key."""
    raw = load_public_key(key).public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    digest = hashlib.sha256(raw).hexdigest()
    return "SHA256:" + ":".join(digest[i:i + 4] for i in range(0, len(digest), 4))


def load_private_key(path: Path) -> Ed25519PrivateKey:
    """Read an unencrypted PEM Ed25519 private key, with a clear error if missing or malformed."""
    path = Path(path)
    data = _read_key_file(path, "private")
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError, UnsupportedAlgorithm) as exc:
        raise SigningError(f"{path}: not a readable unencrypted PEM private key ({exc})") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise SigningError(f"{path}: holds a {type(key).__name__}, expected an Ed25519 private key")
    return key


def load_public_key(source: PublicKeySource) -> Ed25519PublicKey:
    """Read an Ed25519 public key from PEM bytes, or from a file (str or path); a key object is
    returned as is. Raises SigningError naming the source if missing or malformed."""
    if isinstance(source, Ed25519PublicKey):
        return source
    if isinstance(source, (bytes, bytearray)):
        return _parse_public_pem(bytes(source), "public key PEM")
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        return _parse_public_pem(_read_key_file(path, "public"), str(path))
    raise SigningError(f"cannot use a {type(source).__name__} as a public key (give PEM bytes, a path or a key)")


def _read_key_file(path: Path, kind: str) -> bytes:
    """The bytes of a key file; a missing or unreadable file is a SigningError naming it."""
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise SigningError(f"{kind} key file {path} does not exist") from None
    except OSError as exc:
        raise SigningError(f"cannot read {kind} key file {path}: {exc.strerror or exc}") from None


def _parse_public_pem(data: bytes, label: str) -> Ed25519PublicKey:
    """Parse PEM bytes as an Ed25519 public key; `label` names the source in the error."""
    try:
        key = serialization.load_pem_public_key(data)
    except (ValueError, TypeError, UnsupportedAlgorithm) as exc:
        raise SigningError(f"{label}: not a valid PEM public key ({exc})") from None
    if not isinstance(key, Ed25519PublicKey):
        raise SigningError(f"{label}: holds a {type(key).__name__}, expected an Ed25519 public key")
    return key


def _same_key(a: Ed25519PublicKey, b: Ed25519PublicKey) -> bool:
    """Whether two public keys are the same key (compared on their raw 32 bytes)."""
    raw = serialization.Encoding.Raw, serialization.PublicFormat.Raw
    return a.public_bytes(*raw) == b.public_bytes(*raw)


# --- walking a release directory ---------------------------------------------------------------


@dataclass
class _Listing:
    """What a release directory holds: regular files to sign, and entries that must not be there."""

    files: dict[str, Path] = field(default_factory=dict)  # relative POSIX path -> file
    irregular: dict[str, str] = field(default_factory=dict)  # relative POSIX path -> what it is


def _scan(directory: Path) -> _Listing:
    """List the directory recursively without following symlinks, sorted by relative path. The
    signature files at the top are left out of `files` (they cannot list themselves)."""
    listing = _Listing()
    _scan_into(directory, PurePosixPath(), listing)
    listing.files = dict(sorted(listing.files.items()))
    listing.irregular = dict(sorted(listing.irregular.items()))
    return listing


def _scan_into(folder: Path, rel: PurePosixPath, listing: _Listing) -> None:
    """Add the entries of `folder` (at `rel` inside the release) to `listing`."""
    with os.scandir(folder) as entries:
        for entry in entries:
            relpath = rel / entry.name
            kind = _entry_kind(entry)
            reserved = rel == PurePosixPath() and entry.name in _RESERVED
            if reserved and kind != "file":
                reason = "a directory, but the name is reserved for the signature files"
                listing.irregular[str(relpath)] = reason if kind == "directory" else kind
            elif reserved:
                continue
            elif kind == "directory":
                _scan_into(Path(entry.path), relpath, listing)
            elif kind == "file":
                listing.files[str(relpath)] = Path(entry.path)
            else:
                listing.irregular[str(relpath)] = kind


def _entry_kind(entry: os.DirEntry) -> str:
    """'file', 'directory', or a description of anything a release must not contain."""
    if entry.is_symlink():
        return "a symbolic link (a release must be self-contained)"
    if entry.is_dir(follow_symlinks=False):
        return "directory"
    if entry.is_file(follow_symlinks=False):
        return "file"
    return "not a regular file or directory"


def _digest(path: Path) -> tuple[str, int]:
    """SHA-256 (hex) and size of a file, read in chunks so large releases do not fill memory."""
    sha, size = hashlib.sha256(), 0
    with path.open("rb") as fh:
        while chunk := fh.read(_CHUNK):
            sha.update(chunk)
            size += len(chunk)
    return sha.hexdigest(), size


# --- signing -----------------------------------------------------------------------------------


def verify_hint(folder: str) -> str:
    """The command a reader runs to verify a published folder, named by its own name only: the
    publisher's path to it (a server's directories) is no business of the reader's page."""
    return f"dprelease verify path/to/{PurePosixPath(folder).name} --key <the publisher's public key, " \
           "obtained from the publisher>"


def sign_directory(directory: Path, facts: dict, private_key: Ed25519PrivateKey) -> dict:
    """Write manifest.json (every file's SHA-256 and size, plus `facts`), manifest.sig and
    public_key.pem into `directory`; return the manifest as written. Existing signature files are
    replaced. Refuses symlinks and other non-regular entries: a release must be self-contained."""
    directory = _release_directory(directory)
    if not isinstance(private_key, Ed25519PrivateKey):
        raise SigningError(f"expected an Ed25519PrivateKey, got {type(private_key).__name__} (use load_private_key)")
    if not isinstance(facts, dict):
        raise SigningError(f"release facts must be a dict, got {type(facts).__name__}")
    listing = _scan(directory)
    if listing.irregular:
        found = "; ".join(f"{rel}: {what}" for rel, what in listing.irregular.items())
        raise SigningError(f"refusing to sign {directory}: {found}")
    files = {rel: _file_entry(path) for rel, path in listing.files.items()}
    data = _canonical_json({"format": FORMAT, "files": files, "facts": facts})
    (directory / MANIFEST).write_bytes(data)
    (directory / SIGNATURE).write_bytes(_encode_signature(private_key.sign(data)))
    (directory / PUBLIC_KEY).write_bytes(public_key_pem(private_key.public_key()))
    return json.loads(data)


def _release_directory(directory: Path) -> Path:
    """`directory` as a Path, or a SigningError if it is not an existing directory."""
    directory = Path(directory)
    if directory.is_file():
        raise SigningError(f"{directory} is a file, not a release directory: give the folder that holds the "
                           f"release's files and its {MANIFEST} ({directory.parent})")
    if not directory.is_dir():
        raise SigningError(f"release directory {directory} does not exist or is not a directory")
    return directory


def _file_entry(path: Path) -> dict[str, Any]:
    """The manifest entry of one file."""
    sha256, size = _digest(path)
    return {"sha256": sha256, "bytes": size}


def _canonical_json(obj: Any) -> bytes:
    """Canonical JSON bytes (sorted keys, no spaces, UTF-8): the exact bytes that are signed."""
    try:
        text = json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
        return text.encode("utf-8")
    except (TypeError, ValueError) as exc:  # UnicodeEncodeError is a ValueError
        raise SigningError(f"release facts or file names cannot be written as canonical JSON: {exc}") from None


def _encode_signature(signature: bytes) -> bytes:
    """The text form of manifest.sig: standard base64 and a newline."""
    return base64.b64encode(signature) + b"\n"


# --- verifying ---------------------------------------------------------------------------------


@dataclass
class VerifyReport:
    """Outcome of `verify_directory`: `ok` only if nothing is wrong; `problems` names each file.
    `facts` are the release facts, given only when the manifest's signature is valid."""

    ok: bool
    problems: list[str] = field(default_factory=list)
    facts: dict | None = None

    def __str__(self) -> str:
        if self.ok:
            return "verified: signature and all file digests match"
        count = len(self.problems)
        lines = [f"verification FAILED ({count} problem{'s' if count != 1 else ''}):"]
        return "\n".join(lines + [f"  - {problem}" for problem in self.problems])


def verify_directory(directory: Path, public_key: PublicKeySource | None = None) -> VerifyReport:
    """Check a signed release directory and report every problem found, each naming its file.
    With `public_key` (the trusted key: PEM bytes, path or key) the embedded public_key.pem must be
    that key; without it, or given a key file shipped with the publication (shipped_with), the embedded key
    is used, which only proves integrity, not authorship."""
    directory = _release_directory(directory)
    trusted = None if public_key is None or shipped_with(directory, public_key) else load_public_key(public_key)
    problems: list[str] = []
    manifest_bytes = _read_reserved(directory, MANIFEST, problems)
    manifest = None if manifest_bytes is None else _parse_manifest(manifest_bytes, problems)
    key = _verification_key(directory, trusted, problems)
    signed = _check_signature(directory, manifest_bytes, key, trusted is not None, problems)
    listing = _scan(directory)
    problems.extend(f"{rel}: {what}" for rel, what in listing.irregular.items())
    if manifest is not None:
        problems.extend(_file_problems(manifest["files"], listing))
    facts = manifest["facts"] if manifest is not None and signed else None
    return VerifyReport(ok=not problems, problems=problems, facts=facts)


def shipped_with(directory: Path, public_key: PublicKeySource) -> bool:
    """Whether the key given as trusted is a file shipped with the publication: inside the release's
    folder (its public_key.pem), or the public_key.pem beside the releases (the publication root's,
    a folder above it). Whoever altered the files could have replaced it too: it establishes no signer."""
    if not isinstance(public_key, (str, os.PathLike)):
        return False
    key, folder = Path(public_key).resolve(), Path(directory).resolve()
    return key.is_relative_to(folder) or any(key == above / PUBLIC_KEY for above in folder.parents)


def _read_reserved(directory: Path, name: str, problems: list[str], why: str = "") -> bytes | None:
    """The bytes of a signature file at the top of the release, or None with a problem noted.
    A non-regular entry under that name gives None silently: the directory scan reports it."""
    path = directory / name
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        problems.append(f"{name}: missing{why}")
        return None
    if not stat.S_ISREG(mode):
        return None
    try:
        return path.read_bytes()
    except OSError as exc:
        problems.append(f"{name}: cannot be read ({exc.strerror or exc})")
        return None


def _parse_manifest(data: bytes, problems: list[str]) -> dict | None:
    """The manifest as a dict if it is well-formed JSON of our format, else None with problems."""
    try:
        manifest = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        problems.append(f"{MANIFEST}: not valid UTF-8 JSON ({exc})")
        return None
    found = manifest.get("format") if isinstance(manifest, dict) else type(manifest).__name__
    if found != FORMAT:
        problems.append(f"{MANIFEST}: wrong format {found!r} (expected {FORMAT!r})")
        return None
    shape = _manifest_shape_problems(manifest)
    problems.extend(shape)
    return None if shape else manifest


def _manifest_shape_problems(manifest: dict) -> list[str]:
    """What is malformed in the 'files' and 'facts' of a manifest (empty if nothing)."""
    files, facts = manifest.get("files"), manifest.get("facts")
    if not isinstance(files, dict):
        return [f"{MANIFEST}: 'files' is not an object"]
    problems = [f"{MANIFEST}: malformed entry for {rel!r}" for rel, entry in files.items() if not _valid_entry(entry)]
    if not isinstance(facts, dict):
        problems.append(f"{MANIFEST}: 'facts' is not an object")
    return problems


def _valid_entry(entry: Any) -> bool:
    """Whether a manifest file entry has a hex SHA-256 and a non-negative integer size."""
    return (
        isinstance(entry, dict)
        and isinstance(entry.get("sha256"), str)
        and _SHA256_HEX.fullmatch(entry["sha256"]) is not None
        and type(entry.get("bytes")) is int
        and entry["bytes"] >= 0
    )


def _verification_key(
    directory: Path, trusted: Ed25519PublicKey | None, problems: list[str]
) -> Ed25519PublicKey | None:
    """The key to check the signature with: the trusted key if given (and the embedded one must
    match it), else the embedded public_key.pem. None if there is no usable key."""
    why = " (the signer's public key is published with the release)" if trusted else " (no key to verify with)"
    pem = _read_reserved(directory, PUBLIC_KEY, problems, why)
    embedded = None if pem is None else _embedded_key(pem, problems)
    if trusted is None:
        return embedded
    if embedded is not None and not _same_key(embedded, trusted):
        problems.append(f"{PUBLIC_KEY} is not the trusted key")
    return trusted


def _embedded_key(pem: bytes, problems: list[str]) -> Ed25519PublicKey | None:
    """Parse the release's public_key.pem; it must be byte-for-byte the PEM the signer wrote."""
    try:
        key = _parse_public_pem(pem, PUBLIC_KEY)
    except SigningError as exc:
        problems.append(str(exc))
        return None
    if public_key_pem(key) != pem:
        problems.append(f"{PUBLIC_KEY}: not in the exact form the signer wrote (changed after signing)")
    return key


def _check_signature(
    directory: Path, manifest: bytes | None, key: Ed25519PublicKey | None, trusted: bool, problems: list[str]
) -> bool:
    """Whether manifest.sig is a valid signature of the manifest bytes by `key`; notes problems."""
    text = _read_reserved(directory, SIGNATURE, problems)
    signature = None if text is None else _decode_signature(text, problems)
    if signature is None or manifest is None or key is None:
        return False
    try:
        key.verify(signature, manifest)
    except InvalidSignature:
        whose = "the trusted key" if trusted else f"the key in {PUBLIC_KEY}"
        problems.append(f"{SIGNATURE}: signature does not match {MANIFEST} (checked with {whose})")
        return False
    return True


def _decode_signature(text: bytes, problems: list[str]) -> bytes | None:
    """The raw signature from manifest.sig, which must be exactly the base64 text we write (so
    that no byte of it, not even a base64 padding bit, can change unnoticed)."""
    try:
        signature = base64.b64decode(text.removesuffix(b"\n"), validate=True)
    except (binascii.Error, ValueError):
        problems.append(f"{SIGNATURE}: not valid base64")
        return None
    if len(signature) != _SIGNATURE_BYTES:
        problems.append(f"{SIGNATURE}: holds {len(signature)} bytes, an Ed25519 signature has {_SIGNATURE_BYTES}")
        return None
    if _encode_signature(signature) != text:
        problems.append(f"{SIGNATURE}: not in the exact base64 form the signer wrote (changed after signing)")
        return None
    return signature


def _file_problems(listed: dict[str, dict], listing: _Listing) -> list[str]:
    """Per-file problems, sorted by path: missing, resized, changed, or not in the manifest.
    Only files found by the scan are read, so manifest paths never reach outside the release."""
    found: list[tuple[str, str]] = []
    for rel, entry in listed.items():
        path = listing.files.get(rel)
        if path is None:
            if rel not in listing.irregular:  # irregular entries are reported by the scan
                found.append((rel, f"{rel}: missing (deleted after signing)"))
            continue
        problem = _entry_problem(rel, entry, path)
        if problem:
            found.append((rel, problem))
    found.extend(
        (rel, f"{rel}: not in the manifest (added after signing)") for rel in listing.files if rel not in listed
    )
    return [problem for _, problem in sorted(found)]


def _entry_problem(rel: str, entry: dict, path: Path) -> str | None:
    """What differs between one file and its manifest entry (None if it matches)."""
    try:
        sha256, size = _digest(path)
    except OSError as exc:
        return f"{rel}: cannot be read ({exc.strerror or exc})"
    if size != entry["bytes"]:
        return f"{rel}: size changed ({entry['bytes']} bytes signed, {size} now)"
    if sha256 != entry["sha256"]:
        return f"{rel}: SHA-256 differs (changed after signing)"
    return None
