"""Contribution bounding in SQL: one unit's influence is limited to C_u partitions and the stated
per-partition sensitivity; the C_u partitions a unit keeps are chosen at random, not first-come."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import dp_core as dp
from dp_core.backend import DuckDBBackend
from dp_core.bounding import build_plan
from dp_core.engine import exact_statistics

CU = 4
SEED = 987654321


def base_data(rng: np.random.Generator, units: int = 3000, partitions: int = 1000) -> pd.DataFrame:
    rows = []
    for u in range(units):
        parts = rng.choice(partitions, size=rng.integers(1, 9), replace=False)
        for p in parts:
            for _ in range(rng.integers(1, 4)):
                rows.append((u, f"p{p}", int(rng.integers(0, 51))))
    return pd.DataFrame(rows, columns=["uid", "part", "x"])


QUERY = dp.Query(
    [dp.count(upper=3), dp.sum_("x", 0, 40), dp.avg("x", 0, 40), dp.count_units(), dp.var("x", 0, 40)],
    privacy_unit="uid", group_by=("part",), epsilon=1.0, max_partitions_contributed=CU,
    public_partitions=[f"p{i}" for i in range(1000)],
)
# final column -> per-partition sensitivity D from dp-engine.md (aggregates in QUERY order; half = 20)
SENSITIVITY = {"_n_units": 1, "_a0_sum": 3, "_a1_sum": 40, "_a2_N": 1, "_a2_S": 20, "_a3_n": 1,
               "_a4_N": 1, "_a4_S": 20, "_a4_Q": 400}


def exact_sums(df: pd.DataFrame, query=QUERY, seed=SEED) -> pd.DataFrame:
    """The plan's per-partition exact sums, in value units (real components come in quanta)."""
    backend = DuckDBBackend.for_input(df)
    plan = build_plan(query, {"uid", "x"}, seed)
    out = backend.run(plan.sql).set_index("part").sort_index()
    for aplan in plan.aggregates:
        for comp in aplan.components:
            assert comp.sensitivity == SENSITIVITY.get(comp.column, comp.sensitivity)  # plan states the spec's D
            out[comp.column] = out[comp.column] * comp.quantum
    return out


def test_one_unit_with_10000_rows_moves_at_most_cu_partitions_by_at_most_d():
    rng = np.random.default_rng(1)
    base = base_data(rng)
    heavy = pd.DataFrame({"uid": 10**6, "part": [f"p{i % 1000}" for i in range(10_000)], "x": 1000})
    before = exact_sums(base)
    after = exact_sums(pd.concat([base, heavy], ignore_index=True))
    diff = (after[list(SENSITIVITY)] - before[list(SENSITIVITY)]).abs()
    changed = (diff > 0).any(axis=1)
    assert 1 <= changed.sum() <= CU  # the heavy unit is in 1,000 partitions; at most C_u are touched
    for col, d in SENSITIVITY.items():
        assert diff[col].max() <= d + 1e-9, col
        assert diff[col].sum() <= CU * d + 1e-9, col  # in total over all partitions


def _per_unit_rows(df: pd.DataFrame, query, seed) -> pd.Series:
    backend = DuckDBBackend.for_input(df)
    plan = build_plan(query, set(), seed)
    sql = plan.with_clause + "\nSELECT uid, count(*) AS kept FROM _bounded GROUP BY uid"
    return backend.run(sql).set_index("uid")["kept"]


def test_after_bounding_every_unit_keeps_min_of_cu_and_its_partitions():
    df = base_data(np.random.default_rng(2), units=2000, partitions=50)
    kept = _per_unit_rows(df, QUERY.__class__(**{**QUERY.__dict__, "public_partitions": None}), SEED)
    have = df.groupby("uid")["part"].nunique()
    assert kept.max() <= CU
    assert (kept.sort_index() == np.minimum(have, CU).sort_index()).all()


