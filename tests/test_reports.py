"""HTML reports: what the analyst sees (public only), what the controller sees, self-containment,
escaping, data files, and a real browser rendering the analyst page (platform.md, "Reports";
invariants 1 and 4; usability.md, "Measures of accuracy", "Explaining privacy")."""

from __future__ import annotations

import csv as csv_module
import dataclasses
import html
import io
import json
import math
import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from patience import PATIENCE_S

import dp_core as dp
from dp_core import display, pri
from dp_core import risk as risk_model
from dprelease.reporting import charts, data_files, pages

SCRIPT = "<script>alert(1)</script>"
NAMESPACES = {"http://www.w3.org/2000/svg", "http://www.w3.org/1999/xlink"}
URL = re.compile(r"https?://[^\s\"'<>)]*", re.IGNORECASE)
#: words that label controller-only numbers; none may appear on the analyst's page
FORBIDDEN = ("partition loss", "clamping loss", "clamped", "controller", "bounding loss", "exact", "raw data")


@pytest.fixture(scope="module")
def data(adult) -> pd.DataFrame:
    df = adult.copy()
    # a column whose exact per-group sums have many distinctive digits (e.g. 2663191.2020561695):
    # the released sums sit on a coarse grid, so finding one of these strings means a leak
    df["score"] = np.random.default_rng(20261122).uniform(0, 1000, len(df)).round(6)
    return df


@pytest.fixture(scope="module")
def result(data):
    q = dp.Query(
        [dp.count(upper=1, name="people"), dp.avg("age", 17, 90, name="avg_age"),
         dp.median("age", 17, 90, name="median_age"), dp.sum_("score", 0, 1000, name="score_total"),
         dp.Aggregate("sum", column="capital_gain", name="capital_gain")],  # bounds inferred: clamping > 0
        privacy_unit="person_id", group_by=("education",), epsilon=1.0,
    )
    return dp.execute(q, data)


def make_ctx(**kw) -> pages.ReleaseContext:
    base = {
        "release_id": "rel-0007", "dataset": "adult", "dataset_fingerprint": "sha256:" + "3f" * 32,
        "privacy_unit": "person_id",
        "request_text": f"SELECT education, COUNT(*) FROM adult GROUP BY education -- {SCRIPT}",
        "requested_by": "ana@example.org", "approved_by": "Dana Approver", "decided_at": "2026-11-02T10:15:00Z",
        "created_at": "2026-11-01T09:00:00Z", "epsilon_mode": "fixed",
        "epsilon_explanation": "Epsilon 1 was fixed in the release request.", "risk_summary": None, "charts": {},
        "verify_hint": "dprelease verify releases/rel-0007",
    }
    base.update(kw)
    return pages.ReleaseContext(**base)


# rendered in each test that reads them (cheap): mutation testing runs, for a mutant of the renderer,
# only the tests that call it themselves, and a module-scoped page would count for its first test only
@pytest.fixture
def analyst_html(result) -> str:
    return pages.render_analyst_report(result, make_ctx())


@pytest.fixture
def controller_html(result) -> str:
    return pages.render_controller_report(result, make_ctx())


def exact_strings(result) -> list[str]:
    """Several spellings of each released group's exact score_total (raw data)."""
    ex = result.controller_only.exact
    ex = ex[ex["released"].astype(bool)]
    out = []
    for v in ex["score_total"].astype(float):
        assert not float(v).is_integer()
        out += [pages.fmt_number(v), f"{v:.2f}", f"{v:.3f}", repr(float(v))]
    assert out
    return out


def external_urls(text: str) -> set[str]:
    return {u for u in URL.findall(text) if u not in NAMESPACES}


# --------------------------------------------------------------------------------------------
# analyst report: the public view


def test_analyst_report_has_the_public_facts(result, analyst_html):
    page = analyst_html
    assert f"<b>{pages.fmt_number(result.epsilon_spent)}</b>" in page  # epsilon in the header
    assert pages.fmt_number(result.delta_spent) in page
    assert "sha256:" + "3f" * 32 in page and "Dana Approver" in page and "2026-11-02T10:15:00Z" in page
    assert "dprelease verify releases/rel-0007" in page
    # every released group and its value with the confidence interval
    readable = result.readable_table()
    for row in readable.drop(columns=["people"]).itertuples(index=False):  # counts: as integers (below)
        for cell in row:
            assert f">{html.escape(str(cell))}<" in page, cell
    # CI columns of the numeric table and the caveats
    for name in ("people", "avg_age", "score_total", "capital_gain"):
        assert f"{name} low" in page and f"{name} high" in page and f"{name} noise sd" in page
    for note in result.notes:
        assert html.escape(note) in page
    # mechanisms with sensitivity and scale; budget split
    for m in result.mechanisms:
        assert html.escape(m.target) in page
        if m.scale is not None:
            assert f">{pages.fmt_number(m.scale)}<" in page
        assert f">{pages.fmt_number(m.sensitivity)}<" in page
    for s in result.budget:
        assert f"<td>{html.escape(s.part)}</td>" in page
    # bounds, inferred bounds with their DP histogram (inline SVG)
    inferred = result.inferred_bounds[0]
    assert "APPROX_BOUNDS" in page and f"bounds chosen: [{inferred.lower:g}, {inferred.upper:g}]" in page
    # one histogram per inferred bound, one released-values chart per statistic
    assert page.count("<svg") == len(result.inferred_bounds) + len(result.query.aggregates)
    assert len(result.inferred_bounds) >= 1
    # plain words: posterior guessing bound for a yes/no attribute at this epsilon
    q = 100 * risk_model.guessing_bound(result.epsilon_spent, 2)
    assert f"cannot be more than {q:.1f}% sure" in page and "73.1%" in page
    assert "knows the data of everyone except one person" in page and "a coin toss (50%)" in page
    # missing groups: said, not counted
    assert pages.MISSING_GROUPS_NOTE in page
    assert "Epsilon 1 was fixed in the release request." in page


def test_analyst_report_contains_nothing_controller_only(result, analyst_html):
    page = analyst_html
    lower = page.lower()
    for word in FORBIDDEN:
        assert word not in lower, word
    assert not re.search(r"\bPRIs?\b", page)
    assert "controller_only" not in page
    for s in exact_strings(result):
        assert s not in page, f"exact (raw) value {s} on the analyst page"
    co = result.controller_only
    assert co.partitions_dropped >= 0 and co.clamping["capital_gain"].clamped > 0
    assert pages.fmt_number(co.clamping["capital_gain"].total_shift) not in page


def test_analyst_report_never_reads_the_controller_field(result):
    """Structural check of invariant 4: rendering does not touch `controller_only` at all."""

    class Tripwire:
        def __getattr__(self, name):
            raise AssertionError(f"the analyst report read controller_only.{name}")

    sealed = dataclasses.replace(result, controller_only=Tripwire())
    assert "<h2>Results</h2>" in pages.render_analyst_report(sealed, make_ctx())


