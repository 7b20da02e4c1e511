"""tools/mutants.py, the `make mutants` summary: a drawn sample's kill rates read from mutmut's own
result files (.meta), with the mutants judged equivalent counted apart, and the 95% Wilson interval."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def tool(tmp_path, monkeypatch):
    """The tool, reading a results tree under tmp_path instead of the repository's mutants/."""
    spec = importlib.util.spec_from_file_location("mutants_tool", ROOT / "tools" / "mutants.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(module, "ROOT", tmp_path)
    monkeypatch.setattr(module, "EQUIVALENT_LIST", tmp_path / "equivalent.txt")
    return module


def _results(root: Path, path: str, codes: dict) -> None:
    meta = root / "mutants" / (path + ".meta")
    meta.parent.mkdir(parents=True, exist_ok=True)
    meta.write_text(json.dumps({"exit_code_by_key": codes}))


def test_wilson_interval_matches_the_published_values(tool):
    low, high = tool.wilson(8, 10)  # by hand: (0.8 + z^2/20 +- z sqrt(0.016 + z^2/400)) / (1 + z^2/10), z = 1.96
    assert (round(low, 4), round(high, 4)) == (0.4902, 0.9433)
    assert tool.wilson(0, 0) == (0.0, 1.0)


def test_a_sample_counts_equivalent_mutants_apart_survivors_and_untested_alike(tool, tmp_path):
    """A survivor and a mutant no selected test reaches, both judged equivalent, leave the
    denominator; the other survivor counts as not killed; the group rate weighs modules by size."""
    core = {f"dp_core.a.x_f__mutmut_{i}": code for i, code in enumerate([1, 3, 0, 0, 33], start=1)}
    escrow = {f"dprelease.escrow.b.x_g__mutmut_{i}": 1 for i in range(1, 5)}
    _results(tmp_path, "dp_core/a.py", {**core, "dp_core.a.x_f__mutmut_9": None})  # one not drawn
    _results(tmp_path, "dprelease/escrow/b.py", escrow)
    (tmp_path / "equivalent.txt").write_text("# judged\ndp_core.a.x_f__mutmut_3  # why\ndp_core.a.x_f__mutmut_5\n")
    (tmp_path / "mutants" / "sample-7.json").write_text(json.dumps({
        "seed": 7, "size": 5, "population": {"dp_core/a.py": 100, "dprelease/escrow/b.py": 50},
        "drawn": {"dp_core/a.py": sorted(core), "dprelease/escrow/b.py": sorted(escrow)}}))
    table = tool.sample_summary(7)
    # killed 2 (exit codes 1 and 3), survived 1, equivalent 2 (a survivor and an untested one)
    assert "| dp_core/a.py | 100 | 5 | 2 | 1 | 2 | 0 | 0 | 0 | 66.7% |" in table
    assert "| dprelease/escrow/b.py | 50 | 4 | 4 | 0 | 0 | 0 | 0 | 0 | 100.0% |" in table
    low, high = tool.wilson(2, 3)
    assert f"| dp_core/ | 1 | 3 | 66.7% | {100 * low:.1f}-{100 * high:.1f}% | not established |" in table
    low, high = tool.wilson(4, 4)
    assert f"| publishing, signing, escrow, ledger | 1 | 4 | 100.0% | {100 * low:.1f}-{100 * high:.1f}% |" in table
    assert tool.status_of(33, "dp_core.a.x_f__mutmut_5", tool.equivalent_mutants()) == "equivalent"
    assert tool.status_of(33, "dp_core.a.x_f__mutmut_4", tool.equivalent_mutants()) == "no tests"


def test_a_targeted_sample_gives_no_verdict_for_its_group(tool, tmp_path):
    """A sample of modules chosen by hand (--files) is marked targeted: the summary gives their
    weighted rate but no verdict on the group's target."""
    _results(tmp_path, "dp_core/a.py", {f"dp_core.a.x_f__mutmut_{i}": 1 for i in range(1, 4)})
    (tmp_path / "mutants" / "sample-8.json").write_text(json.dumps({
        "seed": 8, "size": 3, "population": {"dp_core/a.py": 100}, "targeted": True,
        "drawn": {"dp_core/a.py": [f"dp_core.a.x_f__mutmut_{i}" for i in range(1, 4)]}}))
    assert tool.sample_summary(8).splitlines()[-1].endswith(
        "| none: a targeted sample of 1 chosen modules, not the group's estimate |")


def test_a_sample_can_draw_more_mutants_under_a_path_prefix(tool, tmp_path):
    """`--sample 2 --sample-for dprelease/=3 dprelease/store/=1`: the longest prefix a module starts
    with gives its size; other modules get the common size."""
    for path, n in {"dp_core/a.py": 5, "dprelease/escrow/b.py": 5, "dprelease/store/c.py": 5}.items():
        _results(tmp_path, path, {f"{path[:-3].replace('/', '.')}.x_f__mutmut_{i}": None for i in range(n)})
    sizes = {"dprelease/": 3, "dprelease/store/": 1}
    drawn = tool.draw_sample(["dp_core/a.py", "dprelease/escrow/b.py", "dprelease/store/c.py"], 2, 7, sizes)
    assert {path: len(names) for path, names in drawn.items()} == {
        "dp_core/a.py": 2, "dprelease/escrow/b.py": 3, "dprelease/store/c.py": 1}
    assert drawn["dp_core/a.py"] == tool.draw_sample(["dp_core/a.py"], 2, 7)["dp_core/a.py"]  # same seed, same draw
