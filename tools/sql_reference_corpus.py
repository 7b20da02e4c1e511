"""Agreement of the DP SQL compiler with the reference (ZetaSQL / BigQuery) on its public analyzer tests.

A stand-in for the held-out corpus of issue 16: the DP statements of ZetaSQL's analyzer test files
(zetasql/analyzer/testdata/{anonymization,differential_privacy,dp_functions}*.test), each compiled
with `dp_core.sql.statement.compile_statement` (compile only, nothing runs) and our verdict (a plan
or a refusal) compared with the reference's (its expected output, or its ERROR line).

    python tools/sql_reference_corpus.py [--mirror DIR] [--show N] [--kind we_refuse]

Needs a git clone of google/zetasql (default: /work/.mirror/google+zetasql/repo, a bare mirror is
fine: files are read with `git show HEAD:...`). NOT run in CI: CI has no mirror; without one this
prints what it needs and exits with status 2.

How a case is chosen and read (each rule stated, since the reference's test harness differs from ours):
- a case is a block between `==` lines: the SQL before `--`, the expected output after; the
  verdict is OK unless an `ERROR:` or `Rewrite ERROR:` line is expected;
- kept: statements with a DP clause, over the catalog below only, without query parameters
  (`@p`), alternations (`{{a|b}}`), UNNEST, DDL/DML/TVF/proto/array files (types we do not model);
- a statement tested under several language-feature sets (the reference refuses it where a
  feature is off): the verdict of the richest set counts (we offer every feature); a case that turns
  a feature off on its own and is refused for it ("... is not supported", "... has not been
  enabled") is left out;
- a case whose expected output has no rewritten AST was checked by the analyzer only (the
  differential-privacy rewriter, which checks privacy units, did not run): its OK says nothing
  about units, so such an OK over tables that have no privacy unit is left out (dp_functions.test);
- cases run with another catalog (`[use_database=...]`) or with OPTIONS names allowed by the
  embedding application (`[additional_allowed_anonymization_options=...]`) are left out;
- the catalog is ZetaSQL's sample catalog (zetasql/testdata/sample_catalog_impl.cc) for the tables
  these tests read: columns in order, the privacy unit where `SetAnonymizationInfo` names one.
"""

from __future__ import annotations

import argparse
import collections
import re
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

DEFAULT_MIRROR = "/work/.mirror/google+zetasql/repo"
TESTDATA = "zetasql/analyzer/testdata"
SKIPPED_FILES = ("ddl", "dml", "tvf", "proto", "disabled", "array")
SIMPLE_TYPES = ("int32", "int64", "uint32", "uint64", "string", "bytes", "bool", "float", "double", "date",
                "timestamp_seconds", "timestamp_millis", "timestamp_micros", "timestamp_nanos", "timestamp",
                "numeric", "bignumeric", "json", "uuid")
#: ZetaSQL's sample catalog (sample_catalog_impl.cc): name -> (columns in order, privacy unit)
CATALOG = {
    "SimpleTypes": (SIMPLE_TYPES, None),
    "SimpleTypesWithAnonymizationUid": (("int32", "int64", "uint32", "uint64", "string", "bytes", "bool", "float",
                                         "double", "date", "uid", "numeric"), "uid"),
    "KeyValue": (("Key", "Value"), None),
    "T1StringAnonymizationUid": (("uid", "c2"), "uid"),
    "T2StringAnonymizationUid": (("c1", "uid"), "uid"),
}
#: test options that configure the reference beyond its product behaviour: another catalog (named
#: constants such as SQL_PROTO), extra OPTIONS names allowed by the embedding application
CONFIGURED = ("[use_database=", "[additional_allowed_anonymization_options=")
#: a refusal because a language feature is off in this case ("max_rows_contributed is not supported")
FEATURE_GATED = re.compile(r"is not supported$|is not supported \[|has not been enabled|not enabled")
#: names the tests use for CTEs and aliases (a FROM of these alone is still over the catalog)
LOCAL_NAMES = {"t", "t1", "t2", "t3", "a", "b", "s", "q", "x"}


def git(mirror: str, *args: str) -> str:
    return subprocess.run(["git", "-C", mirror, *args], capture_output=True, text=True, check=True).stdout


