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
    python tools/mutants.py --sample 30 --seed 20261124   # a uniform random sample of each module's mutants
    python tools/mutants.py --summary --seed 20261124     # that sample's kill rates, with 95% Wilson intervals
    python tools/mutants.py --sample 4 --sample-for dprelease/=8 --seed 20261125   # 8 per module under dprelease/

The summary counts the survivors listed in tools/mutants_equivalent.txt (judged equivalent in
docs/testing.md) apart from the others. A sample (`--sample N --seed S`) draws N mutant names per module
uniformly at random, with a generator seeded by S and the module's path, so the same seed draws the same
sample again (as long as the module's code has not changed) and a module's sample does not depend on which
other modules are in scope. The drawn names are kept in mutants/sample-S.json for the summary. A sample
of modules chosen with --files or --changed is marked targeted: its summary gives no group verdict.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import math
import os
import random
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


def run_mutmut(modules: list[str] | None, max_children: int, names: list[str] | None = None) -> int:
    """mutmut run over `names`, else every mutant of `modules` (None: all of them), with the mutated copy first
    on every path."""
    mutmut = Path(sys.executable).with_name("mutmut")
    globs = names or ([f"{module_of(m)}.x*" for m in modules] if modules else [])
    env = dict(os.environ)
    # subprocesses started by tests import the mutated copy too, never the work tree. The directory
    # must exist before mutmut starts: Python remembers a missing path entry as unusable, and the
    # packages would then be imported from wherever else they are installed.
    (ROOT / "mutants").mkdir(exist_ok=True)
    env["PYTHONPATH"] = str(ROOT / "mutants")
    command = [str(mutmut), "run", "--max-children", str(max_children), *globs]
    print("mutants:", " ".join(command[1:]), flush=True)
    return subprocess.run(command, cwd=ROOT, env=env).returncode


#: mutmut's own first step of `mutmut run` (copy the packages, write every mutant, record each function's
#: hash in the .meta files), run on its own so that the mutant names exist before any test runs
GENERATE = """
import mutmut.__main__ as m
from mutmut.mutation.trampoline import set_mutant_under_test
from mutmut.utils.file_utils import copy_also_copy_files, copy_src_dir, setup_source_paths
set_mutant_under_test("mutant_generation")
copy_src_dir(); copy_also_copy_files(); setup_source_paths(); m.store_lines_covered_by_tests()
print(m.create_mutants(1))
"""


def generate_mutants() -> None:
    """Write every mutant (only the modules changed since the last time: mutmut compares file times)."""
    (ROOT / "mutants").mkdir(exist_ok=True)
    print("mutants: generating the mutants (the first time about 7 minutes)", flush=True)
    subprocess.run([sys.executable, "-c", GENERATE], cwd=ROOT, check=True, stdout=subprocess.DEVNULL)


def mutant_names(path: str) -> list[str]:
    """Every generated mutant of the module at `path`, from mutmut's .meta file (in generation order)."""
    meta = ROOT / "mutants" / (path + ".meta")
    return list(json.loads(meta.read_text())["exit_code_by_key"]) if meta.exists() else []


def size_for(path: str, size: int, sizes: dict[str, int] | None) -> int:
    """The sample size of the module at `path`: that of the longest prefix in `sizes` it starts with, else `size`."""
    prefixes = [p for p in (sizes or {}) if path.startswith(p)]
    return sizes[max(prefixes, key=len)] if prefixes else size


def draw_sample(modules: list[str], size: int, seed: int, sizes: dict[str, int] | None = None) -> dict[str, list[str]]:
    """Per module, `size` of its mutant names (or the size `sizes` gives its path prefix) drawn uniformly
    without replacement (all of them if fewer).

    The generator is seeded by the seed and the module's path: a module's draw is the same whatever else
    is in scope, and redrawing with the same seed gives the same names while the module is unchanged.
    """
    drawn = {}
    for path in modules:
        names = sorted(mutant_names(path))
        if not names:
            continue  # a module of constants and classes without methods: nothing to mutate
        n = size_for(path, size, sizes)
        drawn[path] = sorted(random.Random(f"{seed}:{path}").sample(names, min(n, len(names))))
    return drawn


def sample_file(seed: int) -> Path:
    return ROOT / "mutants" / f"sample-{seed}.json"


def run_sample(modules: list[str], size: int, seed: int, max_children: int, sizes: dict[str, int] | None = None,
               targeted: bool = False) -> int:
    """Draw the sample, record it in mutants/sample-SEED.json and run exactly those mutants.
    targeted: the modules were chosen (--files, --changed), so the sample estimates no group."""
    if any(not (ROOT / "mutants" / (m + ".meta")).exists() for m in modules) or os.environ.get("MUTANTS_REGENERATE"):
        generate_mutants()
    drawn = draw_sample(modules, size, seed, sizes)
    size = size if not sizes else f"{size} ({', '.join(f'{p}: {n}' for p, n in sizes.items())})"
    record = {"seed": seed, "size": size, "population": {m: len(mutant_names(m)) for m in drawn}, "drawn": drawn,
              "targeted": targeted}
    previous = json.loads(sample_file(seed).read_text()) if sample_file(seed).exists() else None
    if previous and previous["size"] == size:
        # a later run with the same seed (e.g. to rerun after new tests) keeps the modules drawn before
        record["population"] = previous["population"] | record["population"]
        record["drawn"] = previous["drawn"] | record["drawn"]
        record["targeted"] = previous.get("targeted", False) or targeted
    sample_file(seed).write_text(json.dumps(record, indent=1))
    names = [name for path in drawn for name in drawn[path]]
    print(f"mutants: {len(names)} mutants drawn from {len(drawn)} modules (seed {seed}, up to {size} each)")
    return run_mutmut(modules, max_children, names=names)


def wilson(killed: int, n: float, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval of a proportion killed/n (n may be an effective, fractional size)."""
    if n <= 0:
        return 0.0, 1.0
    p = killed / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


#: the two groups issue 19 sets the 90% target for, by path prefix
GROUPS = {"dp_core/": ("dp_core/",),
          "publishing, signing, escrow, ledger": ("dprelease/reporting/", "dprelease/escrow/",
                                                  "dprelease/store/ledger.py")}


def sample_summary(seed: int) -> str:
    """Markdown tables of a drawn sample: per module and per group, the kill rate with its 95% Wilson interval.

    A group's rate is stratified: each module's sampled rate weighted by its number of mutants, so a small
    module sampled whole does not weigh like a large one; its interval is Wilson's at the effective sample
    size 1 / sum(w^2 / n) of that weighting (Kish), which equals the plain count when sampling is proportional.
    """
    if not sample_file(seed).exists():
        sys.exit(f"mutants: no sample drawn with seed {seed} (run --sample N --seed {seed} first)")
    record = json.loads(sample_file(seed).read_text())
    equivalent = equivalent_mutants()
    rows = ["| module | mutants | sampled | killed | survived | equivalent | no tests | timeout | not run "
            "| kill rate | 95% interval |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    strata = {}
    for path, names in sorted(record["drawn"].items()):
        meta = ROOT / "mutants" / (path + ".meta")
        codes = json.loads(meta.read_text())["exit_code_by_key"] if meta.exists() else {}
        counts: Counter = Counter(status_of(codes.get(name), name, equivalent) for name in names)
        killed, judged = counts["killed"] + counts["timeout"], _judged(counts)
        # a module's non-equivalent mutants, estimated from the share of its sample judged equivalent
        sampled_done = judged + counts["equivalent"]
        population = record["population"][path]
        weight = population * (judged / sampled_done) if sampled_done else 0
        strata[path] = (killed, judged, weight)
        low, high = wilson(killed, judged)
        rate = f"{100 * killed / judged:.1f}%" if judged else "-"
        rows.append(f"| {path} | {population} | {len(names)} | {killed} | {counts['survived']} | {counts['equivalent']} "
                    f"| {counts['no tests']} | {counts['timeout']} | {counts['not run']} | {rate} "
                    f"| {100 * low:.1f}-{100 * high:.1f}% |")
    lines = ["\n".join(rows), "",
             "| group | modules | sampled mutants judged | estimated kill rate | 95% interval | target 90% |",
             "|---|---:|---:|---:|---|---|"]
    for group, prefixes in GROUPS.items():
        members = [s for path, s in strata.items() if path.startswith(prefixes) and s[1]]
        if not members:
            continue
        total_weight = sum(w for _, _, w in members)
        rate = sum(w * k / n for k, n, w in members) / total_weight
        effective = 1 / sum((w / total_weight) ** 2 / n for _, n, w in members)
        low, high = wilson(rate * effective, effective)
        verdict = "met" if low >= 0.9 else ("not met" if high < 0.9 else "not established")
        if record.get("targeted"):  # modules chosen by hand: their rate, not an estimate of the group
            verdict = f"none: a targeted sample of {len(members)} chosen modules, not the group's estimate"
        lines.append(f"| {group} | {len(members)} | {sum(n for _, n, _ in members)} | {100 * rate:.1f}% "
                     f"| {100 * low:.1f}-{100 * high:.1f}% | {verdict} |")
    return "\n".join(lines)


def status_of(code: int | None, name: str, equivalent: set[str]) -> str:
    """The summary's column for one mutant: mutmut's verdict, or "equivalent" for a mutant judged so
    that no test kills (a survivor, or one of a function no selected test calls)."""
    status = STATUS.get(code, "suspicious")
    return "equivalent" if status in ("survived", "no tests") and name in equivalent else status


def _judged(c: Counter) -> int:
    """Mutants with a verdict that counts: killed, timed out, survived or not reached by any selected test."""
    return c["killed"] + c["timeout"] + c["survived"] + c["no tests"]


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
        counts: Counter = Counter(status_of(code, name, equivalent)
                                  for name, code in json.loads(meta.read_text())["exit_code_by_key"].items())
        if not counts:
            continue
        totals.update(counts)
        rows.append(_row(path, counts))
    rows.append(_row("**all**", totals))
    return "\n".join(rows)


def _row(label: str, c: Counter) -> str:
    # timeouts count as killed (the mutant never finished the tests), as mutmut counts them
    judged = _judged(c)
    rate = f"{100 * (c['killed'] + c['timeout']) / judged:.1f}%" if judged else "-"
    return (f"| {label} | {c['killed']} | {c['survived']} | {c['equivalent']} | {c['no tests']} | {c['timeout']} "
            f"| {c['not run']} | {rate} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", nargs="*", default=None, help="only these source files (paths from the root)")
    parser.add_argument("--changed", metavar="REF", help="only the mutated modules changed since REF (e.g. main)")
    parser.add_argument("--max-children", type=int, default=1, help="parallel mutant workers (default 1)")
    parser.add_argument("--summary", action="store_true", help="print the kill-rate table and stop "
                        "(with --seed: the table of that sample)")
    parser.add_argument("--sample", type=int, metavar="N", help="run a uniform random sample of N mutants per module")
    parser.add_argument("--sample-for", nargs="*", default=[], metavar="PREFIX=N",
                        help="another sample size for the modules under a path prefix, e.g. dprelease/=8")
    parser.add_argument("--seed", type=int, metavar="S", help="the seed of the sample (required with --sample)")
    args = parser.parse_args()
    os.chdir(ROOT)
    if args.summary:
        print(sample_summary(args.seed) if args.seed is not None else summary())
        return 0
    if args.sample is not None and args.seed is None:
        parser.error("--sample needs --seed, so that the sample can be drawn again")
    modules = None
    if args.files is not None or args.changed:
        wanted = list(args.files or []) + (changed_files(args.changed) if args.changed else [])
        modules = scope(wanted)
        if not modules:
            print("mutants: no mutated module in scope; nothing to do")
            return 0
    if args.sample is not None:
        sizes = {prefix: int(n) for prefix, n in (item.rsplit("=", 1) for item in args.sample_for)}
        code = run_sample(modules or mutated_modules(), args.sample, args.seed, args.max_children, sizes,
                          targeted=modules is not None)
        print(sample_summary(args.seed))
    else:
        code = run_mutmut(modules, args.max_children)
        print(summary(modules))
    print("survivors: `mutmut results` lists them, `mutmut show NAME` shows one (run from the repository root)")
    return code


if __name__ == "__main__":
    sys.exit(main())
