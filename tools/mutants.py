"""`make mutants`: mutation testing of the privacy-critical code with mutmut, scoped and summarised.

mutmut copies the packages into mutants/, mutates the modules that [tool.mutmut] only_mutate names in
pyproject.toml (dp_core/ and the publishing, signing, escrow and ledger modules), records once which
tests call which function, and then runs each mutant against only those tests (one worker by default:
the machines we share have two cores). Results are cached in mutants/: a rerun tests only the
functions whose code changed.

    python tools/mutants.py                       # every critical module (cached results kept)
    python tools/mutants.py --files dp_core/noise.py dprelease/store/ledger.py
    python tools/mutants.py --changed main        # critical modules changed since `main` (and uncommitted)
    python tools/mutants.py --summary             # the kill-rate table of what has run so far

The summary counts the survivors listed in tools/mutants_equivalent.txt (judged equivalent in
docs/testing.md) apart from the others.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import subprocess
import sys
import tomllib
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EQUIVALENT_LIST = ROOT / "tools" / "mutants_equivalent.txt"
#: mutmut's exit codes (mutmut/stats.py) folded into the columns of the summary
STATUS = {1: "killed", 3: "killed", 0: "survived", 5: "no tests", 33: "no tests", 34: "skipped",
          36: "timeout", -24: "timeout", 24: "timeout", 152: "timeout", 255: "timeout", None: "not run"}


def mutmut_config() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mutmut"]


def mutated_modules() -> list[str]:
    """The source files mutmut mutates (only_mutate minus do_not_mutate), relative to the root."""
    cfg = mutmut_config()
    found = []
    for source in cfg["source_paths"]:
        for path in sorted((ROOT / source).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if any(fnmatch.fnmatch(rel, p) for p in cfg.get("only_mutate", ["*"])) and not any(
                    fnmatch.fnmatch(rel, p) for p in cfg.get("do_not_mutate", [])):
                found.append(rel)
    return found


def changed_files(ref: str) -> list[str]:
    """Files changed between `ref` and the work tree (committed on this branch or not yet committed)."""
    base = subprocess.run(["git", "merge-base", ref, "HEAD"], cwd=ROOT, capture_output=True, text=True)
    if base.returncode != 0:
        sys.exit(f"mutants: cannot compare with {ref!r} ({base.stderr.strip()}); give a branch or commit that exists")
    diff = subprocess.run(["git", "diff", "--name-only", base.stdout.strip()], cwd=ROOT, capture_output=True,
                          text=True, check=True)
    untracked = subprocess.run(["git", "ls-files", "--others", "--exclude-standard"], cwd=ROOT, capture_output=True,
                               text=True, check=True)
    return sorted(set(diff.stdout.split()) | set(untracked.stdout.split()))


def scope(files: list[str]) -> list[str]:
    """The mutated modules among `files`; says which ones are not mutated and why."""
    critical = set(mutated_modules())
    packages = tuple(f"{source}/" for source in mutmut_config()["source_paths"])
    chosen = [f for f in dict.fromkeys(Path(f).as_posix() for f in files) if f in critical]
    for f in files:
        if Path(f).as_posix() not in critical and f.endswith(".py") and Path(f).as_posix().startswith(packages):
            print(f"mutants: {f} is not mutated (not in [tool.mutmut] only_mutate of pyproject.toml)")
    return chosen


def module_of(path: str) -> str:
    return path[:-3].replace("/", ".")


def run_mutmut(modules: list[str] | None, max_children: int) -> int:
    """mutmut run over `modules` (None: all of them), with the mutated copy first on every path."""
    mutmut = Path(sys.executable).with_name("mutmut")
    globs = [f"{module_of(m)}.x*" for m in modules] if modules else []
    env = dict(os.environ)
    # subprocesses started by tests import the mutated copy too, never the work tree. The directory
    # must exist before mutmut starts: Python remembers a missing path entry as unusable, and the
    # packages would then be imported from wherever else they are installed.
    (ROOT / "mutants").mkdir(exist_ok=True)
    env["PYTHONPATH"] = str(ROOT / "mutants")
    command = [str(mutmut), "run", "--max-children", str(max_children), *globs]
    print("mutants:", " ".join(command[1:]), flush=True)
    return subprocess.run(command, cwd=ROOT, env=env).returncode


def equivalent_mutants() -> set[str]:
    """Mutant names judged equivalent (docs/testing.md says why), one per line, `#` starts a comment."""
    if not EQUIVALENT_LIST.exists():
        return set()
    return {line.split("#")[0].strip() for line in EQUIVALENT_LIST.read_text().splitlines()} - {""}


def summary(modules: list[str] | None = None) -> str:
    """Markdown table: per module, killed / non-equivalent mutants, plus survivors and the equivalent ones."""
    equivalent = equivalent_mutants()
    rows = ["| module | killed | survived | equivalent | no tests | timeout | not run | kill rate |",
            "|---|---:|---:|---:|---:|---:|---:|---:|"]
    totals: Counter = Counter()
    for path in modules or mutated_modules():
        meta = ROOT / "mutants" / (path + ".meta")
        if not meta.exists():
            continue
        counts: Counter = Counter()
        for name, code in json.loads(meta.read_text())["exit_code_by_key"].items():
            status = STATUS.get(code, "suspicious")
            if status == "survived" and name in equivalent:
                status = "equivalent"
            counts[status] += 1
        if not counts:
            continue
        totals.update(counts)
        rows.append(_row(path, counts))
    rows.append(_row("**all**", totals))
    return "\n".join(rows)


def _row(label: str, c: Counter) -> str:
    # timeouts count as killed (the mutant never finished the tests), as mutmut counts them
    judged = c["killed"] + c["timeout"] + c["survived"] + c["no tests"]
    rate = f"{100 * (c['killed'] + c['timeout']) / judged:.1f}%" if judged else "-"
    return (f"| {label} | {c['killed']} | {c['survived']} | {c['equivalent']} | {c['no tests']} | {c['timeout']} "
            f"| {c['not run']} | {rate} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", nargs="*", default=None, help="only these source files (paths from the root)")
    parser.add_argument("--changed", metavar="REF", help="only the mutated modules changed since REF (e.g. main)")
    parser.add_argument("--max-children", type=int, default=1, help="parallel mutant workers (default 1)")
    parser.add_argument("--summary", action="store_true", help="print the kill-rate table and stop")
    args = parser.parse_args()
    os.chdir(ROOT)
    if args.summary:
        print(summary())
        return 0
    modules = None
    if args.files is not None or args.changed:
        wanted = list(args.files or []) + (changed_files(args.changed) if args.changed else [])
        modules = scope(wanted)
        if not modules:
            print("mutants: no mutated module in scope; nothing to do")
            return 0
    code = run_mutmut(modules, args.max_children)
    print(summary(modules))
    print("survivors: `mutmut results` lists them, `mutmut show NAME` shows one (run from the repository root)")
    return code


if __name__ == "__main__":
    sys.exit(main())