def test_epsilon_from_pri_is_public_on_the_analyst_page(data):
    q = dp.Query([dp.count(upper=1, name="people")], privacy_unit="person_id", epsilon=1.0)
    res = pri.release_with_pri(q, data.head(2000), p=50)  # public mode: a count, no grouping
    assert res.controller_only.pri_ranges and res.epsilon_choice is not None
    ctx = make_ctx(epsilon_mode="pri", epsilon_explanation="Chosen by the platform from p = 50.",
                   charts={"Noise against risk": charts.noise_risk_svg(
                       trust="high", sensitivity="high", max_risk=0.2, n=2, chosen_eps=res.epsilon_spent)})
    page = pages.render_analyst_report(res, ctx)
    assert "privacy risk indicator test" in page and "Chosen by the platform from p = 50." in page
    assert not re.search(r"\bPRIs?\b", page) and "controller" not in page.lower()
    assert "Noise against risk" not in page  # ctx.charts go to the controller only
    assert pages.MISSING_GROUPS_NOTE not in page  # no grouping: nothing can be missing
    ctl = pages.render_controller_report(res, ctx)
    assert "PRI ranges per candidate epsilon" in ctl and "Noise against risk" in ctl
    assert ctl.count("<svg") >= 2  # PRI ranges chart and the noise-vs-risk chart
    assert "PRI range of one probe per candidate epsilon (controller only)" in ctl  # the PRI chart's own title
    top = res.controller_only.pri_ranges[0]
    assert f">{pages.fmt_number(top.maximum)}<" in ctl


# --------------------------------------------------------------------------------------------
# controller report


def test_an_ungrouped_release_has_no_chart_of_groups(data):
    """A release without GROUP BY is one row: its numbers are in the results table, and the results
    section draws no per-group chart (grouped releases get one per aggregate: the heading test)."""
    single = dp.execute(dp.Query([dp.count(upper=1, name="people"), dp.avg("age", 17, 90, name="avg_age")],
                                 privacy_unit="person_id", epsilon=1.0), data)
    assert len(single.table) == 1
    page = pages.render_analyst_report(single, make_ctx())
    results = page[page.index('<section id="results">'):]
    results = results[:results.index("</section>")]
    assert 'class="released-chart"' not in page and "<svg" not in results and "people" in results


def test_controller_report_has_the_loss_numbers(result, analyst_html, controller_html):
    page = controller_html
    co = result.controller_only
    assert "CONTROLLER ONLY" in page and "Controller only — not differentially private" in page
    row = (f'<td class="n">{co.partitions_nonempty}</td><td class="n">{co.partitions_released}</td>\n'
           f'<td class="n">{co.partitions_dropped}</td><td class="n">{co.partition_loss * 100:.2f}%</td>')
    assert row in page
    for name, c in co.clamping.items():
        assert (f'<tr><td>{name}</td><td class="n">{c.values}</td><td class="n">{c.clamped}</td>'
                f'<td class="n">{(c.clamped / c.values if c.values else 0) * 100:.2f}%</td>'
                f'<td class="n">{pages.fmt_number(c.total_shift)}</td></tr>') in page
    assert f"<b>{co.pairs_dropped_by_bounding}</b>" in page
    for s in exact_strings(result)[::4]:  # fmt_number spelling: the exact values are shown here
        assert s in page
    assert "Raw against private: capital_gain" in page  # the clamped column's chart
    assert page.count("<svg") == analyst_html.count("<svg") + 1
    # everything the analyst sees is there too
    for section in ('id="privacy"', 'id="results"', 'id="mechanisms"', 'id="bounds"', 'id="verify"'):
        assert section in page


# --------------------------------------------------------------------------------------------
# escaping and self-containment


def test_autoescape(result, analyst_html, controller_html):
    for page in (analyst_html, controller_html):
        assert SCRIPT not in page
        assert html.escape(SCRIPT) in page
    idx = pages.render_index([{"release_id": "r1", "dataset": "a<b>", "title": SCRIPT, "epsilon": 1.0, "delta": 1e-6,
                                     "published_at": "2026-11-02", "path": "r1/report.html"}])
    assert SCRIPT not in idx and html.escape(SCRIPT) in idx and "a&lt;b&gt;" in idx


def test_reports_are_self_contained(result, analyst_html, controller_html):
    idx = pages.render_index([{"release_id": "rel-0007", "dataset": "adult", "title": "Education", "epsilon": 1.0,
                                 "delta": 1e-6, "published_at": "2026-11-02", "path": "rel-0007/analyst.html"}])
    for page in (analyst_html, controller_html, idx):
        assert page.startswith("<!DOCTYPE html>")
        assert external_urls(page) == set()
        low = page.lower()
        assert "<script" not in low.replace(html.escape(SCRIPT).lower(), "")
        assert "<link" not in low and "@import" not in low and "<iframe" not in low
        assert not re.search(r"""(src|href)\s*=\s*["']?\s*(//|[a-z][a-z0-9+.-]*:)""", low)
        assert "<?xml" not in page  # SVG prologs are stripped when inlined
        assert "<style>" in page
    assert 'href="rel-0007/analyst.html"' in idx and "Education" in idx
    with pytest.raises(ValueError):
        pages.render_index([{"release_id": "x", "dataset": "d", "title": "t", "epsilon": 1, "delta": 0,
                                   "published_at": "now", "path": "https://example.org/x.html"}])


def test_index_lists_every_release():
    entries = [{"release_id": f"rel-{i}", "dataset": "adult", "title": f"Release number {i}", "epsilon": 0.5 * i,
                "delta": 1e-6, "published_at": f"2026-11-0{i}", "path": f"rel-{i}/analyst.html"} for i in range(1, 4)]
    page = pages.render_index(entries)
    for e in entries:
        assert f'href="{e["path"]}"' in page and e["title"] in page and e["published_at"] in page
    assert page.count("<tr>") == 1 + len(entries)
    assert "Nothing has been published yet." in pages.render_index([])


def test_index_links_out_of_the_folder_are_refused_naming_the_release_or_series():
    """The index links only inside the published folder; a refusal names the entry and the path."""
    entry = {"release_id": "rel-9", "dataset": "d", "title": "t", "epsilon": 1, "delta": 0, "published_at": "now"}
    with pytest.raises(ValueError) as caught:
        pages.render_index([{**entry, "path": "/srv/www/rel-9.html"}])
    assert str(caught.value) == "index entry 'rel-9': path must be relative, got '/srv/www/rel-9.html'"
    with pytest.raises(ValueError) as caught:
        pages.render_index([{**entry, "path": "rel-9/analyst.html"}],
                           series=[{"name": "visits", "path": "https://example.org/visits.html"}])
    assert str(caught.value) == "series 'visits': path must be relative, got 'https://example.org/visits.html'"


# --------------------------------------------------------------------------------------------
# data files


def test_data_files_are_public_only(result, tmp_path):
    paths = data_files.write_data_files(result, tmp_path / "out")
    assert [p.name for p in paths] == ["results.csv", "results.json"]
    table = pd.read_csv(paths[0])
    assert list(table.columns) == list(result.table.columns)
    assert len(table) == len(result.table)
    assert np.allclose(table["people"], result.table["people"])
    doc = json.loads(paths[1].read_text())
    assert doc == json.loads(result.to_json())
    assert len(doc["rows"]) == len(result.table)
    text = paths[0].read_text() + paths[1].read_text()
    assert set(doc["rows"][0]) == set(result.table.columns)
    for word in ("controller", "partition_loss", "clamping", "clamped", "pri_ranges", "exact",
                 "partitions_nonempty", "pairs_dropped"):
        assert word not in text.lower().replace("not the bias from clamping", ""), word
    for s in exact_strings(result):
        assert s not in text


