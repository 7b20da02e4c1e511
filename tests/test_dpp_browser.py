"""The DPP tool in a real browser (Playwright driving the machine's Chromium): a controller moves each
slider of an analyst's request's page and the graph's chosen point, the written summary and every
previewed interval are checked against dp_core.risk and dp_core.accuracy called directly, with the
escrow key absent (nothing reads the data); "use this epsilon" writes the choice into the request,
and the release run from it chooses the same epsilon, and its summary and published intervals are
the page's (exact for counts). An analyst previews their request's accuracy before submitting."""

from __future__ import annotations

import html
import json
import math
import re

import pytest
from console_harness import Browser, console_server
from moved_away import moved_away
from test_console import paused_release, platform_env  # noqa: F401 - the module's home and Prefect API
from test_console_browser import enrolled, enrolment_link  # noqa: F401

SQL = ("SELECT WITH ANONYMIZATION education, ANON_COUNT(*, 1) AS people, ANON_AVG(age, 17, 90) AS avg_age "
       "FROM adult GROUP BY education")


@pytest.fixture(scope="module")
def console(platform_env):  # noqa: F811
    with console_server(platform_env) as origin:
        yield origin


@pytest.fixture(scope="module")
def controller(platform_env, console, browser):  # noqa: F811
    context, page = enrolled(browser, enrolment_link("dora", "controller", console))
    yield page
    context.close()


def submitted(platform_env, title: str) -> str:  # noqa: F811
    """An analyst's request in the inbox (as the console writes it for its signed-in analyst): its id."""
    from dprelease.requests import inbox
    from dprelease.store import Store

    request = inbox.parse_text(f"dataset: adult\ntitle: {title}\nepsilon: 1.0\nsql: {SQL}\n")
    return inbox.submit_in_console(platform_env, Store(platform_env.store_url), request, "ana").id


def no_escrow_key(settings):
    """The escrow key moved away: anything that reads the data fails while it is."""
    return moved_away(settings.escrow_key_file)


def settled(page) -> dict:
    """The page's numbers once every slider move has been answered (the last answer drawn)."""
    page.locator('#dpp[data-busy="false"]:not([data-updates="0"])').wait_for()  # no eval: the page's CSP
    return page.evaluate("window.dppLast")


def slid(page, selector: str, key: str, times: int) -> dict:
    """Move a slider as a person does (focus, arrow keys) and wait for the page's answer."""
    page.locator(selector).focus()
    for _ in range(times):
        page.keyboard.press(key)
    return settled(page)


def oracle(platform_env, page):  # noqa: F811
    """dp_core's own choice for the values the page's sliders show now (not the console's code)."""
    from dp_core import risk
    from dprelease import pipeline
    from dprelease.requests import inbox

    sent = page.evaluate("window.dppLast.risk_fields")
    values = {k: float(page.input_value(f"#{k}")) for k in ("trust", "sensitivity", "max_risk", "p")}
    assert values["trust"] == sent["trust"] and values["sensitivity"] == sent["sensitivity"]
    platform = pipeline.Platform.open(platform_env)
    query = pipeline.plan(platform, inbox.parse_text(f"dataset: adult\nepsilon: 1.0\nsql: {SQL}\n")).query
    ints = pipeline.integer_columns(platform.store.get_dataset("adult"))
    try:
        choice = risk.choose_epsilon_for_plan(
            query, trust=values["trust"], sensitivity=values["sensitivity"], max_risk=values["max_risk"],
            max_noise=sent["max_noise"], n=int(page.input_value("#n")), m=int(page.input_value("#m")),
            p=values["p"], headline=page.input_value("#headline"), integer_columns=ints)
    except Exception as err:  # noqa: BLE001 - the chooser's refusal is what the page must show
        return None, str(err), query, ints
    return choice, "", query, ints


def chosen_point(page) -> tuple[float, float]:
    return tuple(page.evaluate("(() => { const t = document.getElementById('graph2d').data"
                               ".find((x) => x.name === 'your choice'); return [t.x[0], t.y[0]]; })()"))


