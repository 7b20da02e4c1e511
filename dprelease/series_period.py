"""What follows the publication of a series' period, whoever finished it: the publication run
(dprelease.flows.publication) or the recovery that completed it after its run died
(dprelease.recovery). One function, so that the two paths cannot drift.

Its own module: it reads the running total (running_total.py), the series page (series.py) and
the publication index (pipeline.py), and pipeline.py reads series.py for the index's series section.
"""

from __future__ import annotations

from . import pipeline
from . import running_total as running_totals
from .series import publish_series_page


def period_published(platform, series: str, snapshot: str) -> list[str]:
    """What follows the publication of a series' period, by its run (dprelease.flows.publication) or
    by the recovery that finished it (dprelease.recovery): the running total through the newest period
    whose releases are all published (its noise sealed: the same values whoever computes them), the
    signed series page, and the publication index that links it. Each is done even when an earlier
    one could not be: the period is published and its budget spent whatever follows, and each is
    done again, from the store, after the next period. Returns one line for each that did not reach
    `snapshot` or could not be done (for the run's log or the recovery's line); never raises."""
    notes = []
    try:
        if held := running_totals.release_published(platform, series, snapshot):
            notes.append(held)
    except running_totals.RunningTotalRefused as err:  # a period moved, say: it says so itself
        notes.append(str(err))
    except Exception as err:  # noqa: BLE001 - the archive unreadable, say: said, the page still follows
        notes.append(f"running total of series {series!r} not released: {err}")
    pages = (("series page", lambda: publish_series_page(platform, series)),
             ("publication index", lambda: pipeline.write_index(platform)))  # after the page: it links it
    for what, publish in pages:
        try:
            publish()
        except Exception as err:  # noqa: BLE001 - said; the next period's run publishes it again
            notes.append(f"the {what} was not published again (the next period's run publishes it): {err}")
    return notes
