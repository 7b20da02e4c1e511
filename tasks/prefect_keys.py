"""The keys a release gives Prefect objects (its pauses, its artifacts): Prefect 3.8 takes only
lowercase letters, digits and dashes, and a series' later snapshot is released as `<run>@<label>`."""

from __future__ import annotations

import hashlib
import re


def prefect_key(text: str) -> str:
    """`text` as a key Prefect takes: as it is when it is one; else those characters, other runs
    turned into a dash, and a digest of the whole, so that keys that differ only there (`<run>@2026-B`,
    `<run>@2026-b`) stay apart."""
    if re.fullmatch(r"[a-z0-9-]+", text):
        return text
    return f"{re.sub(r'[^a-z0-9-]+', '-', text.lower())}-{hashlib.sha256(text.encode()).hexdigest()[:12]}"


def artifact_key(kind: str, release_id: str) -> str:
    """The key of a release's artifact of `kind` (release, refused, risk, preview, published, utility):
    the kind and the start of the release id, and a series snapshot's label, so that the snapshots one
    run releases each keep their own artifact (the start of `<run>@<label>` is the run's alone)."""
    run, _, snapshot = release_id.partition("@")
    return prefect_key(f"{kind}-{run[:12].lower()}" + (f"-{snapshot}" if snapshot else ""))