def check_against_dp_core(platform_env, page):  # noqa: F811
    """The graph's point, the epsilon, the summary and each interval are dp_core's, to the digit shown."""
    from dp_core import accuracy, display, risk

    choice, refusal, query, ints = oracle(platform_env, page)
    if choice is None:
        assert refusal.split(": ", 1)[-1] in page.inner_text("#summary")
        assert page.locator("#use").is_disabled()
        return None
    n, m = int(page.input_value("#n")), int(page.input_value("#m"))
    assert page.inner_text("#epsilon") == f"{choice.epsilon:.4g}"
    assert page.inner_text("#summary") == choice.summary
    headline = page.input_value("#headline")
    h = next(s.halfwidth for s in accuracy.statistic_intervals(query, choice.epsilon, confidence=choice.confidence,
                                                               integer_columns=ints) if s.name == headline)
    x, y = chosen_point(page)
    assert x == h
    assert y == pytest.approx(risk.risk(choice_value(page, "sensitivity"), choice_value(page, "trust"),
                                        risk.guessing_bound(choice.epsilon, n, m)), rel=1e-12)
    assert y <= float(page.input_value("#max_risk")) + 1e-12  # the point is under the tolerable line
    for s in choice.promise:
        group = f" for {s.reference_count:g} people" if s.reference_count else ""
        written = display.halfwidth(s.halfwidth, display.is_integer_kind(s.kind)) + group
        assert page.inner_text(f'#intervals tr[data-statistic="{s.name}"] td.written') == written
    return choice


def choice_value(page, name: str) -> float:
    return float(page.input_value(f"#{name}"))


def test_each_slider_moves_the_point_the_summary_and_the_intervals_as_dp_core_says(
        platform_env, console, controller):  # noqa: F811
    page = controller
    request_id = submitted(platform_env, "Disease states per village")
    with no_escrow_key(platform_env):
        page.goto(f"{console}/inbox")
        page.get_by_role("link", name="choose epsilon", exact=True).first.click()
        page.wait_for_url(re.compile(rf"/dpp/{request_id}$"))
        first = settled(page)
        assert "for the whole plan" in page.inner_text("#dpp")
        check_against_dp_core(platform_env, page)
        page.fill("#n", "4")  # the seed's running example: S, I, R, D
        settled(page)
        check_against_dp_core(platform_env, page)
        moves = [("#trust", "ArrowRight", 2), ("#sensitivity", "ArrowRight", 4), ("#noise", "ArrowLeft", 120),
                 ("#max_risk", "ArrowLeft", 10), ("#noise", "ArrowRight", 60)]
        epsilons = [first["epsilon"]]
        for selector, key, times in moves:
            before = page.input_value(selector)
            slid(page, selector, key, times)
            assert page.input_value(selector) != before, f"{selector} did not move"
            choice = check_against_dp_core(platform_env, page)
            epsilons.append(None if choice is None else choice.epsilon)
        assert len({e for e in epsilons if e is not None}) >= 2, "the noise slider changed no epsilon"
        # a tolerable risk no epsilon meets: refused in the chooser's words, nothing to use
        page.fill("#max_risk", "0.01")
        out = settled(page)
        assert not out["feasible"] and "nothing is released" in page.inner_text("#summary")
        check_against_dp_core(platform_env, page)
        # the 3D surface is drawn, with the choice on it
        assert page.evaluate("document.getElementById('graph3d').data[0].type") == "surface"


def test_what_if_c_u_bounds_and_split_change_the_intervals_as_dp_core_says(platform_env, console, controller):  # noqa: F811
    from dataclasses import replace

    from dp_core import accuracy, display

    page = controller
    request_id = submitted(platform_env, "What if")
    with no_escrow_key(platform_env):
        page.goto(f"{console}/dpp/{request_id}")
        out = settled(page)
        page.fill("#whatif-cu", "3")
        page.fill("#whatif-weight", "2")
        page.get_by_label("bounds of avg_age").fill("20, 70")
        page.get_by_label("bounds of avg_age").dispatch_event("change")
        out = settled(page)
        _, _, query, ints = oracle(platform_env, page)
        aggs = tuple(replace(a, lower=20.0, upper=70.0) if a.label == "avg_age" else a for a in query.aggregates)
        changed = replace(query, max_partitions_contributed=3, selection_weight=2.0, aggregates=aggs)
        for s in accuracy.statistic_intervals(changed, out["epsilon"], confidence=out["confidence"],
                                              integer_columns=ints):
            cell = page.inner_text(f'#intervals tr[data-statistic="{s.name}"] td:nth-child(4)')
            assert cell == display.halfwidth(s.halfwidth, display.is_integer_kind(s.kind))
        assert page.evaluate("document.getElementById('selection').data.length") == 2


