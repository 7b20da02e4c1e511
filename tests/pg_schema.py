"""Fresh, empty schemas of the test PostgreSQL (DPRELEASE_TEST_PG_URL, which .ci/run sets) for the
stores of tests; a test asking for one is skipped without it."""

from __future__ import annotations

import os
import uuid

import pytest

PG_ENV = "DPRELEASE_TEST_PG_URL"


def fresh_schema(prefix: str, why: str = "PostgreSQL tests") -> tuple[str, str]:
    """A new schema named `prefix` and a random suffix, and the store URL that uses it; skips the
    test, saying that `why` needs DPRELEASE_TEST_PG_URL, when it is not set."""
    from sqlalchemy import create_engine, make_url, text

    url = os.environ.get(PG_ENV)
    if not url:
        pytest.skip(f"{why} need {PG_ENV}, e.g. postgresql+psycopg://user:pw@127.0.0.1:5432/db")
    schema = f"{prefix}{uuid.uuid4().hex[:12]}"
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    engine.dispose()
    scoped = make_url(url).update_query_dict({"options": f"-csearch_path={schema}"})
    return schema, scoped.render_as_string(hide_password=False)


def drop_schema(schema: str) -> None:
    """Remove a schema made by fresh_schema, with everything in it."""
    from sqlalchemy import create_engine, text

    engine = create_engine(os.environ[PG_ENV])
    with engine.begin() as conn:
        conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
    engine.dispose()
