"""The two DP SQL syntaxes, reduced to one sqlglot tree (dp-engine.md, "Query syntax").

    SELECT WITH ANONYMIZATION dept, ANON_COUNT(*, 5) AS c ... GROUP BY dept          (the seed)
    SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 1, ...) dept,
           COUNT(*, contribution_bounds_per_group => (0, 5)) AS c ... GROUP BY dept     (BigQuery)

sqlglot parses neither clause, so it is cut out at the token level (sqlglot's own tokenizer: no
hand-written parser) and recorded; BigQuery's DP aggregates in the anonymized SELECT list (depth 0)
are renamed `__DP_<NAME>` so that sqlglot keeps their extra arguments. Everything else is parsed
by sqlglot in the DuckDB dialect.
"""

from __future__ import annotations

from dataclasses import dataclass

import sqlglot
from sqlglot import exp
from sqlglot.tokens import Tokenizer, TokenType

from ..errors import InvalidQueryError

DP_FUNCTIONS_BQ = ("COUNT", "SUM", "AVG", "VAR_POP", "STDDEV_POP", "PERCENTILE_CONT")
OPTION_NAMES = ("epsilon", "delta", "max_groups_contributed", "privacy_unit_column", "partition_selection")


@dataclass(frozen=True)
class ParsedDPQuery:
    """The anonymized SELECT as a sqlglot tree, which syntax it used, and its OPTIONS."""

    tree: exp.Select
    syntax: str  # "anonymization" (seed) or "differential_privacy" (BigQuery)
    options: dict
    with_clause: exp.With | None


def _tokens(sql: str):
    try:
        return Tokenizer().tokenize(sql)
    except sqlglot.errors.TokenError as err:
        raise InvalidQueryError(f"the query is not valid SQL: {str(err).splitlines()[0]}") from None


def _parse_options(tokens, start: int) -> tuple[dict, int]:
    """OPTIONS (name = value, ...) starting at tokens[start] ('('); returns the options and the
    index after the closing parenthesis."""
    if start >= len(tokens) or tokens[start].token_type != TokenType.L_PAREN:
        raise InvalidQueryError("OPTIONS must be followed by a parenthesised list: OPTIONS (epsilon = 1, ...)")
    options, i = {}, start + 1
    while i < len(tokens) and tokens[i].token_type != TokenType.R_PAREN:
        name = tokens[i].text.lower()
        if name not in OPTION_NAMES:
            raise InvalidQueryError(f"unknown OPTIONS entry {tokens[i].text!r}: allowed are {', '.join(OPTION_NAMES)}")
        if i + 2 >= len(tokens) or tokens[i + 1].token_type != TokenType.EQ:
            raise InvalidQueryError(f"OPTIONS entry {name!r} needs '= value'")
        value_tok = tokens[i + 2]
        j = i + 3
        text = value_tok.text
        if value_tok.token_type == TokenType.DASH and i + 3 < len(tokens):  # a negative number
            text, j = "-" + tokens[i + 3].text, i + 4
        if name in options:
            raise InvalidQueryError(f"OPTIONS gives {name!r} twice")
        options[name] = _option_value(name, text, value_tok.token_type)
        i = j
        if i < len(tokens) and tokens[i].token_type == TokenType.COMMA:
            i += 1
        elif i < len(tokens) and tokens[i].token_type != TokenType.R_PAREN:
            raise InvalidQueryError(f"OPTIONS: expected ',' or ')' after {name!r}, got {tokens[i].text!r}")
    if i >= len(tokens):
        raise InvalidQueryError("OPTIONS ( ... is not closed")
    return options, i + 1