def test_the_kept_partitions_are_a_uniform_random_subset():
    """20,000 units each in p0..p7, C_u = 4: every partition is kept by about half of the units.
    Keeping the 'first' four would give 20,000 / 0. Tolerance 6 sd (false failure < 1e-8)."""
    units = 20_000
    df = pd.DataFrame({"uid": np.repeat(np.arange(units), 8), "part": np.tile([f"p{i}" for i in range(8)], units), "x": 1})
    query = dp.Query([dp.count_units()], privacy_unit="uid", group_by=("part",), epsilon=1.0,
                     max_partitions_contributed=CU, public_partitions=[f"p{i}" for i in range(8)])
    counts = exact_sums(df, query)["_n_units"]
    assert counts.sum() == units * CU
    assert (counts - units / 2).abs().max() < 6 * np.sqrt(units * 0.25)
    other = exact_sums(df, query, seed=SEED + 1)["_n_units"]
    assert not counts.equals(other)  # a new seed, a new choice


def test_public_partitions_filter_before_bounding_and_list_every_key():
    df = pd.DataFrame({"uid": [1, 1, 1, 2], "part": ["a", "z", "y", "a"], "x": [1, 2, 3, 4]})
    query = dp.Query([dp.count_units()], privacy_unit="uid", group_by=("part",), epsilon=1.0,
                     max_partitions_contributed=1, public_partitions=["a", "b"])
    sums = exact_sums(df, query)
    # unit 1's rows in z and y are not public: they must not use up its single partition
    assert sums.loc["a", "_n_units"] == 2 and sums.loc["b", "_n_units"] == 0
    r = dp.execute(query, df)
    assert list(r.table["part"]) == ["a", "b"]  # the empty public key is released too (with noise)
    assert r.delta_spent == 0.0


@pytest.mark.parametrize("portable_hash", [False, True])
def test_which_partitions_a_unit_keeps_follows_the_seed(portable_hash):
    """A unit in 20 partitions, 1 kept: the release's seed chooses which (the same seed the same one,
    eight seeds not all the same), with the engine's own hash and with the portable one."""
    df = pd.DataFrame({"uid": [1] * 20, "part": [f"p{i:02d}" for i in range(20)]})
    query = dp.Query([dp.count(upper=1)], privacy_unit="uid", group_by=("part",), epsilon=1.0,
                     max_partitions_contributed=1, public_partitions=sorted(df["part"]))

    def kept(seed: int) -> str:
        exact = exact_statistics(query, df, bounding_seed=seed, portable_hash=portable_hash).rows
        return "".join(exact.loc[exact["_n_units"] > 0, "part"])

    choices = [kept(seed) for seed in range(8)]
    assert all(len(c) == 3 for c in choices)  # one partition each
    assert kept(5) == choices[5]
    assert len(set(choices)) > 1, choices


@pytest.mark.parametrize("source", ["frame", "arrow", "csv", "csv.gz", "tsv", "tsv.gz", "parquet", "relation"])
def test_every_input_kind_gives_the_same_exact_sums(tmp_path, source):
    import duckdb
    import pyarrow as pa

    df = base_data(np.random.default_rng(3), units=300, partitions=20)
    query = dp.Query([dp.sum_("x", 0, 40), dp.count(upper=2)], privacy_unit="uid", group_by=("part",),
                     epsilon=1.0, max_partitions_contributed=2)
    reference = dp.execute(query, df, bounding_seed=SEED).controller_only.exact
    data = {"frame": lambda: df, "arrow": lambda: pa.Table.from_pandas(df)}.get(source)
    if source == "csv":
        df.to_csv(tmp_path / "d.csv", index=False)
        data = tmp_path / "d.csv"
    elif source == "csv.gz":
        df.to_csv(tmp_path / "d.csv.gz", index=False)
        data = tmp_path / "d.csv.gz"
    elif source in ("tsv", "tsv.gz"):  # tab-separated: read with a tab, not a comma
        df.to_csv(tmp_path / f"d.{source}", index=False, sep="\t")
        data = tmp_path / f"d.{source}"
    elif source == "parquet":
        df.to_parquet(tmp_path / "d.parquet")
        data = str(tmp_path / "d.parquet")
    elif source == "relation":
        con = duckdb.connect()
        con.register("t", df)
        data = con.sql("SELECT * FROM t")
    else:
        data = data()
    got = dp.execute(query, data, bounding_seed=SEED).controller_only.exact
    cols = ["part", "units", "sum_x", "count"]
    pd.testing.assert_frame_equal(
        got[cols].sort_values("part").reset_index(drop=True),
        reference[cols].sort_values("part").reset_index(drop=True), check_dtype=False,
    )