def test_use_this_epsilon_releases_what_the_page_promised(platform_env, console, controller):  # noqa: F811
    from dprelease.requests import load_request
    from dprelease.requests.epsilon import to_parameter

    page = controller
    request_id = submitted(platform_env, "Villages, as chosen")
    page.goto(f"{console}/dpp/{request_id}")
    settled(page)
    page.fill("#n", "4")
    settled(page)
    slid(page, "#noise", "ArrowLeft", 80)
    choice = check_against_dp_core(platform_env, page)
    assert choice is not None
    shown = page.evaluate("window.dppLast")
    page.get_by_role("button", name="Use this epsilon").click()
    page.locator("#used").wait_for()
    request = load_request(platform_env.inbox_dir / f"{request_id}.json")  # a request file, as `release` reads it
    assert request.epsilon_mode == "risk"
    for name in ("trust", "sensitivity", "max_risk"):
        assert request.risk[name] == choice_value(page, name)
    # the run, started with the request's parameters as the Prefect UI would
    rel, thread, box = paused_release(platform_env, title=request.title, sql=request.sql,
                                      epsilon=to_parameter(request), requested_by=request.requested_by)
    summary = (platform_env.archive_dir / rel.id / "summary.md").read_text()
    assert choice.summary in summary
    page.goto(f"{console}/releases/{rel.id}")
    assert f"{choice.epsilon:.4g}" in page.inner_text("dl.facts")
    page.get_by_role("button", name="Approve and publish").click()
    page.locator("#state", has_text="Published").wait_for()
    thread.join(180)
    assert box["result"]["status"] == "published"
    controller_html = html.unescape((platform_env.archive_dir / rel.id / "controller" / "controller.html").read_text())
    assert choice.summary in controller_html
    published = json.loads((platform_env.publication_dir / rel.id / "results.json").read_text())
    assert published["epsilon"] == pytest.approx(shown["epsilon"], rel=1e-12)
    promised = {r["name"]: r["halfwidth"] for r in shown["intervals"]}
    rows = published["rows"]
    assert rows
    unclipped = [r for r in rows if r["people_ci_low"] > 0]
    assert unclipped
    for row in unclipped:  # a count's interval is exactly the promise (clipped only at 0)
        assert (row["people_ci_high"] - row["people_ci_low"]) / 2 == promised["people"]
        assert (row["people_ci_high"] - row["people"]) == promised["people"]
    for row in rows:  # AVG: first order, stated for 100 people; a group of at least 100 is no wider
        if row["people"] >= 100 and math.isfinite(row["avg_age_ci_high"]) and 17 <= row["avg_age"] <= 90:
            assert (row["avg_age_ci_high"] - row["avg_age_ci_low"]) / 2 <= promised["avg_age"] * (1 + 1e-9)


def test_an_analyst_previews_the_accuracy_at_their_policy_s_epsilon(platform_env, console, browser):  # noqa: F811
    from dp_core import accuracy, display
    from dprelease import pipeline
    from dprelease.requests import inbox

    platform = pipeline.Platform.open(platform_env)
    platform.store.add_policy("ava-adult", "adult", analyst="ava", max_epsilon_per_release=0.5)
    platform.store.add_policy("ana-adult", "adult", analyst="ana", max_epsilon_per_release=10)  # the other tests'
    context, page = enrolled(browser, enrolment_link("ava", "analyst", console))
    text = f"dataset: adult\ntitle: Preview me\nepsilon: 2.0\nsql: {SQL}\n"
    with no_escrow_key(platform_env):
        page.get_by_label("A release request").fill(text)
        page.get_by_role("button", name="Preview the accuracy").click()
        page.locator("#preview-intervals").wait_for()
    eps = 0.5  # asked 2.0; the policy allows 0.5 per release
    assert "above your policy's limit 0.5" in page.inner_text("#preview")
    query = pipeline.plan(platform, inbox.parse_text(text)).query
    ints = pipeline.integer_columns(platform.store.get_dataset("adult"))
    assert f"epsilon {eps:.4g}" in page.inner_text("#preview")
    for s in accuracy.statistic_intervals(query, eps, integer_columns=ints):
        group = f" for {s.reference_count:g} people" if s.reference_count else ""
        written = display.halfwidth(s.halfwidth, display.is_integer_kind(s.kind)) + group
        assert page.inner_text(f'#preview-intervals tr[data-statistic="{s.name}"] td.written') == written
    # nothing was submitted by previewing
    assert not any(f.get("title") == "Preview me" for _, f in inbox.submitted(platform_env.inbox_dir))
    context.close()


