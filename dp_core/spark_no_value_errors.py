"""On the Spark backend too, one person's value cannot fail a release (no_value_errors.py says why).

Spark has no TRY(expression). What it offers (PySpark 4.3, checked on 2026-11-30): under ANSI mode,
its default, a value that does not fit fails the query (a cast, arithmetic, a date, an array index,
and every implicit conversion: `v = 1` over a text 'x' casts it to BIGINT and fails); with ANSI off
the same expressions give NULL, except that an integer overflow wraps around and a narrowing cast
truncates; `try_cast`, `try_add`, `try_subtract`, `try_multiply`, `try_divide`, `try_mod`,
`try_sum`, `try_avg` and `try_to_binary` give NULL in either mode. A few built-ins fail whatever
the mode: a regular expression or LIKE pattern that does not parse (read from the data, or written
and invalid for Java's syntax while valid for DuckDB's), `unbase64` of text that is no base64,
`timestamp_millis` (DuckDB's epoch_ms) past 2^63 microseconds, a `sequence` (range,
generate_series) of more than 2^31 elements.

So three parts, all decided by the query's text, never by its data:
  1. every statement the backend runs is analysed with ANSI off (`ansi_off`): implicit conversions
     and built-ins give NULL; a temporary view keeps the setting it was created with, so the DP
     SELECT's source view keeps it whatever the session says afterwards;
  2. the analyst's expressions are rewritten into their never-failing forms (`never_failing_on_spark`):
     a cast into TRY_CAST, + - * / % into try_add ... try_mod, SUM and AVG of the source into try_sum
     and try_avg, from_base64 into try_to_binary, epoch_ms(x) into NULL past its range; so an
     overflow is NULL, as under DuckDB's TRY, not a wrapped number, and both backends compute the
     same on every value that fits;
  3. what cannot be made safe is refused by name before anything runs: a pattern (regular expression,
     LIKE) that is not a literal, a series whose bounds are not (`refuse_failing_on_spark`); a literal
     pattern is compiled once by Spark over one constant row (`check_patterns`), so an invalid one is
     refused whatever the data.

Which expressions are the analyst's: those under the TRY guards no_value_errors.never_failing and
row_filter add (the source's and a row filter's), and the whole of a DP SELECT's source (its view);
the engine's own SQL around them is left as written (it runs with ANSI off too: its per-unit SUM of
one person's BIGINTs wraps around there, and is clamped, where it failed)."""

from __future__ import annotations

import threading
from contextlib import contextmanager

import sqlglot
from sqlglot import exp

from .errors import InvalidQueryError

ANSI = "spark.sql.ansi.enabled"
#: arithmetic -> the Spark function that gives NULL where the operator fails or wraps around
TRY_ARITHMETIC = {exp.Add: "try_add", exp.Sub: "try_subtract", exp.Mul: "try_multiply", exp.Div: "try_divide",
                  exp.Mod: "try_mod"}
#: aggregates of a source -> their forms that give NULL on overflow (Spark sums a BIGINT in a BIGINT)
TRY_AGGREGATES = {exp.Sum: "try_sum", exp.Avg: "try_avg"}
#: epoch_ms(x): Spark's TIMESTAMP_MILLIS fails whatever ANSI says once x * 1000 microseconds overflow a
#: BIGINT: it is computed only for x within +-(2^63 - 1) / 1000 (NULL beyond, as TRY gives on DuckDB)
MILLIS_BOUND = (2**63 - 1) // 1000
#: calls whose second argument is a pattern Spark compiles row by row (Java's syntax), failing on one
#: that does not parse whatever ANSI says
PATTERN_CALLS = (exp.RegexpLike, exp.RegexpILike, exp.RegexpExtract, exp.RegexpExtractAll, exp.RegexpReplace,
                 exp.RegexpSplit, exp.RegexpCount, exp.RegexpInstr, exp.RegexpSubstr, exp.RegexpFullMatch,
                 exp.Like, exp.ILike, exp.SimilarTo)


#: sessions inside ansi_off -> [how many blocks are, the setting the first one found]: threads
#: sharing a session (a flow's tasks) turn it off once and back once, after the last block
_ANSI_HOLDERS: dict[int, list] = {}
_ANSI_LOCK = threading.Lock()


@contextmanager
def ansi_off(spark):
    """The session with ANSI mode off while the block runs (its statements analysed, and a view
    created, under it), the caller's setting back once no block of any thread still needs it off."""
    with _ANSI_LOCK:
        held = _ANSI_HOLDERS.get(id(spark))
        if held is None:
            held = _ANSI_HOLDERS[id(spark)] = [0, spark.conf.get(ANSI, None)]
            spark.conf.set(ANSI, "false")
        held[0] += 1
    try:
        yield
    finally:
        with _ANSI_LOCK:
            held[0] -= 1
            if held[0] == 0:
                del _ANSI_HOLDERS[id(spark)]
                if held[1] is None:
                    spark.conf.unset(ANSI)
                else:
                    spark.conf.set(ANSI, held[1])


def _never_failing_node(node: exp.Expression, whole: bool) -> exp.Expression:
    """One node in its never-failing Spark form (its children already are)."""
    if type(node) is exp.Cast:  # TryCast is a Cast too: only the failing form is rewritten
        return exp.TryCast(this=node.this, to=node.args["to"], safe=True)
    for kind, name in TRY_ARITHMETIC.items():
        if type(node) is kind:
            return exp.Anonymous(this=name, expressions=[node.this, node.expression])
    if isinstance(node, exp.UnixToTime) and node.args.get("scale") is not None and \
            str(node.args["scale"].this) == str(exp.UnixToTime.MILLIS):
        value = node.this.copy()
        return exp.Case(ifs=[exp.If(this=exp.Between(this=value, low=exp.Literal.number(-MILLIS_BOUND),
                                                      high=exp.Literal.number(MILLIS_BOUND)), true=node.copy())])
    if isinstance(node, exp.FromBase64):
        return exp.Anonymous(this="try_to_binary", expressions=[node.this, exp.Literal.string("base64")])
    if whole:
        for kind, name in TRY_AGGREGATES.items():
            if type(node) is kind:
                return exp.Anonymous(this=name, expressions=[node.this])
    return node


