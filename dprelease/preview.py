"""Accuracy preview: before any budget is reserved, how wide each statistic's interval is expected
to be at the chosen epsilon, from the plan and its public facts only (bounds, C_u, the budget
split, the noise). No data is read, so the preview itself spends nothing (as OpenDP's DP Wizard
offers before a release).

The half-widths are `dp_core.accuracy.statistic_intervals`: the calibration the release itself
uses (the budget split, each component's grid and scale, `release.calibrate`'s half-width), so the
interval previewed for a COUNT, a COUNT(DISTINCT unit) or a SUM is, to the last bit, the one the
release reports (a group's interval is only ever narrower, clipped at a bound such as 0). An
AVG's is first order and depends on the group's size n: it is given for GROUP_SIZES people, in the
worst case for the mean (at a bound). VAR, STDDEV, quantiles and bounds inferred from the data have
no data-free interval. Each half-width is written by `dp_core.display.halfwidth`, as the summary
and the reports write it (`±10` for a count, not the continuous `± 10.5`).
"""

from __future__ import annotations

from dp_core import Query, accuracy, display

GROUP_SIZES = (100, 1000)  # the group sizes an AVG preview is given for


def accuracy_preview(query: Query, epsilon: float, integer_columns=None) -> list[dict]:
    """One row per aggregate: label, kind, expected half-width (None when there is none; an AVG's
    per group size in `by_group_size`) and a note. integer_columns: the dataset's integer-typed
    columns (a SUM over one is noised on the integers); None when unknown (the wider of the two)."""
    def intervals(n: float):
        return accuracy.statistic_intervals(query, epsilon, integer_columns=integer_columns, reference_count=n)

    by_size = {n: intervals(float(n)) for n in GROUP_SIZES}
    rows = []
    for i, s in enumerate(by_size[GROUP_SIZES[0]]):
        row = {"statistic": s.name, "kind": s.kind, "halfwidth": None, "note": s.note}
        if s.halfwidth is not None and s.reference_count is None:
            row["halfwidth"] = s.halfwidth
        elif s.halfwidth is not None:  # an AVG: one half-width per group size
            row["by_group_size"] = {n: by_size[n][i].halfwidth for n in GROUP_SIZES}
            row["note"] = "depends on the group's size n (at most, to first order)"
        rows.append(row)
    return rows


def preview_markdown(query: Query, epsilon: float, integer_columns=None) -> str:
    """The preview as a short markdown section (the CLI and the Prefect UI show it)."""
    level = f"{query.confidence:.0%}"
    intro = (f"Expected {level} interval of each released value, from the plan's public facts only "
             "(bounds, groups per person, the budget split); no data was read.")
    lines = [f"## Accuracy preview at epsilon {display.budget(epsilon)} (before any budget is spent)", intro, "",
             "| statistic | expected interval | note |", "|---|---|---|"]
    for row in accuracy_preview(query, epsilon, integer_columns):
        whole = display.is_integer_kind(row["kind"])
        if row["halfwidth"] is not None:
            shown = display.halfwidth(row["halfwidth"], whole)
        elif "by_group_size" in row:
            shown = "; ".join(f"{display.halfwidth(h)} for {n} people" for n, h in row["by_group_size"].items())
        else:
            shown = "—"
        lines.append(f"| {row['statistic']} | {shown} | {row['note']} |")
    return "\n".join(lines)