def test_results_csv_quotes_text_and_leaves_numbers_bare(tmp_path):
    """In results.csv every text cell is quoted and every number bare, so a reader typing by quotes
    keeps a key such as "007" or "1e3" as text (and a key with a line break as one cell) and reads
    the released values as numbers. The files go into a folder that may exist already (the
    release's staging folder) or not yet (nor its parent), and a second write replaces them."""
    import csv

    keys = ["007", "1e3", "two\nlines"]
    df = pd.DataFrame({"uid": range(30), "k": keys * 10, "x": [1.0] * 30})
    query = dp.Query([dp.sum_("x", 0, 2, name="total")], privacy_unit="uid", epsilon=1.0, group_by=("k",),
                     public_partitions=keys)
    result = dp.execute(query, df)
    for _ in range(2):
        data_files.write_data_files(result, tmp_path)
    nested = tmp_path / "staging" / "rel-1"  # a folder whose parent does not exist yet either
    data_files.write_data_files(result, nested)
    assert (nested / "results.csv").read_bytes() == (tmp_path / "results.csv").read_bytes()
    with (tmp_path / "results.csv").open(newline="") as handle:
        header, *rows = list(csv.reader(handle, quoting=csv.QUOTE_NONNUMERIC))
    assert header == list(result.table.columns)
    assert sorted(row[0] for row in rows) == sorted(keys)
    assert all(isinstance(v, float) for row in rows for v in row[1:])


# --------------------------------------------------------------------------------------------
# a real browser


CHROMIUM = next((p for p in (shutil.which("chromium"), "/usr/bin/chromium") if p and os.path.exists(p)), None)
#: chromium 156 with --enable-logging=stderr logs every console message (log, warning, error,
#: uncaught exception) as `[pid:tid:time:INFO:CONSOLE:<line>] "<text>", source: <url> (<line>)`;
#: older builds wrote `INFO:CONSOLE(<line>)` or `ERROR:CONSOLE`. The reports have no scripts, so
#: any console line at all is a failure.
CONSOLE_LINE = re.compile(r":CONSOLE[:(\]]|Uncaught")


def run_chromium(page: Path, png: Path, profile: Path) -> subprocess.CompletedProcess:
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           f"--user-data-dir={profile}", f"--screenshot={png}", "--window-size=1200,1600",
           "--enable-logging=stderr", "--v=0", page.resolve().as_uri()]
    return subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=PATIENCE_S)


def console_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if CONSOLE_LINE.search(line)]


def screenshot(page: Path, tmp_path: Path, name: str) -> Path:
    """The page as a browser draws it (skipped without chromium): no console message, and the
    screenshot `tmp_path/name` is a real picture."""
    if CHROMIUM is None:
        pytest.skip("chromium is not installed (apt-get install -y chromium); CI installs it")
    png = tmp_path / name
    run = run_chromium(page, png, tmp_path / "profile")
    assert run.returncode == 0 and console_lines(run.stderr) == [], run.stderr[-3000:]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    return png


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install -y chromium); CI installs it")
def test_chromium_renders_the_analyst_report(analyst_html, tmp_path):
    import matplotlib.image as mpimg

    # the detector must see a console error on a page that throws, else the check below is vacuous
    canary = tmp_path / "canary.html"
    canary.write_text("<!DOCTYPE html><html><body><p>x</p><script>notDefinedAnywhere();</script></body></html>")
    seen = run_chromium(canary, tmp_path / "canary.png", tmp_path / "profile-canary")
    assert any("notDefinedAnywhere" in line for line in console_lines(seen.stderr)), (
        "chromium's console log format changed: update CONSOLE_LINE\n" + seen.stderr[-3000:])

    page = tmp_path / "analyst.html"
    page.write_text(analyst_html, encoding="utf-8")
    png = tmp_path / "analyst.png"
    run = run_chromium(page, png, tmp_path / "profile")
    assert run.returncode == 0, run.stderr[-3000:]
    assert console_lines(run.stderr) == [], console_lines(run.stderr)
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(data) > 10_000
    img = mpimg.imread(io.BytesIO(data), format="png")
    assert img.shape[:2] == (1600, 1200)
    rgb = img[..., :3].reshape(-1, 3)
    assert float(np.ptp(rgb, axis=0).max()) > 0.5  # dark text on a light page, not one colour
    colours = np.unique((rgb[::97] * 255).round().astype(np.uint8), axis=0)
    assert len(colours) > 10
    dark = float((rgb.mean(axis=1) < 0.35).mean())
    assert 0.001 < dark < 0.5, dark  # some text, not a black page
    assert math.isfinite(dark)


def test_analyst_report_heading_chart_integer_counts_glossary(result):
    """The title as heading, a chart of released values with intervals, counts as integers, a
    glossary of the mechanism table, the publisher's key fingerprint with how to pin it."""
    import re as _re

    page = pages.render_analyst_report(result, make_ctx(title="Age by education", signer_fingerprint="SHA256:ab12"))
    assert "<h1>Age by education</h1>" in page
    assert page.count('class="released-chart"') == len(result.query.aggregates)
    results = page[page.index('id="results"'):page.index("<details>", page.index('id="results"'))]
    people_cells = _re.findall(r'<td class="n">([^<]*)</td>', results)[0::len(result.query.aggregates)]
    assert people_cells and all(_re.fullmatch(r"[\d,]+ \[-?[\d,]+, [\d,]+\]|[\d,]+", c) for c in people_cells), people_cells
    assert 'class="glossary"' in page and "Noise scale" in page and "Groups per person" in page
    assert "SHA256:ab12" in page and "out of band" in page


def test_the_bounds_table_shows_each_statistic_s_bounds_as_used(result, analyst_html):
    """The analyst page's "Bounds used": a count from 0 to its row limit, given bounds as given, inferred
    bounds as inferred (with their source), the quantile's search range."""
    inferred = {b.aggregate: b for b in result.inferred_bounds}["capital_gain"]
    num = pages.fmt_number
    expected = [("people", "count", "—", "rows per person and group counted at most", 0, 1),
                ("avg_age", "avg", "age", "each person&#39;s value limited to", 17, 90),
                ("median_age", "quantile", "age", "0.5-quantile searched within", 17, 90),
                ("score_total", "sum", "score", "each person&#39;s value limited to", 0, 1000),
                ("capital_gain", "sum", "capital_gain", "each person&#39;s value limited to", inferred.lower,
                 inferred.upper)]
    for name, kind, column, meaning, lower, upper in expected:
        row = (f"<tr><td>{name}</td><td>{kind}</td><td>{column}</td><td>{meaning}</td>\n"
               f'<td class="n">{num(lower)}</td><td class="n">{num(upper)}</td>')
        assert row in analyst_html, name
    assert "inferred privately (APPROX_BOUNDS); estimated share of values outside: " in analyst_html