def cases(mirror: str, name: str):
    """(sql, verdict, features, analyzer_only) of each case of one test file."""
    text = git(mirror, "show", f"HEAD:{TESTDATA}/{name}")
    default_features = ""
    for block in text.split("\n==\n"):
        head, _, rest = block.partition("\n--\n")
        options = [line for line in head.splitlines() if line.startswith("[")]
        for line in options:
            if line.startswith("[default language_features="):
                default_features = line
        override = next((line for line in options if line.startswith("[language_features=")), None)
        features = override or default_features
        if any(line.startswith(CONFIGURED) for line in options):
            continue  # the reference was configured beyond its defaults for this case (see CONFIGURED)
        sql = "\n".join(line for line in head.splitlines() if not line.startswith(("[", "#"))).strip()
        err = re.search(r"^(?:Rewrite )?ERROR: (.*)$", rest, re.MULTILINE)
        verdict = err.group(1)[:150] if err else "OK"
        analyzer_only = verdict == "OK" and "REWRITTEN AST" not in rest
        if override and override != default_features and FEATURE_GATED.search(verdict):
            continue  # refused because the case turned a language feature off (we offer every feature)
        yield sql, verdict, features, analyzer_only


def richness(features: str) -> int:
    """How many features a case's language_features line enables (MAXIMUM: all)."""
    return 10_000 if "MAXIMUM" in features else features.count("+")


def corpus(mirror: str):
    """The kept cases: (file, sql, verdict), one per statement (the richest feature set's verdict)."""
    files = [line.rsplit("/", 1)[-1] for line in git(mirror, "ls-tree", "-r", "--name-only", "HEAD", TESTDATA).split()
             if re.search("differential_privacy|dp_functions|anonymization", line)]
    known = {k.lower() for k in CATALOG}
    chosen: dict[str, tuple] = {}
    for name in files:
        if any(x in name for x in SKIPPED_FILES):
            continue
        for sql, verdict, features, analyzer_only in cases(mirror, name):
            if (not sql or "{{" in sql or "@" in sql or "unnest" in sql.lower()
                    or not re.search(r"with\s+(differential_privacy|anonymization)", sql, re.IGNORECASE)):
                continue
            tables = {t.lower() for t in re.findall(r"(?:from|join)\s+([A-Za-z_]\w*)", sql, re.IGNORECASE)}
            if not tables <= known | LOCAL_NAMES:
                continue
            if analyzer_only and not any(CATALOG[k][1] for k in CATALOG if k.lower() in tables):
                continue  # the rewriter (unit checks) never ran: the OK is not a verdict on units
            key = " ".join(sql.split()).lower()
            rank = richness(features)
            if key not in chosen or rank > chosen[key][3]:
                chosen[key] = (name, sql, verdict, rank)
    return [(name, sql, verdict) for name, sql, verdict, _ in chosen.values()]


def evaluate(mirror: str):
    import dp_core as dp
    from dp_core.sql.ownership import TableInfo
    from dp_core.sql.statement import compile_statement

    catalog = {name: TableInfo(name, columns, unit) for name, (columns, unit) in CATALOG.items()}
    stats: collections.Counter = collections.Counter()
    wrong = collections.defaultdict(list)
    for name, sql, verdict in corpus(mirror):
        try:
            compile_statement(sql, catalog, epsilon=1.0)
            ours = "OK"
        except dp.DPError as err:
            ours = "ERR: " + str(err)[:160]
        except Exception as err:  # noqa: BLE001 - a crash is what this counts
            ours = "CRASH " + repr(err)[:160]
        if ours.startswith("CRASH"):
            kind = "crash"
        elif (ours == "OK") == (verdict == "OK"):
            kind = "agree"
        else:
            kind = "we_refuse" if verdict == "OK" else "we_accept"
        stats[kind] += 1
        if kind != "agree":
            wrong[kind].append((name, " ".join(sql.split())[:300], verdict, ours))
    return stats, wrong


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mirror", default=DEFAULT_MIRROR, help="a git clone of google/zetasql")
    parser.add_argument("--show", type=int, default=10, help="disagreements listed per kind")
    parser.add_argument("--kind", choices=("we_refuse", "we_accept", "crash"), help="list this kind only")
    args = parser.parse_args(argv)
    if not Path(args.mirror).exists():
        print(f"no ZetaSQL mirror at {args.mirror}: clone https://github.com/google/zetasql there (or give "
              "--mirror DIR); this tool is not run in CI", file=sys.stderr)
        return 2
    stats, wrong = evaluate(args.mirror)
    total = sum(stats.values())
    print(f"{total} statements: {stats['agree']} agree ({stats['agree'] / max(total, 1):.1%}), "
          f"{stats['we_refuse']} wrongly refused, {stats['we_accept']} wrongly accepted, {stats['crash']} crashed")
    for kind, items in wrong.items():
        if args.kind and kind != args.kind:
            continue
        print(f"===== {kind} {len(items)}")
        for name, sql, verdict, ours in items[:args.show]:
            print(f"  {name} | {sql}\n     REF:  {verdict[:120]}\n     OURS: {ours[:160]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