def _rewritten(tree: exp.Expression, whole: bool) -> exp.Expression:
    """`tree` with each node in its never-failing form, children first (sqlglot's transform does not
    visit the children of a node it replaced); the new root."""
    for node in reversed(list(tree.walk())):  # depth-first, reversed: every node after its descendants
        new = _never_failing_node(node, whole)
        if new is not node:
            if node is tree:
                tree = new
            else:
                node.replace(new)
    return tree


def never_failing_on_spark(tree: exp.Expression, whole: bool = False) -> exp.Expression:
    """A copy of `tree` (DuckDB syntax, with no_value_errors' TRY guards) with each TRY replaced by
    its content in never-failing Spark forms; whole=True: every expression of `tree` is the
    analyst's (a DP SELECT's source), its aggregates too. The result is meant for dialect="spark"."""
    refuse_failing_on_spark(tree)
    tree = tree.copy()
    if whole:
        tree = _rewritten(tree, whole=True)
    for guard in reversed(list(tree.find_all(exp.Try))):  # an inner guard before the one around it
        content = guard.this if whole else _rewritten(guard.this, whole=False)
        if guard is tree:
            tree = content
        else:
            guard.replace(content)
    return tree


def _pattern(call: exp.Expression) -> exp.Expression | None:
    return call.args.get("expression")


def refuse_failing_on_spark(tree: exp.Expression) -> None:
    """A pattern that is not a literal string is refused, in one line that names it: Spark compiles
    it row by row and fails the query on one person's value that does not parse. So is a series
    (range, generate_series) whose bounds are not literals: Spark fails on one of more than 2^31 - 15
    elements, whatever ANSI says."""
    for series in tree.find_all(exp.GenerateSeries):
        bounds = [series.args.get(k) for k in ("start", "end", "step") if series.args.get(k) is not None]
        if not all(isinstance(b, exp.Literal) for b in bounds):
            raise InvalidQueryError(
                f"{series.sql('duckdb')[:80]!r}: on the Spark backend a series (range, generate_series) must have "
                f"literal bounds: Spark fails the release on one longer than 2^31 elements, so one person's value "
                f"would decide whether it fails; write its bounds as numbers")
    for call in tree.find_all(*PATTERN_CALLS):
        pattern = _pattern(call)
        if pattern is not None and not (isinstance(pattern, exp.Literal) and pattern.is_string):
            written = call.sql("duckdb")
            raise InvalidQueryError(
                f"{written[:80]!r}: on the Spark backend a pattern (regular expression, LIKE) must be a literal "
                f"string: Spark fails the release on a value that is no valid pattern, so one person's value would "
                f"decide whether it fails; write the pattern as a quoted string")


def refuse_text_failing_on_spark(sql: str) -> None:
    """refuse_failing_on_spark over SQL text (DuckDB syntax: a DP SELECT's source, a row filter):
    data-free, for the platform's checks before any flow starts."""
    refuse_failing_on_spark(sqlglot.parse_one(sql, read="duckdb"))


def literal_patterns(tree: exp.Expression) -> list[tuple[exp.Expression, str]]:
    """Each pattern call of `tree` with its literal pattern (refuse_failing_on_spark refused the others)."""
    found = []
    for call in tree.find_all(*PATTERN_CALLS):
        pattern = _pattern(call)
        if isinstance(pattern, exp.Literal) and pattern.is_string:
            found.append((call, pattern.this))
    return found


def check_patterns(spark, tree: exp.Expression, checked: set) -> None:
    """Each literal pattern of `tree` compiled once by Spark over one constant row (no data read),
    as the call that holds it would (a LIKE's escapes, a regular expression's syntax): one that
    does not compile is refused whatever the data (Spark compiles an expression's pattern when a
    row reaches it: over no row, or before a filter drops the rows, it did not fail)."""
    for call, pattern in literal_patterns(tree):
        escaped = isinstance(call.parent, exp.Escape)  # LIKE ... ESCAPE '!': compiled with its escape
        probe = (call.parent if escaped else call).copy()
        (probe.this if escaped else probe).set("this", exp.Literal.string(""))
        sql = probe.sql("spark")
        if sql in checked:
            continue
        try:
            with ansi_off(spark):
                probed = spark.sql(f"SELECT {sql} AS probe FROM VALUES (1) AS one(x)")
        except Exception:  # noqa: BLE001, S112 - Spark cannot prepare the call: the query's own preparation says why
            continue
        try:
            with ansi_off(spark):
                probed.collect()
        except Exception as err:  # noqa: BLE001 - pyspark's and the JVM's errors: the pattern, not data
            said = str(err).strip().splitlines()[0][:200] if str(err).strip() else type(err).__name__
            raise InvalidQueryError(
                f"{call.sql('duckdb')[:80]!r}: the pattern {pattern!r} does not compile on Spark (Java's syntax): "
                f"{said}; write it as Spark reads it") from None
        checked.add(sql)


__all__ = ["ansi_off", "check_patterns", "never_failing_on_spark", "refuse_failing_on_spark",
           "refuse_text_failing_on_spark"]
