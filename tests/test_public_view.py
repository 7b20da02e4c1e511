"""Controller-only numbers (partition loss, clamping loss, bounding loss, exact values) never
appear in what an analyst receives: str, repr, to_dict, to_json, explain, the table."""

from __future__ import annotations

import json
import re

import numpy as np
import pandas as pd

import dp_core as dp


def release():
    # distinctive raw numbers: 1000 values of 777.777 clamped to 500 (total shift 277777), and a
    # tiny partition "rare" that selection drops
    df = pd.DataFrame({
        "uid": np.arange(2003),
        "g": ["big"] * 1000 + ["other"] * 1000 + ["rare"] * 3,
        "x": [777.777] * 1000 + [123.457] * 1000 + [5.0] * 3,
    })
    q = dp.Query([dp.sum_("x", 0, 500, name="s"), dp.count(name="n")], privacy_unit="uid", group_by=("g",),
                 epsilon=1.0, delta=1e-6)
    return dp.execute(q, df)


def test_controller_field_is_filled():
    r = release()
    c = r.controller_only
    assert c.partitions_nonempty == 3 and c.partitions_dropped >= 1  # "rare" (3 units) cannot pass
    assert c.clamping["s"].clamped == 1000 and abs(c.clamping["s"].total_shift - 1000 * 277.777) < 1e-3
    assert "big" in set(c.exact["g"])


def test_no_public_serialiser_reaches_controller_only():
    r = release()
    c = r.controller_only
    outputs = [str(r), repr(r), r.to_json(), json.dumps(r.to_dict(), default=str), r.explain(), r.table.to_csv()]
    forbidden = ["controller", "partition_loss", "partition loss", "clamping loss", "clamped", "partitions_dropped",
                 "pairs_dropped", "total_shift", "nonempty", "rare", "277777"]
    assert str(int(c.clamping["s"].total_shift)).startswith("277777")
    for text in outputs:
        for word in forbidden:
            assert word not in text, (word, text[:200])
    assert "controller_only" not in r.to_dict()
    assert set(r.table.columns) == {"g"} | {f"{a}{suffix}" for a in ("s", "n")
                                            for suffix in ("", "_ci_low", "_ci_high", "_noise_sd")}


def test_released_values_are_not_the_exact_ones():
    r = release()
    exact = r.controller_only.exact.set_index("g")
    t = r.table.set_index("g")
    assert (t["s"] != exact.loc[t.index, "s"]).all()  # noise was added to every released value


def test_explain_states_each_mechanism_the_inferred_bounds_and_the_epsilon_choice():
    """explain(), the plain-text account of a release: a quantile (exponential mechanism) states its
    C_u and no noise scale; inferred bounds are stated as [lower, upper], a count's from 0; an epsilon
    chosen by the privacy risk indicator closes the text with its mode, p and guarantee. to_dict()
    states the query's parameters under their names."""
    from dp_core import pri

    df = pd.DataFrame({"uid": np.repeat(np.arange(3000), 3), "g": np.repeat(["a", "b", "c"], 3000), "x": 5.0})
    q = dp.Query([dp.median("x", 0, 10, name="m"), dp.Aggregate("count", name="n"),
                  dp.Aggregate("sum", column="x", name="s")], privacy_unit="uid", group_by=("g",), epsilon=3.0,
                 max_partitions_contributed=2, public_partitions=["a", "b", "c"])
    r = dp.execute(q, df)
    lines = r.explain().splitlines()
    assert lines[:6] == ["Total: epsilon 3, delta 0 (basic composition)", "  share bounds of n: epsilon 0.5, delta 0",
                         "  share bounds of s: epsilon 0.5, delta 0", "  share m: epsilon 1, delta 0",
                         "  share n: epsilon 0.5, delta 0", "  share s: epsilon 0.5, delta 0"]  # Laplace: no rho
    (median_line,) = [line for line in lines if line.startswith("  m: ")]
    assert "x C_u=2 -> 1, epsilon 1 (" in median_line  # no noise scale to state
    assert any(line.startswith("  n.count: discrete Laplace") and ", scale 12," in line for line in lines)
    assert any(line.startswith("  bounds of n inferred (APPROX_BOUNDS): [0, 3],") for line in lines)  # 3 rows each
    assert any(line.startswith("  bounds of s inferred (APPROX_BOUNDS): [8, 16],") for line in lines)  # sums of 15
    d = r.to_dict()
    assert (d["privacy_unit"], d["group_by"], d["max_partitions_contributed"], d["confidence"]) == ("uid", ["g"], 2, 0.95)
    assert d["budget"][2] == {"part": "m", "epsilon": 1.0, "delta": 0.0, "rho": None} and len(d["budget"]) == 5
    assert r.to_json(indent=1).splitlines()[:2] == ["{", ' "epsilon": 3.0,']  # json.dumps's options reach it
    assert d["aggregates"][0] == {"name": "m", "kind": "quantile", "column": "x", "lower": 0, "upper": 10, "q": 0.5}

    chosen = pri.release_with_pri(dp.Query([dp.count(upper=1, name="people")], privacy_unit="uid", epsilon=1.0),
                                  df.head(2000), p=50)
    c = chosen.epsilon_choice
    assert chosen.explain().splitlines()[-1] == (
        f"Epsilon chosen from the privacy risk indicator ({c.mode} mode, p = 50): {c.guarantee}.")