def test_the_plan_renders_for_spark_with_its_own_hash_and_cutoff():
    import sqlglot

    from dp_core.errors import UnsupportedError

    plan = build_plan(QUERY, {"x"}, SEED, dialect="spark")
    sql = plan.sql
    sqlglot.parse_one(sql, read="spark")  # valid Spark SQL
    assert "XXHASH64(XXHASH64(`uid`, `part`) ^ CAST(987654321 AS BIGINT))" in sql
    # one window pass over the per-(unit, partition) rows (Spark would recompute a CTE read twice)
    assert "COUNT(*) OVER (PARTITION BY `uid` ORDER BY _rk NULLS LAST RANGE BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS _le" in sql
    assert "WHERE _le <= 4" in sql and "_cut" not in sql and sql.count("FROM _partial") == 1
    assert "hash(" not in sql.replace("XXHASH64(", "")
    median = build_plan(dp.Query([dp.median("x", 0, 1)], privacy_unit="uid", epsilon=1.0), set(), 1, dialect="spark").sql
    sqlglot.parse_one(median, read="spark")  # quantile bins counted per partition without DuckDB's histogram()
    assert "MAP_FROM_ENTRIES(COLLECT_LIST(STRUCT(_b, _c)))" in median and "HISTOGRAM(" not in median.upper()
    assert "RAND() AS _row_draw" in median and "MIN_BY(`x`, _row_draw)" in median
    with pytest.raises(UnsupportedError, match="no SQL dialect"):
        build_plan(QUERY, set(), 1, dialect="oracle")


def test_hash_ties_at_the_cutoff_never_keep_more_than_cu(monkeypatch):
    """Force every hash to collide (a constant hash): units in more than C_u partitions then keep
    none of the tied rows, units in at most C_u keep all; nobody keeps more than C_u."""
    from dp_core import bounding

    pieces = dict(bounding.DIALECT_PIECES["duckdb"], hash="CAST(7 AS UBIGINT)")
    monkeypatch.setitem(bounding.DIALECT_PIECES, "duckdb", pieces)
    df = base_data(np.random.default_rng(4), units=500, partitions=30)
    query = dp.Query([dp.count_units()], privacy_unit="uid", group_by=("part",), epsilon=1.0, max_partitions_contributed=CU)
    kept = _per_unit_rows(df, query, SEED)
    have = df.groupby("uid")["part"].nunique()
    assert kept.max() <= CU
    assert (kept.reindex(have.index, fill_value=0) == np.where(have <= CU, have, 0)).all()


@pytest.mark.parametrize("kind", ["DATE", "TIMESTAMP", "TIMESTAMPTZ"])
def test_whether_a_release_fails_does_not_depend_on_a_row_filter_selecting_an_infinite_date_key(kind):
    """A refusal that depends on the rows a filter selects is a bit outside the mechanism. A DATE or
    TIMESTAMP 'infinity' group key (a value DuckDB stores and pandas cannot hold) ended the query with
    a conversion error only when the filter kept that row (until 2026-11-25): `where="uid = 0"` said
    whether unit 0's date is infinite. Now the whole input is refused, whatever the filter, saying why."""
    import duckdb

    relation = duckdb.connect().sql(f"SELECT i AS uid, CASE WHEN i = 0 THEN {kind} 'infinity' ELSE {kind} "
                                    "'2020-01-01' END AS d FROM range(10) t(i)")
    for where in ("uid = 0", "uid = 1"):
        q = dp.Query([dp.count(upper=1, name="n")], privacy_unit="uid", group_by=("d",), epsilon=1.0, delta=1e-6,
                     where=where)
        with pytest.raises(dp.InvalidDataError) as caught:
            dp.execute(q, relation)
        assert str(caught.value) == ("group-by column 'd' has 1 infinite date(s) or timestamp(s) ('infinity'): no "
                                     "partition can be keyed by one; drop those rows or make them missing (NULL) "
                                     "before grouping by it")
    finite = duckdb.connect().sql(f"SELECT i AS uid, {kind} '2020-01-01' AS d FROM range(10) t(i)")
    assert len(dp.execute(dp.Query([dp.count(upper=1, name="n")], privacy_unit="uid", group_by=("d",), epsilon=1.0,
                                   delta=1e-6, public_partitions=[]), finite).table) == 0


