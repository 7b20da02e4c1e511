"""The two DP SQL syntaxes, reduced to one sqlglot tree (dp-engine.md, "Query syntax").

    SELECT WITH ANONYMIZATION [OPTIONS (...)] dept, ANON_COUNT(*, 5) AS c ... GROUP BY dept     (seed)
    SELECT WITH ANONYMIZATION OPTIONS (epsilon = 1) ANON_SUM(x CLAMPED BETWEEN 0 AND 9) ...     (BigQuery, legacy)
    SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 1, ...) dept,
           COUNT(*, contribution_bounds_per_group => (0, 5)) AS c ... GROUP BY dept            (BigQuery)

A statement may hold several DP SELECTs (subqueries, CTEs, set operations of DP results). sqlglot
parses neither clause, so each is cut out at the token level (sqlglot's own tokenizer: no
hand-written parser) and replaced by a marker select item `__dpmark_<n>()` that `mark_of` finds in
the tree; its syntax and OPTIONS are recorded. Aggregate calls in a DP SELECT list are renamed
`__DP_<NAME>` (BigQuery names) so that sqlglot keeps their extra arguments, and `CLAMPED BETWEEN
L AND U` becomes the named arguments `__clamp_lo => L, __clamp_hi => U`. The rest is parsed by
sqlglot in the DuckDB dialect, or in the BigQuery dialect when DuckDB's refuses it (backquoted
paths, BigQuery-only functions).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import sqlglot
from sqlglot import exp
from sqlglot.tokens import Tokenizer, TokenType

from ..errors import InvalidQueryError, UnsupportedError

DP_FUNCTIONS_BQ = ("COUNT", "SUM", "AVG", "VAR_POP", "STDDEV_POP", "PERCENTILE_CONT", "APPROX_QUANTILES",
                   "APPROX_COUNT_DISTINCT")
#: OPTIONS names each syntax accepts (BigQuery's reference); `kappa` is the legacy name of max_groups_contributed
OPTION_NAMES = {
    "differential_privacy": ("epsilon", "delta", "max_groups_contributed", "max_rows_contributed",
                             "privacy_unit_column", "group_selection_strategy", "partition_selection"),
    "anonymization": ("epsilon", "delta", "max_groups_contributed", "kappa", "max_rows_contributed",
                      "group_selection_strategy", "partition_selection"),
}
#: `partition_selection` (this engine's extension): 'truncated-geometric', 'laplace-threshold',
#: 'weighted_gaussian', 'mad', 'mad_damped' (dp_core.partition_selection)
#: valid in the reference, not offered by this engine
UNSUPPORTED_OPTIONS = ("k_threshold", "min_privacy_units_per_group")
#: max_rows_contributed = r (BigQuery: at most r rows per unit in all): read as max_groups_contributed = r
#: (r rows touch at most r groups); each group's contribution is then bounded as usual. A valid,
#: looser bound than sampling r rows (its noise can be larger), documented in docs/sql.md
MARK = "__dpmark_"


@dataclass(frozen=True)
class DPClause:
    """One DP SELECT's clause: which syntax, and its OPTIONS."""

    syntax: str  # "anonymization" or "differential_privacy"
    options: dict


@dataclass(frozen=True)
class ParsedStatement:
    """The whole statement as a sqlglot tree, and the clause of each marked DP SELECT."""

    tree: exp.Expression
    clauses: dict[int, DPClause]


def quote(sql: exp.Expression) -> str:
    """A node as DuckDB SQL, for a refusal's message (its class name if it cannot be rendered), with
    the DP aggregates as the user wrote them (`COUNT(*)`, not the parser's `__DP_COUNT(*)`)."""
    try:
        return _DP_CALL.sub("", sql.sql("duckdb"))
    except Exception:  # noqa: BLE001 - rendering is for messages only
        return type(sql).__name__


#: a decimal number as SQL writes one (a sign, digits, a fraction, an exponent)
_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")
_DP_CALL = re.compile(r"\b__DP_(?=\w+\()")  # the parser's prefix of a DP aggregate call


