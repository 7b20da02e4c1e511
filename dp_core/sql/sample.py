"""Per-row samples in a DP SQL statement: `TABLESAMPLE BERNOULLI (p PERCENT)` and `TABLESAMPLE
SYSTEM (p PERCENT)` after a table or a subquery.

Both are carried through to the engine as a per-row Bernoulli(p) sample: each row of the sampled
relation is kept with probability p/100, independently of every other row. For BERNOULLI this is its
definition; SYSTEM's contract is "a random subset of about p% of the rows" (an engine may sample
blocks of rows), which a per-row sample satisfies, so SYSTEM is sampled per row too (never by
blocks: a block holds several units' rows, and adding one unit's rows moves the block boundaries).

Privacy (why the per-unit bound and every sensitivity are unchanged). Write D' = D + the rows of
one unit u (neighbouring datasets). Each row r is kept iff keep(r) holds, where keep(r) depends on
r's own content, its index among the rows identical to it, the sample's occurrence number and the
release's key, and on nothing else. Then for every key the sample of D' is the sample of D plus the
kept rows of u (a row of another unit has the same content and the same index among its identical
rows in D and in D': identical rows share their unit column, so u's rows are never identical to
another unit's). So there is a coupling of the two samples (the same key) under which every other
unit's kept rows are identical and the samples differ only in u's rows, i.e. they are neighbouring
datasets themselves. Contribution bounding then runs on the sampled rows (the sample is in the
engine's source, below `_src`), so each unit's contribution to the release is bounded exactly as
without a sample and the sensitivities are those of the query without it; by the coupling, for any
output set S, P[M(sample(D')) in S] = E_key[P[A(S_key(D) + u_key) in S]] <= e^eps P[M(sample(D)) in
S] + delta. No amplification by subsampling is claimed: the budget is charged in full. The argument
holds for any key (even a known one): it does not rest on the key's secrecy, only on each row's
decision being its own; the key (from the OS CSPRNG, fresh per release) makes the sample a uniform
random one and independent across releases.

Why a keyed hash, not `random() < p`. The engine reads its source several times in one release
(input checks, APPROX_BOUNDS histograms, the bounding plan, MAD's second round, PUBLIC_GROUPS'
key list beside the source's join, COUNT(DISTINCT unit) of the controller-only totals): a fresh
random() per scan would give each scan a different sample, and Spark re-draws rand() whenever a
view is re-analysed. Materialising the sample (a temporary table) works on DuckDB but on Spark needs
a checkpoint (data written to disk) or a cache that may be recomputed. A deterministic decision
from the row's content and a per-release key gives every scan the same rows on both engines,
without copying data. The hash is `bounding.portable_hash_sql` (MD5 of the key, the occurrence
number, the row's index among identical rows and every column as `length:value`), the same number
on DuckDB and Spark, so a sampled public-groups subquery keeps the same groups in the key list
(read by DuckDB) as in the source's join (read on Spark). The row's index among identical rows
(`row_number() OVER (PARTITION BY every column)`) makes identical rows independent draws (which
of them gets which index does not matter: they are identical; the window partitions by every
column, the unit among them, so unlike the window functions the ownership rules refuse it never
mixes units' rows); rows are kept iff the 60-bit digest is below p * 2^60. Each TABLESAMPLE clause is its own sample (its occurrence number); a sampled CTE
is one sample wherever it is read.

Refused: a sample of n ROWS (RESERVOIR, or a size without PERCENT: which rows are kept depends on
how many rows all units have, so one unit's rows change which of the others' are kept);
REPEATABLE (seed) (a seeded sample is drawn by position in the engine's scan, so adding a unit's
rows shifts which of the others' rows are kept, and a fixed seed repeats it in every release); a
percentage outside (0, 100]; DuckDB's `USING SAMPLE` (it samples a whole SELECT's rows by blocks by
default: write TABLESAMPLE BERNOULLI after the table instead). The same rules hold for public
tables and for the outer query (where a sample of released or public rows is post-processing,
run once by DuckDB's own per-row BERNOULLI sample).
"""

from __future__ import annotations

from typing import overload

from sqlglot import exp

from ..bounding import portable_hash_sql
from ..errors import InvalidQueryError, UnsupportedError
from .syntax import number_literal

PLACEHOLDER = "__rowsample_keep"
DUP = "__dp_dup"
INNER = "__dp_sample_inner"
DIGEST_RANGE = float(2**60)  # bounding.PORTABLE_DIGEST: a 60-bit prefix of an MD5 digest


