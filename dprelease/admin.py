"""Setting up the platform: `init` (directories, keys, store) and dataset registration (escrow)."""

from __future__ import annotations

from pathlib import Path

from . import checks, escrow
from .reporting import signing
from .requests import inbox
from .settings import Settings
from .store import Store


def init(settings: Settings) -> list[str]:
    """Create the home, the escrow key, the signing key pair, the store and the analysts' inbox with
    its decided/ (sticky folders: inbox.ready_folder, also those of an earlier version; decided/ made
    now is the controller's, never an analyst's who made it first); keep what exists."""
    settings.ensure_dirs()
    for folder in (settings.inbox_dir, settings.inbox_dir / inbox.DECIDED):
        inbox.ready_folder(folder)
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


def checked_risk_profile(given: dict | None) -> dict:
    """A dataset's risk profile: the given fields over the defaults, each checked at registration as
    every release will read it (a level name or a number in [0, 1]; n, the values the sensitive
    attribute can take, a whole number from 2), so that no registered profile refuses every release."""
    from dp_core import risk
    from dp_core.errors import InvalidQueryError

    profile = {**DEFAULT_RISK_PROFILE, **(given or {})}
    for field in ("sensitivity", "trust", "max_risk"):
        try:
            risk.level_value(profile[field])  # refuses unknown levels before anything is sealed
        except InvalidQueryError as err:
            raise InvalidQueryError(f"the risk profile's {field}: {err}") from None
    n = profile["n"]
    if isinstance(n, bool) or not isinstance(n, int) or n < 2:
        raise InvalidQueryError(f"the sensitive attribute's number of possible values (--sensitive-values, the risk "
                                f"model's n) must be a whole number of at least 2 (a yes/no attribute: 2), got {n!r}")
    return profile


def _refuse_missing_units(path: Path, profile) -> None:
    """Data whose privacy unit is empty in some rows fails the first check of its own suite (a non-null
    unit), so every release of it would stop there: refused at registration instead, naming the rows."""
    if profile.unit_missing:
        raise escrow.EscrowError(
            f"{path}: the privacy unit column {profile.unit!r} is empty in {profile.unit_missing} row(s) (the first: "
            f"data row {profile.first_unit_missing}, line {profile.first_unit_missing + 1} of a CSV): every row needs "
            "the person it belongs to; fill in or remove those rows, then register again")


def register_dataset(settings: Settings, name: str, path: Path, privacy_unit: str | None, epsilon_cap: float,
                     delta_cap: float = 1e-5, expectations: list[dict] | None = None, add_row_id: bool = False,
                     risk_profile: dict | None = None):
    """Seal the file into the escrow (Parquet, chunked AEAD, streamed), record its fingerprint,
    schema, caps and checks.

    Atomic: everything that can be refused (profile, key, file type, columns, name) is refused
    before anything is written; the blob is new for this registration (never shared with another
    dataset) and is removed again if recording the dataset fails, so a failed registration leaves
    the escrow and the store as they were. add_row_id: the file has one row per person and no id;
    the unit column is added as the row number while sealing. risk_profile: sensitivity, trust, n
    (values of the sensitive attribute), max_risk: the numbers behind the noise-against-risk chart
    of every controller summary (defaults: DEFAULT_RISK_PROFILE). privacy_unit None registers a
    public table (no one's rows: DP SQL may join it and outer queries may read it; it is never
    charged); it is stored with an empty unit."""
    from dp_core import input_checks

    from . import progress
    from .store import StoreError

    input_checks.check_file(path)  # the engine's file rules, before anything is sealed
    profile = checked_risk_profile(risk_profile)
    public = not privacy_unit
    if public and add_row_id:
        raise escrow.EscrowError("a public dataset has no privacy unit: drop --add-row-id")
    key = escrow.load_or_create_key(settings, create=False)
    store = Store(settings.store_url)
    if name in {d.name for d in store.list_datasets()}:
        raise StoreError(f"dataset {name!r} is already registered: choose another name")
    path = Path(path)
    source = escrow.read_source(path)
    try:
        columns = list(source.schema.names)
        input_checks.check_column_names(columns, str(path))  # duplicate or empty names: the engine's rule
        if add_row_id and privacy_unit in columns:
            raise escrow.EscrowError(f"{path} already has a column {privacy_unit!r}: drop --add-row-id")
        if not public and not add_row_id and privacy_unit not in columns:
            raise escrow.EscrowError(f"the privacy unit column {privacy_unit!r} is not in {path} (columns: {columns})")
        size = path.stat().st_size
        with progress.track(f"fingerprint {path.name}", size, "bytes") as advance:
            fingerprint = escrow.file_fingerprint(path, advance)
    except BaseException:
        source.close()
        raise
    unit_column = privacy_unit if add_row_id else None
    schema = source.schema if unit_column is None else source.schema.insert(0, _int64_field(unit_column))
    data_profile = checks.DatasetProfile.for_schema(schema, privacy_unit)
    with progress.track(f"seal {path.name} (Parquet, encrypted)", source.total_rows, "rows") as advance:
        def observe(batch) -> None:
            data_profile.add(batch)
            advance(batch.num_rows)

        sealed = escrow.seal_source(path, source, fingerprint, settings, key, row_number_column=unit_column,
                                    on_batch=observe)
    try:
        _refuse_missing_units(path, data_profile)
        suite = expectations if expectations is not None else [
            e for e in data_profile.expectations(privacy_unit or "") if e["kwargs"].get("column", True) != ""]
        return store.add_dataset(name, privacy_unit=privacy_unit or "", blob_path=sealed.path, fingerprint=fingerprint,
                                 file_format=sealed.file_format, schema=_schema_names(sealed.schema),
                                 epsilon_cap=epsilon_cap, delta_cap=delta_cap, expectations=suite,
                                 risk_profile=profile)
    except BaseException:
        escrow.location.remove(sealed.path)  # this registration's own blob, shared with no one
        raise


def _int64_field(name: str):
    import pyarrow as pa

    return pa.field(name, pa.int64(), nullable=False)


def _schema_names(schema) -> dict[str, str]:
    """Column -> the pandas dtype name its Arrow type maps to (what the store has always held)."""
    import numpy as np

    out = {}
    for f in schema:
        try:
            out[f.name] = str(np.dtype(f.type.to_pandas_dtype()))
        except (NotImplementedError, TypeError):
            out[f.name] = "object"
    return out