def number_literal(node: exp.Expression | None, what: str, integer: bool = False) -> float:
    """A numeric literal (possibly negative, possibly in parentheses); with integer=True a
    whole-number literal (INT64). Anything else (missing, a string, NULL, a column, a parameter, an
    expression) is refused naming `what`: bounds, percentiles, LIMIT and sample percentages are
    read at compile time, before any row is, so they must be constants written in the query."""
    neg = False
    while isinstance(node, exp.Paren):
        node = node.this
    if isinstance(node, exp.Neg):
        neg, node = True, node.this
    if node is None:
        raise InvalidQueryError(f"{what} is missing: it must be a number literal")
    if isinstance(node, exp.Literal) and node.is_string:  # '17': a number in quotes is text in SQL
        fix = (f"write {'-' if neg else ''}{node.this.strip()} without quotes" if _NUMBER.fullmatch(node.this.strip())
               else "write a number, without quotes")
        raise InvalidQueryError(f"{what} must be a number literal, got the string {quote(node)}: {fix}")
    if not isinstance(node, exp.Literal):
        kind = "NULL" if isinstance(node, exp.Null) else repr(quote(node))
        raise InvalidQueryError(f"{what} must be a number literal, got {kind}")
    text = str(node.this)
    try:
        value = float(text)
    except ValueError:
        raise InvalidQueryError(f"{what} must be a number literal, got {text!r}") from None
    if integer and not text.lstrip("+-").isdigit():
        raise InvalidQueryError(f"{what} must be a whole-number literal (INT64), got {text!r}")
    return -value if neg else value


def mark_of(select: exp.Expression) -> int | None:
    """The marker number of a DP SELECT (its first select item is `__dpmark_<n>()`), else None."""
    if not isinstance(select, exp.Select) or not select.expressions:
        return None
    first = select.expressions[0]
    inner = first.this if isinstance(first, exp.Alias) else first
    if isinstance(inner, exp.Anonymous) and str(inner.name).lower().startswith(MARK):
        try:
            return int(str(inner.name)[len(MARK):])
        except ValueError:
            return None
    return None


class _Tokenizer(Tokenizer):
    """sqlglot's tokenizer, with BigQuery's backquoted identifiers as well as double-quoted ones."""

    IDENTIFIERS = ['"', "`"]  # noqa: RUF012 - sqlglot's own attribute


def _tokens(sql: str):
    try:
        return _Tokenizer().tokenize(sql)
    except Exception as err:  # noqa: BLE001 - sqlglot raises TokenError, and sometimes ValueError
        raise InvalidQueryError(f"the query is not valid SQL: {str(err).splitlines()[0] if str(err) else err!r}") from None


def _parse_options(sql: str, tokens, start: int, syntax: str) -> tuple[dict, int]:
    """OPTIONS (name = value, ...) starting at tokens[start] ('('); returns the options and the
    index after the closing parenthesis. A value is every token up to the next ',' or ')' at its
    depth (so `.01`, `-1`, `1e-5`, `t.uid`, `(uid)` all read as written)."""
    if start >= len(tokens) or tokens[start].token_type != TokenType.L_PAREN:
        raise InvalidQueryError("OPTIONS must be followed by a parenthesised list: OPTIONS (epsilon = 1, ...)")
    allowed = OPTION_NAMES[syntax]
    clause = "SELECT WITH DIFFERENTIAL_PRIVACY" if syntax == "differential_privacy" else "SELECT WITH ANONYMIZATION"
    options, i = {}, start + 1
    named = set()
    while i < len(tokens) and tokens[i].token_type != TokenType.R_PAREN:
        name = tokens[i].text.lower()
        named.add(name)
        if "max_rows_contributed" in named and named & {"max_groups_contributed", "kappa"}:
            raise InvalidQueryError("OPTIONS: give at most one of max_groups_contributed (kappa) and "
                                    "max_rows_contributed (even as NULL): they are two ways of bounding a unit")
        if name in UNSUPPORTED_OPTIONS and not _null_value(tokens, i):
            raise UnsupportedError(f"OPTIONS {name}: not offered by this engine (allowed: {', '.join(allowed)})")
        if name not in allowed and name not in UNSUPPORTED_OPTIONS:
            raise InvalidQueryError(f"unknown OPTIONS entry {tokens[i].text!r} for {clause}: allowed are {', '.join(allowed)}")
        if i + 2 >= len(tokens) or tokens[i + 1].token_type != TokenType.EQ:
            raise InvalidQueryError(f"OPTIONS entry {name!r} needs '= value'")
        j, depth = i + 2, 0
        while j < len(tokens):
            tt = tokens[j].token_type
            if tt == TokenType.L_PAREN:
                depth += 1
            elif tt == TokenType.R_PAREN:
                if depth == 0:
                    break
                depth -= 1
            elif tt == TokenType.COMMA and depth == 0:
                break
            j += 1
        value_tokens = tokens[i + 2:j]
        if not value_tokens:
            raise InvalidQueryError(f"OPTIONS entry {name!r} needs a value")
        key = "max_groups_contributed" if name == "kappa" else name
        if name in UNSUPPORTED_OPTIONS:  # `= NULL`: BigQuery's "the default", i.e. not set
            i = j + (j < len(tokens) and tokens[j].token_type == TokenType.COMMA)
            continue
        if key in options:
            raise InvalidQueryError(f"OPTIONS gives {key!r} twice")
        options[key] = _option_value(key, sql, value_tokens)
        i = j
        if i < len(tokens) and tokens[i].token_type == TokenType.COMMA:
            i += 1
    if i >= len(tokens):
        raise InvalidQueryError("OPTIONS ( ... is not closed")
    return options, i + 1