def test_the_controller_report_is_titled_for_its_release(result):
    """Without a title of its own, the controller report is called after its release, in its <title>
    and its heading. Rendered here, not taken from the module's fixture, so that mutation testing,
    which runs the tests that call a function themselves, runs this one for the report's title."""
    controller_html = pages.render_controller_report(result, make_ctx())
    assert "<title>Release rel-0007 — controller report</title>" in controller_html
    assert "<h1>Release rel-0007 — controller report</h1>" in controller_html


def test_numbers_past_fifteen_digits_or_below_a_ten_thousandth_are_shown_in_scientific_form():
    assert [pages.fmt_number(v) for v in (1.5e16, -2e15, 3.25e-5, 0.00012345, 1234.56789, 7.0)] == [
        "1.5e+16", "-2e+15", "3.25e-05", "0.0001", "1234.5679", "7"]


def test_a_statistic_with_one_bound_given_and_the_other_inferred_shows_both_as_used(data):
    """A SUM with only its lower bound given (the upper inferred privately), and one with only its
    upper bound given: "Bounds used" shows the given bound as given and the inferred one as inferred,
    and so does the caption of the histogram the inferred one was chosen from (the page could not be
    rendered before 2026-11-25: the histogram compared its bins with the side not inferred, None)."""
    q = dp.Query([dp.Aggregate("sum", column="capital_gain", lower=0.0, name="gain_from_0"),
                  dp.Aggregate("sum", column="hours_per_week", upper=60.0, name="hours_to_60")],
                 privacy_unit="person_id", epsilon=1.0)
    res = dp.execute(q, data)
    inferred = {b.aggregate: b for b in res.inferred_bounds}
    page = pages.render_analyst_report(res, make_ctx())
    num = pages.fmt_number
    for name, column, lower, upper in (("gain_from_0", "capital_gain", 0.0, inferred["gain_from_0"].upper),
                                       ("hours_to_60", "hours_per_week", inferred["hours_to_60"].lower, 60.0)):
        assert lower is not None and upper is not None
        row = (f"<tr><td>{name}</td><td>sum</td><td>{column}</td><td>each person&#39;s value limited to</td>\n"
               f'<td class="n">{num(lower)}</td><td class="n">{num(upper)}</td>')
        assert row in page, name
        assert f"Bounds of {name} were chosen" in page and f"[{num(lower)}, {num(upper)}]," in page


def test_group_keys_are_shown_as_written_and_a_missing_one_of_any_type_as_a_dash():
    """Keys in the results table: numbers as short numbers (1.0 as 1), booleans as True and False,
    and a missing key (NULL) as "—" whatever the column's type (text, float, nullable integer or
    boolean, date), never "None", "<NA>" or "NaT"."""
    n = 600
    i = np.arange(n)
    keys = {"number": np.where(i % 3 == 0, 1.0, np.where(i % 3 == 1, 2.5, np.nan)),
            "flag": pd.array(np.where(i % 3 == 0, True, np.where(i % 3 == 1, False, None)), dtype="boolean"),
            "whole": pd.array(np.where(i % 2 == 0, 7, None), dtype="Int64"),
            "text": np.where(i % 2 == 0, "a", None),
            "day": pd.to_datetime(np.where(i % 2 == 0, "2026-01-02", None))}
    shown = {"number": ["1", "2.5", "—"], "flag": ["False", "True", "—"], "whole": ["7", "—"], "text": ["a", "—"],
             "day": ["2026-01-02 00:00:00", "—"]}
    for key, column in keys.items():
        df = pd.DataFrame({"uid": i, key: column})
        res = dp.execute(dp.Query([dp.count(upper=1, name="n")], privacy_unit="uid", group_by=(key,), epsilon=5.0,
                                  delta=1e-6), df)
        page = pages.render_analyst_report(res, make_ctx())
        results = page[page.index('<table class="results">'):]
        cells = re.findall(r"<tr><td>([^<]*)</td>", results[:results.index("</table>")])
        assert cells == shown[key], (key, cells)


def test_the_controller_table_heads_every_column_and_gives_released_minus_exact(result):
    """The controller's "Exact against released values": the group key, the exact number of people,
    then per statistic its exact value, its released value and the difference released - exact.
    Rendered here (not by the module's fixture) so that mutation testing runs this test for the table."""
    controller_html = pages.render_controller_report(result, make_ctx())
    num = pages.fmt_number
    labels = [a.label for a in result.query.aggregates]
    head = ["education", "units (exact)"] + [h for name in labels for h in (f"{name} exact", f"{name} released",
                                                                                 "difference")]
    table = controller_html[controller_html.index('<table class="exact">'):]
    table = table[:table.index("</table>")]
    assert re.findall(r"<th[^>]*>([^<]*)</th>", table) == head
    exact = result.controller_only.exact.set_index("education")
    for _, row in result.table.iterrows():
        ex, rel = float(exact.loc[row["education"], "score_total"]), float(row["score_total"])
        exact_cell = (f'<td class="n">{num(ex)}</td>' if row["score_total_ci_low"] <= ex <= row["score_total_ci_high"]
                      else f'<td class="n outside" title="outside the released value\'s interval">{num(ex)} '
                           '<span class="outside-mark">✱</span></td>')
        assert (f'{html.unescape(exact_cell)}<td class="n">{num(rel)}</td><td class="n">{num(rel - ex)}</td>'
                in html.unescape(table)), row["education"]


def test_the_controller_chart_draws_each_released_value_s_interval(result, controller_html):
    """The raw-against-private chart draws the released value of each group shown with its interval
    (a whisker from low to high), beside the exact value."""
    assert "<h3>Raw against private: capital_gain</h3>" in controller_html  # the most clamped statistic
    chart = controller_html[controller_html.index("<h3>Raw against private"):]
    chart = chart[:chart.index("</svg>")]
    values = result.table[["capital_gain", "capital_gain_ci_low", "capital_gain_ci_high"]].astype(float)
    with_interval = int(np.isfinite(values).all(axis=1).sum())
    assert with_interval >= 10
    assert chart.count('stroke="#333333" stroke-width="1" fill="none"/>') == with_interval


@pytest.mark.parametrize("mode, guarantee", [
    ("public", "epsilon was chosen without looking at the data (the privacy risk indicator test over the public "
               "domain of contributions, on simulated noise); the released output is a fresh draw at that epsilon, "
               "so the release is epsilon-DP end to end"),
    ("data", "epsilon was chosen from the privacy risk indicators of the actual data (the seed's Algorithm 1); the "
             "released output is a fresh draw at that epsilon and is epsilon-DP given epsilon, but epsilon itself "
             "and the decision to release depend on the data: the release as a whole has no end-to-end DP guarantee"),
])
def test_the_analyst_page_states_the_guarantee_of_an_epsilon_chosen_by_the_risk_indicator(data, mode, guarantee):
    """An epsilon chosen from PRIs: the analyst page states what guarantee the release has in that mode (in
    data mode, none end to end), with the acronym written out."""
    q = dp.Query([dp.count(upper=1, name="people")], privacy_unit="person_id", epsilon=1.0)
    res = pri.release_with_pri(q, data.head(2000), p=50, mode=mode)
    page = pages.render_analyst_report(res, make_ctx(epsilon_mode="pri"))
    assert f"<dt>Guarantee</dt><dd>{html.escape(guarantee).replace('&#x27;', '&#39;')}</dd>" in page


