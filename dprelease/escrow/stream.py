"""Chunked authenticated encryption of escrow blobs (format v1), read back by random access.

Layout: a header, then chunks of `chunk_size` plaintext bytes (the last one shorter, possibly
empty), each AES-256-GCM ciphertext followed by its 16-byte tag.

    header = MAGIC (8) | version (1) | chunk_size (u32) | salt (16) | nonce_prefix (7)
             | fingerprint (32: SHA-256 of the registered source file) | key_check (16)

- The blob key and a header MAC key come from the escrow's Fernet key by HKDF-SHA256 with the
  blob's random salt, so every blob has its own AES key and the Fernet key file keeps working.
- Chunk i is sealed with nonce = nonce_prefix | i (u32) | final (u8) and associated data =
  header without key_check | i (u64) | final (u8): the STREAM construction (Hoang, Reyhanitabar,
  Rogaway, Vizar 2015), so a chunk changed, moved, dropped, duplicated, cut short or appended,
  or a tag changed, fails authentication at the first chunk read that is affected; the chunk
  count follows from the file size and the last chunk must carry the final flag (truncation at a
  chunk boundary or an appended chunk fails there).
- key_check is an HMAC of the header under the derived MAC key: a wrong key is told apart from
  an altered chunk, and the fingerprint in the header cannot be swapped without the key.

Readers see a seekable plaintext file (`DecryptingFile`) that decrypts one chunk at a time, so a
Parquet reader can fetch the footer and the row groups it needs; nothing is written to disk.
"""

from __future__ import annotations

import hashlib
import hmac
import io
import os
import struct
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from . import location
from .errors import EscrowError

MAGIC = b"DPESCROW"
VERSION = 1
CHUNK_SIZE = 1 << 20  # plaintext bytes per chunk (1 MiB)
TAG_SIZE = 16
_FIXED = struct.Struct(">8sBI16s7s")  # magic, version, chunk_size, salt, nonce_prefix
FIXED_SIZE = _FIXED.size
HEADER_SIZE = FIXED_SIZE + 32 + 16
_INFO = b"dprelease escrow stream v1"


def is_stream_blob(address: Path | str) -> bool:
    """Whether the blob starts with this format's magic (else it may be a legacy Fernet blob)."""
    handle, _size = location.open_for_reading(address)
    try:
        return handle.read(len(MAGIC)) == MAGIC
    finally:
        handle.close()


def _derive(fernet_key: bytes, salt: bytes) -> tuple[bytes, bytes]:
    """(AES-256 key, header MAC key) for one blob, from the escrow's Fernet key and the blob salt."""
    import base64

    secret = base64.urlsafe_b64decode(fernet_key)
    okm = HKDF(algorithm=hashes.SHA256(), length=64, salt=salt, info=_INFO).derive(secret)
    return okm[:32], okm[32:]


@dataclass(frozen=True, repr=False)
class BlobKey:
    """One blob's own keys (derived from the escrow key and that blob's salt): what a reader that
    serves one blob for a while (escrow.engine_files) holds instead of the escrow key, which opens
    every blob. It opens only a blob with this salt; any other fails its header's check."""

    salt: bytes
    aes_key: bytes
    mac_key: bytes

    def __post_init__(self) -> None:
        if (len(self.salt), len(self.aes_key), len(self.mac_key)) != (16, 32, 32):
            raise EscrowError("a blob key is a 16-byte salt, a 32-byte AES key and a 32-byte MAC key")

    def __reduce__(self):
        raise TypeError("a blob key is never pickled (it opens an escrowed dataset)")


def _nonce(prefix: bytes, index: int, final: bool) -> bytes:
    return prefix + struct.pack(">IB", index, final)


def _aad(fixed: bytes, index: int, final: bool) -> bytes:
    return fixed + struct.pack(">QB", index, final)


class EncryptingWriter:
    """A write-only binary file that encrypts what is written into `target` chunk by chunk.
    `finish()` seals the final chunk; a writer never finished leaves a blob that fails to open."""

    def __init__(self, target, fernet_key: bytes, fingerprint_hex: str, chunk_size: int = CHUNK_SIZE):
        if chunk_size < 1 or chunk_size > (1 << 31):
            raise ValueError("chunk_size must be between 1 byte and 2 GiB")
        self._out = target
        self._chunk_size = chunk_size
        salt, self._prefix = os.urandom(16), os.urandom(7)
        self._fixed = _FIXED.pack(MAGIC, VERSION, chunk_size, salt, self._prefix)
        aes_key, mac_key = _derive(fernet_key, salt)
        self._aead = AESGCM(aes_key)
        unchecked = self._fixed + bytes.fromhex(fingerprint_hex)
        self._out.write(unchecked + hmac.new(mac_key, unchecked, hashlib.sha256).digest()[:16])
        self._buffer = bytearray()
        self._index = 0
        self._written = 0
        self._finished = False
        self.closed = False

    # the file-like surface pyarrow's writers use
    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def readable(self) -> bool:
        return False

    def tell(self) -> int:
        return self._written

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True  # the sink outlives its users; finish() seals it

    def write(self, data) -> int:
        if self._finished:
            raise ValueError("the escrow blob is already sealed")
        view = memoryview(data).cast("B")
        self._buffer += view
        self._written += len(view)
        size = self._chunk_size
        if len(self._buffer) > size:  # keep the last (possibly full) chunk back for the final flag
            whole = (len(self._buffer) - 1) // size
            for k in range(whole):
                self._seal_chunk(bytes(self._buffer[k * size:(k + 1) * size]), final=False)
            del self._buffer[:whole * size]
        return len(view)

    def _seal_chunk(self, plain: bytes, final: bool) -> None:
        if self._index >= 1 << 32:
            raise EscrowError("the dataset is too large for one escrow blob (2^32 chunks)")
        nonce = _nonce(self._prefix, self._index, final)
        self._out.write(self._aead.encrypt(nonce, plain, _aad(self._fixed, self._index, final)))
        self._index += 1

    def finish(self) -> int:
        """Seal the final chunk; returns the number of chunks."""
        self._seal_chunk(bytes(self._buffer), final=True)
        self._buffer = bytearray()
        self._finished = True
        return self._index


