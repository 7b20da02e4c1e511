"""The one settings object: where the platform keeps its state. Read from the environment once,
then passed down; no other module reads the environment.

    DPRELEASE_HOME        home directory (default ~/.dprelease): store, escrow blobs, archive
    DPRELEASE_STORE_URL   SQLAlchemy URL of the store (default: SQLite file in the home)
    DPRELEASE_ESCROW_KEY  Fernet key (urlsafe base64) for the escrow; else the key file
    DPRELEASE_ESCROW_URL  the escrow's blobs in an S3-compatible object store (s3://bucket/prefix;
                          default: <home>/escrow); its endpoint and credentials: the AWS_* variables
    DPRELEASE_ARCHIVE_URL the release archive and publications in an object store, shared by every host
                          (s3://bucket/prefix; default: <home>/archive and <home>/published only)
    DPRELEASE_KEY_DIR     where key files live (default <home>/keys; keep it off the data disk)
    DPRELEASE_CONTROLLER_KEY  the controller's own private key (signs decisions; default: none)
    DPRELEASE_SPARK_MASTER    the Spark master for external datasets, or a Spark Connect server
                              (sc://host:port/;token=...) (default: Spark's own, local[*])
    DPRELEASE_SPARK_LOGS      `on`: Spark's own logs as Spark prints them, in a session the platform
                              starts (default `off`: they quote the data, dprelease/spark_logs.py)
    DPRELEASE_ENGINE_THREADS  DuckDB threads of one release's scans (default `auto`: the idle cores, 1 to 4,
                              1 where the OS gives no load average, see ENGINE_THREADS; a whole number;
                              `all`: every core DuckDB is given)
    DPRELEASE_CONSOLE_URL     the controllers' console as browsers reach it (default http://localhost:8400):
                              the paused run's Resume dialog links to its decision page
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from .engine_threads import idle_cores, load_average, usable_cores
from .object_store import location_setting

#: DuckDB threads per release. `auto` by default: the cores that are idle when the release's scan
#: starts (the cores this process may use minus the 1-minute load average, rounded, at least 1, at
#: most 4 (engine_threads.py); one where the OS gives no load average). The engine's hash aggregates keep
#: a table per thread, so peak memory grows with threads (10M rows of the engine benchmark: 0.65 GB
#: with one thread, 0.96 GB with two), and threads bought nothing where other work held the cores:
#: on the shared 2-core machine (load 4-5, 2026-11-29) two threads were no faster at 10M rows
#: (medians 1.7-5.6 s against 1.8-2.7 s, three alternating processes each); where nothing else
#: competes, two threads took 5-13% less wall time at 10M rows, 20-35% less at 50M (docs/engine.md,
#: "Threads"). A whole number fixes the threads; `all` (None here) gives the engine every core
#: DuckDB is given.
ENGINE_THREADS = "auto"


@dataclass(frozen=True)
class Settings:
    home: Path
    store_url: str
    key_dir: Path
    escrow_key: str | None = None  # from the environment; takes precedence over the key file
    controller_key: Path | None = None  # this controller's private key (decisions are signed with it)
    spark_master: str | None = None  # where external datasets are computed (dprelease.external)
    engine_threads: int | str | None = ENGINE_THREADS  # DuckDB threads of a release's scans (None: every core)
    escrow_url: str | None = None  # blobs in an object store (s3://bucket/prefix) instead of escrow_dir
    console_url: str = "http://localhost:8400"  # the controllers' console (`dprelease console`), as browsers reach it
    archive_url: str | None = None  # archive and publications shared in an object store (dprelease.shared_archive)
    spark_logs: bool = False  # Spark's own logs printed, in a session the platform starts (dprelease.spark_logs)

    @property
    def escrow_dir(self) -> Path:
        """Encrypted dataset blobs (never plaintext)."""
        return self.home / "escrow"

    @property
    def escrow_location(self) -> Path | str:
        """Where new blobs are sealed: the object-store URL when one is set, else `escrow_dir`."""
        return self.escrow_url or self.escrow_dir

    @property
    def archive_dir(self) -> Path:
        """The controller's archive: controller reports and sealed results. Never published."""
        return self.home / "archive"

    @property
    def publication_dir(self) -> Path:
        """What the public and analysts receive: approved, signed releases and the index."""
        return self.home / "published"

    @property
    def inbox_dir(self) -> Path:
        """Requests submitted by analysts, waiting for a controller to run them."""
        return self.home / "inbox"

    @property
    def escrow_key_file(self) -> Path:
        return self.key_dir / "escrow.key"

    @property
    def signing_key_file(self) -> Path:
        return self.key_dir / "signing_ed25519.pem"

    @property
    def public_key_file(self) -> Path:
        return self.key_dir / "signing_ed25519.pub.pem"

    @classmethod
    def from_env(cls, environ: dict | None = None) -> Settings:
        env = os.environ if environ is None else environ
        home = Path(env.get("DPRELEASE_HOME", Path.home() / ".dprelease")).expanduser().resolve()
        store = env.get("DPRELEASE_STORE_URL") or f"sqlite:///{home / 'store.db'}"
        key_dir = Path(env.get("DPRELEASE_KEY_DIR", home / "keys")).expanduser().resolve()
        controller_key = env.get("DPRELEASE_CONTROLLER_KEY")
        return cls(home, store, key_dir, env.get("DPRELEASE_ESCROW_KEY") or None,
                   Path(controller_key).expanduser().resolve() if controller_key else None,
                   env.get("DPRELEASE_SPARK_MASTER") or None, _engine_threads(env.get("DPRELEASE_ENGINE_THREADS")),
                   location_setting("DPRELEASE_ESCROW_URL", env.get("DPRELEASE_ESCROW_URL"), "the escrow in <home>/escrow"),
                   console_url=(env.get("DPRELEASE_CONSOLE_URL") or cls.console_url).rstrip("/"),
                   archive_url=location_setting("DPRELEASE_ARCHIVE_URL", env.get("DPRELEASE_ARCHIVE_URL"),
                                                "the archive in <home>/archive and <home>/published"),
                   spark_logs=_spark_logs(env.get("DPRELEASE_SPARK_LOGS")))

    def threads_now(self) -> int | None:
        """The DuckDB threads for a scan starting now: the setting, or under `auto` the idle cores."""
        if self.engine_threads != "auto":
            return self.engine_threads
        return idle_cores(usable_cores(), load_average())

    def ensure_dirs(self) -> None:
        for d in (self.home, self.escrow_dir, self.archive_dir, self.publication_dir, self.key_dir):
            d.mkdir(parents=True, exist_ok=True)
        os.chmod(self.key_dir, 0o700)


def _engine_threads(value: str | None) -> int | str | None:
    """DPRELEASE_ENGINE_THREADS as a positive whole number, `auto`, or None for `all` (every core
    DuckDB is given); unset or empty: the default (`auto`)."""
    if value is None or not value.strip():
        return ENGINE_THREADS
    if value.strip().lower() == "all":
        return None
    if value.strip().lower() == "auto":
        return "auto"
    try:
        threads = int(value)
    except ValueError:
        threads = 0
    if threads < 1:
        raise ValueError(f"DPRELEASE_ENGINE_THREADS={value!r} is not a positive whole number: set it to 1, 2, ... "
                         "auto (the idle cores), or all (every core), or unset it (default auto)")
    return threads


def _spark_logs(value: str | None) -> bool:
    """DPRELEASE_SPARK_LOGS: `on` or `off` (unset or empty: off)."""
    if value is None or value.strip().lower() in ("", "off"):
        return False
    if value.strip().lower() == "on":
        return True
    raise ValueError(f"DPRELEASE_SPARK_LOGS={value!r} is neither on nor off: set it to on (Spark's own logs, which "
                     "can quote the data) or off, or unset it (default off)")