def test_every_column_the_plan_names_for_itself_is_refused_as_a_group_key_or_unit():
    """Query.validate refuses a group key or unit named like one of the plan's own columns (PLAN_COLUMN:
    a key named _n_units was read as the partition's count of units). The list is kept by hand, so this
    checks it against the plans themselves: every column name starting with "_" that the bounding plan
    (DuckDB's and Spark's window form), the automatic and per-partition bounds, the selections and MAD's
    two rounds give their rows is refused (a new internal column the list misses fails here)."""
    import sqlglot
    from sqlglot import exp

    from dp_core.query import PLAN_COLUMN
    from dp_core.selection_mad import numbered_sql, round_two_by_number_sql

    rng = np.random.default_rng(1)  # test data only
    df = pd.DataFrame({"uid": np.repeat(np.arange(3000), 3), "g": rng.integers(0, 5, 9000).astype(str),
                       "x": rng.normal(10, 3, 9000)})
    kw = dict(privacy_unit="uid", group_by=("g",), epsilon=50.0, delta=1e-6)
    queries = [dp.Query([dp.count(), dp.count_units(), dp.sum_("x", None, None), dp.avg("x", 0, 20), dp.var("x", 0, 20),
                         dp.median("x", 0, 20)], **kw),
               dp.Query([dp.sum_("x", None, None)], bounds_scope="partition", **kw),
               dp.Query([dp.count()], noise="gaussian", selection="mad", **kw),
               dp.Query([dp.count()], noise="gaussian", selection="weighted_gaussian", **kw),
               dp.Query([dp.count(upper=3)], privacy_unit="uid", group_by=("g",), epsilon=1.0, public_partitions=["0"])]
    names = set()
    for q in queries:
        stats = exact_statistics(q, df, bounding_seed=1)
        window = build_plan(stats.query, set(), 1, dialect="spark", transpile=False)
        for sql in (stats.plan.sql, window.sql, numbered_sql(stats.plan.with_clause, stats.plan.body, q),
                    round_two_by_number_sql(stats.plan.with_clause, q, [1])):
            names |= {a.alias for a in sqlglot.parse_one(sql, read="duckdb").find_all(exp.Alias)}
        names |= set(stats.rows.columns)
    internal = {n for n in names if n.startswith("_")}
    assert {"_n_units", "_rk", "_w1", "_w2", "_pid", "_a0_raw"} <= internal
    assert sorted(n for n in internal if not PLAN_COLUMN.fullmatch(n)) == []


def _reference_kept(df: pd.DataFrame, ranks: pd.DataFrame, cu: int) -> pd.DataFrame:
    """The bounding rule of dp-engine.md written in pandas, from each (unit, partition)'s keyed hash
    `_rk`: a unit keeps the pairs whose hash is below its C_u-th smallest, and those equal to it
    unless the (C_u+1)-th is equal too; said otherwise, a pair is kept iff at most C_u of its unit's
    pairs have a hash at most its own."""
    pairs = df.groupby(["uid", "part"], as_index=False).agg(n=("x", "size"), s=("x", "sum")).merge(ranks, on=["uid", "part"])
    return pairs.loc[_at_most(pairs) <= cu]


def _at_most(pairs: pd.DataFrame) -> pd.Series:
    """Per pair, how many of its unit's pairs have a hash at most its own (ties counted)."""
    order = pairs.sort_values(["uid", "_rk"], kind="stable")
    last_of_tie = order.groupby(["uid", "_rk"])["_rk"].transform("size")
    position = order.groupby("uid").cumcount() + 1
    first_of_tie = order.groupby(["uid", "_rk"]).cumcount()
    return (position - first_of_tie + last_of_tie - 1).reindex(pairs.index)


