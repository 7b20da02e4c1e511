"""The escrow: registered datasets kept encrypted at rest and decrypted only into memory for a
release, never to a plaintext file. It owns the escrow key (`keys`: from the environment or a 0600
key file kept apart from the data) and the encrypted blobs (`blobs`: sealing a file, opening and
checking a blob against its fingerprint, parsing it).
"""

from .blobs import (
    BLOB_SUFFIX,
    SUFFIX_FORMATS,
    file_format_of,
    fingerprint,
    load_frame,
    open_blob,
    parse_bytes,
    seal_bytes,
    seal_file,
)
from .errors import EscrowError
from .keys import KEY_HINT, load_or_create_key

__all__ = [
    "BLOB_SUFFIX", "KEY_HINT", "SUFFIX_FORMATS", "EscrowError", "file_format_of", "fingerprint", "load_frame",
    "load_or_create_key", "open_blob", "parse_bytes", "seal_bytes", "seal_file",
]