def test_explain_states_a_mechanism_without_a_note_with_nothing_after_its_epsilon():
    """A mechanism with no note (a count and a sum with given bounds) ends its explain() line at its
    epsilon: no empty parentheses."""
    df = pd.DataFrame({"uid": np.arange(100), "x": np.arange(100) % 7})
    r = dp.execute(dp.Query([dp.count(upper=1, name="people"), dp.sum_("x", 0, 6, name="t")], privacy_unit="uid",
                            epsilon=1.0), df)
    assert r.explain().splitlines()[4:6] == [
        "  people.count: discrete Laplace, sensitivity 1 per partition x C_u=1 -> 1, scale 2, epsilon 0.5",
        "  t.sum: discrete Laplace, sensitivity 6 per partition x C_u=1 -> 6, scale 12, epsilon 0.5"]


def test_the_public_view_states_the_budget_spent_and_notes_a_variance_s_first_order_interval():
    """to_dict names what was spent ("epsilon", "delta", as a reader of the JSON looks them up), and a
    release with a VAR (no AVG or STDDEV beside it) carries the note on first-order intervals."""
    df = pd.DataFrame({"uid": np.arange(500), "x": np.arange(500) % 10})
    r = dp.execute(dp.Query([dp.var("x", 0, 10, name="v")], privacy_unit="uid", epsilon=1.0), df)
    d = r.to_dict()
    assert d["epsilon"] == r.epsilon_spent == 1.0 and d["delta"] == r.delta_spent
    first_order = [n for n in r.notes if n.startswith("AVG/VAR/STDDEV intervals are first-order")]
    assert len(first_order) == 1 and first_order[0] in d["notes"]


def test_the_controller_summary_names_each_of_its_numbers():
    """ControllerOnly.summary(): the controller's figures under their names, clamping per aggregate."""
    r = release()
    s = r.controller_only.summary()
    assert s["partitions_nonempty"] == 3 and s["partitions_released"] == r.controller_only.partitions_released
    assert s["clamping"]["s"]["clamped"] == 1000 and s["clamping"]["s"]["values"] == 2003
    assert set(s) == {"partitions_nonempty", "partitions_released", "partitions_dropped", "partition_loss",
                      "unit_partition_pairs", "pairs_dropped_by_bounding", "clamping", "pri_ranges"}


def test_a_release_s_text_gives_its_budget_its_size_and_its_readable_table():
    """What print() shows of a release: a line with the epsilon and delta spent, the number of partitions
    and the confidence of the intervals, then the readable table, then the note on what the intervals cover."""
    df = pd.DataFrame({"uid": np.arange(3000), "g": np.where(np.arange(3000) % 3 == 0, "a", "b")})
    result = dp.execute(dp.Query([dp.count(name="n")], privacy_unit="uid", group_by=("g",), epsilon=2.0,
                                 public_partitions=["a", "b"], confidence=0.9), df)
    lines = str(result).splitlines()
    assert lines[0] == ("DP release: epsilon=2, delta=0, 2 partition(s); each value with its 90% confidence "
                        "interval")
    assert lines[1:-1] == result.readable_table().to_string(index=False).splitlines()
    assert lines[-1].startswith("Confidence intervals cover the noise only")