def sample_fraction(sample: exp.TableSample, where: str) -> float:
    """The kept fraction p/100 of an accepted sample, or the refusal of the rule it breaks."""
    shown = sample.sql("duckdb")
    method = str(sample.args["method"].name).upper() if sample.args.get("method") is not None else ""
    if method == "RESERVOIR" or sample.args.get("size") is not None or sample.args.get("rows") is not None:
        raise UnsupportedError(f"{where}: {shown!r}: a sample of n ROWS (RESERVOIR) is not supported: it keeps n "
                               "rows chosen among all units' rows, so one unit's rows change which of the others' are "
                               "kept (the per-unit bound breaks); use TABLESAMPLE BERNOULLI (p PERCENT)")
    if sample.args.get("seed") is not None:
        raise UnsupportedError(f"{where}: {shown!r}: REPEATABLE (seed) is not supported: a seeded sample keeps rows "
                               "by their position in the scan, so one unit's rows shift which of the others' are kept; "
                               "leave it out (each release draws its own per-row sample)")
    unknown = [k for k in ("bucket_numerator", "bucket_denominator", "bucket_field") if sample.args.get(k) is not None]
    if unknown or method not in ("", "BERNOULLI", "SYSTEM"):
        raise UnsupportedError(f"{where}: {shown!r}: only TABLESAMPLE BERNOULLI / SYSTEM (p PERCENT) is supported")
    value = number_literal(sample.args.get("percent"), f"{where}: {shown!r}: the sample's percentage")
    if not 0 < value <= 100:
        raise InvalidQueryError(f"{where}: {shown!r}: the sample's percentage must be in (0, 100], got {value:g}")
    return value / 100


def _ident(name: str) -> exp.Identifier:
    return exp.to_identifier(name, quoted=True)


def sampled_select(inner: exp.Expression, columns: list[str], fraction: float, occurrence: int) -> exp.Select:
    """`SELECT cols FROM (SELECT *, <index among identical rows> FROM inner) WHERE <keep>`: the
    per-row sample of `inner` (a table or a subquery), its placeholder rendered per release."""
    cols = ", ".join(_ident(c).sql("duckdb") for c in columns)
    text = (f"SELECT {cols} FROM (SELECT *, row_number() OVER (PARTITION BY {cols} ORDER BY "
            f"{_ident(columns[0]).sql('duckdb')}) AS {DUP} FROM {INNER} AS __dp_s) AS __dp_r "
            f"WHERE {PLACEHOLDER}({float(fraction)!r}, {int(occurrence)}, {DUP}, {cols})")
    select = exp.maybe_parse(text, dialect="duckdb")
    target = next(t for t in select.find_all(exp.Table) if t.name == INNER)
    alias = exp.TableAlias(this=exp.to_identifier("__dp_s"))
    if isinstance(inner, exp.Table):
        inner.set("alias", alias)
        target.replace(inner)
    else:
        target.replace(exp.Subquery(this=inner, alias=alias))
    return select


def has_samples(sql: str | None) -> bool:
    return sql is not None and PLACEHOLDER in sql.lower()


@overload
def render(sql: str, dialect: str, key: int | None) -> str: ...
@overload
def render(sql: None, dialect: str, key: int | None) -> None: ...
def render(sql: str | None, dialect: str, key: int | None) -> str | None:
    """`sql` (DuckDB syntax) with every sample placeholder replaced by its decision on `dialect`
    (duckdb or spark; the result stays in DuckDB's syntax with that engine's pieces, as the
    bounding plan's) under the release's `key`. key=None leaves the placeholders (for display:
    such SQL cannot run, so no path executes a sample without a key)."""
    if key is None or not has_samples(sql):
        return sql
    tree = exp.maybe_parse(sql, dialect="duckdb")

    def decide(node: exp.Expression) -> exp.Expression:
        if not (isinstance(node, exp.Anonymous) and str(node.name).lower() == PLACEHOLDER):
            return node
        fraction, occurrence, *columns = node.expressions
        parts = [str(int(occurrence.this))] + [c.sql("duckdb") for c in columns]
        digest = portable_hash_sql(dialect, parts, f"CAST({int(key)} AS BIGINT)")
        threshold = float(fraction.this) * DIGEST_RANGE
        return exp.maybe_parse(f"(CAST({digest} AS DOUBLE) < {threshold!r})", dialect="duckdb")

    return tree.transform(decide).sql("duckdb")


__all__ = ["PLACEHOLDER", "has_samples", "render", "sample_fraction", "sampled_select"]