class DecryptingFile(io.RawIOBase):
    """The plaintext of a v1 blob as a read-only seekable file; each chunk is authenticated when
    read (one decrypted chunk cached). Opening checks the key and the registered fingerprint. The
    key is the escrow's (Fernet) key or this blob's own (`BlobKey`, e.g. another reader's `blob_key`)."""

    def __init__(self, path: Path | str, key: bytes | BlobKey, expected_fingerprint: str | None):
        super().__init__()
        self.path = location.as_address(path)  # a local file or an object-store URL (ranged reads)
        self._file, size = location.open_for_reading(self.path)  # held open until close()
        header = self._file.read(HEADER_SIZE)
        if len(header) < HEADER_SIZE or not header.startswith(MAGIC):
            self._file.close()
            raise EscrowError(f"{self.path} is not an escrow blob (bad header): register the dataset again")
        _magic, version, chunk_size, salt, self._prefix = _FIXED.unpack(header[:FIXED_SIZE])
        if version != VERSION:
            self._file.close()
            raise EscrowError(f"the escrow blob {self.path} has format version {version}; this dprelease reads "
                              f"version {VERSION}: upgrade dprelease")
        self._fixed = header[:FIXED_SIZE]
        if isinstance(key, BlobKey):  # another blob's keys (another salt) fail the header's check below
            aes_key, mac_key = key.aes_key, key.mac_key
        else:
            aes_key, mac_key = _derive(key, salt)
        check = hmac.new(mac_key, header[:-16], hashlib.sha256).digest()[:16]
        if not hmac.compare_digest(check, header[-16:]):
            self._file.close()
            raise EscrowError(
                f"cannot decrypt {self.path}: wrong escrow key or the blob was altered "
                f"(check DPRELEASE_ESCROW_KEY / the key file, or register the dataset again)")
        self.fingerprint = header[FIXED_SIZE:FIXED_SIZE + 32].hex()
        if expected_fingerprint is not None and self.fingerprint != expected_fingerprint:
            self._file.close()
            raise EscrowError(f"the escrow blob {self.path} does not match the registered fingerprint "
                              "(tampered or swapped): register the dataset again")
        self.blob_key = BlobKey(salt, aes_key, mac_key)
        self._aead = AESGCM(aes_key)
        self._chunk_size = chunk_size
        body = size - HEADER_SIZE
        full = chunk_size + TAG_SIZE
        self._chunks = max(1, -(-body // full))
        last = body - (self._chunks - 1) * full
        last = max(last, TAG_SIZE)  # a last chunk too short to hold a tag fails when read
        self.size = (self._chunks - 1) * chunk_size + (last - TAG_SIZE)
        self._position = 0
        self._cached: tuple[int, bytes] | None = None
        self.chunks_read = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._position

    def seek(self, offset: int, whence: int = 0) -> int:
        base = {0: 0, 1: self._position, 2: self.size}[whence]
        self._position = max(0, base + offset)
        return self._position

    def _chunk(self, index: int) -> bytes:
        if self._cached is not None and self._cached[0] == index:
            return self._cached[1]
        final = index == self._chunks - 1
        full = self._chunk_size + TAG_SIZE
        self._file.seek(HEADER_SIZE + index * full)
        sealed = self._file.read(full)
        try:
            plain = self._aead.decrypt(_nonce(self._prefix, index, final), sealed, _aad(self._fixed, index, final))
        except InvalidTag:
            raise EscrowError(
                f"the escrow blob {self.path} failed authentication at chunk {index + 1} of {self._chunks}: "
                "it was altered, truncated, reordered or extended; restore it from a backup or register "
                "the dataset again") from None
        # a chunk before the last is read whole (chunk_size + TAG_SIZE bytes, as the size at opening says);
        # one cut short since fails authentication: the writer never seals a short chunk but the final one
        self._cached = (index, plain)
        self.chunks_read += 1
        return plain

    def readinto(self, buffer) -> int:
        view = memoryview(buffer).cast("B")
        want = min(len(view), max(0, self.size - self._position))
        done = 0
        while done < want:
            index, offset = divmod(self._position, self._chunk_size)
            plain = self._chunk(index)
            take = min(want - done, len(plain) - offset)
            if take <= 0:
                break
            view[done:done + take] = plain[offset:offset + take]
            done += take
            self._position += take
        return done

    def read(self, size: int = -1) -> bytes:
        if size is None or size < 0:
            size = max(0, self.size - self._position)
        buffer = bytearray(size)
        n = self.readinto(buffer)
        return bytes(buffer[:n])

    def verify_all(self) -> None:
        """Authenticate every chunk in order (the final one last), without keeping the plaintext."""
        for index in range(self._chunks):
            self._chunk(index)

    def close(self) -> None:
        if not self.closed:
            self._file.close()
            self._cached = None
        super().close()