def test_the_readable_table_writes_numbers_short_and_the_public_view_dates_in_iso():
    """readable_table: from 100 on (and 0) whole numbers with thousands separators, from 1 up to two
    decimals (no trailing zeros), below 1 three significant digits. to_dict: a date key as ISO 8601 text, not epoch
    milliseconds."""
    import dataclasses

    day = pd.Timestamp("2026-01-02")
    n = 300
    df = pd.DataFrame({"uid": np.arange(n), "day": [day] * n, "x": 1.0})
    result = dp.execute(dp.Query([dp.sum_("x", 0, 1, name="s")], privacy_unit="uid", group_by=("day",), epsilon=1.0,
                                 public_partitions=[day.date()]), df)
    assert str(result.to_dict()["rows"][0]["day"]).startswith("2026-01-02T00:00:00")
    values = [1234.5, 150.0, 0.0, 1.5, 1.0, 0.5, 0.01234]
    table = pd.DataFrame({"day": [day] * len(values), "s": values, "s_ci_low": np.nan, "s_ci_high": np.nan})
    shown = dataclasses.replace(result, table=table).readable_table()["s"].tolist()
    assert shown == ["1,234", "150", "0", "1.5", "1", "0.5", "0.0123"]


def test_the_notes_say_a_count_of_units_is_the_selection_s_and_each_gaussian_share_a_slice_of_one_pool():
    """COUNT(DISTINCT unit) under Laplace-threshold selection is released from the selection's count,
    and Gaussian aggregates are accounted in one pool, by privacy loss distributions: the notes say
    both, word for word, with the accountant's figures (the pool is the two Gaussian aggregates' two
    thirds of epsilon 2 and delta 1e-6)."""
    df = pd.DataFrame({"uid": np.arange(3000), "g": np.arange(3000) % 3, "v": np.arange(3000) % 5})
    q = dp.Query([dp.count_units(name="people"), dp.sum_("v", 0, 4, name="s"), dp.count(name="n")],
                 privacy_unit="uid", group_by=("g",), epsilon=2.0, delta=1e-6, noise="gaussian",
                 selection="laplace-threshold")
    notes = dp.execute(q, df).notes
    assert notes[1:3] == (
        "COUNT(DISTINCT unit) is the partition selection's noisy count, released as is (no extra budget); "
        "only counts above the threshold are released, so near the threshold they lean high.",
        "Gaussian aggregates are accounted together: their pooled (1.33333, 6.67e-07) is rho = 0.0447971 (on the "
        "Gaussians' exact privacy curve, privacy loss distributions; the discrete noise sampled is certified "
        "exactly), split between them; an aggregate's listed epsilon and delta are its slice of the pool, not a "
        "guarantee of its own.")
    assert ("Accountant: privacy loss distributions (dp-accounting) for the Gaussian aggregates: together "
            "0.299323-GDP (mu^2 = 2 rho adds up), whose exact delta at epsilon 1.33333 is 5e-07; the discrete "
            "Gaussians sampled, accounted exactly: delta 5e-07, within their delta 6.67e-07; basic composition "
            "with the other parts.") in notes


