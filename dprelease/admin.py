"""Setting up the platform: `init` (directories, keys, store) and dataset registration (escrow)."""

from __future__ import annotations

import io
from pathlib import Path

from . import checks, escrow
from .reporting import signing
from .settings import Settings
from .store import Store


def init(settings: Settings) -> list[str]:
    """Create the home, the escrow key, the signing key pair and the store; keep what exists."""
    settings.ensure_dirs()
    done = []
    if settings.escrow_key is None and not settings.escrow_key_file.exists():
        escrow.load_or_create_key(settings, create=True)
        done.append(f"escrow key created: {settings.escrow_key_file}")
    if not settings.signing_key_file.exists():
        signing.generate_keypair(settings.signing_key_file, settings.public_key_file)
        done.append(f"signing key pair created: {settings.signing_key_file} (public: {settings.public_key_file})")
    Store(settings.store_url).create_all()
    done.append(f"store ready: {settings.store_url}")
    return done


#: the risk profile when the controller gives none (risk.md): a sensitive yes/no attribute, data of
#: medium sensitivity, a recipient of low trust, a tolerable risk of 0.2
DEFAULT_RISK_PROFILE = {"sensitivity": "medium", "trust": "low", "n": 2, "max_risk": 0.2}


def register_dataset(settings: Settings, name: str, path: Path, privacy_unit: str | None, epsilon_cap: float,
                     delta_cap: float = 1e-5, expectations: list[dict] | None = None, add_row_id: bool = False,
                     risk_profile: dict | None = None):
    """Encrypt the file into the escrow, record its fingerprint, schema, caps and checks.

    add_row_id: the file has one row per person and no id; the unit column is added as the row
    number, in memory, and the result (Parquet) is what gets sealed. risk_profile: sensitivity,
    trust, n (values of the sensitive attribute), max_risk: the numbers behind the noise-against-
    risk chart of every controller summary (defaults: DEFAULT_RISK_PROFILE). privacy_unit None
    registers a public table (no one's rows: DP SQL may join it and outer queries may read it; it
    is never charged); it is stored with an empty unit."""
    from dp_core import risk

    profile = {**DEFAULT_RISK_PROFILE, **(risk_profile or {})}
    for field in ("sensitivity", "trust", "max_risk"):
        risk.level_value(profile[field])  # refuses unknown levels before anything is sealed
    public = not privacy_unit
    if public and add_row_id:
        raise escrow.EscrowError("a public dataset has no privacy unit: drop --add-row-id")
    key = escrow.load_or_create_key(settings, create=False)
    if add_row_id:
        frame = escrow.parse_bytes(Path(path).read_bytes(), escrow.file_format_of(Path(path)))
        if privacy_unit in frame.columns:
            raise escrow.EscrowError(f"{path} already has a column {privacy_unit!r}: drop --add-row-id")
        frame.insert(0, privacy_unit, range(len(frame)))
        buffer = io.BytesIO()
        frame.to_parquet(buffer, index=False)
        blob, fingerprint, file_format = escrow.seal_bytes(buffer.getvalue(), "parquet", settings, key)
    else:
        blob, fingerprint, file_format = escrow.seal_file(Path(path), settings, key)
    frame = escrow.load_frame(blob, key, fingerprint, file_format)
    if not public and privacy_unit not in frame.columns:
        blob.unlink()
        raise escrow.EscrowError(f"the privacy unit column {privacy_unit!r} is not in {path} (columns: {list(frame.columns)})")
    schema = {c: str(t) for c, t in frame.dtypes.items()}
    suite = expectations if expectations is not None else [
        e for e in checks.default_expectations(frame, privacy_unit or "") if e["kwargs"].get("column", True) != ""]
    store = Store(settings.store_url)
    return store.add_dataset(name, privacy_unit=privacy_unit or "", blob_path=blob, fingerprint=fingerprint,
                             file_format=file_format, schema=schema, epsilon_cap=epsilon_cap, delta_cap=delta_cap,
                             expectations=suite, risk_profile=profile)