def test_the_pri_choice_names_its_rule_for_the_analyst_and_marks_its_epsilon_for_the_controller(data):
    """An epsilon chosen from PRIs: the analyst page states the rule it was chosen by, and the
    controller's PRI chart marks the chosen epsilon."""
    q = dp.Query([dp.count(upper=1, name="people")], privacy_unit="person_id", epsilon=1.0)
    res = pri.release_with_pri(q, data.head(2000), p=50)
    rule = res.epsilon_choice.public_summary()["rule"]
    assert rule
    ctx = make_ctx(epsilon_mode="pri", epsilon_explanation="Chosen by the platform from p = 50.")
    assert f"<dt>Rule</dt><dd>{html.escape(rule, quote=True).replace('&#x27;', '&#39;')}</dd>" in (
        pages.render_analyst_report(res, ctx))
    assert f"chosen epsilon {res.epsilon_choice.epsilon:g}" in pages.render_controller_report(res, ctx)


def test_an_ungrouped_release_s_controller_chart_labels_its_one_bar_all(data):
    single = dp.execute(dp.Query([dp.count(upper=1, name="people")], privacy_unit="person_id", epsilon=1.0), data)
    page = pages.render_controller_report(single, make_ctx())
    chart = page[page.index("<h3>Raw against private"):]
    chart = chart[:chart.index("</svg>")]
    assert ">all</text>" in chart


def test_infinite_numbers_are_shown_as_signed_infinity():
    assert [pages.fmt_number(v) for v in (math.inf, -math.inf, np.float64("inf"))] == ["∞", "−∞", "∞"]


def test_index_paths_rooted_at_a_backslash_are_refused():
    """A Windows-rooted path (\\\\server\\share or \\dir) would link out of the published folder too."""
    entry = {"release_id": "rel-9", "dataset": "d", "title": "t", "epsilon": 1, "delta": 0, "published_at": "now"}
    for path in ("\\\\server\\share\\rel-9.html", "\\www\\rel-9.html"):
        with pytest.raises(ValueError) as caught:
            pages.render_index([{**entry, "path": path}])
        assert str(caught.value) == f"index entry 'rel-9': path must be relative, got {path!r}"
    with pytest.raises(ValueError, match="series 'visits'"):
        pages.render_index([], series=[{"name": "visits", "path": "\\visits.html"}])


def test_a_series_page_linked_by_an_absolute_path_is_refused_naming_the_series():
    """The index links a series page only inside the published folder: a path rooted at "/" is refused,
    naming the series and the path, like a release entry's."""
    for path in ("/srv/www/visits.html", "//example.org/visits.html"):
        with pytest.raises(ValueError) as caught:
            pages.render_index([], series=[{"name": "visits", "path": path}])
        assert str(caught.value) == f"series 'visits': path must be relative, got {path!r}"


def test_the_bounds_histogram_labels_its_bins_and_greys_those_below_the_threshold(result):
    """The histogram behind inferred bounds: bins labelled by their edges ([0, 2) starts at "0"),
    blue where the noisy count reaches the threshold, grey below it (noise only)."""
    b = {x.aggregate: x for x in result.inferred_bounds}["capital_gain"]
    svg = pages.bounds_histogram_svg(b)
    labels = re.findall(r">(\[[^<]*\))</text>", svg)
    assert "[-2, 0)" in labels and "[0, 2)" in labels
    fills = re.findall(r'fill="(#[0-9a-f]+)" stroke="#333333" stroke-width="0.3"><title>', svg)  # the bars
    counts = np.asarray(b.noisy_counts, dtype=float)
    assert len(fills) == len(labels) and 0 < fills.count("#2d6cdf") < len(fills)
    assert fills.count("#2d6cdf") == int((counts >= b.threshold).sum())  # every bin above it is shown


def test_a_table_cell_shows_a_number_at_most_four_decimals_without_trailing_zeros_or_point():
    """2.00001 reads "2" (not "2." nor "2.0000"), 2.5 reads "2.5", -0.12345 reads "-0.1235"."""
    assert [pages.fmt_number(v) for v in (2.00001, -7.99999, 2.5, -0.12345, 1234.56789)] == \
        ["2", "-8", "2.5", "-0.1235", "1234.5679"]


def test_text_cells_a_spreadsheet_would_run_are_written_quoted(tmp_path):
    """results.csv: a released key starting with =, +, -, @ is written with a single quote in front
    (read as text, never run as a formula); other keys as they are."""
    i = np.arange(900)
    df = pd.DataFrame({"uid": i, "k": np.array(["=1+1", "@cmd", "plain"])[i % 3]})
    res = dp.execute(dp.Query([dp.count(upper=1, name="n")], privacy_unit="uid", group_by=("k",), epsilon=5.0,
                              public_partitions=["=1+1", "@cmd", "plain"]), df)
    data_files.write_data_files(res, tmp_path)
    keys = pd.read_csv(tmp_path / "results.csv", dtype=str)["k"].tolist()
    assert sorted(keys) == ["'=1+1", "'@cmd", "plain"]


def test_the_controller_chart_is_380_high_and_45_wide_per_group_between_600_and_1400():
    """The raw-against-private chart's size: 380 px high; 200 px plus 45 per group wide, at least 600
    and at most 1400."""
    def size(groups: int) -> str:
        svg = pages.exact_vs_released_svg("s", [f"g{i}" for i in range(groups)], [1.0] * groups, [1.0] * groups,
                                          [0.5] * groups, [1.5] * groups)
        return svg[:svg.index(" viewBox")].split(" width=", 1)[1]

    assert [size(n) for n in (2, 12, 40)] == ['"600" height="380"', '"740" height="380"', '"1400" height="380"']


def test_without_clamping_the_controller_chart_is_the_first_aggregate_with_exact_values(data):
    """The controller chart shows the aggregate with the most clamped values; when none is clamped,
    the first in the query with exact values (here the sum, before the count of units, which has no
    clamping record)."""
    q = dp.Query([dp.sum_("age", 0, 200, name="total_age"), dp.count_units(name="people")], privacy_unit="person_id",
                 group_by=("sex",), epsilon=1.0, delta=1e-6)
    result = dp.execute(q, data)
    assert result.controller_only.clamping["total_age"].clamped == 0 and "people" not in result.controller_only.clamping
    page = pages.render_controller_report(result, make_ctx())
    chart = page[page.index("<h3>Raw against private"):]
    assert "<title>total_age: exact against released value per group</title>" in chart[:chart.index("</svg>")]


def test_results_csv_ends_each_row_with_one_newline_whatever_the_platform_s_line_separator(tmp_path, monkeypatch):
    """results.csv ends its rows with "\\n" even where the platform's line separator is "\\r\\n"."""
    df = pd.DataFrame({"uid": range(40), "k": ["a", "b"] * 20, "x": [1.0] * 40})
    query = dp.Query([dp.sum_("x", 0, 2, name="total")], privacy_unit="uid", epsilon=1.0, group_by=("k",),
                     public_partitions=["a", "b"])
    result = dp.execute(query, df)
    monkeypatch.setattr(os, "linesep", "\r\n")
    csv_path, _ = data_files.write_data_files(result, tmp_path)
    assert b"\r" not in csv_path.read_bytes() and csv_path.read_bytes().count(b"\n") == 3