def test_the_public_json_keys_per_partition_bounds_by_numbers_and_dates_as_the_table_holds_them():
    """Per-partition bounds in to_json name their partition by its keys: an integer key as a number,
    a date key by its text (json has no date type). Epsilon 8: each partition's 2,000 values of 1 to
    3 give the bounds [1, 4]."""
    import datetime

    n = 8000
    day = np.where(np.arange(n) % 2 == 0, datetime.date(2024, 1, 1), datetime.date(2025, 1, 1))
    df = pd.DataFrame({"uid": np.arange(n), "year": np.where(np.arange(n) < n // 2, 2024, 2025),
                       "day": pd.to_datetime(day), "x": np.tile([1.0, 2.0, 3.0], n)[:n]})
    q = dp.Query([dp.Aggregate("sum", column="x", name="s")], privacy_unit="uid", group_by=("year", "day"),
                 epsilon=8.0, bounds_scope="partition")
    found = json.loads(dp.execute(q, df).to_json())["inferred_bounds"]
    assert [(b["partition"], b["lower"], b["upper"]) for b in found] == [
        ({"year": year, "day": f"{day} 00:00:00"}, 1.0, 4.0)
        for year, day in ((2024, "2024-01-01"), (2024, "2025-01-01"), (2025, "2024-01-01"), (2025, "2025-01-01"))]


def test_the_public_view_says_how_its_partitions_were_chosen():
    """partition_selection, in the result and its public dict: one partition without GROUP BY, the
    public keys' count with public partitions, else the selection mechanism and its description."""
    df = pd.DataFrame({"uid": np.arange(2000), "g": np.arange(2000) % 2})
    count = [dp.count(upper=1, name="n")]
    ungrouped = dp.execute(dp.Query(count, privacy_unit="uid", epsilon=1.0), df)
    public = dp.execute(dp.Query(count, privacy_unit="uid", group_by=("g",), public_partitions=[0, 1], epsilon=1.0), df)
    private = dp.execute(dp.Query(count, privacy_unit="uid", group_by=("g",), epsilon=1.0, delta=1e-6), df)
    assert ungrouped.partition_selection == "none (no GROUP BY: one partition, always released)"
    assert public.partition_selection == ("public partitions (2 keys from public data: the request's list or a "
                                          "PUBLIC_GROUPS table; no selection)")
    assert private.partition_selection.startswith("truncated-geometric: ")
    for r in (ungrouped, public, private):
        assert r.to_dict()["partition_selection"] == r.partition_selection


def test_explain_marks_an_inferred_bound_s_given_side_as_given():
    """A sum whose upper bound is given and whose lower one is inferred: explain() shows the inferred
    lower bound and the upper one as "given"."""
    import re

    df = pd.DataFrame({"uid": np.arange(3000), "x": np.arange(3000) % 50 - 10.0})
    result = dp.execute(dp.Query([dp.Aggregate("sum", column="x", name="total", upper=40)], privacy_unit="uid",
                                 epsilon=1.0), df)
    lines = [line for line in result.explain().splitlines() if "inferred (APPROX_BOUNDS)" in line]
    assert len(lines) == 1 and re.fullmatch(r"  bounds of total inferred \(APPROX_BOUNDS\): \[-?\d+, given\], "
                                            r"estimated share of values outside: \d+\.\d%", lines[0]), lines


def test_the_public_dict_states_every_mechanism_under_its_key():
    """The analyst's dict lists each mechanism (its target, sensitivity and budget share) under
    "mechanisms", one entry per noisy sum the release drew, exactly the release's own records."""
    r = release()
    d = r.to_dict()
    assert d["mechanisms"] == [m.to_dict() for m in r.mechanisms] and len(d["mechanisms"]) >= 2
    assert {m["target"] for m in d["mechanisms"]} >= {"s.sum", "n.count"}


def test_a_released_count_is_an_integer_in_the_table_its_text_and_its_json():
    """A count (of rows or of people) is released on the integers: the table holds it as integers
    (value and interval ends), its text writes `62 [52, 72]` (never `62.00`), its JSON writes 62
    (never 62.0), grouped or not; a sum of real values stays as it is."""
    df = pd.DataFrame({"uid": np.arange(3000), "g": ["a", "b", "c"] * 1000, "x": np.linspace(0.0, 9.0, 3000)})
    for group_by in (("g",), ()):
        q = dp.Query([dp.count(name="n"), dp.count_units(name="people"), dp.sum_("x", 0, 10, name="s")],
                     privacy_unit="uid", group_by=group_by, epsilon=1.0)
        r = dp.execute(q, df)
        for name in ("n", "people"):
            for column in (name, f"{name}_ci_low", f"{name}_ci_high"):
                assert r.table[column].dtype.kind == "i", (group_by, column, r.table[column].dtype)
            assert all(re.fullmatch(r"[\d,]+ \[[\d,]+, [\d,]+\]", cell) for cell in r.readable_table()[name])
            assert all(type(row[name]) is int and type(row[f"{name}_ci_low"]) is int for row in r.to_dict()["rows"])
            assert f'"{name}": {int(r.table[name].iloc[0])},' in r.to_json()
        assert r.table["s"].dtype.kind == "f"


def test_a_release_s_text_and_explanation_write_each_epsilon_with_four_significant_digits():
    """print() and explain() write the epsilon spent, each share's and each mechanism's as the reports
    do (dp_core.display.budget): 0.4375, not 0.437451 or 0.43745083326922696."""
    epsilon = 0.43745083326922696
    df = pd.DataFrame({"uid": np.arange(3000), "g": np.where(np.arange(3000) % 3 == 0, "a", "b")})
    result = dp.execute(dp.Query([dp.count(name="n"), dp.count_units(name="people")], privacy_unit="uid",
                                 group_by=("g",), epsilon=epsilon, public_partitions=["a", "b"]), df)
    assert str(result).splitlines()[0].startswith("DP release: epsilon=0.4375, delta=0,")
    text = result.explain()
    assert text.startswith("Total: epsilon 0.4375, delta 0 (basic composition)")
    assert "  share n: epsilon 0.2187, delta 0" in text
    assert not re.search(r"epsilon \d\.\d{5}", text), text