def _option_value(name: str, text: str, token_type) -> object:
    if name == "partition_selection":  # a name: OPTIONS (partition_selection = 'mad'); checked by the Query
        return text
    if name == "privacy_unit_column":
        if token_type not in (TokenType.VAR, TokenType.IDENTIFIER, TokenType.STRING):
            raise InvalidQueryError(f"privacy_unit_column must name a column, got {text!r}")
        return text
    try:
        value = float(text)
    except ValueError:
        raise InvalidQueryError(f"OPTIONS {name} must be a number, got {text!r}") from None
    if name == "max_groups_contributed":
        if not value.is_integer() or value < 1:
            raise InvalidQueryError(f"OPTIONS max_groups_contributed must be a whole number >= 1, got {text}")
        return int(value)
    return value


def parse_dp_sql(sql: str) -> ParsedDPQuery:
    """Find the one anonymized SELECT, cut its DP clause, parse the rest with sqlglot."""
    if not isinstance(sql, str) or not sql.strip():
        raise InvalidQueryError("the query is empty")
    tokens = _tokens(sql)
    marks = [
        i for i, t in enumerate(tokens[:-1])
        if t.token_type == TokenType.SELECT and tokens[i + 1].token_type == TokenType.WITH
        and i + 2 < len(tokens) and tokens[i + 2].text.upper() in ("ANONYMIZATION", "DIFFERENTIAL_PRIVACY")
    ]
    if not marks:
        raise InvalidQueryError(
            "not a DP query: write SELECT WITH ANONYMIZATION ... (ANON_COUNT, ANON_SUM, ...) or "
            "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (...) ..."
        )
    if len(marks) > 1:
        raise InvalidQueryError("the query has two anonymization clauses: exactly one SELECT may be anonymized")
    at = marks[0]
    kind_tok = tokens[at + 2]
    syntax = "anonymization" if kind_tok.text.upper() == "ANONYMIZATION" else "differential_privacy"
    cut_from, cut_to = tokens[at + 1].start, kind_tok.end + 1
    options: dict = {}
    after = at + 3
    if after < len(tokens) and tokens[after].text.upper() == "OPTIONS":
        if syntax == "anonymization":
            raise InvalidQueryError("OPTIONS belongs to SELECT WITH DIFFERENTIAL_PRIVACY; the seed syntax takes "
                                    "epsilon, delta and max_partitions from the request")
        options, after = _parse_options(tokens, after + 1)
        cut_to = tokens[after - 1].end + 1
    renames = []
    if syntax == "differential_privacy":
        depth, i = 0, after
        while i < len(tokens):
            t = tokens[i]
            if t.token_type == TokenType.L_PAREN:
                depth += 1
            elif t.token_type == TokenType.R_PAREN:
                depth -= 1
                if depth < 0:
                    break
            elif depth == 0 and t.token_type in (TokenType.FROM,):
                break
            elif (depth == 0 and t.text.upper() in DP_FUNCTIONS_BQ and i + 1 < len(tokens)
                  and tokens[i + 1].token_type == TokenType.L_PAREN):
                renames.append((t.start, t.end + 1, "__DP_" + t.text.upper()))
            i += 1
    text = sql
    for start, end, new in sorted(renames + [(cut_from, cut_to, "")], reverse=True):
        text = text[:start] + new + text[end:]
    try:
        trees = sqlglot.parse(text, read="duckdb")
    except sqlglot.errors.ParseError as err:
        raise InvalidQueryError(f"the query is not valid SQL: {str(err).splitlines()[0]}") from None
    except sqlglot.errors.SqlglotError as err:
        raise InvalidQueryError(f"the query is not valid SQL: {str(err).splitlines()[0]}") from None
    trees = [t for t in trees if t is not None]
    if len(trees) != 1:
        raise InvalidQueryError("give exactly one SQL statement")
    tree = trees[0]
    with_clause = tree.args.get("with_") or tree.args.get("with")
    if not isinstance(tree, exp.Select):
        raise InvalidQueryError(
            f"the anonymized query must be a single SELECT (not {type(tree).__name__.upper()}): "
            "UNION and other set operations would mix units' rows"
        )
    return ParsedDPQuery(tree, syntax, options, with_clause)