@pytest.mark.parametrize("hash_sql", [None, "CAST(hash({cols}) % 3 AS UBIGINT)"], ids=["keyed hash", "many ties"])
def test_the_plan_keeps_the_pairs_the_bounding_rule_keeps(monkeypatch, hash_sql):
    """The kept (unit, partition) pairs and the per-partition sums of the engine's plan equal a
    pandas implementation of the rule, for the release's keyed hash and for a hash with ties inside
    most units (the tie rule at the cutoff). A plan that reorganises the bounding (issue 41) must
    keep exactly these rows for the same key."""
    from dp_core import bounding

    if hash_sql is not None:
        monkeypatch.setitem(bounding.DIALECT_PIECES, "duckdb", dict(bounding.DIALECT_PIECES["duckdb"], hash=hash_sql))
    df = base_data(np.random.default_rng(5), units=1500, partitions=25)
    query = dp.Query([dp.count(upper=2), dp.sum_("x", 0, 60)], privacy_unit="uid", group_by=("part",), epsilon=1.0,
                     max_partitions_contributed=CU)
    backend = DuckDBBackend.for_input(df)
    plan = build_plan(query, {"uid", "x"}, SEED)
    rank = bounding.DIALECT_PIECES["duckdb"]["hash"].format(cols='"uid", "part"', seed=f"CAST({SEED} AS UBIGINT)")
    ranks = backend.run(f"SELECT DISTINCT uid, part, {rank} AS _rk FROM dp_input")
    expected = _reference_kept(df, ranks, CU)
    kept = backend.run(plan.with_clause + "\nSELECT uid, part FROM _bounded")
    assert sorted(map(tuple, kept.to_numpy().tolist())) == sorted(map(tuple, expected[["uid", "part"]].to_numpy().tolist()))
    sums = backend.run(plan.sql).set_index("part").sort_index()
    by_part = expected.assign(c=expected["n"].clip(upper=2), v=expected["s"].clip(0, 60)).groupby("part").agg(
        units=("uid", "size"), c=("c", "sum"), v=("v", "sum"))
    assert list(sums.index) == list(by_part.index)
    assert (sums["_n_units"] == by_part["units"]).all()
    assert (sums["_a0_sum"] == by_part["c"]).all() and (sums["_a1_sum"] == by_part["v"]).all()
    assert 0 < len(expected) < df.groupby(["uid", "part"]).ngroups  # some units lost pairs to C_u


def _plan_of_2026_11_28(ctes: tuple[str, ...], cu: int) -> str:
    """The DuckDB plan's CTEs as they were before issue 41's change (kept here as the reference):
    `_cut` kept each unit's C_u + 1 smallest hashes with min(_rk, n), `_bounded` was a LEFT JOIN
    filtered on that list; the Gaussian selections' `_deg` used the same min(_rk, n)."""
    old = []
    for cte in ctes:
        if cte.startswith("_cut AS (SELECT") and "_cutoff" in cte:
            cte = (f'_cut AS (SELECT "uid", min(_rk, {cu + 1}) AS _m, count(*) - {cu} AS _over FROM _partial '
                   f'GROUP BY "uid" HAVING count(*) > {cu})')
        elif cte.startswith("_bounded AS (SELECT _partial.* FROM _partial ANTI JOIN"):
            cte = (f'_bounded AS (SELECT _partial.* FROM _partial LEFT JOIN _cut USING ("uid") WHERE _cut._m IS NULL '
                   f"OR _partial._rk < list_extract(_cut._m, {cu}) OR (_partial._rk = list_extract(_cut._m, {cu}) "
                   f"AND list_extract(_cut._m, {cu + 1}) <> list_extract(_cut._m, {cu})))")
        old.append(cte.replace(f"list_aggregate(list(_rk), 'min', {cu + 1})", f"min(_rk, {cu + 1})"))
    assert old != list(ctes)  # the plan under test has the new form
    return "WITH " + ",\n".join(old)


