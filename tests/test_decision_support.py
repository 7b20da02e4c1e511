"""The DPP tool's numbers (dprelease.decision_support) are dp_core's: over a grid of slider values
the epsilon, the summary, the chosen point and every interval equal dp_core.risk /
dp_core.accuracy called directly, a refusal is the chooser's, and nothing needs the escrow key.
(tests/test_dpp_browser.py checks the same through the page, in Chromium.)"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

SQL = ("SELECT WITH ANONYMIZATION education, ANON_COUNT(*, 1) AS people, ANON_AVG(age, 17, 90) AS avg_age "
       "FROM adult GROUP BY education")


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    """A home with Adult registered, its escrow key then removed (nothing here may read the data)."""
    from dprelease import admin
    from dprelease.pipeline import Platform
    from dprelease.settings import Settings

    adult = Path(__file__).resolve().parents[1] / "examples" / "data" / "adult.csv.gz"
    with pytest.MonkeyPatch.context() as env:
        env.setenv("DPRELEASE_HOME", str(tmp_path_factory.mktemp("home")))
        settings = Settings.from_env()
        admin.init(settings)
        admin.register_dataset(settings, "adult", adult, "person_id", epsilon_cap=10, add_row_id=True)
        settings.escrow_key_file.unlink()
        yield Platform.open(settings)


def request(epsilon: str = "1.0"):
    from dprelease.requests import inbox

    return inbox.parse_text(f"dataset: adult\nepsilon: {epsilon}\nsql: {SQL}\n")


@pytest.mark.parametrize("trust,sensitivity,max_risk,noise,n,m", list(itertools.product(
    (0.1, 0.5), (0.5, 0.9), (0.1, 0.4), (3.0, 12.5), (2, 4), (1, 2))))
def test_the_numbers_are_dp_core_s(home, trust, sensitivity, max_risk, noise, n, m):
    from dp_core import accuracy, risk
    from dprelease import decision_support as tool
    from dprelease import pipeline

    sliders = tool.Sliders.from_json({"trust": trust, "sensitivity": sensitivity, "max_risk": max_risk,
                                      "max_noise": noise, "n": n, "m": m, "p": 0.9})
    out = tool.numbers(home, request(), sliders)
    query = pipeline.plan(home, request()).query
    ints = pipeline.integer_columns(home.store.get_dataset("adult"))
    try:
        choice = risk.choose_epsilon_for_plan(query, trust=trust, sensitivity=sensitivity, max_risk=max_risk,
                                              max_noise=noise, n=n, m=m, p=0.9, headline="people",
                                              integer_columns=ints)
    except Exception as err:  # noqa: BLE001 - the refusal the tool must show
        assert not out["feasible"] and str(err) in out["summary"]
        return
    assert out["feasible"] and out["epsilon"] == choice.epsilon and out["summary"] == choice.summary
    # one epsilon, one string: the page's headline and split read as its summary writes them (0.4757 once stood
    # above "Epsilon 0.476 for the whole plan (partition selection 0.159, ...)")
    split = ", ".join(f"{share['part']} {share['written']}" for share in out["shares"])
    assert out["summary"].startswith(f"Epsilon {out['epsilon_written']} for the whole plan ({split});")
    assert [r["halfwidth"] for r in out["intervals"]] == [s.halfwidth for s in choice.promise]
    h = next(s.halfwidth for s in accuracy.statistic_intervals(query, choice.epsilon, confidence=0.9,
                                                               integer_columns=ints) if s.name == "people")
    assert out["point"] == {"noise": h, "risk": choice.risk}
    assert out["point"]["risk"] <= max_risk
    assert out["surface"]["risk"][10][6] == pytest.approx(risk.risk(0.5, 0.3, choice.guessing_probability))


@pytest.mark.parametrize("trust,max_risk,allowed", [
    (0.6, 0.3, "the tolerable risk is met at every epsilon up to 10)"),  # s (1 - t) = 0.2: no epsilon exceeds 0.3
    (0.3, 0.32, "the risk allows at most 1.184)"),
])
def test_the_release_s_explanation_of_a_risk_model_epsilon(home, trust, max_risk, allowed):
    """What "Use this epsilon" writes, run as a release: its explanation gives each epsilon as the page does
    (four significant digits), and where the tolerable risk is above the risk without noise it says so rather
    than "the risk allows at most 10" (the chooser's cap, which a walkthrough read as a limit of the risk)."""
    from dprelease import decision_support as tool
    from dprelease import pipeline

    sliders = tool.Sliders.from_json({"trust": trust, "sensitivity": 0.5, "max_risk": max_risk, "max_noise": 7,
                                      "n": 2, "m": 2, "p": 0.9})
    shown = tool.numbers(home, request(), sliders)
    used = tool.with_risk(request(), shown["risk_fields"])
    decision = pipeline.choose_epsilon(home, pipeline.plan(home, used))
    assert decision.epsilon == shown["epsilon"]
    assert f"(the noise needs at least {shown['epsilon_written']}, {allowed}" in decision.explanation


def test_what_if_and_the_analyst_s_limit(home):
    from dprelease import decision_support as tool

    sliders = tool.Sliders.from_json({"trust": 0.5, "sensitivity": 0.5, "max_risk": 0.4, "max_noise": 10})
    base = tool.numbers(home, request(), sliders)
    wider = tool.numbers(home, request(), sliders, {"max_partitions": 4})
    assert [r["halfwidth"] for r in wider["whatif"]["intervals"]] > [r["halfwidth"] for r in base["intervals"]]
    with pytest.raises(tool.ToolError, match="C_u"):
        tool.numbers(home, request(), sliders, {"max_partitions": 0})
    with pytest.raises(tool.ToolError, match="not a statistic"):
        tool.numbers(home, request(), sliders, {"bounds": {"nope": [0, 1]}})
    home.store.add_policy("ana-adult", "adult", analyst="ana", max_epsilon_per_release=0.5)
    shown = tool.analyst_preview(home, request("2.0"), "ana")
    assert shown["epsilon"] == 0.5 and "limit 0.5" in shown["note"]
    assert tool.analyst_preview(home, request("0.25"), "ana")["epsilon"] == 0.25


@pytest.mark.parametrize("body,message", [
    ({"trust": 2}, "trust must be a number from 0 to 1, got 2"),
    ({"trust": 0.5, "sensitivity": "high"}, "sensitivity must be a number from 0 to 1, got 'high'"),
    ({"trust": 0.5, "sensitivity": 0.5, "max_risk": 0.5, "max_noise": 0}, "max_noise must be a number > 0 (the tolerable half-width), got 0"),
    ({"trust": 0.5, "sensitivity": 0.5, "max_risk": 0.5, "max_noise": 3, "n": 2.5}, "n and m must be whole numbers"),
])
def test_slider_values_out_of_range_are_refused_in_one_line(body, message):
    from dprelease import decision_support as tool

    with pytest.raises(tool.ToolError) as err:
        tool.Sliders.from_json(body)
    assert str(err.value).startswith(message)


def test_an_interval_s_note_on_the_page_writes_plus_minus_as_the_reports_do():
    """The decision tool's notes are read on a web page, where the reports write ±; the engine's plain
    text (a terminal) keeps +-."""
    import dp_core as dp
    from dp_core.accuracy import statistic_intervals
    from dprelease.decision_support import interval_rows

    query = dp.Query([dp.count(upper=1)], privacy_unit="u", group_by=("g",), epsilon=1.0, delta=1e-6)
    intervals = statistic_intervals(query, 1.0, integer_columns={"u", "g"})
    notes = [row["note"] for row in interval_rows(intervals)]
    assert notes and all("±" in note and "+-" not in note for note in notes), notes
    assert all("+-" in s.describe() for s in intervals)