def test_the_tool_s_refusals_over_http(platform_env, console):  # noqa: F811
    from console_harness import enrolment_link as link_for

    analyst = Browser(console)
    assert analyst.enrol(link_for(platform_env, "abe", "analyst")).status_code == 200
    request_id = submitted(platform_env, "Refusals")
    assert analyst.post("/dpp/numbers", {"request_id": request_id}).status_code == 403
    assert analyst.get(f"/dpp/{request_id}").status_code == 403
    boss = Browser(console)
    assert boss.enrol(link_for(platform_env, "cleo", "controller")).status_code == 200
    # the page's buttons come disabled, enabled by its script once it runs: a click before it (plotly.js is
    # large, and deferred) did nothing, and the page never answered (a clean-clone run waited 900 s)
    assert re.search(r'<button[^>]*id="use"[^>]*disabled', boss.get(f"/dpp/{request_id}").text)
    assert re.search(r'<button[^>]*id="explore"[^>]*disabled', boss.get("/dpp").text)
    bad = boss.post("/dpp/numbers", {"request_id": request_id, "trust": 2, "sensitivity": 0.5, "max_risk": 0.5,
                                     "max_noise": 5})
    assert bad.status_code == 400 and bad.json()["error"] == "trust must be a number from 0 to 1, got 2"
    assert boss.post("/dpp/numbers", {"request_id": "nope", "trust": 0.5}).status_code == 404
    draft = boss.post("/dpp/numbers", {"draft": "dataset: nowhere\nepsilon: 1\nsql: SELECT 1\n", "defaults": True})
    assert draft.status_code == 400 and "\n" not in draft.json()["error"]
    refused = boss.post(f"/dpp/{request_id}/use", {"request_id": request_id, "trust": 0.0, "sensitivity": 1.0,
                                                   "max_risk": 0.01, "max_noise": 1, "n": 2, "m": 2})
    assert refused.status_code == 400 and refused.json()["error"].startswith("nothing was written")
    assert json.loads((platform_env.inbox_dir / f"{request_id}.json").read_text())["epsilon"] == 1.0
    assert boss.post("/dpp/numbers", {"request_id": request_id}, csrf="forged").status_code == 403
    # a file dropped into the inbox is nobody's: its epsilon is not chosen, lest it look vouched for by the console
    dropped = platform_env.inbox_dir / "d0d0d0d0d0d1.json"
    dropped.write_text(json.dumps({"dataset": "adult", "epsilon": 1.0, "sql": SQL, "requested_by": "ana"}))
    try:
        refused = boss.post("/dpp/d0d0d0d0d0d1/use", {"trust": 0.3, "sensitivity": 0.5, "max_risk": 1, "max_noise": 50})
        assert refused.status_code == 409 and "is not signed" in refused.json()["error"], refused.text
        assert json.loads(dropped.read_text())["epsilon"] == 1.0
    finally:
        dropped.unlink()


def test_a_draft_is_explored_without_submitting_it(platform_env, console, controller):  # noqa: F811
    from dprelease.requests import inbox

    page = controller
    before = len(inbox.submitted(platform_env.inbox_dir))
    with no_escrow_key(platform_env):
        page.goto(f"{console}/inbox")
        page.get_by_role("link", name="Choose epsilon for a draft request").click()
        page.locator("#draft").fill(f"dataset: adult\nepsilon: 1.0\nsql: {SQL}\n")
        page.get_by_role("button", name="Explore this draft").click()
        settled(page)
        check_against_dp_core(platform_env, page)
        slid(page, "#trust", "ArrowLeft", 3)
        check_against_dp_core(platform_env, page)
        assert page.locator("#use").count() == 0  # a draft has no request to write into
        page.locator("#draft").fill("dataset: adult\nepsilon: 1.0\nsql: SELECT nothing FROM nowhere\n")
        page.get_by_role("button", name="Explore this draft").click()
        page.locator("#problem:not([hidden])").wait_for()
        assert "\n" not in page.inner_text("#problem")
    assert len(inbox.submitted(platform_env.inbox_dir)) == before