def test_the_analyst_page_states_each_promise_for_its_group_size_and_the_epsilons_tried(data):
    """How epsilon was chosen: an average's promised interval is stated for the group size it holds for
    (its reference count), and a PRI choice lists every candidate epsilon it tried."""
    from dp_core import accuracy

    plan = dp.Query([dp.count(upper=1, name="people"), dp.avg("age", 17, 90, name="average_age")],
                    privacy_unit="person_id", epsilon=1.0, group_by=("education",))
    choice = risk_model.choose_epsilon_for_plan(plan, trust="low", sensitivity="high", max_risk=0.2, max_noise=10,
                                                n=16, m=2)
    released = dp.execute(dataclasses.replace(plan, epsilon=choice.epsilon), data)
    page = pages.render_analyst_report(released, make_ctx(promise=choice))
    average = choice.promised("average_age")
    assert isinstance(average, accuracy.StatisticInterval) and average.reference_count == 100
    assert (f"<td>average_age</td><td>{display.halfwidth(average.halfwidth)} at 90% for a group of 100 people</td>"
            in page)
    q = dp.Query([dp.count(upper=1, name="people")], privacy_unit="person_id", epsilon=1.0)
    res = pri.release_with_pri(q, data.head(2000), p=50)
    tried = res.epsilon_choice.candidates
    assert len(tried) >= 2
    assert f"<dt>Candidates tried</dt><dd>{', '.join(f'{c:g}' for c in tried)}</dd>" in pages.render_analyst_report(
        res, make_ctx(epsilon_mode="pri"))


def test_a_sql_release_s_page_names_each_table_it_read_and_whether_it_was_charged(data):
    """The analyst page of a SQL release lists the tables the statement read: the protected one with its
    privacy unit (charged), the public one (no one's rows, not charged)."""
    from dp_core.sql import Table, run_sql

    people = data[["person_id", "education", "age"]]
    levels = pd.DataFrame({"education": sorted(people["education"].unique())})
    sql = ("SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 1, privacy_unit_column = person_id) "
           "education, COUNT(*) AS n FROM people WHERE education IN (SELECT education FROM levels) GROUP BY education")
    released = run_sql(sql, {"people": Table(people, "person_id"), "levels": Table(levels, None)})
    page = pages.render_analyst_report(released, make_ctx())
    assert ('<dd id="tables-read"><code>people</code> (protected, privacy unit <code>person_id</code>: charged); '
            '<code>levels</code> (public: no one\'s rows, not charged)</dd>') in page.replace("&#39;", "'")


def test_the_controller_chart_s_legend_names_the_exact_and_the_released_bars():
    svg = pages.exact_vs_released_svg("s", ["a", "b"], [1.0, 2.0], [1.5, 2.5], [1.0, 2.0], [2.0, 3.0])
    assert ">exact (raw data, not DP)</text>" in svg and ">released (DP) with interval</text>" in svg


def test_an_ungrouped_release_s_controller_report_takes_any_aggregate_names(data):
    """Aggregate names are the analyst's: an ungrouped release of statistics named "index" and "level_0"
    (the names pandas gives an index it turns into a column) gets its controller report, exact values
    beside released ones."""
    single = dp.execute(dp.Query([dp.count(upper=1, name="index"), dp.sum_("age", 0, 100, name="level_0")],
                                 privacy_unit="person_id", epsilon=1.0), data)
    page = pages.render_controller_report(single, make_ctx())
    exact = single.controller_only.exact
    for name in ("index", "level_0"):
        assert f'<th class="n">{name} exact</th><th class="n">{name} released</th>' in page
        # an exact value outside its released interval carries a mark (about 1 release in 7 here)
        assert re.search(rf'<td class="n( outside)?"[^>]*>{pages.fmt_number(exact[name].iloc[0])}'
                         rf'( <span class="outside-mark">✱</span>)?</td>'
                         rf'<td class="n">{pages.fmt_number(single.table[name].iloc[0])}</td>', page)


def test_the_analyst_page_states_the_epsilon_a_pri_choice_chose(data):
    """How epsilon was chosen: the chosen epsilon is stated beside its mode, p and rule."""
    q = dp.Query([dp.count(upper=1, name="people")], privacy_unit="person_id", epsilon=1.0)
    res = pri.release_with_pri(q, data.head(2000), p=50)
    page = pages.render_analyst_report(res, make_ctx(epsilon_mode="pri"))
    assert (f"<dt>Chosen epsilon</dt><dd>{pages.fmt_number(res.epsilon_choice.epsilon)}</dd>\n  <dt>Mode</dt>"
            f"<dd>public</dd>") in page


def test_the_controller_chart_names_each_bar_by_its_group_s_keys_or_all(data):
    """The raw-against-private chart labels a bar with its group's keys joined by ", " (a release by sex
    and income), and the one bar of an ungrouped release "all"."""
    def chart(query) -> str:
        page = pages.render_controller_report(dp.execute(query, data), make_ctx())
        part = page[page.index("<h3>Raw against private"):]
        return part[:part.index("</svg>")]

    grouped = chart(dp.Query([dp.count(upper=1, name="people")], privacy_unit="person_id", epsilon=1.0,
                             group_by=("sex", "income")))
    for label in ("Female, &lt;=50K", "Female, &gt;50K", "Male, &lt;=50K", "Male, &gt;50K"):
        assert f">{label}</text>" in grouped, label
    assert ">all</text>" not in grouped
    assert ">all</text>" in chart(dp.Query([dp.count(upper=1, name="people")], privacy_unit="person_id", epsilon=1.0))


def test_a_count_of_people_needs_no_bounds_and_the_analyst_page_says_so():
    """COUNT(DISTINCT unit) in "Bounds used": each person counts once per group, so it has no lower or
    upper bound and none is needed; the page must not describe it as a value limited to bounds that
    were "given" (the analyst would look for bounds nobody chose)."""
    df = pd.DataFrame({"uid": [1, 1, 2, 3, 3, 3], "k": ["a", "b", "a", "a", "b", "b"]})
    q = dp.Query([dp.count_units(name="people"), dp.count(upper=2, name="rows")], privacy_unit="uid", epsilon=1.0,
                 group_by=("k",), public_partitions=["a", "b"])
    page = pages.render_analyst_report(dp.execute(q, df), make_ctx())
    bounds = page[page.index('<section id="bounds">'):]
    bounds = bounds[:bounds.index("</section>")]
    assert ("<tr><td>people</td><td>count_units</td><td>—</td><td>each person counts once per group</td>\n"
            '<td class="n">—</td><td class="n">—</td><td>none needed</td></tr>') in bounds
    assert ("<tr><td>rows</td><td>count</td><td>—</td><td>rows per person and group counted at most</td>\n"
            '<td class="n">0</td><td class="n">2</td><td>given</td></tr>') in bounds


