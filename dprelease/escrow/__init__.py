"""The escrow: registered datasets kept encrypted at rest and decrypted only into memory for a
release, never to a plaintext file. It owns the escrow key (`keys`: from the environment or a 0600
key file kept apart from the data) and the encrypted blobs (`blobs`: sealing a file as Parquet
through `stream`'s chunked AEAD, reading it back as Arrow batches; legacy Fernet blobs still read).
"""

from .blobs import (
    BATCH_ROWS,
    BLOB_SUFFIX,
    SUFFIX_FORMATS,
    EscrowRows,
    SealedBlob,
    SourceReader,
    file_fingerprint,
    file_format_of,
    fingerprint,
    load_frame,
    open_batches,
    open_blob,
    parse_bytes,
    read_source,
    seal_file,
    seal_source,
)
from .errors import EscrowError
from .keys import KEY_HINT, load_or_create_key

__all__ = [
    "BATCH_ROWS",
    "BLOB_SUFFIX",
    "KEY_HINT",
    "SUFFIX_FORMATS",
    "EscrowError",
    "EscrowRows",
    "SealedBlob",
    "SourceReader",
    "file_fingerprint",
    "file_format_of",
    "fingerprint",
    "load_frame",
    "load_or_create_key",
    "open_batches",
    "open_blob",
    "parse_bytes",
    "read_source",
    "seal_file",
    "seal_source",
]
