"""No published CSV holds a cell a spreadsheet would run as a formula (CSV injection, OWASP): real
releases whose group columns, group values and output names start with each of = + - @ tab and
carriage return are published through the platform's own steps, with the series page of their
series, and every cell of every CSV in the publication folder, header rows included, is read back:
text starting with one of those characters must carry the leading single quote, numbers stay numbers."""

from __future__ import annotations

import csv

import numpy as np
import pandas as pd
import pytest

#: the characters a spreadsheet reads as the start of a formula; spelled here, not imported from
#: dprelease.reporting.data_files, so that a character dropped from the product's list is noticed
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
SERIES, SNAPSHOT = "visits", "2026-01"
pytestmark = pytest.mark.filterwarnings("ignore:Glyph:UserWarning")  # a chart label holding a tab or CR


def key_column(start: str) -> str:
    return f'{start}HYPERLINK("http://x","key")'


def key_value(start: str) -> str:
    return f"{start}cmd|' /C calc'!A0"  # not a number, whatever the first character


def statistic(start: str) -> str:
    return f"{start}SUM(A1:A9)"


@pytest.fixture(scope="module")
def published(tmp_path_factory):
    """A home whose publication folder holds two releases of one snapshot of a series (one asked
    as a query spec, the series' period; one as DP SQL) and the series page."""
    from dprelease import admin, pipeline, series
    from dprelease.requests import parse_request
    from dprelease.settings import Settings
    from dprelease.store import series as store_series

    home = tmp_path_factory.mktemp("home")
    settings = Settings.from_env({"DPRELEASE_HOME": str(home)})
    admin.init(settings)
    people = np.arange(6 * 400)
    group = people % len(FORMULA_STARTS)  # every key column takes its value from the same group: 6 groups
    data = pd.DataFrame({"person_id": people, "x": (people % 11 - 5).astype(float),
                         **{key_column(c): [key_value(FORMULA_STARTS[g]) for g in group] for c in FORMULA_STARTS}})
    path = tmp_path_factory.mktemp("data") / "snapshot.parquet"
    data.to_parquet(path, index=False)
    series.register_snapshot(settings, SERIES, path, SNAPSHOT, privacy_unit="person_id", budget_mode="per_snapshot",
                             epsilon_cap=10)
    dataset = store_series.snapshot_dataset_name(SERIES, SNAPSHOT)
    platform = pipeline.Platform.open(settings)
    keys = [key_column(c) for c in FORMULA_STARTS]
    spec = {"group_by": keys, "public_partitions": [[key_value(c)] * len(keys) for c in FORMULA_STARTS],
            "aggregates": [{"kind": "count", "upper": 1, "name": statistic("=")},
                           *({"kind": "sum", "column": "x", "lower": -5, "upper": 5, "name": statistic(c)}
                             for c in FORMULA_STARTS[1:])]}
    quoted = ", ".join(f'"{k.replace(chr(34), chr(34) * 2)}"' for k in keys)
    sql = (f"SELECT WITH ANONYMIZATION {quoted}, ANON_COUNT(*, 1) AS \"{statistic('@')}\", "
           f"ANON_SUM(x, -5, 5) AS \"{statistic('-')}\" FROM \"{dataset}\" GROUP BY {quoted}")
    for release_id, request in (("spec", {"query": spec}), ("sql", {"sql": sql})):
        planned = pipeline.plan(platform, parse_request({"dataset": dataset, "epsilon": 2.0, **request}))
        decision = pipeline.choose_epsilon(platform, planned)
        platform.store.add_release(dataset, planned.request.to_json(), release_id=release_id)  # as the flows do
        if release_id == "spec":
            store_series.claim(platform.store, SERIES, SNAPSHOT, release_id)  # the series' period
        pipeline.reserve(platform, release_id, dataset, decision.epsilon, planned.query.delta)
        result = pipeline.compute_sealed(platform, release_id, planned, decision)
        pipeline.write_controller_report(platform, release_id, planned, decision, result)
        pipeline.publish(platform, release_id, planned, decision, result, approved_by="alice")
    series.publish_series_page(platform, SERIES)
    return settings.publication_dir


def csv_cells(folder) -> dict:
    """Every CSV under `folder` (its path inside it) -> its rows of cells as a spreadsheet reads them."""
    tables = {}
    for path in sorted(folder.rglob("*.csv")):
        with path.open(newline="", encoding="utf-8") as handle:
            tables[str(path.relative_to(folder))] = list(csv.reader(handle))
    return tables


def is_number(cell: str) -> bool:
    try:
        float(cell)
    except ValueError:
        return False
    return True


def test_every_published_csv_is_there_with_the_dangerous_names_and_values(published):
    """The check below sees what it must: each release's results.csv and the series' series.csv,
    each key column, group value and statistic of the releases, neutralised."""
    tables = csv_cells(published)
    assert set(tables) == {"spec/results.csv", "sql/results.csv", f"series/{SERIES}/series.csv"}, sorted(tables)
    for name, rows in tables.items():
        cells = {cell for row in rows for cell in row}
        assert {"'" + key_column(c) for c in FORMULA_STARTS} <= set(rows[0]), (name, rows[0])  # headers
        assert {"'" + key_value(c) for c in FORMULA_STARTS} <= cells, name  # values
        assert len(rows) == 1 + len(FORMULA_STARTS), name  # every group released, once
    spec_header = set(tables["spec/results.csv"][0]) & set(tables[f"series/{SERIES}/series.csv"][0])
    for start in FORMULA_STARTS:
        assert {"'" + statistic(start), "'" + statistic(start) + "_ci_low", "'" + statistic(start) + "_ci_high"} \
            <= spec_header, start
    assert {"'" + statistic("@"), "'" + statistic("-")} <= set(tables["sql/results.csv"][0])


def test_no_cell_of_any_published_csv_starts_a_formula(published):
    """Header rows included: a text cell starting with = + - @ tab or CR is written with a leading
    quote; the only cells that may start with - or + are numbers (a negative sum stays a number)."""
    tables = csv_cells(published)
    runnable = [(name, row_number, cell) for name, rows in tables.items() for row_number, row in enumerate(rows)
                for cell in row if cell.startswith(FORMULA_STARTS) and not is_number(cell)]
    assert runnable == []
    numbers = [cell for rows in tables.values() for row in rows[1:] for cell in row if is_number(cell)]
    assert any(cell.startswith("-") for cell in numbers), "negative numbers are published as numbers"