def test_a_number_from_ten_to_the_fifteen_on_is_shown_in_scientific_form():
    """A table cell of 10^15 (16 digits) or more is shown in scientific form, 10^15 itself and a
    non-integer just above it included; the largest integer below it is shown in full."""
    assert [pages.fmt_number(v) for v in (1e15, -1e15, 1e15 + 0.5, 999_999_999_999_999.0)] == [
        "1e+15", "-1e+15", "1e+15", "999999999999999"]


def test_the_numeric_table_shows_text_group_keys_as_written_and_the_values_as_numbers():
    """The analyst page's numeric table (value, low, high, noise sd per group): a text key that looks
    like a number ("007", "1e3", "nan") is shown as written, not as the number it parses to, and a
    value column as a number."""
    df = pd.DataFrame({"uid": range(6), "code": ["007", "007", "1e3", "1e3", "nan", "nan"]})
    q = dp.Query([dp.count(upper=1, name="people")], privacy_unit="uid", epsilon=1.0, group_by=("code",),
                 public_partitions=["007", "1e3", "nan"])
    res = dp.execute(q, df)
    page = pages.render_analyst_report(res, make_ctx())
    numeric = page[page.index('<table class="numeric">'):]
    numeric = numeric[numeric.index("<tbody>"):numeric.index("</tbody>")]
    cells = [re.findall(r"<td[^>]*>([^<]*)</td>", row) for row in re.findall(r"<tr>(.*?)</tr>", numeric)]
    assert [row[0] for row in cells] == ["007", "1e3", "nan"]
    expected = {k: pages.fmt_number(v) for k, v in zip(res.table["code"], res.table["people"])}
    assert [row[1] for row in cells] == [expected[k] for k in ("007", "1e3", "nan")]
    assert all(re.fullmatch(r"-?\d+", row[1]) for row in cells), cells


def test_the_controller_s_pri_table_says_yes_or_no_for_each_candidate_epsilon():
    """The controller's "PRI ranges per candidate epsilon": one row per candidate, its PRI range as numbers
    and whether it passed the PRI test as "yes" or "no" (fixed ranges: a candidate that failed, one that
    passed)."""
    df = pd.DataFrame({"uid": range(6), "k": ["a", "a", "a", "b", "b", "b"]})
    res = dp.execute(dp.Query([dp.count(upper=1, name="people")], privacy_unit="uid", epsilon=1.0, group_by=("k",),
                              public_partitions=["a", "b"]), df)
    ranges = (pri.PRIRange(2.0, 0.125, 0.25, 0.5, False), pri.PRIRange(1.0, 0.375, 0.4, 0.5, True))
    res = dataclasses.replace(res, controller_only=dataclasses.replace(res.controller_only, pri_ranges=ranges))
    page = pages.render_controller_report(res, make_ctx())
    table = page[page.index("<h3>PRI ranges per candidate epsilon</h3>"):]
    table = table[table.index("<tbody>"):table.index("</tbody>")]
    assert re.findall(r"<tr>.*</tr>", table) == [
        '<tr><td class="n">2</td><td class="n">0.125</td><td class="n">0.25</td><td class="n">0.5</td><td>no</td></tr>',
        '<tr><td class="n">1</td><td class="n">0.375</td><td class="n">0.4</td><td class="n">0.5</td><td>yes</td></tr>']


@pytest.mark.parametrize("mode, words", [
    ("fixed", "fixed in the request"),
    ("pri", "chosen by the platform with the privacy risk indicator test (a fresh draw at the chosen epsilon)"),
    ("risk", "chosen from the data owner&#39;s trust in the recipient, the data&#39;s sensitivity and the tolerable "
             "risk"),
    ("agreed with the data owner", "agreed with the data owner"),
])
def test_the_analyst_page_says_in_words_how_epsilon_was_chosen_and_an_unknown_mode_as_written(result, mode, words):
    """"How epsilon was chosen" spells out each known mode in plain words, and shows a mode it has no
    words for as it was given (never "None" or a bare code)."""
    page = pages.render_analyst_report(result, make_ctx(epsilon_mode=mode))
    assert f"<p>Epsilon was <b>{words}</b>.</p>" in page


def test_the_analyst_page_states_the_beta_of_a_public_pri_choice_and_none_for_a_data_one(data):
    """A PRI choice in public mode is the beta-quantile of the epsilons that pass: the analyst page
    states its beta (here 0.75); a choice in data mode has no beta, and the page shows no beta row."""
    q = dp.Query([dp.count(upper=1, name="people")], privacy_unit="person_id", epsilon=1.0)
    public = pri.release_with_pri(q, data.head(2000), p=50, beta=0.75)
    page = pages.render_analyst_report(public, make_ctx(epsilon_mode="pri"))
    assert page.count("<dt>beta</dt><dd>0.75</dd>") == 1
    by_data = pri.release_with_pri(q, data.head(2000), p=50, mode="data")
    assert "<dt>beta</dt>" not in pages.render_analyst_report(by_data, make_ctx(epsilon_mode="pri"))


def test_the_analyst_chart_of_a_grouped_release_names_each_bar_by_its_group_s_keys():
    """The analyst page's chart of released values labels each bar and its hover title with its
    group's keys joined by ", " (here a release by two keys), never "all"."""
    df = pd.DataFrame({"uid": range(12), "sex": ["F", "M"] * 6, "band": ["young"] * 6 + ["old"] * 6})
    res = dp.execute(dp.Query([dp.count(upper=1, name="people")], privacy_unit="uid", epsilon=1.0,
                              group_by=("sex", "band"), public_partitions=[("F", "old"), ("F", "young"),
                                                                           ("M", "old"), ("M", "young")]), df)
    page = pages.render_analyst_report(res, make_ctx())
    chart = page[page.index('<figure class="released-chart">'):]
    chart = chart[:chart.index("</figure>")]
    labels = {f"{s}, {b}" for s, b in zip(res.table["sex"], res.table["band"])}
    assert labels == {"F, old", "F, young", "M, old", "M, young"}
    assert set(re.findall(r'rotate\(-45\)" font-size="9" text-anchor="end">([^<]*)</text>', chart)) == labels
    titles = {f"{s}, {b}: {v:g}" for s, b, v in zip(res.table["sex"], res.table["band"], res.table["people"])}
    assert set(re.findall(r"<title>([^<]*)</title></rect>", chart)) == titles


def test_the_controller_chart_leaves_out_an_exact_value_that_is_not_a_number_and_the_report_renders():
    """An exact value that is not a number (the text "NaN", as a table read back from text holds it)
    is shown as "—" in the exact table and left out of the raw-against-private chart, which still
    draws the other groups, largest exact value first; the controller report is still rendered."""
    df = pd.DataFrame({"uid": range(9), "k": list("aaabbbccc")})
    res = dp.execute(dp.Query([dp.count(upper=1, name="people")], privacy_unit="uid", epsilon=1.0, group_by=("k",),
                              public_partitions=["a", "b", "c"]), df)
    exact = res.controller_only.exact.assign(people=pd.Series([3.0, "NaN", 5.0], dtype=object))
    res = dataclasses.replace(res, controller_only=dataclasses.replace(res.controller_only, exact=exact))
    page = pages.render_controller_report(res, make_ctx())
    released = dict(zip(res.table["k"], res.table["people"]))
    table = page[page.index('<table class="exact">'):]
    assert (f'<tr><td>b</td><td class="n">3</td><td class="n">—</td><td class="n">{pages.fmt_number(released["b"])}'
            '</td><td class="n">—</td></tr>') in table[:table.index("</table>")].replace("\n", "")
    chart = page[page.index("<h3>Raw against private: people</h3>"):]
    chart = chart[:chart.index("</svg>")]
    assert re.findall(r'rotate\(-45\)" font-size="9" text-anchor="end">([^<]*)</text>', chart) == ["c", "a"]
    assert "The 2 largest of 3 groups are shown." in page