def _null_value(tokens, i: int) -> bool:
    """OPTIONS entry at tokens[i] is `name = NULL` (followed by ',' or ')')."""
    return (i + 3 < len(tokens) and tokens[i + 1].token_type == TokenType.EQ and tokens[i + 2].token_type == TokenType.NULL
            and tokens[i + 3].token_type in (TokenType.COMMA, TokenType.R_PAREN))


def _option_value(name: str, sql: str, value_tokens) -> object:
    while (len(value_tokens) >= 2 and value_tokens[0].token_type == TokenType.L_PAREN
           and value_tokens[-1].token_type == TokenType.R_PAREN):
        value_tokens = value_tokens[1:-1]  # (uid) is uid
    if not value_tokens:
        raise InvalidQueryError(f"OPTIONS {name} needs a value")
    text = sql[value_tokens[0].start:value_tokens[-1].end + 1].strip()
    types = {t.token_type for t in value_tokens}
    if name == "partition_selection":  # a name: OPTIONS (partition_selection = 'mad'); checked by the Query
        return text.strip("'\"")
    if name == "group_selection_strategy":  # an enum name, or its name as a string (BigQuery casts it)
        word = text.upper()
        if len(value_tokens) == 1 and value_tokens[0].token_type in (TokenType.STRING, TokenType.IDENTIFIER):
            word = value_tokens[0].text.upper()
        if word == "LAPLACE_THRESHOLD":
            return "laplace-threshold"
        if word == "PUBLIC_GROUPS":
            return "public-groups"  # dp_core/sql/public_groups.py
        raise InvalidQueryError(f"OPTIONS group_selection_strategy must be LAPLACE_THRESHOLD or PUBLIC_GROUPS, got {text!r}")
    if name == "privacy_unit_column":
        parts = [t for t in value_tokens if t.token_type != TokenType.DOT]
        path = (all(t.token_type not in (TokenType.STRING, TokenType.NUMBER, TokenType.L_PAREN, TokenType.R_PAREN,
                                         TokenType.COMMA) for t in value_tokens)
                and all(t.token_type == TokenType.DOT for t in value_tokens[1::2])
                and len(parts) == (len(value_tokens) + 1) // 2)
        if not path:
            raise InvalidQueryError(f"OPTIONS privacy_unit_column must be a path expression naming a column "
                                    f"(privacy_unit_column = uid or t.uid, not a string or expression), got {text!r}")
        return ".".join(t.text for t in parts)
    if types == {TokenType.NULL}:
        return None  # BigQuery: NULL means "the default"
    if types & {TokenType.STRING, TokenType.VAR, TokenType.IDENTIFIER}:
        raise InvalidQueryError(f"OPTIONS {name} must be a number, got {text!r}")
    # a sign may stand apart from its number (+ 5), but the number is one word: `1 2` is not 12
    signed = value_tokens[0].token_type in (TokenType.PLUS, TokenType.DASH) and len(value_tokens) > 1
    number = sql[value_tokens[int(signed)].start:value_tokens[-1].end + 1]
    compact = (value_tokens[0].text if signed else "") + number
    try:
        if any(c.isspace() for c in number):
            raise ValueError(number)
        value = float(compact)
    except ValueError:
        raise InvalidQueryError(f"OPTIONS {name} must be a number, got {text!r}") from None
    if name in ("max_groups_contributed", "max_rows_contributed"):
        digits = compact.lstrip("+")
        if not digits.isdigit() or not 1 <= value <= 2**31 - 1:
            raise InvalidQueryError(f"OPTIONS {name} must be a whole number in [1, 2147483647] "
                                    f"(an INT64 literal), got {text}")
        return int(value)
    return value


def _select_list_edits(tokens, start: int, syntax: str) -> list[tuple[int, int, str]]:
    """Text edits inside one DP SELECT list (from tokens[start] to its FROM or end): rename the
    BigQuery aggregate calls and rewrite CLAMPED BETWEEN L AND U as named arguments."""
    edits = []
    depth, i = 0, start
    clamp_depth = None
    while i < len(tokens):
        t = tokens[i]
        tt = t.token_type
        if tt == TokenType.L_PAREN:
            depth += 1
        elif tt == TokenType.R_PAREN:
            depth -= 1
            if depth < 0:
                break
        elif depth == 0 and tt in (TokenType.SEMICOLON, TokenType.UNION, TokenType.INTERSECT, TokenType.EXCEPT,
                                   TokenType.ORDER_BY, TokenType.LIMIT, TokenType.QUALIFY, TokenType.WINDOW):
            break
        elif depth == 0 and tt in (TokenType.FROM, TokenType.WHERE, TokenType.GROUP_BY):
            # FROM ... GROUP BY: nothing to rename; the DP SELECT's HAVING holds DP aggregates again
            i += 1
            while i < len(tokens):
                t2 = tokens[i].token_type
                if t2 == TokenType.L_PAREN:
                    depth += 1
                elif t2 == TokenType.R_PAREN:
                    depth -= 1
                    if depth < 0:
                        return edits
                elif depth == 0 and t2 in (TokenType.HAVING, TokenType.SEMICOLON, TokenType.UNION, TokenType.INTERSECT,
                                           TokenType.EXCEPT, TokenType.ORDER_BY, TokenType.LIMIT, TokenType.QUALIFY,
                                           TokenType.WINDOW):
                    break
                i += 1
            if i >= len(tokens) or tokens[i].token_type != TokenType.HAVING:
                break
            i += 1
            continue
        elif (t.text.upper() in DP_FUNCTIONS_BQ and i + 1 < len(tokens)
              and tokens[i + 1].token_type == TokenType.L_PAREN
              and (i == 0 or tokens[i - 1].token_type != TokenType.DOT)):
            edits.append((t.start, t.end + 1, "__DP_" + t.text.upper()))
        elif t.text.upper() == "CLAMPED" and i + 1 < len(tokens) and tokens[i + 1].token_type == TokenType.BETWEEN:
            edits.append((t.start, tokens[i + 1].end + 1, ", __clamp_lo =>"))
            clamp_depth = depth
            i += 2
            continue
        elif tt == TokenType.AND and clamp_depth is not None and depth == clamp_depth:
            edits.append((t.start, t.end + 1, ", __clamp_hi =>"))
            clamp_depth = None
        elif (tt == TokenType.WITH and depth > 0 and i + 1 < len(tokens)
              and tokens[i + 1].text.upper() == "REPORT"):
            i = _with_report_edit(tokens, i, edits)
            continue
        i += 1
    return edits


def _with_report_edit(tokens, i: int, edits: list) -> int:
    """`WITH REPORT(FORMAT = JSON)` inside a WITH ANONYMIZATION aggregate call (BigQuery's legacy
    report clause) becomes the named argument `__report_format => 'JSON'`; a clause without a
    format or with another option becomes `__report_bad => '<what>'`, refused by the compiler."""
    j = i + 2
    if j < len(tokens) and tokens[j].token_type == TokenType.L_PAREN:
        k, depth = j + 1, 0
        while k < len(tokens) and not (tokens[k].token_type == TokenType.R_PAREN and depth == 0):
            depth += {TokenType.L_PAREN: 1, TokenType.R_PAREN: -1}.get(tokens[k].token_type, 0)
            k += 1
        inner = tokens[j + 1:k]
        if (len(inner) == 3 and inner[0].text.upper() == "FORMAT" and inner[1].token_type == TokenType.EQ):
            value = inner[2].text.replace("'", "''")  # the format as written: 'JS''ON' is JS'ON, not JSON
            edits.append((tokens[i].start, tokens[min(k, len(tokens) - 1)].end + 1, f", __report_format => '{value}'"))
        else:
            what = (inner[0].text if inner else "").replace("'", "''") or "nothing"
            edits.append((tokens[i].start, tokens[min(k, len(tokens) - 1)].end + 1, f", __report_bad => '{what}'"))
        return k + 1
    edits.append((tokens[i].start, tokens[i + 1].end + 1, ", __report_bad => 'nothing'"))
    return i + 2


def _parse(text: str) -> exp.Expression:
    errors = []
    for dialect in ("duckdb", "bigquery"):
        try:
            trees = [t for t in sqlglot.parse(text, read=dialect) if t is not None]
        except Exception as err:  # noqa: BLE001 - sqlglot raises ParseError, TokenError, and at times others
            errors.append(str(err).splitlines()[0] if str(err) else repr(err))
            continue
        if len(trees) != 1:
            raise InvalidQueryError("give exactly one SQL statement")
        return trees[0]
    raise InvalidQueryError(f"the query is not valid SQL: {errors[0]}")


def parse_statement(sql: str) -> ParsedStatement:
    """Cut every DP clause (replaced by a marker), rewrite their aggregate calls, parse the rest."""
    if not isinstance(sql, str) or not sql.strip():
        raise InvalidQueryError("the query is empty")
    tokens = _tokens(sql)
    for at, t in enumerate(tokens[:-1]):
        if t.token_type == TokenType.TABLE_SAMPLE and tokens[at + 1].text.upper() == "RESERVOIR":
            raise UnsupportedError("TABLESAMPLE RESERVOIR (n ROWS) is not supported: it keeps n rows chosen among all "
                                   "units' rows, so one unit's rows change which of the others' are kept (the per-unit "
                                   "bound breaks); use TABLESAMPLE BERNOULLI (p PERCENT)")
        if t.text.upper() == "USING" and tokens[at + 1].text.upper() == "SAMPLE":
            raise UnsupportedError("USING SAMPLE is not supported (DuckDB samples a SELECT's rows by blocks by "
                                   "default): write TABLESAMPLE BERNOULLI (p PERCENT) after the table or subquery")
        # TABLESAMPLE BERNOULLI / SYSTEM (p PERCENT): checked and carried through by the ownership checker (sample.py)
    edits: list[tuple[int, int, str]] = []
    clauses: dict[int, DPClause] = {}
    for at, t in enumerate(tokens[:-2]):
        if not (t.token_type == TokenType.SELECT and tokens[at + 1].token_type == TokenType.WITH):
            continue
        kind_tok = tokens[at + 2]
        word = kind_tok.text.upper()
        if word not in ("ANONYMIZATION", "DIFFERENTIAL_PRIVACY"):
            if word in ("AGGREGATION_THRESHOLD",):
                raise UnsupportedError("SELECT WITH AGGREGATION_THRESHOLD is not a DP query: use "
                                       "SELECT WITH DIFFERENTIAL_PRIVACY")
            continue
        syntax = "anonymization" if word == "ANONYMIZATION" else "differential_privacy"
        n = len(clauses)
        options: dict = {}
        after = at + 3
        if after < len(tokens) and tokens[after].text.upper() == "OPTIONS":
            options, after = _parse_options(sql, tokens, after + 1, syntax)
        if (after + 1 < len(tokens) and tokens[after].token_type == TokenType.ALIAS
                and tokens[after + 1].text.upper() in ("STRUCT", "VALUE")):
            after += 2  # SELECT WITH ... AS STRUCT / AS VALUE: released as a table, one column per item
        cut_to = tokens[after - 1].end + 1
        edits.append((tokens[at + 1].start, cut_to, f" {MARK}{n}() AS {MARK}{n},"))
        edits += _select_list_edits(tokens, after, syntax)
        clauses[n] = DPClause(syntax, options)
    text = sql
    for start, end, new in sorted(edits, reverse=True):
        text = text[:start] + new + text[end:]
    tree = _parse(text)
    if not isinstance(tree, exp.Query):
        raise InvalidQueryError(f"only queries are allowed, not {type(tree).__name__.upper()} statements")
    found = {mark_of(s) for s in tree.find_all(exp.Select)} - {None}
    if found != set(clauses):
        raise InvalidQueryError("a DP clause must directly follow SELECT: SELECT WITH DIFFERENTIAL_PRIVACY "
                                "OPTIONS (...) <select list> FROM ...")
    return ParsedStatement(tree, clauses)