def _shape(name: str, rng: np.random.Generator) -> pd.DataFrame:
    """Test data of one shape (test data only: numpy's seeded generator)."""
    if name == "at C_u":  # most units in exactly C_u partitions, some in C_u + 1, a few in fewer
        degrees = rng.choice([CU, CU, CU, CU + 1, 1, CU - 1], size=600)
        rows = [(u, f"p{p}", int(rng.integers(0, 51))) for u, d in enumerate(degrees)
                for p in rng.choice(30, size=d, replace=False) for _ in range(rng.integers(1, 3))]
        return pd.DataFrame(rows, columns=["uid", "part", "x"])
    df = base_data(rng, units=800, partitions=40)
    if name == "two keys":
        df["k2"] = rng.integers(0, 3, len(df))
    return df


SHAPES = {  # name -> (data shape, query keywords, hash SQL replacing the keyed hash or None)
    "keyed hash": ("base", {}, None),
    "many ties": ("base", {}, "CAST(hash({cols}) % 3 AS UBIGINT)"),
    "all tied": ("base", {}, "CAST(7 AS UBIGINT)"),
    "units at C_u": ("at C_u", {}, None),
    "two keys": ("two keys", {"group_by": ("part", "k2")}, None),
    "public partitions": ("base", {"public_partitions": [f"p{i}" for i in range(0, 40, 3)]}, "CAST(hash({cols}) % 5 AS UBIGINT)"),
    "weighted gaussian": ("base", {"noise": "gaussian", "selection": "weighted_gaussian", "delta": 1e-6}, None),
    "weighted gaussian, ties": ("base", {"noise": "gaussian", "selection": "weighted_gaussian", "delta": 1e-6},
                                "CAST(hash({cols}) % 3 AS UBIGINT)"),
    "partition bounds": ("base", {"bounds_scope": "partition", "aggregates": [dp.sum_("x", None, None)], "delta": 1e-6,
                                  "epsilon": 50.0}, None),  # enough for every partition's bounds
    "quantile": ("base", {"aggregates": [dp.median("x", 0, 50), dp.count(upper=2)]}, None),
}


@pytest.mark.parametrize("shape", SHAPES)
def test_the_plan_keeps_the_rows_the_plan_of_2026_11_28_kept(monkeypatch, shape):
    """Issue 41 rewrote DuckDB's bounding CTEs (an anti join on each unit's cutoff, the smallest
    hashes by list_aggregate): for the same seed the new plan keeps the same (unit, partition) rows
    as the old one, and gives the same per-partition values and dropped pairs, on each shape where
    the two could part: hash ties (some, all), units at exactly C_u, two keys, public partitions,
    the Gaussian selections' degrees, per-partition bounds and quantiles (whose per-unit value is
    a random draw: their rows are compared, not their histograms)."""
    from dp_core import bounding

    data, kw, hash_sql = SHAPES[shape]
    if hash_sql is not None:
        monkeypatch.setitem(bounding.DIALECT_PIECES, "duckdb", dict(bounding.DIALECT_PIECES["duckdb"], hash=hash_sql))
    kw = {"aggregates": [dp.count(upper=2), dp.sum_("x", 0, 40), dp.avg("x", 0, 40)], "group_by": ("part",), **kw}
    kw = {"epsilon": 1.0, **kw}
    query = dp.Query(kw.pop("aggregates"), privacy_unit="uid", max_partitions_contributed=CU, **kw)
    keys = ", ".join(query.group_by)
    for seed in (11, 12, 13):
        df = _shape(data, np.random.default_rng(seed))
        plan = exact_statistics(query, df, bounding_seed=seed).plan
        old = _plan_of_2026_11_28(plan.ctes, CU)
        backend = DuckDBBackend.for_input(df)
        kept_sql = f"\nSELECT uid, {keys} FROM _bounded ORDER BY ALL"
        new_kept, old_kept = backend.run(plan.with_clause + kept_sql), backend.run(old + kept_sql)
        pd.testing.assert_frame_equal(new_kept, old_kept)
        assert 0 < len(new_kept) < df.groupby(["uid", *query.group_by]).ngroups or shape == "public partitions"
        if shape != "quantile":
            order = f"\nORDER BY {keys} NULLS LAST"
            pd.testing.assert_frame_equal(backend.run(plan.sql + order), backend.run(old + "\n" + plan.body + order))
        else:
            dropped = "\nSELECT DISTINCT _dropped_pairs FROM (" + plan.body + ")"
            assert backend.run(plan.with_clause + dropped).equals(backend.run(old + dropped))