# --------------------------------------------------------------------------------------------
# numbers as a person reads them (one function per kind of number: dp_core.display)


def test_counts_are_written_as_integers_in_results_csv_and_the_pages(result, tmp_path):
    """A released count is an integer in results.csv (`932`, not `932.0`), in results.json and in
    both reports' readable tables."""
    csv_path, json_path = data_files.write_data_files(result, tmp_path / "out")
    rows = list(csv_module.DictReader(io.StringIO(csv_path.read_text())))
    counts = [row[c] for row in rows for c in ("people", "people_ci_low", "people_ci_high")]
    assert counts and all(re.fullmatch(r"\d+", cell) for cell in counts), counts[:6]
    assert all(type(row["people"]) is int for row in json.loads(json_path.read_text())["rows"])
    for page in (pages.render_analyst_report(result, make_ctx()), pages.render_controller_report(result, make_ctx())):
        results = page[page.index('id="results"'):page.index("<details>", page.index('id="results"'))]
        for cell in result.readable_table()["people"]:
            assert re.fullmatch(r"[\d,]+ \[[\d,]+, [\d,]+\]", cell) and f">{cell}</td>" in results, cell


def test_every_epsilon_and_delta_on_the_pages_has_four_significant_digits_at_most(result):
    """An epsilon such as 0.43745083326922696 reads 0.4375 wherever the pages state a budget: the
    badges, the plain words, the split, the mechanisms, the publication index."""
    epsilon = 0.43745083326922696
    shares = tuple(dataclasses.replace(s, epsilon=epsilon / 3) for s in result.budget)
    mechanisms = tuple(dataclasses.replace(m, epsilon=epsilon / 7) for m in result.mechanisms)
    odd = dataclasses.replace(result, epsilon_spent=epsilon, delta_spent=1.234567e-7, budget=shares,
                              mechanisms=mechanisms)
    index = pages.render_index([{"release_id": "r1", "dataset": "adult", "title": "t", "epsilon": epsilon,
                                 "delta": 1.234567e-7, "published_at": "2026-11-29", "path": "r1/index.html"}])
    for page in (pages.render_analyst_report(odd, make_ctx()), pages.render_controller_report(odd, make_ctx()), index):
        for long in ("0.43745", "0.14582", "0.062493", "1.23457e-07", "1.2346e-07"):
            assert long not in page, long
        assert "0.4375" in page and "1.235e-07" in page
    split = pages.render_analyst_report(odd, make_ctx())
    split = split[split.index('id="budget"'):split.index('id="bounds"')]
    for share in (epsilon / 3, epsilon / 7):  # the split's and the mechanisms' epsilons
        assert f'<td class="n">{display.budget(share)}</td>' in split, display.budget(share)


def test_the_budget_view_labels_each_row_and_states_delta_with_four_significant_digits():
    """The Prefect UI's budget artifact (and `dprelease budget`): a row for epsilon and one for delta,
    each named, every amount with four significant digits at most."""
    from dprelease.reporting.budget_table import budget_rows

    budget = {"dataset": "adult", "epsilon_cap": 10.0, "epsilon_committed": 0.43745083326922696,
              "epsilon_reserved": 1.0, "epsilon_remaining": 8.562549166730773, "delta_cap": 1e-5,
              "delta_committed": 3.3333333e-7, "delta_reserved": 0.0, "delta_remaining": 9.6666667e-6}
    assert budget_rows(budget) == [
        {"budget": "epsilon", "cap": "10", "committed": "0.4375", "reserved": "1", "remaining": "8.563"},
        {"budget": "delta", "cap": "1e-05", "committed": "3.333e-07", "reserved": "0", "remaining": "9.667e-06"}]


def test_the_controller_s_exact_table_says_how_many_values_an_interval_misses_and_marks_each(result):
    """Exact against released: the page says that about 1 - confidence of the exact values fall
    outside their interval by chance, counts those that do, and marks each of them (and only them);
    the analyst's page says none of it."""
    page = pages.render_controller_report(result, make_ctx())
    note = page[page.index('id="outside-note"'):page.index('<table class="exact">')]
    assert f"{(1 - result.query.confidence) * 100:.0f}%" in note and "by chance" in note
    table = page[page.index('<table class="exact">'):]
    table = table[:table.index("</table>")]
    exact = result.controller_only.exact.set_index("education")
    marked, with_interval = [], 0
    for a in result.query.aggregates:
        for _, row in result.table.iterrows():
            low, high = row[f"{a.label}_ci_low"], row[f"{a.label}_ci_high"]
            if math.isnan(low):
                continue
            with_interval += 1
            ex = float(exact.loc[row["education"], a.label])
            if not low <= ex <= high:
                marked.append(pages.fmt_number(ex))
    cells = re.findall(r'<td class="n outside"[^>]*>([^<]*) <span class="outside-mark">', table)
    assert sorted(cells) == sorted(marked) and table.count("outside-mark") == len(marked)
    assert f"<b>{len(marked)} of {with_interval}</b>" in note
    analyst = pages.render_analyst_report(result, make_ctx())
    assert "outside-note" not in analyst and "outside-mark\">" not in analyst and "by chance alone" not in analyst


def test_the_risk_model_s_sentences_and_the_promise_table_write_each_half_width_alike(data):
    """With epsilon chosen by the risk model, the summary's sentences (risk_summary, on both reports)
    and the promise table write each statistic's half-width as one string: a count's `10`, an
    average's `0.33`, not `0.3312` beside `±0.331`."""
    plan = dp.Query([dp.count(upper=1, name="people"), dp.avg("age", 17, 90, name="average_age"),
                     dp.sum_("score", 0, 1000, name="score_total")],
                    privacy_unit="person_id", epsilon=1.0, group_by=("education",))
    choice = risk_model.choose_epsilon_for_plan(plan, trust="low", sensitivity="high", max_risk=0.2,
                                                max_noise={"people": 10}, n=16, m=2)
    released = dp.execute(dataclasses.replace(plan, epsilon=choice.epsilon), data)
    rows = {r["name"]: r["promised"] for r in pages.promise_rows(released, choice)}
    for s in choice.promise:
        number = display.value(s.halfwidth, display.is_integer_kind(s.kind))
        assert rows[s.name].startswith(f"±{number} at 90%"), (rows[s.name], number)
        sentence = choice.summary[choice.summary.index(f"{s.name} ({s.kind}): "):]
        assert re.match(rf"[^.]*\+- {re.escape(number)}[ ,]", sentence), (number, sentence)
