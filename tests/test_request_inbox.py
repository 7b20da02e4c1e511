"""The analysts' inbox: a submitted request is written in the request-file format, so a controller
runs the inbox file as it is (`dprelease release INBOX_FILE`), and it reads back as the same request
whatever epsilon choice it makes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "requests"


@pytest.mark.parametrize("text", [
    (EXAMPLES / "education.yaml").read_text(),
    "dataset: adult\ntitle: t\nepsilon: {pri: {p: 50}}\nsql: SELECT WITH ANONYMIZATION sex, ANON_COUNT(*, 1) AS n "
    "FROM adult GROUP BY sex\n",
    "dataset: adult\nepsilon: {risk: {trust: low, sensitivity: high, max_risk: 0.2, max_noise: 10, n: 2}}\n"
    "query: {group_by: [sex], aggregates: [{kind: count}]}\nbackend: duckdb\ndelta: 1.0e-7\n",
])
def test_an_inbox_file_reads_back_as_the_request_submitted(tmp_path, text):
    from dprelease.requests import inbox, load_request
    from dprelease.settings import Settings

    request = inbox.parse_text(text)
    path = inbox.submit(Settings.from_env({"DPRELEASE_HOME": str(tmp_path)}), request, "ana").path
    again = load_request(path)
    assert json.loads(again.to_json()) == {**json.loads(request.to_json()), "requested_by": "ana"}
    # the release it becomes has the inbox request's key: the request then no longer waits
    assert inbox.request_key(json.loads(path.read_text())) == inbox.request_key(json.loads(again.to_json()))


def test_the_command_line_s_inbox_file_runs_as_it_is(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from dprelease.cli.app import app
    from dprelease.requests import load_request

    monkeypatch.setenv("DPRELEASE_HOME", str(tmp_path))
    result = CliRunner().invoke(app, ["request", "submit", str(EXAMPLES / "education.yaml"), "--as", "ana"])
    assert result.exit_code == 0, result.output
    (path,) = (tmp_path / "inbox").glob("*.json")
    assert load_request(path).requested_by == "ana"
