"""A moto S3 server process on a free port of 127.0.0.1, for the tests of what the platform keeps
in an object store (the escrow, the shared archive); stopped by its PID afterwards."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from contextlib import contextmanager

import pytest
from patience import PATIENCE_S


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def moto_server():
    """Yield the AWS variables (endpoint, test credentials, region) that point s3fs at a new moto
    server process; the process is stopped when the block ends."""
    port = free_port()
    log = open(os.devnull, "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=log, stderr=log)
    deadline = time.monotonic() + PATIENCE_S  # a bound only a hung server reaches; ends when it listens
    try:
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=5).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the moto S3 server did not start") from None
                time.sleep(0.2)
        yield {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_ACCESS_KEY_ID": "test",
               "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1"}
    finally:
        proc.terminate()
        proc.wait()
        log.close()


@pytest.fixture(scope="module")
def s3_server():
    """A moto S3 server process for a test module (import this fixture into the module)."""
    with moto_server() as env:
        yield env


def new_bucket(s3_env: dict, monkeypatch, prefix: str):
    """A new bucket named `prefix-<random>` on the server, with the AWS variables s3fs reads set
    for the test; returns its fsspec filesystem and its name."""
    import secrets

    import fsspec

    for name, value in s3_env.items():
        monkeypatch.setenv(name, value)
    fs = fsspec.filesystem("s3", skip_instance_cache=True)
    name = f"{prefix}-{secrets.token_hex(4)}"
    fs.mkdir(name)
    return fs, name
